"""`KVState`: the token ids and KV cache of a batch of rows of one member, and every operation on them.

Operations (one model forward each, plus one that re-feeds rows rolled back before, if any):

- `append(tokens)`              commit tokens to each row, returns their logits;
- `next_probs(...)`             next-token distribution after warping (temperature / top-k / top-p);
- `new_tree()` -> `OpenTree`     a token tree: `grow` feeds its new nodes in one forward (later grows
                                 hang below it, nothing re-fed), `accept(paths)` keeps one chain per
                                 row; `forward_tree(tokens, parents)` is a fresh tree fed at once, and
                                 `append_open` commits tokens and opens a tree below them in one forward;
- `score(continuations)`        log-probs of several continuations per row in one forward (a few when
                                 their logits would pass `SCORE_LOGITS_BYTES`), no commit;
- `rollback(lengths)`           shorten rows (the last logits are refreshed lazily);
- `load_prefix` / `extend_without_logits`  prefill from chunk KV (`runtime.prefix_cache`).

Every forward checks the logits it was asked for once (`torch.isfinite` of their sum): NaN / inf
(a bf16 overflow, broken weights) raise `runtime.errors.NonFiniteLogitsError` naming the member,
rather than being sampled from.

Rows may have different lengths. The cache is a slot array shared by all rows; `slot_pos[b, j]` is
the position id of slot j in row b, or -1 when the slot is free (padding, rejected tree nodes,
rolled-back tokens). Every forward builds its own 4-D masks from `slot_pos`
(`runtime.tree_mask.tree_inputs`: tree masks, per-node positions, sliding windows), so holes cost a
little attention but never change results; `runtime.logits_plan` says which logits it computes. Free
slots are dropped at the end and compacted away when they dominate the cache. The open tree
(at most one per state) is `runtime.open_tree.OpenTree`, which owns its nodes and their logits.
"""
from __future__ import annotations

from typing import Sequence

import torch

from runtime.counters import ModelRunner
from runtime.errors import NonFiniteLogitsError
from runtime.forward_group import current_group
from runtime.logits_plan import LogitsPlan
from runtime.model_calls import execute_forwards
from runtime.open_tree import OpenTree
from runtime.prefix_cache import ChunkKV, stacked_layer
from runtime.sampling import logits_to_probs
from runtime.tree_mask import TreeInputs, tree_inputs


# float32 logits one `score` forward of one state may hold (bytes): views run together stack their
# states' forwards, so a stacked forward holds up to this much per view
SCORE_LOGITS_BYTES = 2 ** 28


def score_groups(continuations: Sequence[Sequence[Sequence[int]]], max_positions: int) -> list[tuple[int, int]]:
    """Consecutive ranges [lo, hi) of continuation indices such that each forward's logits grid (rows x
    the longest row's tokens in the range: rows are padded) stays within `max_positions`; a range holds
    at least one index; one range when everything fits (also when there are no continuations)."""
    rows, width = len(continuations), max((len(c) for c in continuations), default=0)
    ranges, lo = [], 0
    used = [0] * rows
    for i in range(width):
        need = [len(conts[i]) if i < len(conts) else 0 for conts in continuations]
        if i > lo and rows * max(u + n for u, n in zip(used, need)) > max_positions:
            ranges.append((lo, i))
            lo, used = i, [0] * rows
        used = [u + n for u, n in zip(used, need)]
    ranges.append((lo, max(width, lo)))
    return ranges


class KVState:
    """Token ids + KV cache of a batch of rows of one member. See the module docstring."""

    def __init__(self, member: ModelRunner, batch_size: int):
        from runtime.kv_cache import (
            GrowableCache,  # (imports transformers: only once a state is made)
        )

        self.member = member
        self.batch_size = batch_size
        self.cache = GrowableCache()
        self.ids: list[list[int]] = [[] for _ in range(batch_size)]
        self.slots: list[list[int]] = [[] for _ in range(batch_size)]  # slot of each committed token
        self.slot_pos = torch.empty(batch_size, 0, dtype=torch.long, device=member.device)
        self.last_logits: torch.Tensor | None = None  # [B, V] float32, after each row's last token
        self._tree: OpenTree | None = None
        self._stale: set[int] = set()  # rows whose last_logits predate a rollback

    def __repr__(self) -> str:
        return f"KVState(member={self.member.name!r}, rows={self.batch_size}, lengths={self.lengths}, slots={self.num_slots})"

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.ids]

    @property
    def num_slots(self) -> int:
        return int(self.slot_pos.shape[1])

    # ---- the one forward -------------------------------------------------------------------
    def _forward(
        self,
        tokens: list[list[int]],   # per row, N_b new tokens
        parents: list[list[int]],  # per row, parent index within the row's new tokens; -1 = last committed
        keep: str,                 # "all" | "last" | "none" | "at": which logits to compute (`LogitsPlan`)
        at: Sequence[Sequence[int]] | None = None,  # keep="at": per row, node indices wanted
        roots: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor | None, int]:
        """Feed new tokens as a forest hanging off each row's committed sequence. Returns
        (logits [B, N, V] float32 or [B, V] for keep="last", and the first new slot index).
        `roots` = (seen [B, N, S] bool, depth [B, N] long) puts the roots of the new block (parent
        -1) elsewhere: root i of row b sees exactly the past slots seen[b, i] and sits at depth
        depth[b, i] past the row's committed tokens (an open tree's nodes below which it hangs)."""
        S = self.num_slots
        if max((len(t) for t in tokens), default=0) == 0:
            return None, S
        member = self.member
        device = member.device
        seen, root_depth = roots if roots is not None else (None, None)
        inputs = tree_inputs(tokens, parents, self.slot_pos.cpu(), self.lengths, seen=seen, root_depth=root_depth,
                             sliding_window=member.sliding_window if member.has_sliding else None)
        plan = LogitsPlan.make(keep, tokens, inputs.valid, at, device=device)
        logits, compacted = self._run_model(inputs, plan, device)
        out = plan.read(logits, compacted)
        # one check per forward: a sum of logits is finite iff every entry is (they are far from float32's
        # range), and summing costs ~1/20 of isfinite(out).all(); filler positions are told apart on failure
        if out is not None and not bool(torch.isfinite(out.sum())):
            self._refuse_non_finite(out, plan)
        pos = inputs.position_ids
        new_pos = torch.where(inputs.valid, pos, torch.full_like(pos, -1)).to(device)
        self.slot_pos = torch.cat([self.slot_pos, new_pos], dim=1)
        return out, S

    def _refuse_non_finite(self, logits: torch.Tensor, plan: LogitsPlan) -> None:
        """Raise `NonFiniteLogitsError` naming the member if a position asked for has NaN / inf
        logits (filler positions, e.g. padding, may hold anything)."""
        bad = ~torch.isfinite(logits).all(dim=-1) & plan.wanted().to(logits.device)
        if bool(bad.any()):
            row = int(bad.nonzero()[0][0])
            dtype = str(self.member.dtype).replace("torch.", "")
            fix = ("its weights hold NaN/inf or overflow: check the model files (fetch it again)" if dtype == "float32"
                   else f"its activations overflow in {dtype}: load it in float32")
            raise NonFiniteLogitsError(f"member '{self.member.name}' gave NaN/inf logits (row {row}, after "
                                       f"{len(self.ids[row])} tokens), so nothing can be sampled; {fix}")

    def _run_model(self, inputs: TreeInputs, plan: LogitsPlan, device: torch.device) -> tuple[torch.Tensor, bool]:
        """One model call on the cache; counts it. Returns (the model's logits, whether the packed LM
        head compacted them). Packed layers skip padding; "at" / "last" may compact the head. Inside
        `runtime.forward_group.run_together` the call waits for the other threads' forwards and goes
        through the model with those of the same model (`execute_forwards`)."""
        joined = current_group()
        if joined is not None:
            group, index = joined
            return group.forward(index, self.member.model, (self, inputs, plan), execute_forwards)
        return execute_forwards([(self, inputs, plan)])[0]

    # ---- public operations -----------------------------------------------------------------
    def load_prefix(self, ids: Sequence[Sequence[int]], chunks: Sequence[Sequence[ChunkKV]]) -> None:
        """Append precomputed KV (`Member.prefix_chunks`) of `ids[b]` to each row of a state whose
        rows have no free slots (a fresh state, or one only ever extended this way)."""
        if any(len(self.slots[b]) != self.num_slots for b in range(self.batch_size)) or self._tree is not None:
            raise RuntimeError("load_prefix() needs a state without free slots")
        S, B = self.num_slots, self.batch_size
        n = max(len(r) for r in ids)
        if n == 0:
            return
        device = self.member.device
        n_layers = max(len(kv) for row in chunks for kv in row)
        for i in range(n_layers):
            kv = stacked_layer(chunks, [len(r) for r in ids], i, n)
            if kv is not None:
                self.cache.update(kv[0], kv[1], i)
        pos = torch.full((B, n), -1, dtype=torch.long)
        for b, r in enumerate(ids):
            pos[b, : len(r)] = torch.arange(len(r)) + len(self.ids[b])
            self.ids[b].extend(r)
            self.slots[b].extend(range(S, S + len(r)))
            if r:
                self._stale.add(b)  # until the next append brings this row's last_logits
        self.slot_pos = torch.cat([self.slot_pos, pos.to(device)], dim=1)

    def extend_without_logits(self, tokens: Sequence[Sequence[int]]) -> int:
        """Commit the same number of tokens to every row without computing any logits (prefill
        chunks); returns the first new slot."""
        if len({len(t) for t in tokens}) != 1:
            raise ValueError("extend_without_logits() needs the same number of tokens per row")
        self._discard_tree()
        tokens = [list(t) for t in tokens]
        _, first = self._forward(tokens, [list(range(-1, len(t) - 1)) for t in tokens], "none")
        self._commit_rows(tokens, [list(range(first, first + len(t))) for t in tokens], None)
        return first

    @torch.no_grad()
    def append(self, tokens: Sequence[Sequence[int]], return_logits: bool = True) -> torch.Tensor | None:
        """Commit `tokens[b]` to row b (rows may get different counts, including none). Returns
        logits [B, N, V] for every appended position when `return_logits` (row b's valid ones are
        the first len(tokens[b])); updates `last_logits` for rows that got tokens."""
        self._discard_tree()
        tokens = [list(t) for t in tokens]
        self._stale.difference_update(b for b, t in enumerate(tokens) if t)
        parents = [list(range(-1, len(t) - 1)) for t in tokens]
        logits, first = self._forward(tokens, parents, "all" if return_logits else "last")
        if logits is None:
            return None
        last = logits[torch.arange(self.batch_size), [max(len(t) - 1, 0) for t in tokens]] if return_logits else logits
        self._commit_rows(tokens, [list(range(first, first + len(t))) for t in tokens], last)
        return logits if return_logits else None

    def _commit_rows(self, ids: Sequence[Sequence[int]], slots: Sequence[Sequence[int]],
                     last_logits: torch.Tensor | None) -> None:
        """Record committed tokens `ids[b]` at cache slots `slots[b]`; without `last_logits` the rows'
        next-token logits are stale until their next append."""
        if self.last_logits is None and last_logits is not None:
            self.last_logits = torch.zeros(self.batch_size, last_logits.shape[-1], dtype=torch.float32,
                                           device=last_logits.device)
        for b, (row_ids, row_slots) in enumerate(zip(ids, slots)):
            if not row_ids:
                continue
            self.ids[b].extend(row_ids)
            self.slots[b].extend(row_slots)
            if last_logits is None:
                self._stale.add(b)
            else:
                self.last_logits[b] = last_logits[b]

    def next_probs(self, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
        """[B, V] next-token distribution of each row after its last committed token."""
        if self.last_logits is None:
            raise RuntimeError("empty state: append a prompt first")
        self._refresh()
        return logits_to_probs(self.last_logits, temperature, top_k, top_p)

    # ---- open trees (`runtime.open_tree.OpenTree`) -------------------------------------------
    def new_tree(self) -> OpenTree:
        """A token tree over the rows' committed tokens, empty; its first `grow` opens it here
        (discarding any tree open then), and any other operation of this state discards it."""
        return OpenTree(self)

    @property
    def tree(self) -> OpenTree | None:
        """The tree open in this state (None: none)."""
        return self._tree

    @torch.no_grad()
    def grow_tree(self, tree: OpenTree, logits_at: Sequence[Sequence[int]] | None = None) -> torch.Tensor | None:
        """`OpenTree.grow`: feed the tree's nodes added since its last grow in one forward, hanging
        below the nodes fed before (not fed again); returns their logits (all, or `logits_at`'s)."""
        if tree.state is not self:
            raise RuntimeError("grow_tree() got a tree of another state")
        if tree.first is None:
            self._discard_tree()
            self._refresh()  # (a tree is only ever opened on fresh rows)
        elif self._tree is not tree:
            raise RuntimeError("this tree was discarded by another operation of its state: start a new one (new_tree())")
        fed = tree.fed
        tokens = [t[f:] for t, f in zip(tree.tokens, fed)]
        parents = [p[f:] for p, f in zip(tree.parents, fed)]
        if tree.first is None:
            local_parents, roots = parents, None
        else:
            local_parents, roots = tree.roots_below(self.slot_pos, tokens, parents)
        at = None if logits_at is None else [[int(i) - n for i in row] for row, n in zip(logits_at, fed)]
        if at is not None and any(i < 0 or i >= len(t) for row, t in zip(at, tokens) for i in row):
            raise ValueError("logits_at may only name nodes fed by this forward")
        before = self.num_slots
        logits, first = self._forward(tokens, local_parents, "all" if at is None else "at", at=at, roots=roots)
        if tree.first is None:
            tree.first, self._tree = first, tree
        tree.record(before - tree.first, logits, at)
        return logits

    def forward_tree(self, tokens: Sequence[Sequence[int]], parents: Sequence[Sequence[int]],
                     logits_at: Sequence[Sequence[int]] | None = None) -> torch.Tensor | None:
        """Score a token tree per row in one forward, without committing: `new_tree()`, its nodes
        (`parents[b][i]`: node i's parent among row b's nodes, -1 = the last committed token), `grow`.
        Returns logits [B, N, V] (the distribution after each node), or with `logits_at` only those
        nodes' [B, K, V] (rows with fewer repeat a valid column). Call `accept` next (or grow `tree`)."""
        tree = self.new_tree()
        tree.add_nodes(tokens, parents)
        return tree.grow(logits_at)

    @torch.no_grad()
    def append_open(self, tokens: Sequence[Sequence[int]], tree_tokens: Sequence[Sequence[int]],
                    tree_parents: Sequence[Sequence[int]]) -> OpenTree:
        """`append(tokens, return_logits=False)` and `forward_tree(tree_tokens, tree_parents)` in one
        forward: row b commits tokens[b] and opens a tree that hangs below its new last token
        (parent -1), every node with logits, numbered 0.. as if fed by `forward_tree` after the
        append. The same state and logits as the two calls, for the cost of one forward (a
        lazy flush of committed text can so carry guesses of what comes next). Returns the tree."""
        self._discard_tree()
        self._stale.difference_update(b for b, t in enumerate(tokens) if t)
        trunk = [len(t) for t in tokens]
        combined, parents, at = [], [], []
        for t, tt, tp, n in zip(tokens, tree_tokens, tree_parents, trunk):
            if len(tt) != len(tp):
                raise ValueError("tree_tokens and tree_parents must have the same length per row")
            combined.append(list(t) + list(tt))
            parents.append(list(range(-1, n - 1)) + [p + n if p >= 0 else n - 1 for p in tp])
            at.append(([n - 1] if n else []) + [n + i for i in range(len(tt))])
        tree = self.new_tree()
        tree.add_nodes(combined, parents)
        tree.grow(at)
        self._commit_trunk(tree, trunk)
        return tree

    def _commit_trunk(self, tree: OpenTree, trunk: Sequence[int]) -> None:
        """Commit the first trunk[b] nodes of row b's open tree (a chain from the root, the last one
        with logits); the rest stays open, renumbered from 0, its children of the trunk's end now
        children of the last committed token (-1)."""
        ids, slots, last = [], [], []
        for b, n in enumerate(trunk):
            ids.append(tree.tokens[b][:n])
            slots.append([tree.first + s for s in tree.slots[b][:n]])
            last.append(tree.logits(b, n - 1) if n else None)
            if n:
                tree.drop_trunk(b, n)
        if any(trunk):
            fill = next(x for x in last if x is not None)
            self._commit_rows(ids, slots, torch.stack([x if x is not None else fill for x in last]))

    def _discard_tree(self) -> None:
        if self._tree is not None:
            self.accept([[] for _ in range(self.batch_size)])

    def accept(self, paths: Sequence[Sequence[int]]) -> None:
        """Commit, per row, the node numbers of a root-to-node chain of the open tree (may be empty);
        all other tree nodes are freed. A path must end at a node that has logits."""
        tree = self._tree
        if tree is None:
            raise RuntimeError("accept() needs an open tree (forward_tree, OpenTree.grow)")
        last = None
        if any(paths):
            ends = []
            for b, path in enumerate(paths):
                found = tree.logits(b, path[-1]) if path else None
                if path and found is None:
                    raise RuntimeError("with logits_at, an accepted path must end at a node that has logits")
                ends.append(found)
            fill = next(e for e in ends if e is not None)
            last = torch.stack([e if e is not None else fill for e in ends])
        self._tree = None
        first = tree.first
        free = torch.zeros_like(self.slot_pos[:, first:], dtype=torch.bool)  # the tree's slots not kept
        for b, path in enumerate(paths):
            free[b, tree.slots[b]] = True
            if path:
                free[b, [tree.slots[b][i] for i in path]] = False
        self.slot_pos[:, first:] = self.slot_pos[:, first:].masked_fill(free.to(self.slot_pos.device), -1)
        if last is not None:
            self._stale.difference_update(b for b, path in enumerate(paths) if path)
            self._commit_rows([[tree.tokens[b][i] for i in path] for b, path in enumerate(paths)],
                              [[first + tree.slots[b][i] for i in path] for b, path in enumerate(paths)], last)
        # accepted nodes sit at depth 0..k-1 of the tree, so their positions already equal their
        # final positions; only the freed slots need compaction
        self._trim()

    @torch.no_grad()
    def score(self, continuations: Sequence[Sequence[Sequence[int]]],
              logits_budget: int = SCORE_LOGITS_BYTES) -> list[list[torch.Tensor]]:
        """Log-probs of each continuation's tokens given each row's committed prefix (continuations
        become branches of a tree; nothing is committed). Returns, per row and per continuation, a
        float32 tensor [len(continuation)]. One forward when the float32 logits of every row's
        continuations fit in `logits_budget` bytes; else consecutive groups of continuations (the
        same ones of every row) go in one forward each, each group within the budget where one
        continuation per row fits (8 rows x 8 answers of 40 tokens x a 152k vocabulary are 1.6 GB of
        logits in one forward; eight views stacked, 12 GB)."""
        if self.last_logits is None:
            raise RuntimeError("empty state: append a prompt first")
        self._discard_tree()
        self._refresh()
        last_lp = torch.log_softmax(self.last_logits.float(), dim=-1)
        out: list[list[torch.Tensor]] = [[] for _ in continuations]
        for lo, hi in score_groups(continuations, max(1, logits_budget // (4 * self.member.vocab_size))):
            self._score_group([conts[lo:hi] for conts in continuations], last_lp, out)
        return out

    def _score_group(self, continuations: Sequence[Sequence[Sequence[int]]], last_lp: torch.Tensor,
                     out: list[list[torch.Tensor]]) -> None:
        """`score` of some continuations per row, in one forward; appends to `out[b]`."""
        tokens, parents, spans = [], [], []
        for conts in continuations:
            t, p, s = [], [], []
            for c in conts:
                start = len(t)
                t.extend(c)
                p.extend([-1] + list(range(start, start + len(c) - 1)) if c else [])
                s.append((start, len(c)))
            tokens.append(t)
            parents.append(p)
            spans.append(s)
        logits, first = self._forward(tokens, parents, "all")
        self.slot_pos[:, first:] = -1
        self._trim()
        for b, conts in enumerate(continuations):
            lp = torch.log_softmax(logits[b], dim=-1) if logits is not None and tokens[b] else None
            for c, (start, n) in zip(conts, spans[b]):
                if n == 0:
                    out[b].append(torch.zeros(0))
                    continue
                ids = torch.tensor(c, device=last_lp.device)
                prev = torch.cat([last_lp[b : b + 1], lp[start : start + n - 1]], dim=0)
                out[b].append(prev.gather(-1, ids[:, None]).squeeze(-1).cpu())

    def rollback(self, lengths: Sequence[int]) -> None:
        """Shorten row b to `lengths[b]` tokens (>= 1; no-op where equal). A shortened row's
        `last_logits` is refreshed lazily (one re-fed token) unless new tokens are appended first."""
        self._discard_tree()
        for b, n in enumerate(lengths):
            if n > len(self.ids[b]):
                raise ValueError(f"row {b}: cannot roll back to {n} > current length {len(self.ids[b])}")
            if n == len(self.ids[b]):
                continue
            if n < 1:
                raise ValueError("rollback keeps at least one token per row")
            self.slot_pos[b, self.slots[b][n:]] = -1
            del self.ids[b][n:]
            del self.slots[b][n:]
            self._stale.add(b)
        self._trim()

    def refresh(self) -> None:
        """Bring every row's `last_logits` up to date (rows rolled back re-feed their last token; one
        forward for all of them, none when no row needs it)."""
        self._refresh()

    def set_next_logits(self, b: int, logits: torch.Tensor) -> None:
        """Row b's next-token logits are known already (e.g. the target logits a speculative step
        drew its kept last token from): record them instead of re-feeding the row's last token."""
        self.last_logits[b] = logits
        self._stale.discard(b)

    def _refresh(self) -> None:
        """Recompute `last_logits` of rolled-back rows by re-feeding their last token."""
        if not self._stale:
            return
        rows = sorted(self._stale)
        refeed: list[list[int]] = [[] for _ in range(self.batch_size)]
        for b in rows:
            self.slot_pos[b, self.slots[b][-1]] = -1
            self.slots[b].pop()
            refeed[b] = [self.ids[b].pop()]
        self._stale.clear()
        self.append(refeed, return_logits=False)

    def _trim(self) -> None:
        """Drop trailing free slots; compact when free slots dominate the cache."""
        valid = self.slot_pos >= 0
        if valid.numel() == 0:
            return
        any_valid = valid.any(dim=0)
        nz = torch.nonzero(any_valid)
        keep_to = int(nz[-1]) + 1 if len(nz) else 0
        S = self.num_slots
        if keep_to < S:
            self.cache.crop(keep_to - S)
            self.slot_pos = self.slot_pos[:, :keep_to]
        longest = max(self.lengths) if self.batch_size else 0
        if self.num_slots - longest > max(64, longest // 2):
            self.compact()

    def compact(self) -> None:
        """Gather each row's committed slots to the left of the cache (order kept)."""
        longest = max(self.lengths)
        device = self.slot_pos.device
        index = torch.zeros(self.batch_size, longest, dtype=torch.long)
        new_pos = torch.full((self.batch_size, longest), -1, dtype=torch.long)
        for b, slots in enumerate(self.slots):
            n = len(slots)
            if n:
                index[b, :n] = torch.tensor(slots)
                new_pos[b, :n] = self.slot_pos[b, slots].cpu()
        index = index.to(device)
        for layer in self.cache.layers:
            if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
                continue
            idx = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            keys = layer.keys.gather(2, idx)  # (both read before either is replaced)
            values = layer.values.gather(2, idx.expand(-1, -1, -1, layer.values.shape[-1]))
            layer.keys, layer.values = keys, values
        self.slot_pos = new_pos.to(device)
        self.slots = [list(range(len(s))) for s in self.slots]

