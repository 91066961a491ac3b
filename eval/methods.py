"""Generation backends for evaluation: a method name + member names -> an object with
`generate(prompts, *, max_new_tokens, stop, temperature=0.0, seed=None) -> list[GenerationOutput]`.

- `single`: one member from the process-wide loader (`runtime.loader.load`: loaded once per
  (name, dtype)); with `options: {drafter: SPEC, ...}` it becomes speculative through
  `specdec.SpeculativeGenerator` (SPEC as `specdec.drafters.make_drafter` reads it); a program view's
  outputs are run in the sandbox (`runtime.program_answers.ProgramGenerator`).
- every other name (`adafuse`, `token-union`, `word-fixed`, `sample-rerank`) goes to
  `adafuse.Ensemble(members, method=method, **options)` (e.g. `options: {threshold: 0.7,
  drafters: [lookup, lookup, null]}` for speculative members), which loads through the same loader.

Extra backends (e.g. fakes in tests) are added to `METHODS` with `register_method`.
`check_run(method, members, options)` makes the checks building would make, before any model
loads (a config's mistake in its last run is then found before the first run starts).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from adafuse.ensemble import MEMBER_DRAFTING, Ensemble, EnsembleConfig, check_member_drafting, model_specs
from adafuse.methods import METHODS as ADAFUSE_METHODS
from runtime.devices import check_device, check_devices
from runtime.errors import ConfigError
from runtime.loader import default_loader, load
from runtime.member import resolve_dtype
from runtime.outputs import GenerationOutput
from runtime.program_answers import ProgramGenerator
from runtime.views import is_program
from specdec.config import DEFAULT_SHAPE
from specdec.drafters import default_shape, make_drafter, parse_drafter_spec
from specdec.engine import SPECULATIVE_OPTIONS, SpeculativeGenerator


class Generator(Protocol):
    def generate(self, prompts: list[str], *, max_new_tokens: int, stop: list[str], temperature: float = 0.0,
                 seed: int | None = None) -> list[GenerationOutput]: ...


ENSEMBLE_METHODS = tuple(m for m in ADAFUSE_METHODS if m != "single")  # the registry's (`adafuse.methods`)
METHODS: dict[str, Callable[..., Generator]] = {}
_GENERATOR_CACHE: dict[tuple, Generator] = {}


def register_method(name: str) -> Callable[[Callable[..., Generator]], Callable[..., Generator]]:
    """Decorator: `@register_method("fake") def build(members, **options) -> Generator`."""

    def deco(fn: Callable[..., Generator]) -> Callable[..., Generator]:
        METHODS[name] = fn
        return fn

    return deco


def is_builtin(method: str) -> bool:
    """Whether `method` is one of ours (not replaced or added by `register_method`, e.g. a test fake)."""
    if method == "single":
        return METHODS.get("single") is _build_single
    return method in ENSEMBLE_METHODS and method not in METHODS


def known_methods() -> list[str]:
    return list(dict.fromkeys([*METHODS, *ENSEMBLE_METHODS]))


@register_method("single")
def _build_single(members: list[str], *, dtype: str = "float32", drafter: str | None = None,
                  device: str = "cpu", **options: Any) -> Generator:
    _check_single(members, dtype, drafter, options)
    device = check_device(device)
    if device == "cpu":  # target + drafter in RAM together, before either loads
        default_loader().check_fit(model_specs(members, [drafter]), dtype)
    target = load(members[0], dtype=dtype, device=device)
    generator = target if drafter is None else _speculative(target, drafter, dtype, options, device)
    return ProgramGenerator(generator) if is_program(target) else generator  # a program view: its programs run




def _check_single(members: list[str], dtype: str, drafter: Any, options: dict[str, Any]) -> None:
    if len(members) != 1:
        raise ConfigError(f"method 'single' takes exactly one member, got {len(members)}: {', '.join(members)}")
    resolve_dtype(dtype)
    if drafter is None:
        if options:
            raise ConfigError(f"method 'single' does not take option(s) {', '.join(sorted(options))} "
                              f"(only dtype and drafter; speculative options go with a drafter)")
        return
    check_drafter(members[0], drafter)
    unknown = sorted(k for k in options if k not in SPECULATIVE_OPTIONS)
    if unknown:
        raise ConfigError(f"unknown speculative option(s) {', '.join(unknown)}; known: {', '.join(SPECULATIVE_OPTIONS)}")
    try:  # no target, no drafter: only the shape and verifier options are checked
        SpeculativeGenerator(None, None, DEFAULT_SHAPE, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"speculative options {sorted(options)} rejected by specdec.SpeculativeGenerator: {exc}") from None


def check_drafter(member: str, drafter: Any) -> None:
    """A drafter spec that parses (one-line ConfigError otherwise). Any model may draft for any
    member: one with another tokenizer drafts through text (`specdec.text_drafter.TextDrafter`)."""
    parse_drafter_spec(drafter)


def _check_ensemble(method: str, members: list[str], options: dict[str, Any]) -> None:
    opts = dict(options)
    known = {k: opts.pop(k, None) for k in ("weights", "drafters", "lead", "dtype", "chat", "devices", "member_drafting")}
    check_devices(known["devices"], len(members))
    try:
        EnsembleConfig(method, known["weights"], 0 if known["lead"] is None else known["lead"],
                       known["dtype"] or "float32", known["chat"], opts).validate(len(members))
    except TypeError as exc:
        raise ConfigError(f"options of method '{method}' rejected: {exc}") from None
    resolve_dtype(known["dtype"] or "float32")
    drafters = known["drafters"]
    if drafters is not None:
        if not isinstance(drafters, list) or len(drafters) != len(members):
            raise ConfigError(f"option drafters must list one entry (or null) per member: {len(members)} members, "
                              f"got {drafters!r}")
        for member, drafter in zip(members, drafters):
            check_drafter(member, drafter)
    _check_member_drafting(known["member_drafting"], members, known["lead"] or 0, (drafters or [None] * len(members)))


def _check_member_drafting(value: Any, members: list[str], lead: int, drafters: list[Any]) -> None:
    """`adafuse.ensemble.check_member_drafting`, and a name must be a member's other than the lead's."""
    check_member_drafting(value, len(members), lead, drafters[lead] if 0 <= lead < len(drafters) else None)
    if isinstance(value, str) and value not in MEMBER_DRAFTING and value not in members[:lead] + members[lead + 1:]:
        raise ConfigError(f"member_drafting={value!r} names no member other than the lead ({members[lead]}); "
                          f"members: {', '.join(members)}")


def check_run(method: str, members: list[str], options: dict[str, Any]) -> None:
    """Fail now, before any model loads, where `build_generator(method, members, **options)` would:
    the member count, the options (the method's own parser; a single member's speculative ones),
    the dtype, the drafters. Member names are `runtime.loader.check_spec`'s job. Backends added
    with `register_method` (e.g. test fakes) check their options when built."""
    if not is_builtin(method):
        return
    if method == "single":
        opts = dict(options)
        check_device(opts.pop("device", "cpu"))
        _check_single(members, opts.pop("dtype", "float32"), opts.pop("drafter", None), opts)
    else:
        _check_ensemble(method, members, options)


def _speculative(target: Any, drafter: str, dtype: str, options: dict[str, Any], device: str = "cpu") -> Generator:
    """`specdec.SpeculativeGenerator(target, drafter, **options)` (scheme, num_drafts, depth, ...);
    the drafter spec ("lookup", "hybrid:NAME", "NAME@int8", a model name) is read by `make_drafter`,
    its models come from the same loader."""
    made = make_drafter(drafter, load=lambda name, **kw: load(name, **{"dtype": dtype, "device": device, **kw}))
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


def _drafter_models(options: dict[str, Any]) -> list[str]:
    """The models a run's `drafter` / `drafters` options load (`specdec.drafters.parse_drafter_spec`)."""
    from specdec.drafters import parse_drafter_spec

    specs = [options.get("drafter"), *(options.get("drafters") or [])]
    return [m for m in (parse_drafter_spec(s).model for s in specs if isinstance(s, str)) if m]


def release_models(runs_left: list[tuple[str, list[str], dict[str, Any]]]) -> int:
    """Free the models no run left needs (`runs_left`: (method, members, options) of the runs still
    to come; drafters named in options count): their cached generators and loaded members go, and
    the freed heap goes back to the OS. An eval of many runs then holds at most the models of the run
    at hand and those later runs share with it. Returns how many models were let go."""
    import gc

    from runtime.heap import release_free_heap
    from runtime.loader import model_key

    keep = {model_key(m) for _, members, _ in runs_left for m in members}
    keep |= {model_key(d) for _, _, options in runs_left for d in _drafter_models(options)}
    for key in [k for k in _GENERATOR_CACHE if not {model_key(m) for m in k[1]} <= keep]:
        del _GENERATOR_CACHE[key]
    gone = default_loader().release(keep)
    if gone:
        gc.collect()
        release_free_heap()
    return gone


def clear_caches() -> None:
    """Forget loaded members and generators (tests)."""
    default_loader().clear()
    _GENERATOR_CACHE.clear()
