"""Token-level union ensemble (UniTE-style) for members with different tokenizers.

At each step every member gives its next-token distribution after the shared text (its own
`MemberText` state). Each member's top-k tokens are decoded one by one to text, and the union of
those *strings* (leading-space markers such as "Ġ"/"▁" come out of the decoder as " ") is the
candidate set. A member's probability of a string is that of its token whose text is the string,
looked up in its full distribution; when the member has no such token, UniTE's rule applies
(option `missing`): the probability of the first token of the member's encoding of the string
("first-token", default) or 0 ("zero"). Each member's probabilities are renormalised over the union,
averaged with the weights (option `fusion: mean`; or `fusion: contrastive`: the lead as expert minus the
others as amateurs over the lead's plausible strings, `fuse_contrastive`), and the argmax (temperature 0)
or a seeded sample (temperature > 0, from the members' temperature-scaled distributions) is committed:

- the lead member commits its own token for the string (as in its own decoding) when it has one;
- every other member's text is extended by the string, with `MemberText`-style boundary repair, so
  a string that is one token for one member and several (or a prefix of a merged token) for another
  is handled by re-tokenising only the tail. One forward per member per step, all rows together.

The end-of-sequence tokens of all members share one union key; choosing it ends the row ("eos").
Rows also stop at a stop string (excluded from the text) or when the lead has `max_new_tokens`
tokens of output. The output text is exactly the concatenation of the committed strings.

A token whose lone text is empty is left out of the union. A token holding an incomplete UTF-8
character (its lone text has U+FFFD) enters the union with its member's probability only (0 for
the others); if chosen, that member completes the character alone (greedy or sampled from its own
distribution, up to 4 tokens) and the completed text is committed as one piece.

Trace per output: a `UnionTrace` (method, top_k, missing, lead, steps: one `UnionStep` per committed
piece: piece (committed text, None for EOS), prob (its fused probability), union (union size), agree
(members whose own top-1 it was), completed_by (only for an incomplete character)). Stats: steps, lead_text_fallbacks
(pieces the lead had no single token for), tokens_refed (per member, whole batch: tokens re-fed by
boundary repair). Cost: the batch's forwards / tokens per member and wall time, split evenly.
"""
from __future__ import annotations

import functools
import math
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from adafuse.methods.base import GenerationRequest, Method, register_method, run_method
from runtime.errors import ConfigError
from runtime.forward_group import run_members
from runtime.member import Member
from runtime.finish import FinishRule
from runtime.outputs import Cost, CostMeter, GenerationOutput, batch_outputs
from runtime.sampling import draw
from runtime.text_state import MemberText

METHOD = "token-union"
MISSING_MODES = ("first-token", "zero")
FUSIONS = ("mean", "contrastive")
EOS = None  # the union key of end-of-sequence (any member's EOS token)
PARTIAL = "\ufffd"  # what `_Vocab.key` returns for a token holding an incomplete UTF-8 character
MAX_PARTIAL_TOKENS = 4  # a character is completed within this many tokens (UTF-8 has <= 4 bytes)


@dataclass
class TokenUnionOptions:
    top_k: int = 10                # each member's top-k tokens enter the union
    missing: str = "first-token"   # a member without a token for a string: its first token's prob, or 0
    fusion: str = "mean"           # "mean" (UniTE) or "contrastive" (the lead minus the others: fuse_contrastive)
    beta: float = 0.5              # contrastive: how hard the other members' log-probabilities are subtracted
    alpha: float = 0.1             # contrastive: only strings with lead prob >= alpha x its best are plausible

    def validate(self) -> None:
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 1:
            raise ConfigError(f"top_k must be a positive integer, got {self.top_k!r}")
        if self.missing not in MISSING_MODES:
            raise ConfigError(f"missing must be one of {', '.join(MISSING_MODES)}, got {self.missing!r}")
        if self.fusion not in FUSIONS:
            raise ConfigError(f"fusion must be one of {', '.join(FUSIONS)}, got {self.fusion!r}")
        if not _number(self.beta) or not 0 <= self.beta:
            raise ConfigError(f"beta must be a number >= 0, got {self.beta!r}")
        if not _number(self.alpha) or not 0 < self.alpha <= 1:
            raise ConfigError(f"alpha must be a number in (0, 1], got {self.alpha!r}")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


@dataclass
class UnionStep:
    """One committed piece of one row."""

    piece: str | None          # committed text; None: EOS
    prob: float                # its fused probability
    union: int                 # size of the union it was chosen from
    agree: int                 # members whose own top-1 it was
    completed_by: str | None = None  # the member that completed an incomplete character alone


@dataclass
class UnionTrace:
    method: str
    top_k: int
    missing: str
    lead: str
    steps: list[UnionStep] = field(default_factory=list)
    fusion: str = "mean"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- pure fusion --------------------------------------------------------------------------------
def fuse_union(
    member_probs: Sequence[Sequence[float]],  # [M][U]: each member's probability of each union key
    weights: Sequence[float],                 # [M]
) -> list[float]:                             # [U]: weighted mean of the renormalised rows
    """Renormalise each member's probabilities over the union, then take the weighted mean.
    A member giving the whole union probability 0 is left out of the mean."""
    num = [0.0] * (len(member_probs[0]) if member_probs else 0)
    total_w = 0.0
    for probs, w in zip(member_probs, weights):
        s = float(sum(probs))
        if s <= 0 or w <= 0:
            continue
        total_w += w
        for i, p in enumerate(probs):
            num[i] += w * p / s
    return [x / total_w for x in num] if total_w > 0 else num


def fuse_contrastive(
    member_probs: Sequence[Sequence[float]],  # [M][U]: each member's probability of each union key
    weights: Sequence[float],                 # [M]: the non-lead members' shares of the penalty
    lead: int,
    beta: float,
    alpha: float,
) -> list[float]:                             # [U]: softmax of the contrastive scores over the plausible keys
    """Contrastive fusion (Li et al. 2023; O'Brien & Lewis 2023's form): the lead is the expert,
    every other member an amateur. Key u is plausible when p_lead(u) >= alpha * max p_lead; its score
    is (1 + beta) log p_lead(u) - beta * sum_m w_m log p_m(u), the w_m the other members' weights
    normalised to sum 1 (zero weights, or no other member: the lead's own law over the plausible
    keys). Returns the softmax of the scores over the plausible keys (0 elsewhere): its argmax is the
    greedy choice, and a key the lead is sure of (the only plausible one) wins whatever the others say."""
    lead_p = [float(p) for p in member_probs[lead]]
    top = max(lead_p, default=0.0)
    if top <= 0:  # the lead has no mass on the union: nothing to contrast with, the plain mean
        return fuse_union(member_probs, weights)
    others = [(m, float(w)) for m, w in enumerate(weights) if m != lead and w > 0]
    total = sum(w for _, w in others)
    tiny = 1e-30  # an amateur's zero: a large, finite penalty
    scores: list[float | None] = []
    for u, p in enumerate(lead_p):
        if p <= 0 or p < alpha * top:
            scores.append(None)
            continue
        expert = math.log(p)
        amateur = sum(w * math.log(max(float(member_probs[m][u]), tiny)) for m, w in others) / total if total else expert
        scores.append((1 + beta) * expert - beta * amateur)
    best = max(x for x in scores if x is not None)
    expd = [0.0 if x is None else math.exp(x - best) for x in scores]
    z = sum(expd)
    return [e / z for e in expd]


# ---- per-member vocabulary helpers --------------------------------------------------------------
class _Vocab:
    """Cached single-token texts and string -> token lookups of one member."""

    def __init__(self, member: Member):
        self.member = member
        self.texts: dict[int, str] = {}
        self.lookup: dict[str, tuple[int | None, int | None]] = {}  # text -> (exact token, first token)

    def key(self, token: int):
        """Union key of a token: EOS, its text, or PARTIAL (an incomplete UTF-8 character)."""
        if token in self.member.eos_token_ids:
            return EOS
        text = self.texts.get(token)
        if text is None:
            text = self.member.tokenizer.decode([token], skip_special_tokens=False)
            piece = self.member.tokenizer.convert_ids_to_tokens(token)
            if isinstance(piece, str) and piece.startswith("\u2581") and not text.startswith(" "):
                text = " " + text  # SentencePiece decoders that strip a leading "▁" from a lone token
            self.texts[token] = text
        return PARTIAL if "\ufffd" in text else text

    def find(self, text: str) -> tuple[int | None, int | None]:
        """(the token whose text is `text` or None, the first token of the member's encoding)."""
        hit = self.lookup.get(text)
        if hit is None:
            ids = self.member.encode(text)
            exact = ids[0] if len(ids) == 1 and self.key(ids[0]) == text else None
            hit = (exact, ids[0] if ids else None)
            self.lookup[text] = hit
        return hit


_VOCABS: "weakref.WeakKeyDictionary[Member, _Vocab]" = weakref.WeakKeyDictionary()


def vocab_of(member: Member) -> _Vocab:
    """The member's `_Vocab`, kept across calls (decoded texts and lookups are pure functions of its
    tokenizer)."""
    v = _VOCABS.get(member)
    if v is None:
        v = _VOCABS[member] = _Vocab(member)
    return v


def _member_prob(vocab: _Vocab, probs: torch.Tensor, top: dict, key, missing: str) -> tuple[float, int | None]:
    """(probability, token) of union key `key` for one member; `top` maps its top-k keys to
    (prob, token). probs: [V] this member's distribution for the row."""
    if key in top:
        return top[key]
    if isinstance(key, tuple):  # another member's incomplete character
        return 0.0, None
    if key is EOS:
        ids = [i for i in vocab.member.eos_token_ids if i < probs.shape[0]]
        if not ids:
            return 0.0, None
        best = max(ids, key=lambda i: float(probs[i]))
        return float(probs[best]), best
    exact, first = vocab.find(key)
    if exact is not None:
        return float(probs[exact]), exact
    if missing == "first-token" and first is not None:
        return float(probs[first]), None
    return 0.0, None


def _top_keys(vocab: _Vocab, probs: torch.Tensor, k: int, m: int) -> dict:
    """Member m's top-k tokens as {key: (prob, token)} in descending order; tokens sharing a text
    keep the most probable one; empty texts are skipped; an incomplete UTF-8 character gets the
    key (m, token), which only m can complete. probs: [V]."""
    values, ids = torch.topk(probs, min(k, probs.shape[0]))
    top: dict = {}
    for p, t in zip(values.tolist(), ids.tolist()):
        key = vocab.key(t)
        if key == PARTIAL:
            key = (m, t)
        if key == "" or key in top:
            continue
        top[key] = (p, t)
    return top


# ---- commit ------------------------------------------------------------------------------------
def _commit(mt: MemberText, pieces: Sequence[str], own: Sequence[int | None]) -> None:
    """Extend rows in one forward. Row b appends `own[b]` (the member's own token, for the piece
    `pieces[b]` or, with an empty piece, for a character still incomplete) when given, else its
    cache is repaired to the canonical ids of its text extended by `pieces[b]`."""
    rows, as_is = [], {}
    for b, piece in enumerate(pieces):
        if not piece and own[b] is None:
            continue
        mt.texts[b] += piece
        if own[b] is not None:
            as_is[b] = [own[b]]
        else:
            rows.append(b)
    mt.sync(rows, append_as_is=as_is)



# ---- the method ---------------------------------------------------------------------------------
class _UnionRun:
    """The state of one batch: per row the shared text, the lead's token count, the trace, and an
    incomplete character some member is completing alone."""

    def __init__(self, members: Sequence[Member], request: GenerationRequest, options: TokenUnionOptions,
                 weights: Sequence[float], lead: int):
        self.members, self.weights, self.lead = list(members), list(weights), lead
        self.top_k, self.missing = options.top_k, options.missing
        self.fusion = options.fusion
        self.fuse = (functools.partial(fuse_contrastive, lead=lead, beta=options.beta, alpha=options.alpha)
                     if options.fusion == "contrastive" else fuse_union)  # (member_probs, weights) -> fused
        self.max_new_tokens = request.max_new_tokens
        self.temperature = request.temperature
        B = len(request.prompts)
        self.gens = request.sampling.generators(B, "cpu")
        self.mts = run_members(list(members), lambda m: m, lambda m: MemberText(m, request.prompts, request.chat))
        self.vocabs = [vocab_of(m) for m in members]
        self.texts = ["" for _ in range(B)]
        self.steps: list[list[UnionStep]] = [[] for _ in range(B)]
        self.rule = FinishRule(members[lead], B, request.stop, request.max_new_tokens)  # `runtime.finish`
        self.finish: list[str | None] = self.rule.reasons  # why each row finished (None: running)
        self.lead_tokens = [0] * B
        self.lead_fallbacks = [0] * B
        self.pending: list[tuple[int, list[int]] | None] = [None] * B  # (member, its tokens) of a character

    def pick(self, dist: Sequence[float] | torch.Tensor, b: int) -> int:
        if self.temperature == 0:
            return int(torch.as_tensor(dist).argmax())
        q = torch.as_tensor(dist, dtype=torch.float64)
        return draw(q, self.gens[b] if self.gens else None)

    def run(self) -> None:
        warm_t = 1.0 if self.temperature == 0 else float(self.temperature)
        B, M = len(self.texts), len(self.members)
        while any(f is None for f in self.finish):
            probs = [mt.state.next_probs(warm_t).cpu() for mt in self.mts]  # M x [B, V]
            self.pieces = ["" for _ in range(B)]
            self.own: list[list[int | None]] = [[None] * B for _ in range(M)]
            for b in range(B):
                if self.finish[b] is not None:
                    continue
                if self.pending[b] is not None:
                    self._complete_character(b, probs)
                else:
                    self._union_step(b, probs)
            if any(self.pieces) or any(t is not None for row in self.own for t in row):
                # one forward per model: views of one model extend together (`runtime.forward_group`)
                run_members(list(range(M)), lambda m: self.members[m],
                            lambda m: _commit(self.mts[m], self.pieces, self.own[m]))

    def commit(self, b: int, piece: str, lead_tok: int | None, n_lead: int) -> None:
        """Commit `piece` on row b (the lead's own last token `lead_tok`, if any) or finish."""
        new_text = self.texts[b] + piece
        start = len(self.texts[b])
        self.texts[b], self.lead_tokens[b] = new_text, n_lead
        cut = self.rule.after_text(b, new_text, start)
        if cut is not None:  # (the rule has finished the row: "stop")
            self.texts[b] = new_text[:cut]
        elif n_lead >= self.max_new_tokens:
            self.rule.finish(b, "length")
        else:
            self.pieces[b] = piece
            self.own[self.lead][b] = lead_tok

    def _complete_character(self, b: int, probs: list[torch.Tensor]) -> None:
        """Member m_c completes the incomplete character it started on row b, alone."""
        m_c, ids = self.pending[b]
        member = self.members[m_c]
        tok = self.pick(probs[m_c][b], b)
        is_lead = m_c == self.lead
        step = self.steps[b][-1]
        if tok in member.eos_token_ids:
            step.piece = member.decode(ids)
            self.texts[b] += step.piece
            self.lead_tokens[b] += len(ids) + 1 if is_lead else 0
            self.rule.finish(b, "eos")
            self.pending[b] = None
            return
        ids.append(tok)
        piece = member.decode(ids)
        n_lead = self.lead_tokens[b] + len(ids) if is_lead else None
        if "\ufffd" in piece and len(ids) < MAX_PARTIAL_TOKENS:
            if is_lead and n_lead >= self.max_new_tokens:
                step.piece = piece
                self.texts[b], self.lead_tokens[b] = self.texts[b] + piece, n_lead
                self.rule.finish(b, "length")
                self.pending[b] = None
            else:
                self.own[m_c][b] = tok
            return
        self.pending[b] = None
        step.piece = piece
        if not is_lead:
            n_lead = len(self.members[self.lead].encode(self.texts[b] + piece))
        self.commit(b, piece, tok if is_lead else None, n_lead)

    def _union_step(self, b: int, probs: list[torch.Tensor]) -> None:
        """Fuse the members' top-k strings on row b and commit the chosen one."""
        M, lead = len(self.members), self.lead
        k = self.top_k
        while True:  # widen when every member's top-k is uncommittable
            tops = [_top_keys(self.vocabs[m], probs[m][b], k, m) for m in range(M)]
            keys: list = []
            for m in [lead] + [i for i in range(M) if i != lead]:
                keys.extend(key for key in tops[m] if key not in keys)
            if keys or k >= max(p.shape[-1] for p in probs):
                break
            k *= 4
        member_probs, member_tokens = [], []
        for m in range(M):
            pt = [_member_prob(self.vocabs[m], probs[m][b], tops[m], key, self.missing) for key in keys]
            member_probs.append([p for p, _ in pt])
            member_tokens.append([t for _, t in pt])
        fused = self.fuse(member_probs, self.weights)
        choice = self.pick(fused, b)
        key = keys[choice]
        agree = sum(1 for m in range(M) if tops[m] and next(iter(tops[m])) == key)
        self.steps[b].append(UnionStep(key, round(fused[choice], 4), len(keys), agree))
        if key is EOS:
            self.rule.finish(b, "eos")
            self.lead_tokens[b] += 1
            return
        if isinstance(key, tuple):  # an incomplete character: its member goes on alone
            m_c, tok = key
            step = self.steps[b][-1]
            step.piece, step.completed_by = "", self.members[m_c].name
            if m_c == lead and self.lead_tokens[b] + 1 >= self.max_new_tokens:
                step.piece = self.members[m_c].decode([tok])
                self.texts[b] += step.piece
                self.lead_tokens[b] += 1
                self.rule.finish(b, "length")
                return
            self.pending[b] = (m_c, [tok])
            self.own[m_c][b] = tok
            return
        lead_tok = member_tokens[lead][choice]
        if lead_tok is not None:
            n_lead = self.lead_tokens[b] + 1
        else:
            n_lead = len(self.members[lead].encode(self.texts[b] + key))
            self.lead_fallbacks[b] += 1
        self.commit(b, key, lead_tok, n_lead)

    def outputs(self, cost: Cost) -> list[GenerationOutput]:
        rows = range(len(self.texts))
        refed = {m.name: mt.tokens_refed for m, mt in zip(self.members, self.mts)}
        return batch_outputs(
            cost, self.texts, self.lead_tokens, self.finish,
            traces=[UnionTrace(METHOD, self.top_k, self.missing, self.members[self.lead].name, self.steps[b],
                               self.fusion) for b in rows],
            stats=[{"steps": len(self.steps[b]), "lead_text_fallbacks": self.lead_fallbacks[b], "tokens_refed": refed}
                   for b in rows])


@register_method
class TokenUnion(Method):
    """UniTE-style token-union ensemble; see the module docstring."""

    name = METHOD
    Options = TokenUnionOptions

    @torch.no_grad()
    def generate(self, members: Sequence[Member], request: GenerationRequest, options: TokenUnionOptions, *,
                 weights: Sequence[float], lead: int, speculators: Sequence[Any | None] = ()) -> list[GenerationOutput]:
        meter = CostMeter(members)
        run = _UnionRun(members, request, options, weights, lead)
        run.run()
        return run.outputs(meter.cost())


def generate(members: Sequence[Member], prompts: Sequence[str], **kwargs: Any) -> list[GenerationOutput]:
    """`run_method(TokenUnion(), ...)`: validated keyword call (max_new_tokens, stop, temperature, seed,
    weights, lead, chat, and the `TokenUnionOptions`)."""
    return run_method(TokenUnion(), members, prompts, **kwargs)
