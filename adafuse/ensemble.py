"""`adafuse.Ensemble`: the Python API of ensemble decoding across tokenizers.

    ens = adafuse.Ensemble(["smollm2-135m", "gemma3-270m"], method="adafuse", threshold=0.7)
    outs = ens.generate(["Question: ...\\nAnswer:"], max_new_tokens=128, stop=["\\n\\nQuestion:"])
    outs[0].text, outs[0].trace, outs[0].cost

Members: registry names, local folders, hub ids, loaded `(model, tokenizer)` pairs or `Member`s.
Methods (`method=`), each a module with the same `generate(members, prompts, *, ...)` signature:
- `single`        the lead member alone (speculative when it has a drafter);
- `adafuse`       gated adaptive-span word-level ensembling (`adafuse.methods.word_level`);
- `word-fixed`    the same machinery with the gate off: every word is ensembled;
- `token-union`   (`adafuse.methods.token_union`) and `sample-rerank` (`adafuse.methods.sample_rerank`).
Method options (`**config`) are validated when the ensemble is built; bad ones raise a one-line
`ConfigError`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Sequence

from runtime.errors import ConfigError
from runtime.outputs import GenerationOutput

METHOD_MODULES = {
    "single": None,
    "adafuse": "adafuse.methods.word_level",
    "word-fixed": "adafuse.methods.word_level",
    "token-union": "adafuse.methods.token_union",
    "sample-rerank": "adafuse.methods.sample_rerank",
}
WORD_LEVEL = ("adafuse", "word-fixed")


@dataclass
class EnsembleConfig:
    """Everything that defines an ensemble besides the members themselves."""

    method: str = "adafuse"
    weights: list[float] | None = None
    lead: int = 0
    dtype: str = "float32"
    chat: bool | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def validate(self, num_members: int) -> None:
        if self.method not in METHOD_MODULES:
            raise ConfigError(f"unknown method '{self.method}'; use one of: {', '.join(METHOD_MODULES)}")
        if num_members < 1:
            raise ConfigError("an ensemble needs at least one member")
        if self.method != "single" and num_members < 2:
            raise ConfigError(f"method '{self.method}' needs at least two members, got {num_members}")
        if isinstance(self.lead, bool) or not isinstance(self.lead, int) or not 0 <= self.lead < num_members:
            raise ConfigError(f"lead={self.lead!r} is invalid: an index in 0..{num_members - 1}")
        if self.weights is not None:
            w = list(self.weights)
            if len(w) != num_members or any(not isinstance(x, (int, float)) or x < 0 for x in w) or sum(w) <= 0:
                raise ConfigError(f"weights={w} are invalid: {num_members} non-negative numbers with a positive sum")
        if self.chat not in (None, True, False):
            raise ConfigError(f"chat={self.chat!r} is invalid: True, False or None (each member's default)")
        if self.method == "single" and self.options:
            raise ConfigError(f"method 'single' takes no options, got {', '.join(sorted(self.options))}")
        if self.method in WORD_LEVEL:
            from adafuse.methods.word_level import WordConfig

            WordConfig.from_options(self.method, dict(self.options, **({"gate": False} if self.method == "word-fixed" else {})))

    def member_weights(self, num_members: int) -> list[float]:
        return [float(x) for x in self.weights] if self.weights is not None else [1.0] * num_members


def resolve_member(spec: Any, dtype: str):
    """A `Member` from a registry name / folder / hub id, a `(model, tokenizer)` pair or a `Member`."""
    from runtime.member import Member, load_member

    if isinstance(spec, Member):
        return spec
    if isinstance(spec, str):
        return load_member(spec, dtype=dtype)
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        return Member(spec[0], spec[1])
    raise ConfigError(f"member {spec!r} is invalid: a name/folder/hub id, a (model, tokenizer) pair or a Member")


def build_speculator(target, drafter: Any, dtype: str) -> Any:
    """A `specdec.SpeculativeGenerator` for `target` with `drafter`: "lookup" (prompt lookup), a
    model name / Member sharing the target's tokenizer, or a ready drafter object."""
    try:
        from specdec.engine import SpeculativeGenerator
        from specdec import drafters as dr
    except ImportError as exc:
        raise ConfigError(f"speculative members need specdec.SpeculativeGenerator, not available ({exc})") from None
    drafter = dr.make_drafter(drafter, dtype, load=lambda name: resolve_member(name, dtype))
    return SpeculativeGenerator(target, drafter=drafter, **dr.default_shape(drafter))


class Ensemble:
    """Members + a method + its options. `generate` runs a batch of prompts."""

    def __init__(self, members: Sequence[Any], method: str = "adafuse", weights: Sequence[float] | None = None,
                 drafters: Sequence[Any | None] | None = None, lead: int = 0, dtype: str = "float32",
                 chat: bool | None = None, **config: Any):
        if isinstance(members, (str, bytes)):
            members = [m for m in str(members).split(",") if m]
        self.config = EnsembleConfig(method, list(weights) if weights is not None else None, lead, dtype, chat,
                                     dict(config))
        self.config.validate(len(members))
        if drafters is not None and len(drafters) != len(members):
            raise ConfigError(f"drafters must list one entry (or None) per member: {len(members)} members, "
                              f"{len(drafters)} drafters")
        self.members = [resolve_member(m, dtype) for m in members]
        self.speculators = [None if d is None else build_speculator(m, d, dtype)
                            for m, d in zip(self.members, drafters or [None] * len(self.members))]

    def __repr__(self) -> str:
        return (f"Ensemble(method={self.config.method!r}, members={[m.name for m in self.members]}, "
                f"lead={self.config.lead}, options={self.config.options})")

    @property
    def method(self) -> str:
        return self.config.method

    def generate(self, prompts: Sequence[str] | str, max_new_tokens: int = 128, stop: Sequence[str] | None = None,
                 temperature: float = 0.0, seed: int | None = None) -> list[GenerationOutput]:
        """One `GenerationOutput` per prompt: text (stop string excluded), trace (word-level methods:
        a list of `Round`s), cost counters per member and wall time (a batch's cost split evenly)."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if not prompts:
            return []
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={max_new_tokens} is invalid: an integer >= 1")
        if temperature < 0:
            raise ConfigError(f"temperature={temperature} is invalid: >= 0")
        cfg = self.config
        stop = list(stop or [])
        weights = cfg.member_weights(len(self.members))
        if cfg.method == "single":
            lead = self.members[cfg.lead]
            spec = self.speculators[cfg.lead]
            if spec is not None:
                return spec.generate(list(prompts), max_new_tokens=max_new_tokens, stop=stop,
                                     temperature=temperature, seed=seed, chat=cfg.chat)
            return lead.generate(list(prompts), max_new_tokens=max_new_tokens, stop=stop, temperature=temperature,
                                 seed=seed, chat=cfg.chat)
        module = importlib.import_module(METHOD_MODULES[cfg.method])
        extra: dict[str, Any] = dict(cfg.options)
        if cfg.method in WORD_LEVEL:
            extra["method"] = cfg.method
            if any(s is not None for s in self.speculators):
                extra["speculators"] = self.speculators
        return module.generate(self.members, list(prompts), max_new_tokens=max_new_tokens, stop=stop,
                               temperature=temperature, seed=seed, weights=weights, lead=cfg.lead, chat=cfg.chat,
                               **extra)
