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
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Sequence

from runtime.errors import ConfigError
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

    @classmethod
    def make(cls, prompts: Sequence[str] | str, max_new_tokens: int = 128, stop: Sequence[str] | None = None,
             temperature: float = 0.0, seed: int | None = None, top_k: int = 0, top_p: float = 1.0,
             chat: bool | None = None) -> "GenerationRequest":
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
        return cls(list(prompts), max_new_tokens, StopStrings(stop), sampling, chat)

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
    """`options_cls(**options)`, validated; unknown names and bad values raise one-line ConfigErrors."""
    known = {f.name for f in fields(options_cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        extra = f"; known: {', '.join(sorted(known))}" if known else " (it takes none)"
        raise ConfigError(f"method '{method}' has no option(s) {', '.join(unknown)}{extra}")
    parsed = options_cls(**options)
    parsed.validate()
    return parsed


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
