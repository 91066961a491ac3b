"""Answer-level methods: whole answers written, then one chosen (`adafuse.voting`).

- `self-consistency` (Wang et al. 2022): one member (or view) writes `samples` answers per prompt at
  `sampling_temperature` (all samples of all prompts rows of one batch; row (prompt b, sample j) draws
  from a generator seeded `seed + b + 1_000_003 * j`, so prompt b of a batch draws as it would at
  index b alone), and the vote picks one (`vote`: "majority" over the extracted answers, ties to the
  highest summed log-probability then the earliest sample; "consensus": the answer with the highest
  mean chrF against the others; "weighted": a vote weighted by each sample's confidence, its mean token
  probability; "confident": the single most confident sample; `adafuse.voting`).
- `view-vote` (Dipper's rule): every member (typically views of one model) answers greedily, their
  forwards as rows of one batch (`runtime.forward_group`), and the vote picks one; ties go to the lead,
  then to member order (the confidence votes use each view's log-probability of its own answer,
  recorded in the trace's samples).

The answer of an output is what the request's `answer` function extracts (the eval harness passes
the task's filter, e.g. GSM8K's final number); without one, the whole text. The returned text is the
chosen sample's own, so the task's filter finds the voted answer in it. Trace: `VoteTrace`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from adafuse.methods.base import GenerationRequest, Method, register_method
from adafuse.voting import VOTES, normalise_answer, pick, view_pick
from runtime.errors import ConfigError
from runtime.forward_group import run_members
from runtime.member import Member
from runtime.outputs import Cost, CostMeter, GenerationOutput, batch_outputs

SEED_STRIDE = 1_000_003  # seed offset between samples; prompt b adds b, as member.generate does


def _check_vote(vote: Any) -> None:
    if vote not in VOTES:
        raise ConfigError(f"vote must be one of {', '.join(VOTES)}, got {vote!r}")


@dataclass
class SelfConsistencyOptions:
    samples: int = 5           # answers written per prompt
    sampling_temperature: float = 0.7   # the samples' temperature
    top_p: float = 1.0
    vote: str = "majority"     # "majority", "consensus" (free text: mean chrF), "weighted" or "confident"

    def validate(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ConfigError(f"samples must be a positive integer, got {self.samples!r}")
        t = self.sampling_temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0 or t != t:
            raise ConfigError(f"sampling_temperature must be a number > 0 (the samples' temperature), got {t!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        _check_vote(self.vote)


@dataclass
class ViewVoteOptions:
    vote: str = "majority"     # "majority", "consensus", "weighted" or "confident" (adafuse.voting)

    def validate(self) -> None:
        _check_vote(self.vote)


@dataclass
class VoteSample:
    """One written answer."""

    text: str
    answer: str | None      # as extracted (None: nothing extractable)
    by: str                 # the member (and sample number) that wrote it
    finish: str
    num_tokens: int
    logprob: float | None = None
    cross: dict[str, float] | None = None   # sample-rerank: each member's normalised score of it


@dataclass
class VoteTrace:
    method: str
    vote: str
    chosen: int
    samples: list[VoteSample] = field(default_factory=list)

    @property
    def votes(self) -> dict[str, int]:
        """How many samples gave each (normalised) answer."""
        out: dict[str, int] = {}
        for s in self.samples:
            key = normalise_answer(s.answer)
            if key is not None:
                out[key] = out.get(key, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "votes": self.votes}


def _answers(request: GenerationRequest, texts: Sequence[str]) -> list[str | None]:
    extract = request.answer or (lambda t: t)
    return [extract(t) or None for t in texts]


def _outputs(method: str, vote: str, per_prompt: list[tuple[list[VoteSample], int]], cost: Cost
             ) -> list[GenerationOutput]:
    """One output per prompt: its chosen sample, the vote as its trace, the batch's cost split."""
    chosen = [samples[i] for samples, i in per_prompt]
    return batch_outputs(cost, [s.text for s in chosen], [s.num_tokens for s in chosen], [s.finish for s in chosen],
                         traces=[VoteTrace(method, vote, i, samples) for samples, i in per_prompt],
                         stats=[{"samples": len(samples), "distinct_answers": len(
                             {normalise_answer(x.answer) for x in samples} - {None})} for samples, _ in per_prompt])


@register_method
class SelfConsistency(Method):
    """`self-consistency`; see the module docstring."""

    name: ClassVar[str] = "self-consistency"
    Options: ClassVar[type] = SelfConsistencyOptions
    min_members: ClassVar[int] = 1

    @torch.no_grad()
    def generate(self, members: Sequence[Member], request: GenerationRequest, options: SelfConsistencyOptions, *,
                 weights: Sequence[float], lead: int, speculators: Sequence[Any | None] = ()) -> list[GenerationOutput]:
        if len(members) != 1:
            raise ConfigError(f"method 'self-consistency' samples one member (or view); got {len(members)}: use "
                              f"view-vote to vote across members")
        if request.temperature not in (0, options.sampling_temperature):
            raise ConfigError(f"self-consistency samples at its option sampling_temperature="
                              f"{options.sampling_temperature}; the request asks for temperature={request.temperature}:"
                              f" set the option instead (or generate greedily)")
        member, k, B = members[0], options.samples, len(request.prompts)
        meter = CostMeter([member])
        prompt_ids = [member.encode_prompt(p, request.chat) for p in request.prompts]
        rows = [(b, j) for b in range(B) for j in range(k)]
        state = member.start([prompt_ids[b] for b, _ in rows], room=request.max_new_tokens)
        seed = request.seed
        gens = None if seed is None else [torch.Generator(device=member.device).manual_seed(
            int(seed) + b + SEED_STRIDE * j) for b, j in rows]
        logprobs = [0.0] * len(rows)
        texts, finish, new_ids = member.decode_plain(state, request.max_new_tokens, request.stop,
                                                     options.sampling_temperature,
                                                     top_p=options.top_p, generators=gens, logprobs=logprobs)
        answers = _answers(request, texts)
        per_prompt = []
        for b in range(B):
            idx = [r for r, (bb, _) in enumerate(rows) if bb == b]
            samples = [VoteSample(texts[r], answers[r], f"{member.name}#{rows[r][1]}", finish[r], len(new_ids[r]),
                                  round(logprobs[r], 4)) for r in idx]
            per_prompt.append((samples, pick(options.vote, [s.answer for s in samples], [s.logprob for s in samples],
                                             [s.num_tokens for s in samples])))
        return _outputs(self.name, options.vote, per_prompt, meter.cost())


@register_method
class ViewVote(Method):
    """`view-vote`; see the module docstring."""

    name: ClassVar[str] = "view-vote"
    Options: ClassVar[type] = ViewVoteOptions

    @torch.no_grad()
    def generate(self, members: Sequence[Member], request: GenerationRequest, options: ViewVoteOptions, *,
                 weights: Sequence[float], lead: int, speculators: Sequence[Any | None] = ()) -> list[GenerationOutput]:
        meter = CostMeter(members)
        s = request.sampling
        order = [lead] + [m for m in range(len(members)) if m != lead]  # ties: the lead, then member order

        def write(m: int) -> list[GenerationOutput]:
            return members[m].generate(request.prompts, max_new_tokens=request.max_new_tokens, stop=request.stop.stops,
                                       temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed,
                                       chat=request.chat, logprobs=True)

        written = dict(zip(order, run_members(order, lambda m: members[m], write)))  # views of a model together
        per_prompt = []
        for b in range(len(request.prompts)):
            answers = _answers(request, [written[m][b].text for m in order])
            samples = [VoteSample(written[m][b].text, a, members[m].name, written[m][b].finish_reason,
                                  written[m][b].num_tokens, written[m][b].stats.get("logprob"))
                       for m, a in zip(order, answers)]
            per_prompt.append((samples, view_pick(options.vote, answers, [x.logprob for x in samples],
                                                  [x.num_tokens for x in samples])))
        return _outputs(self.name, options.vote, per_prompt, meter.cost())
