"""The drafter contract: propose a `DraftTree` per row on top of the target's current ids.

Contexts passed to `draft` are the full token ids of each row (committed + a pending token), or
None for rows that are finished.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from runtime.member import Member
from runtime.sampling import SamplingParams
from specdec.config import DraftLimit, TreeShape
from specdec.tree import DraftTree

Contexts = Sequence[Sequence[int] | None]
Generators = Sequence[torch.Generator | None] | None


class Drafter:
    """Base class. Subclasses implement `draft` (and may implement `draft_continuations`)."""

    name = "drafter"

    def bind(self, target: Member) -> None:
        """Called once by the engine with the target; raise if the pair cannot work."""

    def reset(self) -> None:
        """Forget any cached state (a new batch starts)."""

    def draft(self, contexts: Contexts, shape: TreeShape, sampling: SamplingParams, generators: Generators = None,
              limit: DraftLimit | None = None) -> list[DraftTree]:
        """One tree per row of `contexts`, shaped by `shape` and drawn with `sampling` (row b's
        random draws from `generators[b]`). `limit` caps each row (None: `shape.depth` for every
        row). A row with a None context gets an empty tree."""
        raise NotImplementedError

    def draft_continuations(self, contexts: Contexts, branches: Sequence[Sequence[Sequence[int]]],
                            depth: Sequence[Sequence[int]], keep: Callable[[int, int, list[int]], bool]
                            ) -> list[list[list[int]]]:
        """Greedy drafts of given branches (e.g. an ensemble member's candidate words in the making):
        per row b and branch i, up to `depth[b][i]` tokens the drafter expects after
        `contexts[b] + branches[b][i]`, each kept only while `keep(b, i, drafted so far)` holds (the
        caller's stop rule, e.g. a word boundary). Drafts only: the target verifies them. Rows with a
        None context get none. Default: no drafts."""
        return [[[] for _ in row] for row in branches]


def drafter_member(drafter: Drafter | None) -> Member | None:
    """The model a drafter runs (its forwards are part of a run's cost), or None (model-free)."""
    model = getattr(drafter, "model", None)
    return getattr(drafter, "member", None) or getattr(model, "member", None)


def resolve_limit(limit: DraftLimit | None, shape: TreeShape, batch_size: int) -> DraftLimit:
    """`limit`, or every row at `shape.depth` when None."""
    if limit is None:
        return DraftLimit.uniform(shape.depth, batch_size)
    if len(limit.depth) != batch_size:
        raise ValueError(f"DraftLimit has {len(limit.depth)} rows for {batch_size} contexts")
    return limit


def kept_prefix(tokens: Sequence[int], keep: Callable[[list[int]], bool]) -> list[int]:
    """The longest prefix of `tokens` every prefix of which (non-empty) satisfies `keep`."""
    out: list[int] = []
    for tok in tokens:
        if not keep(out + [int(tok)]):
            break
        out.append(int(tok))
    return out
