"""What a speculative decode returns: per row the new tokens, where they came from, and its statistics."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RowStats:
    """What one row's speculation did: target forwards (steps), tokens emitted, drafted tokens
    accepted, verification attempts and accepts per tree depth, the summed α* per depth (when
    tracked) and the drafted nodes summed over steps."""

    steps: int = 0
    tokens: int = 0
    accepted: int = 0
    attempts_by_depth: list[int] = field(default_factory=list)
    accepts_by_depth: list[int] = field(default_factory=list)
    alpha_star_by_depth: list[float] = field(default_factory=list)
    tree_nodes: int = 0

    def record(self, depth: int, accepted: bool, alpha: float | None) -> None:
        """One verification at `depth`: whether a draft was accepted, and α* there (None: not tracked)."""
        while len(self.attempts_by_depth) <= depth:
            self.attempts_by_depth.append(0)
            self.accepts_by_depth.append(0)
            self.alpha_star_by_depth.append(0.0)
        self.attempts_by_depth[depth] += 1
        self.accepts_by_depth[depth] += int(accepted)
        if alpha is not None:
            self.alpha_star_by_depth[depth] += alpha

    def to_dict(self, with_alpha: bool) -> dict:
        """The figures `GenerationOutput.stats` reports (rates rounded; α* per depth when `with_alpha`)."""
        att = self.attempts_by_depth
        d = {
            "target_forwards": self.steps,
            "block_efficiency": round(self.tokens / max(self.steps, 1), 4),
            "mean_accepted_length": round(self.accepted / max(self.steps, 1), 4),
            "acceptance_by_depth": [round(a / max(n, 1), 4) for a, n in zip(self.accepts_by_depth, att)],
            "attempts_by_depth": list(att),
            "mean_tree_nodes": round(self.tree_nodes / max(self.steps, 1), 2),
        }
        if with_alpha:
            d["alpha_star_by_depth"] = [round(a / max(n, 1), 4) for a, n in zip(self.alpha_star_by_depth, att)]
        return d

    def __repr__(self) -> str:
        return (f"RowStats(steps={self.steps}, tokens={self.tokens}, accepted={self.accepted}, "
                f"depths={len(self.attempts_by_depth)})")


@dataclass
class RowResult:
    """One row of a decode: the new token ids; with `record_sources`, the target logits [V] each
    one was drawn from (`sources[j]` for `ids[j]`; None when not recorded); whether the state lacks
    the last id (`commit_last=False`); the row's `RowStats`. A stop callback sees it while it grows."""

    ids: list[int] = field(default_factory=list)
    sources: list[torch.Tensor] | None = None
    uncommitted: bool = False
    stats: RowStats = field(default_factory=RowStats)

    def __repr__(self) -> str:
        src = "none" if self.sources is None else len(self.sources)
        return f"RowResult(ids={len(self.ids)}, sources={src}, uncommitted={self.uncommitted})"


@dataclass
class DecodeResult:
    """What `SpeculativeGenerator.decode` returns: one `RowResult` per row of the state (rows it
    was not asked to decode are empty). `ids`, `sources`, `uncommitted`, `stats`: the rows' fields
    as lists."""

    rows: list[RowResult]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, b: int) -> RowResult:
        return self.rows[b]

    @property
    def ids(self) -> list[list[int]]:
        return [r.ids for r in self.rows]

    @property
    def sources(self) -> list[list[torch.Tensor] | None]:
        return [r.sources for r in self.rows]

    @property
    def uncommitted(self) -> list[bool]:
        return [r.uncommitted for r in self.rows]

    @property
    def stats(self) -> list[RowStats]:
        return [r.stats for r in self.rows]

    def __repr__(self) -> str:
        recorded = any(r.sources is not None for r in self.rows)
        return (f"DecodeResult(rows={len(self.rows)}, tokens={[len(r.ids) for r in self.rows]}, "
                f"sources={'recorded' if recorded else 'none'}, uncommitted={sum(self.uncommitted)})")
