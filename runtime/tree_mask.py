"""Attention masks and position ids for one forward that feeds a forest of new tokens (tree attention).

Pure functions: lists and CPU tensors in, CPU tensors out; nothing here knows a model or a cache.

A forward feeds, per row b, N_b new nodes; `parents[b][i] < i` is node i's parent among the row's
new nodes, or -1 for a root, which hangs off the row's past (its committed tokens). EAGLE-style:

- a node's mask row is its parent's row plus itself: it sees what its root sees of the past, its
  ancestors among the new nodes, and itself; never a sibling branch;
- its position id is the row's committed length + its depth below its root (a root is at depth 0,
  unless `root_depth` puts it deeper: a root hanging below nodes of an earlier forward);
- the past it sees: every occupied slot (`past_pos >= 0`), narrowed to `seen` where given;
- sliding-window layers (`sliding_window`) additionally hide the keys `sliding_window` or more
  positions behind the query; a node always sees itself.

Rows are padded to the longest; a padding node sees the past and itself only, at position 0.
`TreeInputs.attention_mask` turns the boolean masks into the additive masks a model takes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

FULL = "full_attention"
SLIDING = "sliding_attention"


@dataclass
class TreeInputs:
    """What one forward feeds: tokens, positions and masks of B rows of N (padded) new nodes over S
    past slots."""

    tokens: torch.Tensor                # [B, N] long, 0 at padding
    valid: torch.Tensor                 # [B, N] bool, False at padding
    position_ids: torch.Tensor          # [B, N] long, 0 at padding
    masks: dict[str, torch.Tensor]      # layer type -> [B, N, S+N] bool, True: the node attends to the key

    def attention_mask(self, dtype: torch.dtype, device) -> torch.Tensor | dict[str, torch.Tensor]:
        """Additive masks [B, 1, N, S+N] in `dtype` on `device` (0 where a node attends, the dtype's
        minimum elsewhere): one tensor, or a dict by layer type when there are sliding layers."""
        neg = torch.finfo(dtype).min
        B, N, K = self.masks[FULL].shape
        out = {k: torch.zeros(B, 1, N, K, dtype=dtype).masked_fill(~m[:, None], neg).to(device)
               for k, m in self.masks.items()}
        return out if SLIDING in out else out[FULL]


def pad_forest(tokens: Sequence[Sequence[int]], parents: Sequence[Sequence[int]]
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens [B, N] long, parents [B, N] long with -1 at padding, valid [B, N] bool) of rows
    padded to the longest."""
    B = len(tokens)
    n_new = max((len(t) for t in tokens), default=0)
    tok = torch.zeros(B, n_new, dtype=torch.long)
    valid = torch.zeros(B, n_new, dtype=torch.bool)
    par = torch.full((B, n_new), -1, dtype=torch.long)
    for b, (t, p) in enumerate(zip(tokens, parents)):
        if len(t) != len(p):
            raise ValueError("tokens and parents must have the same length per row")
        if t:
            tok[b, : len(t)] = torch.tensor(t, dtype=torch.long)
            par[b, : len(p)] = torch.tensor(p, dtype=torch.long)
            valid[b, : len(t)] = True
    return tok, par, valid


def ancestry(parents: torch.Tensor, valid: torch.Tensor, root_depth: torch.Tensor | None = None,
             seen: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per row of `parents` [B, N] (-1: a root): (ancestor-or-self [B, N, N] bool, each valid node
    seeing itself and its ancestors and each padding node only itself; depth [B, N] long below the
    roots, which sit at `root_depth` (default 0); the past slots each node sees [B, N, S], a root's
    own row of `seen` inherited by its descendants, or None without `seen`)."""
    B, n_new = parents.shape
    anc = torch.zeros(B, n_new, n_new, dtype=torch.bool)
    root_depth = root_depth if root_depth is not None else torch.zeros(B, n_new, dtype=torch.long)
    depth = torch.zeros(B, n_new, dtype=torch.long)
    seen = seen.clone() if seen is not None else None
    eye = torch.eye(n_new, dtype=torch.bool)
    rows = torch.arange(B)
    for i in range(n_new):
        p = parents[:, i]
        if bool((p >= i).any()):
            raise ValueError("a node's parent must come before it (parents[i] < i)")
        has_parent = p >= 0
        pc = p.clamp(min=0)
        anc[:, i] = eye[i] | (anc[rows, pc] & has_parent[:, None])
        depth[:, i] = torch.where(has_parent, depth[rows, pc] + 1, root_depth[:, i])
        if seen is not None:
            seen[:, i] = torch.where(has_parent[:, None], seen[rows, pc], seen[:, i])
    anc &= valid[:, None, :]
    anc |= eye[None]  # padding nodes see themselves (avoids empty rows)
    return anc, depth, seen


def eye_pad(n_new: int, n_past: int) -> torch.Tensor:
    """[N, S+N] bool: True at each new node's own slot (it always sees itself)."""
    return torch.cat([torch.zeros(n_new, n_past, dtype=torch.bool), torch.eye(n_new, dtype=torch.bool)], dim=1)


def tree_inputs(
    tokens: Sequence[Sequence[int]],      # per row, N_b new tokens
    parents: Sequence[Sequence[int]],     # per row, each node's parent among the row's new nodes; -1: a root
    past_pos: torch.Tensor,               # [B, S] long: position id of each past slot, -1 where free
    lengths: Sequence[int],               # per row, the number of committed tokens (a root's position)
    seen: torch.Tensor | None = None,     # [B, N, S] bool: the past slots root i of row b sees (default: all occupied)
    root_depth: torch.Tensor | None = None,  # [B, N] long: root i of row b sits this deep below the row's past
    sliding_window: int | None = None,    # also build the mask of sliding-window layers
) -> TreeInputs:
    """Tokens, position ids and boolean masks ("full_attention", and "sliding_attention" with a
    window) of one forward; see the module docstring."""
    tok, par, valid = pad_forest(tokens, parents)
    B, n_new = tok.shape
    S = int(past_pos.shape[1])
    anc, depth, seen = ancestry(par, valid, root_depth, seen)
    base = torch.tensor(list(lengths), dtype=torch.long)
    pos = torch.where(valid, base[:, None] + depth, torch.zeros_like(depth))
    past_valid = (past_pos >= 0)[:, None, :].expand(B, n_new, S)
    if seen is not None:
        past_valid = past_valid & seen
    full = torch.cat([past_valid, anc], dim=-1)  # [B, N, S+N]
    masks = {FULL: full}
    if sliding_window:
        all_pos = torch.cat([past_pos, pos], dim=1)  # [B, S+N]
        window = (pos[:, :, None] - all_pos[:, None, :]) < int(sliding_window)
        masks[SLIDING] = full & (window | eye_pad(n_new, S))
    return TreeInputs(tok, valid, pos, masks)
