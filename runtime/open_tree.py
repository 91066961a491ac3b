"""The bookkeeping of a token tree fed to a `KVState` but not yet accepted (`forward_tree`,
`append_open`): each row's nodes (token, parent, cache slot) and the logits the forwards returned.

Nodes are numbered per row in the order they were fed; parent -1 is the row's last committed token.
A tree's slots start at `first`; its nodes' slots are stored relative to it. Nothing here runs a
model: `roots_below` says, for nodes a later forward hangs below the tree, which past slots they see
and how deep they sit (the inputs `runtime.tree_mask.tree_inputs` takes as `seen` / `root_depth`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class TreeBlock:
    """The logits of one forward of an open tree: row b's node n (tree-wide index) is column
    `cols[b][n]` of `logits` [B, K, V]."""

    logits: torch.Tensor
    cols: list[dict[int, int]]


@dataclass
class OpenTree:
    """A token tree fed by `forward_tree` (and grown by `forward_tree(..., extend=True)`), not yet
    accepted."""

    first: int                      # the tree's first slot
    tokens: list[list[int]]         # per row, each node's token
    parents: list[list[int]]        # per row, each node's parent node (-1: the last committed token)
    slots: list[list[int]]          # per row, each node's slot - first
    blocks: list[TreeBlock]
    serial: int                     # tells trees apart (`KVState.open_tree_serial`)

    @classmethod
    def empty(cls, first: int, batch_size: int, serial: int) -> "OpenTree":
        return cls(first, [[] for _ in range(batch_size)], [[] for _ in range(batch_size)],
                   [[] for _ in range(batch_size)], [], serial)

    def lineage(self, b: int, node: int) -> list[int]:
        """`node` and its ancestors in row b."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[b][node]
        return out

    def logits_of(self, b: int, node: int) -> torch.Tensor | None:
        for block in self.blocks:
            col = block.cols[b].get(node)
            if col is not None:
                return block.logits[b, col]
        return None

    def add_nodes(self, tokens: Sequence[Sequence[int]], parents: Sequence[Sequence[int]], offset: int) -> None:
        """Record row b's new nodes `tokens[b]` (tree-wide `parents[b]`) at slots first + offset + i."""
        for b, (t, p) in enumerate(zip(tokens, parents)):
            self.tokens[b].extend(t)
            self.parents[b].extend(p)
            self.slots[b].extend(offset + i for i in range(len(t)))

    def drop_trunk(self, b: int, n: int) -> None:
        """Forget row b's first n nodes (a chain from the root, just committed); the rest is
        renumbered from 0, its children of the trunk's end now children of the last committed token."""
        self.tokens[b] = self.tokens[b][n:]
        self.parents[b] = [p - n if p >= n else -1 for p in self.parents[b][n:]]
        self.slots[b] = self.slots[b][n:]
        for block in self.blocks:
            block.cols[b] = {node - n: col for node, col in block.cols[b].items() if node >= n}

    def committed_mask(self, slot_pos: torch.Tensor) -> torch.Tensor:
        """[B, S] bool on the CPU: the slots holding committed tokens (not the tree's), given the
        state's `slot_pos` [B, S]."""
        committed = (slot_pos >= 0).cpu()
        for b in range(committed.shape[0]):
            committed[b, [self.first + s for s in self.slots[b]]] = False
        return committed

    def roots_below(self, slot_pos: torch.Tensor, tokens: list[list[int]], parents: list[list[int]]
                    ) -> tuple[list[list[int]], tuple[torch.Tensor, torch.Tensor]]:
        """For nodes added to the tree (tree-wide `parents`): parents within the new block (-1 for a
        node whose parent is committed or in the tree) and, for those roots, the past slots they see
        (the committed slots and their ancestors in the tree, [B, N, S]) and their depth [B, N]."""
        B, S = slot_pos.shape
        n_new = max((len(t) for t in tokens), default=0)
        committed = self.committed_mask(slot_pos)
        seen = torch.zeros(B, n_new, S, dtype=torch.bool)
        seen[:, :, :] = committed[:, None, :]
        depth = torch.zeros(B, n_new, dtype=torch.long)
        local = []
        for b, (_, par) in enumerate(zip(tokens, parents)):
            n = len(self.tokens[b])
            row = []
            for i, p in enumerate(par):
                if p >= n + i or p < -1:
                    raise ValueError("a node's parent must come before it (parents[i] < i)")
                row.append(p - n if p >= n else -1)
                if 0 <= p < n:
                    line = self.lineage(b, p)
                    seen[b, i, [self.first + self.slots[b][a] for a in line]] = True
                    depth[b, i] = len(line)
            local.append(row)
        return local, (seen, depth)
