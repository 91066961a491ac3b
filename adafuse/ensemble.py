"""`adafuse.Ensemble`: the Python API of ensemble decoding across tokenizers.

    ens = adafuse.Ensemble(["smollm2-135m", "gemma3-270m"], method="adafuse", threshold=0.7)
    outs = ens.generate(["Question: ...\\nAnswer:"], max_new_tokens=128, stop=["\\n\\nQuestion:"])
    outs[0].text, outs[0].trace, outs[0].cost

Members: registry names, local folders, hub ids, loaded `(model, tokenizer)` pairs or `Member`s, and
views of a model (`"qwen2.5-coder-1.5b[shots=4:8,chat=false]"` or `{"name": ..., "view": {...}}`,
`runtime.views`): views load their model once and run their forwards together;
`devices=["cpu", "cuda:1", "auto"]` places each loaded member (and its drafter) on its own device
(`runtime.devices`; "auto" = transformers' device_map="auto" for a member too big for one device).
Methods (`method=`): the `Method`s registered in `adafuse.methods` (single, adafuse, word-fixed,
token-union, sample-rerank, self-consistency, view-vote). Method options (`**config`) are parsed into the method's options
dataclass when the ensemble is built; bad ones raise a one-line `ConfigError` before any model loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from adafuse.methods import GenerationRequest, Method, get_method
from adafuse.methods.base import check_members
from runtime.devices import check_devices
from runtime.errors import ConfigError
from runtime.loader import default_loader, load
from runtime.member import Member
from runtime.outputs import GenerationOutput
from runtime.views import split_member_spec, split_members
from specdec import drafters as dr
from specdec.engine import SpeculativeGenerator


@dataclass
class EnsembleConfig:
    """Everything that defines an ensemble besides the members themselves."""

    method: str = "adafuse"
    weights: list[float] | None = None
    lead: int = 0
    dtype: str = "float32"
    chat: bool | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def validate(self, num_members: int) -> tuple[Method, Any]:
        """The method and its parsed options; one-line `ConfigError`s for anything invalid."""
        method = get_method(self.method)
        if num_members < 1:
            raise ConfigError("an ensemble needs at least one member")
        check_members(self.method, num_members, self.lead, self.weights, method.min_members)
        if self.chat not in (None, True, False):
            raise ConfigError(f"chat={self.chat!r} is invalid: True, False or None (each member's default)")
        return method, method.parse_options(self.options)

    def member_weights(self, num_members: int) -> list[float]:
        return [float(x) for x in self.weights] if self.weights is not None else [1.0] * num_members


def build_speculator(target, drafter: Any, dtype: str, device: str = "cpu") -> Any:
    """A `specdec.SpeculativeGenerator` for `target` with `drafter`: "lookup" (prompt lookup), a
    model name / Member sharing the target's tokenizer, or a ready drafter object; a drafter model
    is loaded on its target's device."""
    drafter = dr.make_drafter(drafter, load=lambda name, **kw: load(name, **{"dtype": dtype, "device": device, **kw}))
    return SpeculativeGenerator(target, drafter, dr.default_shape(drafter))


MEMBER_DRAFTING = ("off", "cheapest")


def _is_off(value: Any) -> bool:
    return value is None or value is False or value == "off"


def check_member_drafting(value: Any, num_members: int, lead: int, lead_drafter: Any) -> None:
    """One-line `ConfigError` unless `value` is "off", "cheapest", a member index other than the
    lead's, or (checked against names once loaded) a member name; the lead's own drafter must then be
    none or 'lookup' (the member's model takes the model part of it)."""
    if _is_off(value):
        return
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"member_drafting={value!r} is invalid: use 'off', 'cheapest', a member name or index")
    if num_members < 2:
        raise ConfigError("member_drafting needs at least two members (another member drafts for the lead)")
    if isinstance(value, int) and not (0 <= value < num_members and value != lead):
        raise ConfigError(f"member_drafting={value} is invalid: the index of a member other than the lead "
                          f"({lead}), 0..{num_members - 1}")
    if dr.parse_drafter_spec(lead_drafter).kind not in ("none", "lookup"):
        raise ConfigError(f"member_drafting gives the lead a member as its drafter model, but the lead already has "
                          f"drafter {lead_drafter!r}: set the lead's drafter to null or 'lookup'")


def drafting_member(value: Any, members: Sequence[Member], lead: int, lead_drafter: Any) -> int | None:
    """The index of the member that drafts for the lead under `member_drafting=value` (None: off):
    "cheapest" is the non-lead member with the fewest parameters; a name or an index names it."""
    check_member_drafting(value, len(members), lead, lead_drafter)
    if _is_off(value):
        return None
    others = [i for i in range(len(members)) if i != lead]
    if value == "cheapest":
        return min(others, key=lambda i: (members[i].num_parameters, i))
    if isinstance(value, int):
        return value
    named = [i for i in others if members[i].name == value]
    if not named:
        raise ConfigError(f"member_drafting={value!r} names no member other than the lead; members: "
                          f"{', '.join(m.name for m in members)}")
    return named[0]


def member_drafter(member: Member, lead_drafter: Any) -> dr.Drafter:
    """A drafter running `member` (any tokenizer: the engine drafts through text where it differs
    from the lead's), with prompt lookup first where the lead's own drafter was 'lookup'."""
    model = dr.ModelDrafter(member)
    if dr.parse_drafter_spec(lead_drafter).kind == "lookup":
        return dr.HybridDrafter(model)
    return model


def model_specs(members: Sequence[Any], drafters: Sequence[Any] | None) -> list[tuple[Any, bool]]:
    """(spec, pack_weights) of every model an ensemble loads: its members, then its drafters' models
    ('@int8' drafters load unpacked weights; 'lookup' and ready objects load none)."""
    specs = [(m, True) for m in members]
    for d in drafters or []:
        kind, name = dr.parse_drafter_spec(d)
        if name:
            specs.append((name, "-" not in kind))  # quantized drafters load plain float32 weights
    return specs


class Ensemble:
    """Members + a method + its options. `generate` runs a batch of prompts."""

    def __init__(self, members: Sequence[Any], method: str = "adafuse", weights: Sequence[float] | None = None,
                 drafters: Sequence[Any | None] | None = None, lead: int = 0, dtype: str = "float32",
                 chat: bool | None = None, devices: Sequence[str] | None = None, member_drafting: Any = "off",
                 **config: Any):
        if isinstance(members, (str, bytes)):
            members = split_members(str(members))
        for m in members:  # every view's recipe, checked before any model loads
            if isinstance(m, (str, dict)):
                split_member_spec(m)
        self.config = EnsembleConfig(method, list(weights) if weights is not None else None, lead, dtype, chat,
                                     dict(config))
        self._method, self._options = self.config.validate(len(members))
        if drafters is not None and len(drafters) != len(members):
            raise ConfigError(f"drafters must list one entry (or None) per member: {len(members)} members, "
                              f"{len(drafters)} drafters")
        check_member_drafting(member_drafting, len(members), lead, (drafters or [None] * len(members))[lead])
        places = check_devices(list(devices) if devices is not None else None, len(members)) or ["cpu"] * len(members)
        on_cpu = [p == "cpu" for p in places]  # RAM: what loads on the CPU, all together, before the first load
        default_loader().check_fit(model_specs([m for m, c in zip(members, on_cpu) if c],
                                               [d for d, c in zip(drafters or [None] * len(members), on_cpu) if c]), dtype)
        self.members = [load(m, dtype=dtype, device=d) for m, d in zip(members, places)]
        drafters = list(drafters) if drafters is not None else [None] * len(self.members)
        drafting = drafting_member(member_drafting, self.members, lead, drafters[lead])
        if drafting is not None:  # the lead's drafter is another member: the same loaded model, no second copy
            drafters[lead] = member_drafter(self.members[drafting], drafters[lead])
        self.member_drafting = None if drafting is None else self.members[drafting].name
        self.speculators = [None if d is None else build_speculator(m, d, dtype, place)
                            for m, d, place in zip(self.members, drafters, places)]

    def __repr__(self) -> str:
        return (f"Ensemble(method={self.config.method!r}, members={[m.name for m in self.members]}, "
                f"lead={self.config.lead}, options={self.config.options})")

    @property
    def method(self) -> str:
        return self.config.method

    takes_answer = True  # `generate(answer=...)`: the eval harness hands answer-level methods the task's filter

    def generate(self, prompts: Sequence[str] | str, max_new_tokens: int = 128, stop: Sequence[str] | None = None,
                 temperature: float = 0.0, seed: int | None = None,
                 answer: Callable[[str], str] | None = None) -> list[GenerationOutput]:
        """One `GenerationOutput` per prompt: text (stop string excluded), trace (word-level methods:
        a list of `Round`s), cost counters per member and wall time (a batch's cost split evenly).
        `answer`: an output's answer (e.g. the final number), for the answer-level methods
        (self-consistency, view-vote vote on it); others ignore it."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if not prompts:
            return []
        request = GenerationRequest.make(prompts, max_new_tokens, stop, temperature, seed, chat=self.config.chat,
                                         answer=answer)
        return self._method.generate(self.members, request, self._options, lead=self.config.lead,
                                     weights=self.config.member_weights(len(self.members)),
                                     speculators=self.speculators)
