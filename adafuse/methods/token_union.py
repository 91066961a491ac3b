"""Token-level union ensemble (UniTE-style) for members with different tokenizers.

At each step every member gives its next-token distribution after the shared text (its own
`MemberText` state). Each member's top-k tokens are decoded one by one to text, and the union of
those *strings* (leading-space markers such as "Ġ"/"▁" come out of the decoder as " ") is the
candidate set. A member's probability of a string is that of its token whose text is the string,
looked up in its full distribution; when the member has no such token, UniTE's rule applies
(option `missing`): the probability of the first token of the member's encoding of the string
("first-token", default) or 0 ("zero"). Each member's probabilities are renormalised over the union,
averaged with the weights, and the argmax (temperature 0) or a seeded sample (temperature > 0, from
the members' temperature-scaled distributions) is committed:

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

Trace per output: {"method", "top_k", "missing", "lead", "steps": [{"piece" (committed text, None
for EOS), "prob" (its fused probability), "union" (union size), "agree" (members whose own top-1 it
was), "completed_by" (only for an incomplete character)}]}. Stats: steps, lead_text_fallbacks
(pieces the lead had no single token for), tokens_refed (per member, whole batch: tokens re-fed by
boundary repair). Cost: the batch's forwards / tokens per member and wall time, split evenly.
"""
from __future__ import annotations

import time
import weakref
from typing import Any, Sequence

import torch

from runtime.errors import ConfigError
from runtime.member import Member, make_generators
from runtime.outputs import Cost, GenerationOutput, split_batch_cost
from runtime.text_state import MemberText

METHOD = "token-union"
OPTIONS: dict[str, Any] = {"top_k": 10, "missing": "first-token"}
MISSING_MODES = ("first-token", "zero")
EOS = None  # the union key of end-of-sequence (any member's EOS token)
PARTIAL = "\ufffd"  # what `_Vocab.key` returns for a token holding an incomplete UTF-8 character
MAX_PARTIAL_TOKENS = 4  # a character is completed within this many tokens (UTF-8 has <= 4 bytes)


# ---- shared argument checks (also used by sample_rerank) --------------------------------------
def check_call(method: str, members: Sequence[Member], prompts: Sequence[str], max_new_tokens: int,
               temperature: float, weights: Sequence[float] | None, lead: int, options: dict,
               defaults: dict[str, Any]) -> tuple[list[float], dict[str, Any]]:
    """Validate the common arguments; return (weights, options merged over defaults).
    Raises `ConfigError` with a one-line message."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise ConfigError(f"unknown option '{unknown[0]}' for method {method}; "
                          f"known options: {', '.join(defaults) or '(none)'}")
    if not members:
        raise ConfigError(f"method {method} needs at least one member")
    if not prompts:
        raise ConfigError(f"method {method} needs at least one prompt")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if temperature is None or temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature!r}")
    M = len(members)
    if not isinstance(lead, int) or not 0 <= lead < M:
        raise ConfigError(f"lead must be a member index in 0..{M - 1}, got {lead!r}")
    w = [1.0] * M if weights is None else [float(x) for x in weights]
    if len(w) != M or any(x < 0 for x in w) or sum(w) <= 0:
        raise ConfigError(f"weights must be {M} non-negative numbers with a positive sum, got {list(weights)}")
    return w, {**defaults, **options}


def batch_cost(members: Sequence[Member], snaps: Sequence[tuple[int, int]], wall: float) -> Cost:
    cost = Cost(wall_time_s=wall)
    seen: set[int] = set()
    for m, snap in zip(members, snaps):
        if id(m) not in seen:  # the same Member passed twice shares one counter
            seen.add(id(m))
            cost.merge(m.cost_since(snap))
    return cost


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


def _find_stop(text: str, stop: Sequence[str]) -> int:
    cuts = [c for c in (text.find(s) for s in stop) if c >= 0]
    return min(cuts) if cuts else -1


# ---- the method ---------------------------------------------------------------------------------
@torch.no_grad()
def generate(
    members: Sequence[Member],
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    stop: Sequence[str],
    temperature: float,
    seed: int | None,
    weights: Sequence[float],
    lead: int,
    chat: bool | None,
    **options,
) -> list[GenerationOutput]:
    """UniTE-style token-union ensemble; see the module docstring. Options: `top_k` (10),
    `missing` ("first-token" | "zero")."""
    weights, opts = check_call(METHOD, members, prompts, max_new_tokens, temperature, weights, lead, options, OPTIONS)
    top_k, missing = opts["top_k"], opts["missing"]
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ConfigError(f"top_k must be a positive integer, got {top_k!r}")
    if missing not in MISSING_MODES:
        raise ConfigError(f"missing must be one of {', '.join(MISSING_MODES)}, got {missing!r}")
    stop = [s for s in (stop or []) if s]
    t0 = time.perf_counter()
    snaps = [m.counters.snapshot() for m in members]
    B, M = len(prompts), len(members)
    gens = make_generators(B, seed, "cpu")
    mts = [MemberText(m, prompts, chat) for m in members]
    vocabs = [vocab_of(m) for m in members]
    warm_t = 1.0 if temperature == 0 else float(temperature)

    texts = ["" for _ in range(B)]
    steps: list[list[dict]] = [[] for _ in range(B)]
    finish: list[str | None] = [None] * B
    lead_tokens = [0] * B
    lead_fallbacks = [0] * B
    pending: list[tuple[int, list[int]] | None] = [None] * B  # (member, its tokens) of an incomplete character

    def pick(dist: Sequence[float] | torch.Tensor, b: int) -> int:
        if temperature == 0:
            return int(torch.as_tensor(dist).argmax())
        q = torch.as_tensor(dist, dtype=torch.float64)
        return int(torch.multinomial(q, 1, generator=gens[b] if gens else None))

    while any(f is None for f in finish):
        probs = [mt.state.next_probs(warm_t).cpu() for mt in mts]  # M x [B, V]
        pieces = ["" for _ in range(B)]
        own: list[list[int | None]] = [[None] * B for _ in range(M)]

        def commit(b: int, piece: str, lead_tok: int | None, n_lead: int) -> None:
            """Commit `piece` on row b (the lead's own last token `lead_tok`, if any) or finish."""
            new_text = texts[b] + piece
            texts[b], lead_tokens[b] = new_text, n_lead
            cut = _find_stop(new_text, stop)
            if cut >= 0:
                finish[b], texts[b] = "stop", new_text[:cut]
            elif n_lead >= max_new_tokens:
                finish[b] = "length"
            else:
                pieces[b] = piece
                own[lead][b] = lead_tok

        for b in range(B):
            if finish[b] is not None:
                continue
            if pending[b] is not None:
                # member m_c completes the character it started, alone
                m_c, ids = pending[b]
                tok = pick(probs[m_c][b], b)
                is_lead = m_c == lead
                if tok in members[m_c].eos_token_ids:
                    piece = members[m_c].decode(ids)
                    steps[b][-1]["piece"] = piece
                    texts[b] += piece
                    lead_tokens[b] += len(ids) + 1 if is_lead else 0
                    finish[b], pending[b] = "eos", None
                    continue
                ids.append(tok)
                piece = members[m_c].decode(ids)
                n_lead = lead_tokens[b] + len(ids) if is_lead else None
                if "\ufffd" in piece and len(ids) < MAX_PARTIAL_TOKENS:
                    if is_lead and n_lead >= max_new_tokens:
                        steps[b][-1]["piece"] = piece
                        texts[b], lead_tokens[b], finish[b], pending[b] = texts[b] + piece, n_lead, "length", None
                    else:
                        own[m_c][b] = tok
                    continue
                pending[b] = None
                steps[b][-1]["piece"] = piece
                if not is_lead:
                    n_lead = len(members[lead].encode(texts[b] + piece))
                commit(b, piece, tok if is_lead else None, n_lead)
                continue
            k = top_k
            while True:  # widen when every member's top-k is uncommittable
                tops = [_top_keys(vocabs[m], probs[m][b], k, m) for m in range(M)]
                keys: list = []
                for m in [lead] + [i for i in range(M) if i != lead]:
                    keys.extend(key for key in tops[m] if key not in keys)
                if keys or k >= max(p.shape[-1] for p in probs):
                    break
                k *= 4
            member_probs, member_tokens = [], []
            for m in range(M):
                pt = [_member_prob(vocabs[m], probs[m][b], tops[m], key, missing) for key in keys]
                member_probs.append([p for p, _ in pt])
                member_tokens.append([t for _, t in pt])
            fused = fuse_union(member_probs, weights)
            choice = pick(fused, b)
            key = keys[choice]
            agree = sum(1 for m in range(M) if tops[m] and next(iter(tops[m])) == key)
            steps[b].append({"piece": key, "prob": round(fused[choice], 4), "union": len(keys), "agree": agree})
            if key is EOS:
                finish[b] = "eos"
                lead_tokens[b] += 1
                continue
            if isinstance(key, tuple):  # an incomplete character: its member goes on alone
                m_c, tok = key
                steps[b][-1].update(piece="", completed_by=members[m_c].name)
                if m_c == lead and lead_tokens[b] + 1 >= max_new_tokens:
                    piece = members[m_c].decode([tok])
                    steps[b][-1]["piece"] = piece
                    texts[b], lead_tokens[b], finish[b] = texts[b] + piece, lead_tokens[b] + 1, "length"
                    continue
                pending[b] = (m_c, [tok])
                own[m_c][b] = tok
                continue
            lead_tok = member_tokens[lead][choice]
            if lead_tok is not None:
                n_lead = lead_tokens[b] + 1
            else:
                n_lead = len(members[lead].encode(texts[b] + key))
                lead_fallbacks[b] += 1
            commit(b, key, lead_tok, n_lead)
        if any(pieces) or any(t is not None for row in own for t in row):
            for m, mt in enumerate(mts):
                _commit(mt, pieces, own[m])

    wall = time.perf_counter() - t0
    cost = batch_cost(members, snaps, wall)
    outs = [GenerationOutput(texts[b], lead_tokens[b], finish[b], cost if b == 0 else Cost()) for b in range(B)]
    outs = split_batch_cost(outs)
    for b, out in enumerate(outs):
        out.trace = {"method": METHOD, "top_k": top_k, "missing": missing, "lead": members[lead].name,
                     "steps": steps[b]}
        out.stats = {"steps": len(steps[b]), "lead_text_fallbacks": lead_fallbacks[b],
                     "tokens_refed": {m.name: mt.tokens_refed for m, mt in zip(members, mts)}}
    return outs
