"""Generation backends for evaluation: a method name + member names -> an object with
`generate(prompts, *, max_new_tokens, stop, temperature=0.0, seed=None) -> list[GenerationOutput]`.

- `single`: one member from the process-wide loader (`runtime.loader.load`: loaded once per
  (name, dtype)); with `options: {drafter: SPEC, ...}` it becomes speculative through
  `specdec.SpeculativeGenerator` (SPEC as `specdec.drafters.make_drafter` reads it).
- every other name (`adafuse`, `token-union`, `word-fixed`, `sample-rerank`) goes to
  `adafuse.Ensemble(members, method=method, **options)` (e.g. `options: {threshold: 0.7,
  drafters: [lookup, lookup, null]}` for speculative members), which loads through the same loader.

Extra backends (e.g. fakes in tests) are added to `METHODS` with `register_method`.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from adafuse.ensemble import Ensemble
from runtime.errors import ConfigError
from runtime.loader import default_loader, load
from runtime.outputs import GenerationOutput
from specdec.drafters import default_shape, make_drafter
from specdec.engine import SpeculativeGenerator


class Generator(Protocol):
    def generate(self, prompts: list[str], *, max_new_tokens: int, stop: list[str], temperature: float = 0.0,
                 seed: int | None = None) -> list[GenerationOutput]: ...


ENSEMBLE_METHODS = ("adafuse", "token-union", "word-fixed", "sample-rerank")
METHODS: dict[str, Callable[..., Generator]] = {}
_GENERATOR_CACHE: dict[tuple, Generator] = {}


def register_method(name: str) -> Callable[[Callable[..., Generator]], Callable[..., Generator]]:
    """Decorator: `@register_method("fake") def build(members, **options) -> Generator`."""

    def deco(fn: Callable[..., Generator]) -> Callable[..., Generator]:
        METHODS[name] = fn
        return fn

    return deco


def known_methods() -> list[str]:
    return list(dict.fromkeys([*METHODS, *ENSEMBLE_METHODS]))


@register_method("single")
def _build_single(members: list[str], *, dtype: str = "float32", drafter: str | None = None,
                  **options: Any) -> Generator:
    if len(members) != 1:
        raise ConfigError(f"method 'single' takes exactly one member, got {len(members)}: {', '.join(members)}")
    target = load(members[0], dtype=dtype)
    if drafter is None:
        if options:
            raise ConfigError(f"method 'single' does not take option(s) {', '.join(sorted(options))} "
                              f"(only dtype and drafter; speculative options go with a drafter)")
        return target
    return _speculative(target, drafter, dtype, options)


def _speculative(target: Any, drafter: str, dtype: str, options: dict[str, Any]) -> Generator:
    """`specdec.SpeculativeGenerator(target, drafter, **options)` (scheme, num_drafts, depth, ...);
    the drafter spec ("lookup", "hybrid:NAME", "NAME@int8", a model name) is read by `make_drafter`,
    its models come from the same loader."""
    made = make_drafter(drafter, load=lambda name, **kw: load(name, dtype=dtype, **kw))
    try:
        return SpeculativeGenerator(target, made, default_shape(made), **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"speculative options {sorted(options)} rejected by specdec.SpeculativeGenerator: {exc}") from None


def _build_ensemble(method: str, members: list[str], **options: Any) -> Generator:
    """`adafuse.Ensemble(members, method=method, **options)`; members and drafters' models come from
    the process-wide loader (`runtime.loader`), so runs share the models."""
    return Ensemble(list(members), method=method, **options)


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
    default_loader().clear()
    _GENERATOR_CACHE.clear()
