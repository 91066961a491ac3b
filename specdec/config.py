"""What a speculative run is asked to do: the draft tree's shape, how a decode stops, a drafter's limits.

Small frozen dataclasses in the manner of vLLM's proposals and transformers' `GenerationConfig`;
sampling itself is `runtime.sampling.SamplingParams` (temperature, top-k, top-p, seed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from specdec.drafts import SCHEMES

if TYPE_CHECKING:
    from specdec.results import RowResult

# Measured on the Qwen 1.5B/0.5B pair on a 2-core AVX2 CPU (benchmarks/specdec_speed.py, docs/results/specdec/):
# with packed weights a target forward over 9 tokens costs ~1.4x a one-token forward while every 0.5B drafter
# forward costs ~0.3x one, so one chain beats wider trees: up to 8 tokens, cut where the drafter's top
# probability is below 0.4. Prompt lookup: one gated continuation (a >= 2-gram match, >= 2 tokens) of up to 8.
DEFAULT_STOP_BELOW = 0.4


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class TreeShape:
    """The draft tree a drafter builds per row and step. The defaults are the measured winner for
    every drafter (one greedy chain of up to 8 tokens, cut where a model drafter is unsure).

    scheme: how the `num_drafts` children of an expanded node are drawn at temperature > 0
    ("greedy" | "with" | "without", `specdec.drafts`); depth: the most drafted tokens on a path;
    node_budget: at most this many drafted nodes per row and step, the most probable ones (None or
    0: no budget); stop_below: a model drafter does not expand a node whose top draft probability
    is below this (0: never cut; a `ModelDrafter` built with its own `stop_below` keeps that one)."""

    scheme: str = "greedy"
    num_drafts: int = 1
    depth: int = 8
    node_budget: int | None = None
    stop_below: float = DEFAULT_STOP_BELOW

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {self.scheme!r}; choose one of {SCHEMES}")
        if not _is_int(self.num_drafts) or self.num_drafts < 1 or not _is_int(self.depth) or self.depth < 0:
            raise ValueError(f"num_drafts must be an int >= 1 and depth an int >= 0, got {self.num_drafts!r}, "
                             f"{self.depth!r}")
        if self.node_budget is not None and (not _is_int(self.node_budget) or self.node_budget < 0):
            raise ValueError(f"node_budget must be None or an int >= 0, got {self.node_budget!r}")
        if not isinstance(self.stop_below, (int, float)) or not 0.0 <= self.stop_below < 1.0:
            raise ValueError(f"stop_below must be in [0, 1), got {self.stop_below!r}")


DEFAULT_SHAPE = TreeShape()


@dataclass(frozen=True)
class DraftLimit:
    """Per row, how far a drafter may go this step: `depth`, the tree depth the engine asks for
    (the shape's depth capped by the tokens the row may still emit and the caller's `draft_depth`),
    and `room`, the most tokens the row may still draft at all (a drafter with a depth of its own,
    like a prompt lookup's, stays within it). Rows the engine skips have 0 for both."""

    depth: Sequence[int]
    room: Sequence[int]

    def __post_init__(self) -> None:
        if len(self.depth) != len(self.room):
            raise ValueError(f"DraftLimit: {len(self.depth)} depths for {len(self.room)} rows")

    @classmethod
    def uniform(cls, depth: int, batch_size: int) -> "DraftLimit":
        """Every row drafts to `depth`."""
        return cls([int(depth)] * batch_size, [int(depth)] * batch_size)

    def __repr__(self) -> str:
        return f"DraftLimit(rows={len(self.depth)}, max_depth={max(self.depth, default=0)})"


StopFn = Callable[[int, "RowResult"], bool]
DepthFn = Callable[[int, "RowResult"], int]


@dataclass(frozen=True)
class DecodeControl:
    """How `SpeculativeGenerator.decode` stops and what it records, besides `max_new_tokens`.

    stop(row, result): checked after every new token (`result.ids` so far, `result.sources` when
    recorded); True stops the row there and the state holds exactly its tokens. stop_at_eos: a row
    also stops at an EOS token. rows: decode only these rows (the others get no tokens, drafts or
    tree nodes; None: all). draft_depth(row, result): caps the row's next draft depth where the
    caller knows how much it can use (cost only: greedy output is the same, sampled output keeps
    its law). commit_last=False skips the final forward that commits each row's last token (for a
    caller about to roll it back; `RowResult.uncommitted` says which rows lack it). record_sources:
    keep the target logits every new token was drawn from (`RowResult.sources`)."""

    stop: StopFn | None = None
    stop_at_eos: bool = True
    rows: Sequence[int] | None = None
    draft_depth: DepthFn | None = None
    commit_last: bool = True
    record_sources: bool = False

    def __repr__(self) -> str:
        rows = "all" if self.rows is None else len(self.rows)
        return (f"DecodeControl(stop={self.stop is not None}, stop_at_eos={self.stop_at_eos}, rows={rows}, "
                f"draft_depth={self.draft_depth is not None}, commit_last={self.commit_last}, "
                f"record_sources={self.record_sources})")
