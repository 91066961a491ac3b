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
  recorded in the trace's samples). `samples` (one count, or one per member): a member's answers after
  its first are sampled at `sampling_temperature` / `top_p` (self-consistency over views). Program
  views (`kind=program`) answer with what their program prints, run in the sandbox; `vote: prove`
  keeps the text answers a program confirms. `early_stop`: answers are drawn in batches
  (`adafuse.methods.answer_draws`: every member's first answer, then the next round, ...; or at the
  cumulative counts of `draw`), and a prompt stops drawing once its vote is decided ("decided":
  lossless, the same answer as drawing everything) or once k answers agree (k); each output's stats
  record the answers drawn (`samples`) of those planned (`answers_planned`), and its cost is what its
  own draws cost.

Both decode through a member's speculative generator where the ensemble has one (`drafters=[...]`:
"lookup", a model, or "rows": each row drafts from what the other rows of its prompt have written,
`specdec.cross_row`), losslessly: the same tokens as plain decoding with the same generators.

The answer of an output is what the request's `answer` function extracts (the eval harness passes
the task's filter, e.g. GSM8K's final number); without one, the whole text. The returned text is the
chosen sample's own, so the task's filter finds the voted answer in it. Trace: `VoteTrace`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from adafuse.methods.base import GenerationRequest, Method, register_method
from adafuse.methods.answer_draws import AnswerSlot, WrittenAnswer, answer_order, draw_batches, write_answers
from adafuse.voting import DECIDABLE_VOTES, VOTES, agreeing, confidences, normalise_answer, pick, view_pick, vote_decided
from runtime.errors import ConfigError
from runtime.member import Member
from runtime.outputs import Cost, CostMeter, GenerationOutput
from specdec.cross_row import SiblingBoard


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
    vote: str = "majority"     # "majority", "consensus", "weighted", "confident" or "prove" (adafuse.voting)
    samples: int | list[int] = 1          # answers per member: its first at the request's temperature, the rest sampled
    sampling_temperature: float = 0.7     # the temperature of a member's answers after its first
    top_p: float = 1.0                    # (those answers' nucleus)
    early_stop: str | int | None = None   # "decided" (lossless) or k (stop once k answers agree); None: every answer
    draw: list[int] | None = None         # answers drawn before each early-stop check (cumulative); None: by rounds

    def validate(self) -> None:
        _check_vote(self.vote)
        counts = self.samples if isinstance(self.samples, list) else [self.samples]
        if not counts or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in counts):
            raise ConfigError(f"samples={self.samples!r} is invalid: a positive integer, or one per member")
        SelfConsistencyOptions(2, self.sampling_temperature, self.top_p).validate()
        stop = self.early_stop
        if stop is not None and stop != "decided" and (isinstance(stop, bool) or not isinstance(stop, int) or stop < 2):
            raise ConfigError(f"early_stop={stop!r} is invalid: 'decided' (stop once the answers still to come cannot "
                              f"change the vote) or k >= 2 (stop once k answers agree)")
        if stop == "decided" and self.vote not in DECIDABLE_VOTES:
            raise ConfigError(f"early_stop 'decided' needs vote {' or '.join(DECIDABLE_VOTES)}, got {self.vote!r}; "
                              f"use early_stop: k (stop once k answers agree)")
        draw = self.draw
        if draw is not None and (not isinstance(draw, list) or not draw or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in draw) or draw != sorted(set(draw))):
            raise ConfigError(f"draw={draw!r} is invalid: increasing answer counts, e.g. [2, 4] (the first 2 answers, "
                              f"then up to 4, then the rest)")
        if draw is not None and stop is None:
            raise ConfigError("draw needs early_stop (it says when the vote may stop drawing answers)")

    def counts(self, num_members: int) -> list[int]:
        """How many answers each member writes (one-line ConfigError for a list of another length)."""
        if not isinstance(self.samples, list):
            return [self.samples] * num_members
        if len(self.samples) != num_members:
            raise ConfigError(f"samples lists {len(self.samples)} counts for {num_members} members: give one per member")
        return list(self.samples)


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
    program: dict[str, Any] | None = None   # a program view's answer: the sandbox's result of running it
    prompt: str | None = None               # the prompt as its member saw it (its first answer only)


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


def _outputs(method: str, vote: str, per_prompt: list[tuple[list[VoteSample], int]], costs: Sequence[Cost],
             took_part: Sequence[Sequence[int]], planned: int | None = None) -> list[GenerationOutput]:
    """One output per prompt: its chosen sample (a program's sandbox result with it), the vote as its
    trace; each draw's cost (`costs[i]`) split evenly over the prompts that took part in it
    (`took_part[i]`), so a prompt whose vote stopped early carries less. `planned`: the answers a
    prompt would draw without early stop (recorded with the answers drawn)."""
    outs = []
    for b, (samples, i) in enumerate(per_prompt):
        cost = Cost()
        for draw, rows in zip(costs, took_part):
            if b in rows:
                cost.merge(draw.share(len(rows)))
        stats = {"samples": len(samples), "distinct_answers": len({normalise_answer(x.answer) for x in samples} - {None}),
                 **({"answers_planned": planned} if planned is not None else {})}
        chosen = samples[i]
        outs.append(GenerationOutput(chosen.text, chosen.num_tokens, chosen.finish, cost,
                                     VoteTrace(method, vote, i, samples), stats, chosen.program))
    return outs


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
        meter = CostMeter([*members, *(s.drafter_member for s in speculators if s is not None)])
        member, B = members[0], len(request.prompts)
        slots = [AnswerSlot(0, j) for j in range(options.samples)]
        written = write_answers(members, request, slots, range(B), options.sampling_temperature, options.top_p,
                                all_sampled=True, speculators=speculators, board=SiblingBoard())
        per_prompt = []
        for b in range(B):
            samples = [_sample(written[b, slot], f"{member.name}#{slot.sample}") for slot in slots]
            per_prompt.append((samples, pick(options.vote, [s.answer for s in samples], [s.logprob for s in samples],
                                             [s.num_tokens for s in samples], [s.program is not None for s in samples])))
        return _outputs(self.name, options.vote, per_prompt, [meter.cost()], [list(range(B))])


@register_method
class ViewVote(Method):
    """`view-vote`; see the module docstring."""

    name: ClassVar[str] = "view-vote"
    Options: ClassVar[type] = ViewVoteOptions

    @torch.no_grad()
    def generate(self, members: Sequence[Member], request: GenerationRequest, options: ViewVoteOptions, *,
                 weights: Sequence[float], lead: int, speculators: Sequence[Any | None] = ()) -> list[GenerationOutput]:
        order = answer_order(options.counts(len(members)), lead)  # ties: the lead, then member order
        batches = draw_batches(order, options.draw) if options.early_stop is not None else [order]
        drawn: list[list[VoteSample]] = [[] for _ in request.prompts]
        open_prompts, costs, took_part = list(range(len(request.prompts))), [], []
        board = SiblingBoard()  # what every row of a prompt wrote: cross-row drafters read it
        for batch in batches:
            meter = CostMeter([*members, *(s.drafter_member for s in speculators if s is not None)])
            written = write_answers(members, request, batch, open_prompts, options.sampling_temperature,
                                    options.top_p, speculators=speculators, board=board)
            costs.append(meter.cost())
            took_part.append(list(open_prompts))
            for b in open_prompts:
                drawn[b] += [_sample(written[b, slot], members[slot.member].name + (f"#{slot.sample}" if slot.sample
                                                                                     else "")) for slot in batch]
            open_prompts = [b for b in open_prompts if not _stops(options, drawn[b], len(order) - len(drawn[b]))]
        per_prompt = [(samples, view_pick(options.vote, [x.answer for x in samples], [x.logprob for x in samples],
                                          [x.num_tokens for x in samples], [x.program is not None for x in samples]))
                      for samples in drawn]
        return _outputs(self.name, options.vote, per_prompt, costs, took_part, planned=len(order))


def _sample(answer: WrittenAnswer, by: str) -> VoteSample:
    return VoteSample(answer.text, answer.answer, by, answer.finish, answer.num_tokens, answer.logprob,
                      program=answer.program, prompt=answer.prompt)


def _stops(options: ViewVoteOptions, samples: list[VoteSample], to_come: int) -> bool:
    """Whether a prompt's vote stops drawing answers (`options.early_stop`; none to come: it stops)."""
    answers = [s.answer for s in samples]
    if to_come == 0:
        return True
    if options.early_stop == "decided":
        conf = confidences([s.logprob for s in samples], [s.num_tokens for s in samples]) \
            if options.vote == "weighted" else None
        return vote_decided(options.vote, answers, to_come, conf)
    return agreeing(answers) >= int(options.early_stop)
