"""The method contract: every ensemble method is a `Method` with an options dataclass, run on a
`GenerationRequest`.

    method = get_method("token-union")
    options = method.parse_options({"top_k": 5})          # one-line ConfigError on a bad option
    outs = method.generate(members, request, options, weights=..., lead=..., speculators=...)

`Ensemble` resolves and validates the method and its options when it is built, so a bad option
fails before any model is loaded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

from runtime.errors import ConfigError
from runtime.options import parse_options as parse_dataclass
from runtime.sampling import SamplingParams
from runtime.stopping import StopStrings


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate: the prompts and when to stop, and how to sample."""

    prompts: list[str]
    max_new_tokens: int = 128
    stop: StopStrings = field(default_factory=StopStrings)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    chat: bool | None = None
    answer: Callable[[str], str] | None = None  # an output's answer (the task's filter), for answer-level methods

    @classmethod
    def make(cls, prompts: Sequence[str] | str, max_new_tokens: int = 128, stop: Sequence[str] | None = None,
             temperature: float = 0.0, seed: int | None = None, top_k: int = 0, top_p: float = 1.0,
             chat: bool | None = None, answer: Callable[[str], str] | None = None) -> "GenerationRequest":
        """Validated request; bad values raise a one-line `ConfigError`."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={max_new_tokens!r} is invalid: an integer >= 1")
        if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and \
                (not math.isfinite(temperature) or temperature < 0):
            raise ConfigError(f"temperature={temperature} is invalid: a finite number >= 0")
        try:
            sampling = SamplingParams(float(temperature), top_k, top_p, seed)
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(exc)) from None
        if answer is not None and not callable(answer):
            raise ConfigError(f"answer={answer!r} is invalid: a function from an output text to its answer")
        return cls(list(prompts), max_new_tokens, StopStrings(stop), sampling, chat, answer)

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    @property
    def seed(self) -> int | None:
        return self.sampling.seed


@dataclass
class NoOptions:
    """A method without options."""

    def validate(self) -> None:
        pass


def parse_options(method: str, options_cls: type, options: dict[str, Any]):
    """`options_cls(**options)`, validated (`runtime.options.parse_options`: unknown names with
    did-you-mean, types, the dataclass's `validate()`; one-line ConfigErrors)."""
    return parse_dataclass(options_cls, options, f"method '{method}'")


class Method:
    """An ensemble method: `name`, its `Options` dataclass (with `validate()`), `min_members`, and
    `generate(members, request, options, *, weights, lead, speculators)` -> one `GenerationOutput`
    per prompt, with its typed trace in `.trace` and the batch's `Cost` split over the rows."""

    name: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    min_members: ClassVar[int] = 2

    def parse_options(self, options: dict[str, Any]):
        return parse_options(self.name, self.Options, dict(options))

    def generate(self, members: Sequence[Any], request: GenerationRequest, options: Any, *,
                 weights: Sequence[float], lead: int, speculators: Sequence[Any | None]) -> list:
        raise NotImplementedError


METHODS: dict[str, type[Method]] = {}  # the one registry of methods: name -> class (its Options with it)


def register_method(cls: type[Method]) -> type[Method]:
    """Class decorator: register `cls` under `cls.name` (lm-eval's `register_model` pattern); every
    list of method names (the CLI's choices, eval's, tune's) reads this registry."""
    if cls.name in METHODS and METHODS[cls.name] is not cls:
        raise ValueError(f"method name '{cls.name}' is registered twice")
    METHODS[cls.name] = cls
    return cls


def get_method(name: str) -> Method:
    """The method registered as `name`; an unknown name is a one-line `ConfigError` (did you mean)."""
    if name not in METHODS:
        import difflib

        close = difflib.get_close_matches(name, list(METHODS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"unknown method '{name}'{hint}; use one of: {', '.join(METHODS)}")
    return METHODS[name]()


def check_members(method: str, num_members: int, lead: int, weights: Sequence[float] | None,
                  min_members: int = 1) -> list[float]:
    """The checks every method shares: enough members, `lead` an index, `weights` (default 1 each)
    non-negative with a positive sum. Returns the weights as floats."""
    if num_members < min_members:
        raise ConfigError(f"method '{method}' needs at least {min_members} member(s), got {num_members}")
    if isinstance(lead, bool) or not isinstance(lead, int) or not 0 <= lead < num_members:
        raise ConfigError(f"lead={lead!r} is invalid: a member index in 0..{num_members - 1}")
    if weights is None:
        return [1.0] * num_members
    w = list(weights)
    if len(w) != num_members or any(isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0 for x in w) \
            or sum(w) <= 0:
        raise ConfigError(f"weights={w} are invalid: {num_members} non-negative numbers with a positive sum")
    return [float(x) for x in w]


def run_method(method: Method, members: Sequence[Any], prompts: Sequence[str] | str, *, max_new_tokens: int,
               stop: Sequence[str] | None = None, temperature: float = 0.0, seed: int | None = None,
               weights: Sequence[float] | None = None, lead: int = 0, chat: bool | None = None,
               speculators: Sequence[Any | None] | None = None, answer: Callable[[str], str] | None = None,
               **options: Any) -> list:
    """Validate a call (members, lead, weights, request, options; one-line `ConfigError`s) and run
    `method` on it: the functional entry every method module exposes as its `generate`."""
    weights = check_members(method.name, len(members), lead, weights)
    parsed = method.parse_options(options)
    request = GenerationRequest.make(prompts, max_new_tokens, stop, temperature, seed, chat=chat, answer=answer)
    if not request.prompts:
        raise ConfigError(f"method '{method.name}' needs at least one prompt")
    speculators = list(speculators) if speculators else [None] * len(members)
    return method.generate(list(members), request, parsed, weights=weights, lead=lead, speculators=speculators)
