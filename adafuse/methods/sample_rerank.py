"""Sample-level ensemble: every member writes full answers, every member scores every distinct
answer, the best cross-member mean normalised log-likelihood wins.

1. Each member decodes `samples_per_member` answers per prompt (greedy at temperature 0, which
   allows one sample; seeded sampling otherwise: row b of (member m, sample j) draws from a
   generator seeded `seed + 1_000_003 * (m * n + j) + b`, so batched runs equal per-row runs with
   `seed + b`). All B x n rows of a member share one KV state. Answers are deduplicated by (text,
   how they ended), the lead member's first.
2. The member's state is rolled back to the prompt and it scores every distinct answer of every
   row in one batched forward (`KVState.score`: answers are branches of a tree after the prompt; the
   prompt is not re-encoded): the log-probability of the answer in the member's own tokenisation,
   plus how it ended: the stop string it stopped at, or the member's end token when it ended at EOS
   (so an empty answer is not free), normalised per `normalise` ("byte" default, "token", "char",
   "sum"; `adafuse.scoring`) over the answer text plus its stop string.
3. Scores are averaged across members with the weights; the argmax (first on ties) is returned.
   The trace (`RerankTrace`) lists every answer (`RerankAnswer`): who wrote it, how it ended and each
   member's score.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from adafuse.methods.answer_level import VoteSample
from adafuse.methods.base import GenerationRequest, Method, register_method, run_method
from adafuse.scoring import NORMALISATIONS, combine_scores, normalised_score
from runtime.errors import ConfigError
from runtime.finish import FinishRule
from runtime.forward_group import run_members
from runtime.member import END_OF_TURN_TOKENS, Member
from runtime.outputs import CostMeter, GenerationOutput, batch_outputs

METHOD = "sample-rerank"
SEED_STRIDE = 1_000_003  # seed offset between (member, sample) runs; row b adds b, as member.generate does


@dataclass
class SampleRerankOptions:
    samples_per_member: int = 1   # answers each member writes per prompt (> 1 needs temperature > 0)
    normalise: str = "byte"       # how an answer's log-prob is normalised (`adafuse.scoring`)

    def validate(self) -> None:
        n = self.samples_per_member
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"samples_per_member must be a positive integer, got {n!r}")
        if self.normalise not in NORMALISATIONS:
            raise ConfigError(f"normalise must be one of {', '.join(NORMALISATIONS)}, got {self.normalise!r}")


@dataclass
class RerankAnswer:
    """One distinct answer of one row."""

    text: str
    finish: str                       # "eos" | "stop" | "length"
    stop: str                         # the stop string it ended at ("" otherwise)
    by: list[str] = field(default_factory=list)   # who wrote it ("name" or "name#j")
    scores: list[float] = field(default_factory=list)  # per member, normalised log-prob
    mean: float = math.nan            # the weighted mean it was chosen by
    tokens: int | None = field(default=None, repr=False)  # the lead's new tokens, when the lead wrote it
    writer_tokens: list[int] = field(default_factory=list, repr=False)  # each writer's new tokens (as `by`)


@dataclass
class RerankTrace:
    method: str
    normalise: str
    samples_per_member: int
    chosen: int                       # index into answers
    members: list[str]
    answers: list[RerankAnswer]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for a in d["answers"]:
            a.pop("tokens")
            a.pop("writer_tokens")
        return d

    @property
    def samples(self) -> list[VoteSample]:
        """Every written answer once per writer (in member order), each with `cross`: every member's
        normalised score of it. The runner records them, so the rerank of any subset of the members
        (writers and scorers alike) can be read off one run (`python -m eval.vote_sets --votes rerank`)."""
        written = [VoteSample(a.text, None, who, a.finish, n, cross=dict(zip(self.members, a.scores)))
                   for a in self.answers for who, n in zip(a.by, a.writer_tokens)]
        order = {name: i for i, name in enumerate(self.members)}
        return sorted(written, key=lambda s: order.get(s.by.split("#")[0], len(order)))  # in member order


def end_token(member: Member, chat: bool | None) -> int | None:
    """The token `member` would end an answer with: its end-of-turn token under its chat template,
    else its tokenizer's EOS."""
    use_chat = member.use_chat_template if chat is None else (chat and member.use_chat_template)
    if use_chat:
        vocab = member.tokenizer.get_vocab()
        for t in END_OF_TURN_TOKENS:
            if t in vocab and vocab[t] in member.eos_token_ids:
                return vocab[t]
    eos = member.tokenizer.eos_token_id
    if isinstance(eos, int):
        return eos
    return min(member.eos_token_ids) if member.eos_token_ids else None


def write_answers(members: Sequence[Member], request: GenerationRequest, n: int, lead: int
                  ) -> tuple[list[list[RerankAnswer]], dict[int, Any]]:
    """Step 1: each member decodes its B x n rows on one KV state (rolled back to the prompts and
    kept for scoring). Returns per row the distinct answers (lead's first), and the states."""
    B, M = len(request.prompts), len(members)
    temperature, seed = request.temperature, request.seed
    answers: list[list[RerankAnswer]] = [[] for _ in range(B)]
    index: list[dict[tuple[str, bool, str], int]] = [{} for _ in range(B)]
    rows = [(b, j) for b in range(B) for j in range(n)]

    def write(m: int):
        """Member m's answers: (texts, finish reasons, new ids, stop strings hit, its state)."""
        member = members[m]
        prompt_ids = [member.encode_prompt(p, request.chat) for p in request.prompts]
        state = member.start([prompt_ids[b] for b, _ in rows], room=request.max_new_tokens)
        gens = None
        if seed is not None:
            gens = [torch.Generator(device=member.device).manual_seed(int(seed) + SEED_STRIDE * (m * n + j) + b)
                    for b, j in rows]
        rule = FinishRule(member, len(rows), request.stop, request.max_new_tokens)
        texts, finish, new_ids = member.decode_plain(state, request.max_new_tokens, request.stop, temperature,
                                                     generators=gens, rule=rule)
        ends = rule.stop_string  # the stop string each row ended at ("" where it did not)
        state.rollback([len(prompt_ids[b]) for b, _ in rows])
        return texts, finish, new_ids, ends, state

    order = [lead] + [m for m in range(M) if m != lead]
    written = dict(zip(order, run_members(order, lambda m: members[m], write)))  # views of a model together
    states = {}
    for m in order:
        member = members[m]
        texts, finish, new_ids, ends, states[m] = written[m]
        for r, (b, j) in enumerate(rows):
            key = (texts[r], finish[r] == "eos", ends[r])
            if key not in index[b]:
                index[b][key] = len(answers[b])
                answers[b].append(RerankAnswer(texts[r], finish[r], ends[r],
                                               tokens=len(new_ids[r]) if m == lead else None))
            answers[b][index[b][key]].by.append(f"{member.name}#{j}" if n > 1 else member.name)
            answers[b][index[b][key]].writer_tokens.append(len(new_ids[r]))
    return answers, states


def score_answers(members: Sequence[Member], states: dict[int, Any], answers: list[list[RerankAnswer]], n: int,
                  mode: str, chat: bool | None) -> list[torch.Tensor]:
    """Step 2: every member scores every answer (text, plus its stop string or its end token: how it
    ended), all rows and answers in one forward per member, on the state its own decoding left.
    Returns per row [M, C] normalised log-probs."""
    B, M = len(answers), len(members)
    scores = [torch.zeros(M, len(answers[b])) for b in range(B)]

    def score(m: int) -> list[list[torch.Tensor]]:
        member = members[m]
        eos = end_token(member, chat)
        conts: list[list[list[int]]] = []
        for b in range(B):
            row = []
            for a in answers[b]:
                ids = member.encode(a.text + a.stop) if a.text + a.stop else []
                if a.finish == "eos" and eos is not None:
                    ids = ids + [eos]
                row.append(ids)
            conts.append(row)
            conts.extend([] for _ in range(n - 1))  # the other sample rows of prompt b score nothing
        return states[m].score(conts)

    per_member = run_members(list(range(M)), lambda m: members[m], score)  # views of a model together
    states.clear()
    for m, logprobs in enumerate(per_member):
        for b in range(B):
            for c, a in enumerate(answers[b]):
                scores[b][m, c] = normalised_score(logprobs[b * n][c], a.text + a.stop, mode)
    return scores


@register_method
class SampleRerank(Method):
    """Generate-then-rerank; see the module docstring."""

    name = METHOD
    Options = SampleRerankOptions

    @torch.no_grad()
    def generate(self, members: Sequence[Member], request: GenerationRequest, options: SampleRerankOptions, *,
                 weights: Sequence[float], lead: int, speculators: Sequence[Any | None] = ()) -> list[GenerationOutput]:
        n, mode = options.samples_per_member, options.normalise
        if n > 1 and request.temperature == 0:
            raise ConfigError("samples_per_member > 1 needs temperature > 0 (greedy answers would repeat)")
        meter = CostMeter(members)
        answers, states = write_answers(members, request, n, lead)
        scores = score_answers(members, states, answers, n, mode, request.chat)
        # 3. choose
        w = torch.tensor(weights, dtype=torch.float32)
        chosen, traces = [], []
        for b in range(len(request.prompts)):
            mean = combine_scores(scores[b], w)
            best = int(torch.argmax(mean))  # first maximum: the lead's answers come first
            for c, x in enumerate(answers[b]):
                x.scores = [round(float(v), 4) for v in scores[b][:, c]]
                x.mean = round(float(mean[c]), 4)
            chosen.append(answers[b][best])
            traces.append(RerankTrace(METHOD, mode, n, best, [mm.name for mm in members], answers[b]))
        lead_tokens = [a.tokens if a.tokens is not None else
                       len(members[lead].encode(a.text)) + (1 if a.finish == "eos" else 0) for a in chosen]
        return batch_outputs(meter.cost(), [a.text for a in chosen], lead_tokens, [a.finish for a in chosen],
                             traces=traces, stats=[{"distinct_answers": len(a)} for a in answers])


def generate(members: Sequence[Member], prompts: Sequence[str], **kwargs: Any) -> list[GenerationOutput]:
    """`run_method(SampleRerank(), ...)`: validated keyword call (max_new_tokens, stop, temperature,
    seed, weights, lead, chat, and the `SampleRerankOptions`)."""
    return run_method(SampleRerank(), members, prompts, **kwargs)
