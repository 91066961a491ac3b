"""Draft trees: the data a drafter hands to the engine, and the pure functions that build and lay them out.

A `DraftTree` is one row's proposal. Node 0 is the *root*: the context's last token (it is not
drafted and carries no token id here). Every other node i holds a drafted token `tokens[i]`, its
parent `parents[i]` (< i), and its depth. A node that was expanded holds the draft distribution q
it was expanded from (`draft_probs[i]`, [V] float, or None when the drafter is deterministic, e.g.
prompt lookup) and the drafts in the scheme's draw order (`drafts[i]`, duplicates kept: the
verifier needs the raw draws; equal tokens share one child node).

`forward_inputs` lays a tree out for `KVState.forward_tree`, which builds the attention mask from
the parents (EAGLE-style: a node sees its ancestors and itself, at position offset = its depth).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    """One row's token tree. Index 0 is the root (the last context token, not drafted)."""

    tokens: list[int] = field(default_factory=lambda: [-1])           # [N] token id per node (root: -1)
    parents: list[int] = field(default_factory=lambda: [-1])          # [N] parent index (root: -1)
    draft_probs: list[torch.Tensor | None] = field(default_factory=lambda: [None])  # [N] q [V] at expanded nodes
    drafts: list[list[int] | None] = field(default_factory=lambda: [None])          # [N] raw draws at expanded nodes
    path_prob: list[float] = field(default_factory=lambda: [1.0])     # [N] drafter's probability of the path

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        expanded = sum(d is not None for d in self.drafts)
        return f"DraftTree(nodes={len(self) - 1}, depth={max(self.depths())}, expanded={expanded})"

    @property
    def num_drafted(self) -> int:
        """Drafted nodes (all but the root)."""
        return len(self.tokens) - 1

    def depths(self) -> list[int]:
        """Depth of every node (root 0)."""
        return node_depths(self.parents)

    def children(self, node: int) -> dict[int, int]:
        """token id -> child node index."""
        return {self.tokens[i]: i for i in range(1, len(self)) if self.parents[i] == node}

    def is_deterministic(self, node: int) -> bool:
        """Whether `node` was expanded without a draft distribution (lookup, or temperature 0):
        its children are verified by drawing y ~ p and matching it."""
        return self.drafts[node] is not None and self.draft_probs[node] is None


def add_children(tree: DraftTree, node: int, drafts: list[int], draft_probs: torch.Tensor | None,
                 child_probs: list[float] | None = None) -> list[int]:
    """Expand `node` with the scheme's draws `drafts` (duplicates merge into one child). Returns the
    child node index of each draw. `child_probs[j]`: the drafter's probability of draw j (for ranking)."""
    if tree.drafts[node] is not None:
        raise ValueError(f"node {node} is already expanded")
    tree.drafts[node] = list(drafts)
    tree.draft_probs[node] = draft_probs
    existing = tree.children(node)
    out = []
    for j, tok in enumerate(drafts):
        tok = int(tok)
        if tok not in existing:
            tree.tokens.append(tok)
            tree.parents.append(node)
            tree.draft_probs.append(None)
            tree.drafts.append(None)
            pr = child_probs[j] if child_probs is not None else 1.0
            tree.path_prob.append(tree.path_prob[node] * pr)
            existing[tok] = len(tree.tokens) - 1
        out.append(existing[tok])
    return out


def tree_from_sequences(sequences: list[list[int]]) -> DraftTree:
    """A deterministic tree (a trie) from draft sequences, e.g. prompt-lookup continuations. Every
    node's `drafts` lists its distinct children; `draft_probs` stays None."""
    tree = DraftTree()
    kids: dict[int, list[int]] = {}
    for seq in sequences:
        node = 0
        for tok in seq:
            tok = int(tok)
            found = None
            for c in kids.get(node, []):
                if tree.tokens[c] == tok:
                    found = c
                    break
            if found is None:
                tree.tokens.append(tok)
                tree.parents.append(node)
                tree.draft_probs.append(None)
                tree.drafts.append(None)
                tree.path_prob.append(1.0)
                found = len(tree.tokens) - 1
                kids.setdefault(node, []).append(found)
                tree.drafts[node] = (tree.drafts[node] or []) + [tok]
            node = found
    return tree


def node_depths(parents: list[int]) -> list[int]:
    """Depth of every node (root or parent -1: depth 0). Requires parents[i] < i."""
    depth = []
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError("a node's parent must come before it (parents[i] < i)")
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def forward_inputs(tree: DraftTree, pending: int | None) -> tuple[list[int], list[int], list[int]]:
    """What `KVState.forward_tree` needs for this tree on top of a row's committed tokens.

    `pending`: a token already chosen but not yet in the cache (the last emitted token); it becomes
    the root node of the forward. Returns (tokens, parents, index) where index[i] is the forward
    position of tree node i (-1 for the root when there is no pending token: its distribution is the
    state's `last_logits`)."""
    tokens: list[int] = []
    parents: list[int] = []
    index = [-1] * len(tree)
    if pending is not None:
        tokens.append(int(pending))
        parents.append(-1)
        index[0] = 0
    for i in range(1, len(tree)):
        index[i] = len(tokens)
        tokens.append(tree.tokens[i])
        parents.append(index[tree.parents[i]])
    return tokens, parents, index


def node_path(tree: DraftTree, node: int) -> list[int]:
    """The token ids from the root's first child down to `node` ([] for the root)."""
    path = []
    while node > 0:
        path.append(tree.tokens[node])
        node = tree.parents[node]
    return path[::-1]


def leaf_paths(tree: DraftTree) -> list[list[int]]:
    """The token ids on the path from the root to every leaf, in node order ([] for an empty tree)."""
    has_child = set(tree.parents[1:])
    return [node_path(tree, i) for i in range(1, len(tree)) if i not in has_child]
