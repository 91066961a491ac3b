"""The answers a `view-vote` draws: which member writes which answer, in what order, in which batch.

Every member writes `counts[m]` answers: its first at the request's temperature (greedy by default),
the rest sampled at `sampling_temperature`. The answers are ordered by rounds, the lead first in each
(`answer_order`: round 0 is every member's first answer), and drawn in batches (`draw_batches`): all
at once, or, for an early-stopping vote, up to each `draw` count (default: one round at a time).
`write_answers` writes one batch for the prompts still open: the rows of one member at one
temperature run as one batch, those of views of one model as rows of one forward
(`runtime.forward_group.run_members`). Row (prompt b, answer j of a member) samples from a generator
seeded `seed + b + SEED_STRIDE * j`, as self-consistency's sample j of prompt b does. A program view's
answers are programs: each is run in the sandbox (`runtime.program_answers`), its answer is what it
printed.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from adafuse.methods.base import GenerationRequest
from runtime.finish import FinishRule
from runtime.forward_group import run_members
from runtime.member import Member
from runtime.program_answers import answer_text, run_output
from runtime.sampling import SamplingParams
from runtime.views import is_program
from specdec.config import DecodeControl
from specdec.cross_row import CrossRowDrafter, SiblingBoard
from specdec.drafter_base import Drafter

SEED_STRIDE = 1_000_003  # seed offset between samples; prompt b adds b, as member.generate does


@dataclass(frozen=True)
class AnswerSlot:
    """One answer of a vote: member `member`'s answer number `sample` (0: its first)."""

    member: int
    sample: int


@dataclass
class WrittenAnswer:
    """One answer as written: text, extracted answer (None: none), finish reason, tokens, summed
    log-probability under the member's own distribution, and a program's sandbox result."""

    text: str
    answer: str | None
    finish: str
    num_tokens: int
    logprob: float
    program: dict[str, Any] | None = None
    prompt: str | None = None    # the prompt as the member saw it (kept with a member's first answer)
    accepted: int = 0            # drafted tokens the target accepted (speculative decoding)


def answer_order(counts: Sequence[int], lead: int) -> list[AnswerSlot]:
    """Every answer of the vote in draw order: round j holds each member's answer j (if it writes
    that many), the lead first, then the others in member order."""
    members = [lead] + [m for m in range(len(counts)) if m != lead]
    return [AnswerSlot(m, j) for j in range(max(counts, default=0)) for m in members if j < counts[m]]


def draw_batches(order: Sequence[AnswerSlot], draw: Sequence[int] | None) -> list[list[AnswerSlot]]:
    """`order` cut into the batches drawn before each early-stop check: at the cumulative counts of
    `draw` (then the rest), or, with `draw` None, one round at a time."""
    if draw is None:
        cuts = [i for i in range(1, len(order)) if order[i].sample != order[i - 1].sample]
    else:
        cuts = [n for n in draw if 0 < n < len(order)]
    bounds = [0, *cuts, len(order)]
    return [list(order[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


def write_answers(members: Sequence[Member], request: GenerationRequest, slots: Sequence[AnswerSlot],
                  open_prompts: Sequence[int], sampling_temperature: float, top_p: float, all_sampled: bool = False,
                  speculators: Sequence[Any | None] = (), board: SiblingBoard | None = None
                  ) -> dict[tuple[int, AnswerSlot], WrittenAnswer]:
    """Write answers `slots` for every prompt in `open_prompts` -> {(prompt, slot): answer}. A
    member's first answer decodes with the request's sampling (`all_sampled`: at `sampling_temperature`
    too), the others at `sampling_temperature` and `top_p`; answers are what `request.answer`
    extracts (without it, the whole text). Rows of one decode go prompt by prompt. A member with a
    speculator (`speculators[m]`, a `specdec.SpeculativeGenerator`) decodes through it, losslessly; a
    cross-row drafter drafts from the other rows of the same prompt (`board`: what they wrote so far)."""
    s, extract = request.sampling, request.answer or (lambda t: t)
    items: dict[tuple[int, bool], list[tuple[int, AnswerSlot]]] = {}
    for b in open_prompts:  # one item per (member, sampled or not): one temperature per decode
        for slot in slots:
            items.setdefault((slot.member, all_sampled or slot.sample > 0), []).append((b, slot))
    keys = list(items)

    def write(key: tuple[int, bool]) -> list[WrittenAnswer]:
        m, sampled = key
        member, rows = members[m], items[key]
        temperature, k, p = (sampling_temperature, 0, top_p) if sampled else (s.temperature, s.top_k, s.top_p)
        prompt_ids = [member.encode_prompt(request.prompts[b], request.chat) for b, _ in rows]
        state = member.start(prompt_ids, room=request.max_new_tokens)
        gens = None if s.seed is None or temperature == 0 else [torch.Generator(device=member.device).manual_seed(
            int(s.seed) + b + SEED_STRIDE * slot.sample) for b, slot in rows]
        logprobs = [0.0] * len(rows)
        spec = item_speculator(speculators[m] if m < len(speculators) else None, board or SiblingBoard(),
                               [b for b, _ in rows], [(m, slot.sample) for _, slot in rows],
                               [len(ids) for ids in prompt_ids])
        accepted = [0] * len(rows)
        if spec is None:
            texts, finish, new_ids = member.decode_plain(state, request.max_new_tokens, request.stop, temperature, k,
                                                         p, generators=gens, logprobs=logprobs)
        else:
            texts, finish, new_ids = speculative_decode(spec, state, FinishRule(member, len(rows), request.stop,
                                                                                request.max_new_tokens),
                                                        SamplingParams(temperature, k, p), gens, logprobs, accepted)
        out = []
        for r, text in enumerate(texts):
            program = run_output(text).to_dict() if is_program(member) else None
            b, slot = rows[r]
            seen = member.format_prompt(request.prompts[b], request.chat) if slot.sample == 0 else None
            out.append(WrittenAnswer(text, extract(answer_text(text, program)) or None, finish[r], len(new_ids[r]),
                                     round(logprobs[r], 4), program, seen, accepted[r]))
        return out

    written = dict(zip(keys, run_members(keys, lambda key: members[key[0]], write)))  # views of a model together
    return {row: answer for key in keys for row, answer in zip(items[key], written[key])}


def item_speculator(spec: Any | None, board: SiblingBoard, problems: Sequence[int], keys: Sequence[Any],
                    prompt_lengths: Sequence[int]) -> Any | None:
    """`spec` for one decode of its own (items run side by side): its drafter copied with a fresh
    state, a cross-row drafter bound to these rows of `board`."""
    if spec is None:
        return None
    drafter = spec.drafter
    if isinstance(drafter, CrossRowDrafter):
        drafter = drafter.for_rows(board, problems, keys, prompt_lengths)
    elif drafter is not None:
        drafter = copy.copy(drafter)
        for inner in ("model", "drafter"):  # (a hybrid's model drafter, a text drafter's own): their own state
            if isinstance(getattr(drafter, inner, None), Drafter):
                setattr(drafter, inner, copy.copy(getattr(drafter, inner)))
        drafter.reset()
    out = copy.copy(spec)
    out.drafter = drafter
    return out


def speculative_decode(spec: Any, state, rule: FinishRule, sampling: SamplingParams, generators, logprobs: list[float],
                       accepted: list[int]) -> tuple[list[str], list[str], list[list[int]]]:
    """`Member.decode_plain`'s contract through a speculative generator: every row of `state` until
    `rule` finishes it; `logprobs[r]` gets row r's tokens' log-probabilities under the target's own
    (untempered) logits, read from the logits each token was drawn from; `accepted[r]` its drafted
    tokens the target accepted."""
    control = DecodeControl(stop=lambda b, row: rule.after_tokens(b, row.ids) is not None, stop_at_eos=False,
                            commit_last=False, record_sources=True)
    result = spec.decode(state, rule.max_new_tokens, sampling, generators, control)
    for b, row in enumerate(result.rows):
        accepted[b] = row.stats.accepted
        if rule.reasons[b] is None:
            rule.finish(b, "length")
        if row.ids:
            src = torch.stack([x.float() for x in row.sources])
            logprobs[b] += float(torch.log_softmax(src, -1).gather(1, torch.tensor(row.ids, device=src.device)[:, None]).sum())
    return list(rule.texts), list(rule.reasons), [list(row.ids) for row in result.rows]
