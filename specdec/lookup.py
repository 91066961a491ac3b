"""Prompt lookup: model-free drafts from the row's own text (`PromptLookupDrafter`)."""
from __future__ import annotations

from typing import Sequence

from runtime.sampling import SamplingParams
from specdec.config import DraftLimit, TreeShape
from specdec.drafter_base import Drafter, kept_prefix, resolve_limit
from specdec.tree import DraftTree, tree_from_sequences


class PromptLookupDrafter(Drafter):
    """Model-free drafts: continuations of earlier occurrences of the context's last n-gram
    (n from `ngram_max` down to `ngram_min`), most recent first, up to `num_drafts` distinct ones of
    up to `depth` tokens, at least `min_length` long (`num_drafts`, `depth`: None follows the
    engine's shape and limits; a `depth` of its own is still kept within each row's room)."""

    name = "lookup"

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1, num_drafts: int | None = None,
                 depth: int | None = None, min_length: int = 1):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.num_drafts, self.depth, self.min_length = num_drafts, depth, min_length

    def __repr__(self) -> str:
        return (f"PromptLookupDrafter(ngram={self.ngram_min}..{self.ngram_max}, num_drafts={self.num_drafts}, "
                f"depth={self.depth}, min_length={self.min_length})")

    def continuations(self, ctx: Sequence[int], num_drafts: int, depth: int) -> list[list[int]]:
        """Up to `num_drafts` distinct continuations (none a prefix of an earlier one) of at most
        `depth` tokens that followed earlier occurrences of `ctx`'s last n-gram."""
        ctx = list(ctx)
        L = len(ctx)
        out: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for size in range(min(self.ngram_max, L - 1), self.ngram_min - 1, -1):
            key = ctx[L - size:]
            first = key[0]
            for i in range(L - size - 1, -1, -1):
                if ctx[i] != first or ctx[i:i + size] != key:
                    continue
                cont = ctx[i + size: i + size + depth]
                if len(cont) < self.min_length:
                    continue
                t = tuple(cont)
                if any(s[: len(t)] == t for s in seen):
                    continue  # a prefix of a continuation we already have adds nothing
                seen.add(t)
                out.append(cont)
                if len(out) >= num_drafts:
                    return out
        return out

    def draft(self, contexts, shape: TreeShape, sampling: SamplingParams, generators=None,
              limit: DraftLimit | None = None) -> list[DraftTree]:
        """A trie of the lookup continuations per row (deterministic: no randomness used)."""
        n = self.num_drafts or shape.num_drafts
        lim = resolve_limit(limit, shape, len(contexts))
        ks = [min(self.depth, room) if self.depth else d for d, room in zip(lim.depth, lim.room)]
        return [tree_from_sequences(self.continuations(c, n, k)) if c and k > 0 else DraftTree()
                for c, k in zip(contexts, ks)]

    def draft_continuations(self, contexts, branches, depth, keep):
        """The most recent lookup continuation of each branch (see `Drafter.draft_continuations`)."""
        out = []
        for b, (ctx, row) in enumerate(zip(contexts, branches)):
            drafts = []
            for i, br in enumerate(row):
                k = min(depth[b][i], self.depth or depth[b][i])
                found = self.continuations(list(ctx) + list(br), 1, k) if ctx is not None and k > 0 else []
                drafts.append(kept_prefix(found[0], lambda c, b=b, i=i: keep(b, i, c)) if found else [])
            out.append(drafts)
        return out
