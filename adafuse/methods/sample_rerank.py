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
   The trace lists every answer, who wrote it, how it ended and each member's score.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from runtime.errors import ConfigError
from runtime.member import END_OF_TURN_TOKENS as _END_OF_TURN_TOKENS, Member, check_finished
from adafuse.methods.token_union import batch_cost, check_call
from runtime.outputs import Cost, GenerationOutput, split_batch_cost
from runtime.sampling import sample
from adafuse.scoring import NORMALISATIONS, combine_scores, normalised_score

METHOD = "sample-rerank"
OPTIONS: dict[str, Any] = {"samples_per_member": 1, "normalise": "byte"}
SEED_STRIDE = 1_000_003  # seed offset between (member, sample) runs; row b adds b, as member.generate does


def end_token(member: Member, chat: bool | None) -> int | None:
    """The token `member` would end an answer with: its end-of-turn token under its chat template,
    else its tokenizer's EOS."""
    use_chat = member.use_chat_template if chat is None else (chat and member.use_chat_template)
    if use_chat:
        vocab = member.tokenizer.get_vocab()
        for t in _END_OF_TURN_TOKENS:
            if t in vocab and vocab[t] in member.eos_token_ids:
                return vocab[t]
    eos = member.tokenizer.eos_token_id
    if isinstance(eos, int):
        return eos
    return min(member.eos_token_ids) if member.eos_token_ids else None


def decode(member: Member, state, generators, temperature: float, stop: Sequence[str],
           max_new_tokens: int) -> tuple[list[str], list[str], list[list[int]]]:
    """Plain decoding of every row of `state` (as `Member.generate` does): (texts, finish reasons,
    new token ids). Row r samples from `generators[r]` when given."""
    R = state.batch_size
    new_ids: list[list[int]] = [[] for _ in range(R)]
    texts = ["" for _ in range(R)]
    finish: list[str | None] = [None] * R
    while any(f is None for f in finish):
        probs = state.next_probs(temperature)
        tokens = probs.argmax(-1) if temperature == 0 else sample(probs, generators)
        feed: list[list[int]] = []
        for r, tok in enumerate(tokens.tolist()):
            if finish[r] is not None:
                feed.append([])
                continue
            new_ids[r].append(tok)
            finish[r], texts[r] = check_finished(member, new_ids[r], stop, max_new_tokens)
            feed.append([] if finish[r] is not None else [tok])
        if any(feed):
            state.append(feed, return_logits=False)
    return texts, finish, new_ids


def matched_stop(member: Member, new_ids: Sequence[int], text: str, stop: Sequence[str]) -> str:
    """The stop string a row ended at (the one `check_finished` cut at)."""
    raw = member.decode(new_ids)
    return next((s for s in stop if raw.find(s) == len(text)), "")


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
    """Generate-then-rerank; see the module docstring. Options: `samples_per_member` (1),
    `normalise` ("byte")."""
    weights, opts = check_call(METHOD, members, prompts, max_new_tokens, temperature, weights, lead, options, OPTIONS)
    n, mode = opts["samples_per_member"], opts["normalise"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"samples_per_member must be a positive integer, got {n!r}")
    if n > 1 and temperature == 0:
        raise ConfigError("samples_per_member > 1 needs temperature > 0 (greedy answers would repeat)")
    if mode not in NORMALISATIONS:
        raise ConfigError(f"normalise must be one of {', '.join(NORMALISATIONS)}, got {mode!r}")
    stop = [s for s in (stop or []) if s]
    t0 = time.perf_counter()
    snaps = [m.counters.snapshot() for m in members]
    B, M = len(prompts), len(members)
    order = [lead] + [m for m in range(M) if m != lead]

    # 1. answers: each member decodes its B x n rows on one KV state, kept for scoring afterwards
    answers: list[list[dict]] = [[] for _ in range(B)]  # per row, distinct {"text", "finish", "by", "tokens"}
    index: list[dict[tuple[str, bool, str], int]] = [{} for _ in range(B)]
    states = {}
    for m in order:
        member = members[m]
        rows = [(b, j) for b in range(B) for j in range(n)]
        prompt_ids = [member.encode_prompt(p, chat) for p in prompts]
        state = member.start([prompt_ids[b] for b, _ in rows])
        gens = None
        if seed is not None:
            gens = [torch.Generator(device=member.device).manual_seed(int(seed) + SEED_STRIDE * (m * n + j) + b)
                    for b, j in rows]
        texts, finish, new_ids = decode(member, state, gens, temperature, stop, max_new_tokens)
        ends = [matched_stop(member, ids, text, stop) if f == "stop" else "" for ids, text, f in zip(new_ids, texts, finish)]
        state.rollback([len(prompt_ids[b]) for b, _ in rows])
        states[m] = state
        for r, (b, j) in enumerate(rows):
            key = (texts[r], finish[r] == "eos", ends[r])
            if key not in index[b]:
                index[b][key] = len(answers[b])
                answers[b].append({"text": texts[r], "finish": finish[r], "stop": ends[r], "by": [],
                                   "tokens": len(new_ids[r]) if m == lead else None})
            answers[b][index[b][key]]["by"].append(f"{member.name}#{j}" if n > 1 else member.name)

    # 2. every member scores every answer (text, plus its stop string or its end token: how it ended):
    #    all rows and answers in one forward per member, on the state its own decoding left
    scores = [torch.zeros(M, len(answers[b])) for b in range(B)]  # per row [M, C]
    for m, member in enumerate(members):
        eos = end_token(member, chat)
        conts: list[list[list[int]]] = []
        for b in range(B):
            row = []
            for a in answers[b]:
                ids = member.encode(a["text"] + a["stop"]) if a["text"] + a["stop"] else []
                if a["finish"] == "eos" and eos is not None:
                    ids = ids + [eos]
                row.append(ids)
            conts.append(row)
            conts.extend([] for _ in range(n - 1))  # the other sample rows of prompt b score nothing
        logprobs = states.pop(m).score(conts)
        for b in range(B):
            for c, a in enumerate(answers[b]):
                scores[b][m, c] = normalised_score(logprobs[b * n][c], a["text"] + a["stop"], mode)

    # 3. choose
    w = torch.tensor(weights, dtype=torch.float32)
    wall = time.perf_counter() - t0
    cost = batch_cost(members, snaps, wall)
    outs = []
    for b in range(B):
        mean = combine_scores(scores[b], w)
        best = int(torch.argmax(mean))  # first maximum: the lead's answers come first
        a = answers[b][best]
        n_lead = a["tokens"]
        if n_lead is None:
            n_lead = len(members[lead].encode(a["text"])) + (1 if a["finish"] == "eos" else 0)
        out = GenerationOutput(a["text"], n_lead, a["finish"], cost if b == 0 else Cost())
        out.trace = {
            "method": METHOD, "normalise": mode, "samples_per_member": n, "chosen": best,
            "members": [mm.name for mm in members],
            "answers": [{"text": x["text"], "finish": x["finish"], "stop": x["stop"], "by": x["by"],
                         "scores": [round(float(s), 4) for s in scores[b][:, c]], "mean": round(float(mean[c]), 4)}
                        for c, x in enumerate(answers[b])],
        }
        out.stats = {"distinct_answers": len(answers[b])}
        outs.append(out)
    return split_batch_cost(outs)
