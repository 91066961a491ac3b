"""Cross-row drafting: a row drafts from what the other rows of the same problem have written.

The answers of a vote (views of one model, samples of one view) mostly say the same things in the same
words, so the text another row already wrote is a cheap draft that the target often accepts. A
`SiblingBoard` holds, per problem, the new token ids every row has written so far; a `CrossRowDrafter`
bound to some rows (`for_rows`) writes its rows' ids to the board when it drafts, then proposes for
each row the continuations of its last n-gram in its siblings' ids (most recently written rows first),
then in its own context (prompt lookup). Its drafts are deterministic, so the engine verifies them by
drawing from the target's own distribution and accepting the matching child: the output is the
target's own, token for token with the same generators (`specdec.engine`). Rows must share the
target's tokenizer (views of one model do). Unbound, it is plain prompt lookup.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

from runtime.sampling import SamplingParams
from specdec.config import DraftLimit, TreeShape
from specdec.drafter_base import resolve_limit
from specdec.lookup import PromptLookupDrafter
from specdec.tree import DraftTree, tree_from_sequences


class SiblingBoard:
    """Per problem, the new ids each row (any hashable key) has written so far."""

    def __init__(self) -> None:
        self.rows: dict[Any, dict[Any, list[int]]] = {}

    def write(self, problem: Any, key: Any, ids: Sequence[int]) -> None:
        self.rows.setdefault(problem, {})[key] = list(ids)

    def siblings(self, problem: Any, key: Any) -> list[list[int]]:
        """The other rows' ids of `problem`, the most recently registered first."""
        return [ids for k, ids in reversed(list(self.rows.get(problem, {}).items())) if k != key]


def continuations_in(seqs: Sequence[Sequence[int]], tail: Sequence[int], ngram_max: int, ngram_min: int,
                     depth: int, num: int) -> list[list[int]]:
    """Up to `num` distinct continuations (of at most `depth` ids, none a prefix of an earlier one) that
    follow the longest n-gram of `tail`'s end (n from `ngram_max` down to `ngram_min`) in `seqs`."""
    out: list[list[int]] = []
    for size in range(min(ngram_max, len(tail)), ngram_min - 1, -1):
        key = list(tail[len(tail) - size:])
        for seq in seqs:
            for i in range(len(seq) - size, -1, -1):
                if list(seq[i:i + size]) != key:
                    continue
                cont = list(seq[i + size: i + size + depth])
                if cont and not any(o[:len(cont)] == cont for o in out):
                    out.append(cont)
                    if len(out) >= num:
                        return out
                break  # the latest occurrence in this row
        if out:
            return out
    return out


class CrossRowDrafter(PromptLookupDrafter):
    """Drafts from sibling rows' ids, then from its own context (see the module docstring)."""

    name = "rows"

    def __init__(self, ngram_max: int = 4, ngram_min: int = 2, num_drafts: int | None = None,
                 depth: int | None = None, min_length: int = 2):
        super().__init__(ngram_max, ngram_min, num_drafts, depth, min_length)
        self.board: SiblingBoard | None = None
        self.problems: list[Any] = []
        self.keys: list[Any] = []
        self.prompt_lengths: list[int] = []

    def for_rows(self, board: SiblingBoard, problems: Sequence[Any], keys: Sequence[Any],
                 prompt_lengths: Sequence[int]) -> "CrossRowDrafter":
        """A copy bound to a state's rows: row r belongs to `problems[r]`, is `keys[r]` on the board,
        and its context's first `prompt_lengths[r]` ids are its prompt."""
        out = copy.copy(self)
        out.board, out.problems, out.keys, out.prompt_lengths = board, list(problems), list(keys), list(prompt_lengths)
        return out

    def draft(self, contexts, shape: TreeShape, sampling: SamplingParams, generators=None,
              limit: DraftLimit | None = None) -> list[DraftTree]:
        if self.board is None:
            return super().draft(contexts, shape, sampling, generators, limit)
        for r, ctx in enumerate(contexts):
            if ctx is not None:
                self.board.write(self.problems[r], self.keys[r], ctx[self.prompt_lengths[r]:])
        n = self.num_drafts or shape.num_drafts
        lim = resolve_limit(limit, shape, len(contexts))
        trees = []
        for r, (ctx, d, room) in enumerate(zip(contexts, lim.depth, lim.room)):
            k = min(self.depth, room) if self.depth else d
            if not ctx or k <= 0:
                trees.append(DraftTree())
                continue
            sibs = self.board.siblings(self.problems[r], self.keys[r])
            found = continuations_in(sibs, ctx, self.ngram_max, self.ngram_min, k, n)
            found = [c for c in found if len(c) >= self.min_length] or self.continuations(ctx, n, k)
            trees.append(tree_from_sequences(found) if found else DraftTree())
        return trees
