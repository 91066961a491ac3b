"""Token trees over a `KVState`'s committed rows, not committed themselves: the one owner of a tree's
nodes, their numbering, their trie and the logits after them.

- `TokenTrie`: per row, token tries (shared prefixes are one node; parent -1 is the row's last
  committed token), nodes numbered in the order added. A plain builder; runs nothing.
- `OpenTree`: a `TokenTrie` fed to a member's state (`KVState.new_tree()`): `grow` feeds the nodes
  added since the last `grow` in one forward (the first `grow` opens the tree in the state; each later
  one hangs its nodes below the tree without re-feeding it), `logits(b, node)` / `gather(nodes)` read
  the logits after fed nodes, `accept(paths)` commits one root-to-node chain per row and frees the
  rest. Any other operation on the state discards the open tree (`is_open` turns False).

Nothing here runs a model but through its state (`KVState.grow_tree`). A tree's slots start at
`first`; its fed nodes' slots are stored relative to it. `roots_below` says, for nodes a later
forward hangs below the tree, which past slots they see and how deep they sit (the inputs
`runtime.tree_mask.tree_inputs` takes as `seen` / `root_depth`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch


class TreeHost(Protocol):
    """What a tree needs of its state (`runtime.kv_state.KVState`, which imports this module)."""

    batch_size: int
    member: Any
    tree: "OpenTree | None"

    def grow_tree(self, tree: "OpenTree", logits_at: Sequence[Sequence[int]] | None) -> torch.Tensor | None: ...

    def accept(self, paths: Sequence[Sequence[int]]) -> None: ...


@dataclass
class TreeBlock:
    """The logits of one forward of an open tree: row b's node n (tree-wide number) is column
    `cols[b][n]` of `logits` [B, K, V]."""

    logits: torch.Tensor
    cols: list[dict[int, int]]


class TokenTrie:
    """Per-row token tries: nodes (token, parent) numbered per row in the order added; a
    (parent, token) pair added twice is one node (`add`) unless added raw (`add_nodes`)."""

    def __init__(self, batch_size: int):
        self.tokens: list[list[int]] = [[] for _ in range(batch_size)]
        self.parents: list[list[int]] = [[] for _ in range(batch_size)]
        self.trie: list[dict[tuple[int, int], int]] = [{} for _ in range(batch_size)]

    @property
    def batch_size(self) -> int:
        return len(self.tokens)

    def add(self, b: int, ids: Sequence[int]) -> int:
        """Add a root-to-node path of row b (shared prefixes reuse their nodes); returns its last node
        (-1 for an empty path)."""
        node, trie = -1, self.trie[b]
        for tok in ids:
            nxt = trie.get((node, tok))
            if nxt is None:
                nxt = trie[(node, tok)] = len(self.tokens[b])
                self.tokens[b].append(tok)
                self.parents[b].append(node)
            node = nxt
        return node

    def add_nodes(self, tokens: Sequence[Sequence[int]], parents: Sequence[Sequence[int]]) -> None:
        """Add row b's nodes `tokens[b]` as they are, numbered on from its nodes, `parents[b]` in those
        tree-wide numbers (a parent comes before its child; repeats stay separate nodes)."""
        for b, (t, p) in enumerate(zip(tokens, parents)):
            if len(t) != len(p):
                raise ValueError("tokens and parents must have the same length per row")
            for tok, par in zip(t, p):
                n = len(self.tokens[b])
                if not -1 <= par < n:
                    raise ValueError("a node's parent must come before it (parents[i] < i)")
                self.trie[b].setdefault((int(par), int(tok)), n)
                self.tokens[b].append(int(tok))
                self.parents[b].append(int(par))

    def child(self, b: int, node: int, token: int) -> int | None:
        """Row b's node below `node` (-1: the committed tokens) by `token`, if there is one."""
        return self.trie[b].get((node, token))

    def path(self, b: int, ids: Sequence[int]) -> list[int] | None:
        """The nodes of `ids` hanging off row b's committed tokens, or None if not all are in."""
        node, out = -1, []
        for tok in ids:
            node = self.trie[b].get((node, tok))
            if node is None:
                return None
            out.append(node)
        return out

    def lineage(self, b: int, node: int) -> list[int]:
        """`node` and its ancestors in row b."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[b][node]
        return out


def below(parents: Sequence[int], roots: Sequence[int]) -> set[int]:
    """`roots` and every node under them, in a tree given by parent indices (parents[i] < i)."""
    out = set(roots)
    for i, p in enumerate(parents):
        if p in out:
            out.add(i)
    return out


class OpenTree(TokenTrie):
    """A token tree of a `KVState` (see the module docstring): nodes are added (`add`, `add_nodes`),
    fed (`grow`), read (`logits`, `gather`) and one chain per row kept (`accept`)."""

    def __init__(self, state: TreeHost):
        super().__init__(state.batch_size)
        self.state = state
        self.first: int | None = None       # the tree's first slot (None: never fed)
        self.slots: list[list[int]] = [[] for _ in range(state.batch_size)]  # per fed node, its slot - first
        self.blocks: list[TreeBlock] = []

    @property
    def fed(self) -> list[int]:
        """Per row, how many of its nodes (the first ones) are fed."""
        return [len(s) for s in self.slots]

    @property
    def is_open(self) -> bool:
        """Whether this is the tree open in its state (fed, and not discarded since)."""
        return self.state.tree is self

    def grow(self, logits_at: Sequence[Sequence[int]] | None = None) -> torch.Tensor | None:
        """Feed every node added since the last `grow` in one forward (`KVState.grow_tree`). Returns
        their logits [B, N, V] (row b's i-th = its i-th new node), or with `logits_at` (per row, tree-wide
        numbers of new nodes) only those [B, K, V] in that order (the LM head is the costly part with
        large vocabularies); None when nothing was fed."""
        return self.state.grow_tree(self, logits_at)

    def logits(self, b: int, node: int) -> torch.Tensor | None:
        """The logits [V] after row b's `node` (None: not fed, or fed without logits)."""
        for block in self.blocks:
            col = block.cols[b].get(node)
            if col is not None:
                return block.logits[b, col]
        return None

    def gather(self, nodes: Sequence[Sequence[int]]) -> torch.Tensor:
        """Logits [B, K, V] after the given nodes (per row); row b's k-th = nodes[b][k] (rows with fewer
        repeat their last; a row with none gets zeros)."""
        width = max((len(r) for r in nodes), default=0)
        vocab = self.blocks[0].logits.shape[-1] if self.blocks else self.state.member.vocab_size
        out = torch.zeros(self.batch_size, width, vocab, dtype=torch.float32, device=self.state.member.device)
        for b, row in enumerate(nodes):
            for k, node in enumerate(list(row) + list(row[-1:]) * (width - len(row))):
                found = self.logits(b, node)
                if found is None:
                    raise RuntimeError(f"row {b}: node {node} of the open tree has no logits")
                out[b, k] = found
        return out

    def accept(self, paths: Sequence[Sequence[int]]) -> None:
        """Commit, per row, a root-to-node chain of fed nodes (may be empty; it must end at a node
        with logits); every other node is freed and the tree is closed (`KVState.accept`)."""
        if not self.is_open:
            raise RuntimeError("accept() on a tree that is not open in its state (another operation discarded it)")
        self.state.accept(paths)

    # ---- the state's bookkeeping (`KVState`) ----------------------------------------------------
    def record(self, first_new: int, logits: torch.Tensor | None, at: Sequence[Sequence[int]] | None) -> None:
        """Record the nodes just fed (each row's unfed ones, `at`: those given logits, numbered within
        the new nodes; None: all), the first of them at slot first + first_new, and their logits."""
        fed = self.fed
        for b in range(self.batch_size):
            self.slots[b].extend(first_new + i for i in range(len(self.tokens[b]) - fed[b]))
        if logits is not None:
            cols = ([{fed[b] + i: i for i in range(len(self.tokens[b]) - fed[b])} for b in range(self.batch_size)]
                    if at is None else [{fed[b] + i: k for k, i in enumerate(row)} for b, row in enumerate(at)])
            self.blocks.append(TreeBlock(logits, cols))

    def drop_trunk(self, b: int, n: int) -> None:
        """Forget row b's first n nodes (a chain from the root, just committed); the rest is
        renumbered from 0, its children of the trunk's end now children of the last committed token."""
        self.tokens[b] = self.tokens[b][n:]
        self.parents[b] = [p - n if p >= n else -1 for p in self.parents[b][n:]]
        self.slots[b] = self.slots[b][n:]
        self.trie[b] = {}
        for i, (tok, par) in enumerate(zip(self.tokens[b], self.parents[b])):
            self.trie[b].setdefault((par, tok), i)
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
        """For nodes hung below the fed tree (tree-wide `parents`): parents within the new block (-1 for
        a node whose parent is committed or fed before) and, for those roots, the past slots they see
        (the committed slots and their ancestors in the tree, [B, N, S]) and their depth [B, N]."""
        B, S = slot_pos.shape
        n_new = max((len(t) for t in tokens), default=0)
        committed = self.committed_mask(slot_pos)
        seen = torch.zeros(B, n_new, S, dtype=torch.bool)
        seen[:, :, :] = committed[:, None, :]
        depth = torch.zeros(B, n_new, dtype=torch.long)
        local = []
        for b, par in enumerate(parents):
            n = len(self.slots[b])
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
