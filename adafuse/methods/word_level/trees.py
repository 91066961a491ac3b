"""Candidate words in the making, as token trees in a member's KV state (`runtime.open_tree.OpenTree`:
it grows by one forward at a time and is scored from (`ensembled_word`) or kept (`OpenTree.accept`)).

- `Branches`: one row's candidate words, each first token extended by its greedy next token until
  the word ends.
- `complete_words`: all rows' branches of one member completed together, one tree forward per step,
  walking through draft nodes (other members' words, a `specdec` drafter's continuations) for free.
- `top_firsts`: a member's top-B first tokens, `continuation_ids`: a word's ids for a member.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from adafuse.words import word_end
from runtime.member import Member
from runtime.open_tree import OpenTree, below
from runtime.text_state import MemberText


def continuation_ids(view: MemberText, row: int, text: str, have: Sequence[int] | None = None) -> list[int]:
    """The member's ids of `text` appended to the row's committed text: the tail of a fresh encoding
    of (committed + text) after the cached ids (or `have`); falls back to encoding `text` alone when
    the boundary would re-tokenise them (rare; the score is then of that tokenisation)."""
    have = view.output_ids(row) if have is None else list(have)
    full = view.member.encode(view.texts[row] + text)
    if len(full) > len(have) and full[: len(have)] == have:
        return full[len(have):]
    return view.member.encode(text)


class Branches:
    """One row's candidate words in the making: each first token is extended by its greedy next
    token until the word ends (a token that starts the next word is left out; one that straddles the
    boundary keeps the word's part), EOS, or `max_word_tokens`."""

    def __init__(self, member: Member, firsts: Sequence[int], max_word_tokens: int):
        self.member, self.max_word_tokens = member, max_word_tokens
        self.tokens = [[t] for t in firsts]
        self.texts = [member.decode([t]) for t in firsts]
        self.words: list[str | None] = [None] * len(firsts)
        for i, t in enumerate(self.texts):
            end = word_end(t)
            if end is not None:
                self.words[i] = t[:end]
            elif max_word_tokens <= 1:
                self.words[i] = t

    @property
    def firsts(self) -> list[int]:
        """The first token of each branch, in the order given."""
        return [br[0] for br in self.tokens]

    @property
    def done(self) -> bool:
        """Whether every branch has ended (its word is known)."""
        return all(w is not None for w in self.words)

    def open(self) -> list[int]:
        """The indices of the branches still open."""
        return [i for i, w in enumerate(self.words) if w is None]

    def step(self, i: int, nxt: int) -> bool:
        """Extend open branch i by its greedy next token `nxt`; True if it is still open."""
        br, text = self.tokens[i], self.texts[i]
        if nxt in self.member.eos_token_ids:
            self.words[i] = text
            return False
        new = self.member.decode(br + [nxt])
        end = word_end(new)
        if end is not None:
            self.words[i] = new[:end] if end > len(text) else text
            return False
        br.append(nxt)
        self.texts[i] = new
        if len(br) >= self.max_word_tokens:
            self.words[i] = new
            return False
        return True

    def result(self) -> list[str]:
        """The words, aligned with the first tokens ("" for a branch that never ended)."""
        return [w or "" for w in self.words]


def complete_words(view: MemberText, rows: Sequence[int], firsts: dict[int, list[int]],
                   max_word_tokens: int, known: dict[int, list[str]] | None = None, keep_tree: bool = False,
                   started: dict[int, Branches] | None = None, tree: OpenTree | None = None,
                   drafter: Any | None = None) -> tuple[dict[int, list[str]], OpenTree | None]:
    """Complete each first token greedily to the word boundary (`Branches`) without committing
    anything; all unfinished branches of all rows advance in one forward per step. The steps grow
    one token tree in the member's state (`OpenTree.grow`, nothing re-fed): the first holds the
    branches' tokens and the `known` words as drafts (per row, words other members proposed, by this
    member's continuation ids), each later step feeds only each open branch's next token. A branch
    walks on through the tree while its greedy next token is a node there, so completing a word some
    member already proposed costs no further forward. Logits are computed at the branch ends
    and the drafts below them only (only drafts a branch can walk into are fed); with `keep_tree`
    the tree also holds every known word and the words completed so far, and every node gets logits
    (the lead: its tree usually holds every candidate). The tree stays open in the state (returned as
    an `OpenTree`) for `EnsembledWord.score` to score from or extend and `EnsembledWord.commit` to
    keep the chosen word. `started`: rows
    whose branches (of the same firsts, at the same state) were already advanced elsewhere. `tree`: a
    tree already open in the state (guesses fed with a flush, `EnsembledWord._flush_guessing`), every
    node with logits, that the branches walk first and the steps grow. `drafter`: the member's
    `specdec` drafter; its greedy drafts of each open branch, up to the word's end
    (`draft_branches`), go into the first forward below the branch, so the member verifies them as
    its speculative generator would at temperature 0 (the walk takes the member's argmax at every
    node, so the words are the same with or without drafts; see `WordConfig.draft_candidates` for
    what they save).
    Returns (row -> words aligned with firsts, the open tree or None)."""
    member, state = view.member, view.state
    B = state.batch_size
    started = started or {}
    branches = {b: started[b] if b in started else Branches(member, firsts[b], max_word_tokens) for b in rows}
    drafts = {b: [continuation_ids(view, b, w) for w in (known or {}).get(b, []) if w] for b in rows}
    if tree is None or not tree.is_open:
        tree = state.new_tree()  # grown by each step's forward
    first = True
    drafted: dict[int, list[list[int]]] = {}
    while True:
        for b in rows:
            bs = branches[b]
            for i in bs.open():
                node = (tree.path(b, bs.tokens[i]) or [None])[-1]
                # walk on while the greedy next token is a node with logits
                while node is not None:
                    logits = tree.logits(b, node)
                    if logits is None:
                        break
                    nxt = int(logits.argmax())
                    if not bs.step(i, nxt):
                        break
                    node = tree.child(b, node, nxt)
        if all(branches[b].done for b in rows):
            break
        if first and drafter is not None:
            drafted = draft_branches(view, rows, branches, drafter, max_word_tokens)
        fed = tree.fed
        ends: list[list[int]] = [[] for _ in range(B)]
        for b in rows:
            bs = branches[b]
            if first:  # drafts go into the first forward; without keep_tree only those a branch can walk into
                open_branches = [bs.tokens[i] for i in bs.open()]
                for ids in drafts[b]:
                    if keep_tree or any(ids[: len(br)] == br for br in open_branches):
                        tree.add(b, ids)
                for ids in drafted.get(b, []):
                    tree.add(b, ids)
            for i, word in enumerate(bs.words):
                if word is None:
                    ends[b].append(tree.add(b, bs.tokens[i]))
                elif keep_tree and word:
                    tree.add(b, continuation_ids(view, b, word))
        if all(len(t) == f for t, f in zip(tree.tokens, fed)):
            raise RuntimeError("complete_words: an open branch ends at a node without logits")
        # LM head: every node with keep_tree, else only where a walk can go (branch ends and below)
        tree.grow(None if keep_tree else
                  [[n for n in sorted(below(tree.parents[b], ends[b])) if n >= fed[b]] for b in range(B)])
        first = False
    return {b: branches[b].result() for b in rows}, (tree if tree.is_open else None)


def draft_branches(view: MemberText, rows: Sequence[int], branches: dict[int, Branches], drafter: Any,
                   max_word_tokens: int) -> dict[int, list[list[int]]]:
    """Per row, each open branch's tokens followed by the drafter's greedy continuation of it, cut
    where the word would end (a drafted token is kept only while the branch stays open after it: a
    token that ends the word needs no logits). Branches the drafter has nothing for are left out."""
    member, B = view.member, view.state.batch_size
    opened = {b: branches[b].open() for b in rows}
    tokens = [[list(branches[b].tokens[i]) for i in opened.get(b, [])] for b in range(B)]
    contexts = [list(view.state.ids[b]) if tokens[b] else None for b in range(B)]
    depth = [[max_word_tokens - 1 - len(t) for t in row] for row in tokens]

    def keep(b: int, i: int, draft: list[int]) -> bool:
        """The drafter's stop rule: the branch must stay open after `draft`."""
        ids = tokens[b][i] + draft
        return (draft[-1] not in member.eos_token_ids and len(ids) < max_word_tokens
                and word_end(member.decode(ids)) is None)

    drafts = drafter.draft_continuations(contexts, tokens, depth, keep)
    return {b: [t + d for t, d in zip(tokens[b], drafts[b]) if d] for b in rows}


def top_firsts(view: MemberText, rows: Sequence[int], k: int) -> tuple[dict[int, list[int]], dict[int, bool]]:
    """Per row, the member's top-k first tokens (untempered) other than EOS, and whether an EOS was
    among the top-k (it takes one of the k slots)."""
    probs = view.state.next_probs(1.0)
    eos_ids = view.member.eos_token_ids
    top = torch.topk(probs, min(k, probs.shape[-1]), dim=-1).indices.tolist()
    firsts = {b: [t for t in top[b] if t not in eos_ids] for b in rows}
    return firsts, {b: len(firsts[b]) < len(top[b]) for b in rows}
