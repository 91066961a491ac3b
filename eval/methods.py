"""Generation backends for evaluation: a method name + member names -> an object with
`generate(prompts, *, max_new_tokens, stop, temperature=0.0, seed=None) -> list[GenerationOutput]`.

- `single`: one member via `runtime.registry.load_member` (loaded once per process, cached by
  (name, dtype)); with `options: {drafter: NAME, ...}` it becomes speculative through
  `specdec.SpeculativeGenerator`.
- every other name (`adafuse`, `token-union`, `word-fixed`, `sample-rerank`, ...) goes to
  `adafuse.Ensemble(members, method=method, **options)` (e.g. `options: {threshold: 0.7,
  drafters: [lookup, lookup, null]}` for speculative members); members are the cached `Member`s.

Extra backends (e.g. fakes in tests) are added to `METHODS` with `register_method`.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from runtime.errors import AdafuseError, ConfigError
from runtime.outputs import GenerationOutput


class Generator(Protocol):
    def generate(self, prompts: list[str], *, max_new_tokens: int, stop: list[str], temperature: float = 0.0,
                 seed: int | None = None) -> list[GenerationOutput]: ...


class MissingBackendError(AdafuseError):
    """A method whose implementation is not importable (not built yet, or not installed)."""


ENSEMBLE_METHODS = ("adafuse", "token-union", "word-fixed", "sample-rerank")
METHODS: dict[str, Callable[..., Generator]] = {}
_MEMBER_CACHE: dict[tuple[str, str], Any] = {}
_GENERATOR_CACHE: dict[tuple, Generator] = {}


def register_method(name: str) -> Callable[[Callable[..., Generator]], Callable[..., Generator]]:
    """Decorator: `@register_method("fake") def build(members, **options) -> Generator`."""

    def deco(fn: Callable[..., Generator]) -> Callable[..., Generator]:
        METHODS[name] = fn
        return fn

    return deco


def known_methods() -> list[str]:
    return list(dict.fromkeys([*METHODS, *ENSEMBLE_METHODS]))


def _load_member_fn() -> Callable[..., Any]:
    try:
        from runtime.registry import load_member
    except ImportError:
        try:
            from runtime.member import load_member
        except ImportError as exc:
            raise MissingBackendError(f"method 'single' needs runtime.registry.load_member, which is not available ({exc})") from None
    return load_member


def load_member_cached(name: str, dtype: str = "float32") -> Any:
    """`runtime.registry.load_member(name, dtype=dtype)`, once per (name, dtype) per process."""
    key = (name, dtype)
    if key not in _MEMBER_CACHE:
        _MEMBER_CACHE[key] = _load_member_fn()(name, dtype=dtype)
    return _MEMBER_CACHE[key]


@register_method("single")
def _build_single(members: list[str], *, dtype: str = "float32", drafter: str | None = None,
                  **options: Any) -> Generator:
    if len(members) != 1:
        raise ConfigError(f"method 'single' takes exactly one member, got {len(members)}: {', '.join(members)}")
    target = load_member_cached(members[0], dtype)
    if drafter is None:
        if options:
            raise ConfigError(f"method 'single' does not take option(s) {', '.join(sorted(options))} "
                              f"(only dtype and drafter; speculative options go with a drafter)")
        return target
    return _speculative(target, drafter, dtype, options)


def _speculative(target: Any, drafter: str, dtype: str, options: dict[str, Any]) -> Generator:
    """`specdec.SpeculativeGenerator(target, drafter, **options)` (scheme, num_drafts, depth, ...)."""
    try:
        from specdec.engine import SpeculativeGenerator
    except ImportError as exc:
        raise MissingBackendError(f"option 'drafter' needs specdec.SpeculativeGenerator, which is not available ({exc})") from None
    try:
        from specdec.drafters import default_shape, make_drafter

        made = make_drafter(str(drafter), dtype, load=lambda name: load_member_cached(name, dtype))
        return SpeculativeGenerator(target, made, **{**default_shape(made), **options})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"speculative options {sorted(options)} rejected by specdec.SpeculativeGenerator: {exc}") from None


def _build_ensemble(method: str, members: list[str], **options: Any) -> Generator:
    """`adafuse.Ensemble(members, method=method, **options)`, with members (and model drafters in
    `drafters: [...]`) passed as already-loaded, process-cached `Member`s so runs share the models."""
    try:
        from adafuse import Ensemble  # built by another module; imported lazily
    except ImportError as exc:
        raise MissingBackendError(f"method '{method}' needs adafuse.Ensemble, which is not available yet ({exc})") from None
    dtype = options.get("dtype", "float32")
    loaded = [load_member_cached(m, dtype) for m in members]
    if isinstance(options.get("drafters"), list):
        options = {**options, "drafters": [load_member_cached(d, dtype) if isinstance(d, str) and d != "lookup"
                                           else d for d in options["drafters"]]}
    try:
        return Ensemble(loaded, method=method, **options)
    except TypeError as exc:
        raise ConfigError(f"method '{method}': options {sorted(options)} not accepted by adafuse.Ensemble: {exc}") from None


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def build_generator(method: str, members: list[str], **options: Any) -> Generator:
    """The generator for `method` over `members`; options pass through to the backend.
    Built once per (method, members, options) per process and reused across tasks and runs."""
    key = (method, tuple(members), _freeze(options))
    if key in _GENERATOR_CACHE:
        return _GENERATOR_CACHE[key]
    if method in METHODS:
        generator = METHODS[method](list(members), **options)
    else:
        generator = _build_ensemble(method, list(members), **options)
    _GENERATOR_CACHE[key] = generator
    return generator


def clear_caches() -> None:
    """Forget loaded members and generators (tests)."""
    _MEMBER_CACHE.clear()
    _GENERATOR_CACHE.clear()
