"""`ModelDrafter`: a small LM with the target's tokenizer drafts the tree (another tokenizer:
`specdec.text_drafter.TextDrafter`, which the engine picks by itself).

It expands the tree level by level, one drafter forward per depth (all frontier nodes of all rows
in one forward), n children per expanded node drawn by the scheme from that node's warped q. At
temperature 0 it takes the top-n tokens of the drafter's logits (any drafts are lossless there).
With a node budget only the most probable frontier nodes are expanded; with `stop_below` a node
where the drafter is unsure is not expanded (dynamic draft length).
"""
from __future__ import annotations

from typing import Sequence

import torch

from runtime.errors import TokenizerMismatchError
from runtime.kv_state import KVState
from runtime.member import Member
from runtime.open_tree import OpenTree
from runtime.sampling import SamplingParams
from runtime.text_state import common_prefix_len
from specdec.config import DraftLimit, TreeShape
from specdec.drafter_base import Drafter, resolve_limit
from specdec.drafts import sample_drafts
from specdec.tree import DraftTree, add_children

_NO_BUDGET = 10 ** 9


def same_tokenizer(target: Member, drafter: Member) -> bool:
    """Whether both members map the same strings to the same ids."""
    return target.tokenizer is drafter.tokenizer or target.tokenizer.get_vocab() == drafter.tokenizer.get_vocab()


def check_same_tokenizer(target: Member, drafter: Member) -> None:
    """Raise TokenizerMismatchError unless both members map the same strings to the same ids."""
    if not same_tokenizer(target, drafter):
        raise TokenizerMismatchError(
            f"drafter '{drafter.name}' and target '{target.name}' use different tokenizers "
            f"({len(drafter.tokenizer)} vs {len(target.tokenizer)} tokens); a ModelDrafter drafts in the "
            f"target's tokens: use specdec.text_drafter.TextDrafter (SpeculativeGenerator picks it by itself)")


def draft_distribution(logits: torch.Tensor, vocab: int | None, sampling: SamplingParams) -> torch.Tensor:
    """[..., V_target] draft distribution q from drafter logits [..., V_drafter]: cut or padded
    (with -inf) to the target's vocabulary `vocab`, then warped like the target's (temperature 0:
    the plain softmax, used only to rank drafts)."""
    V = vocab or logits.shape[-1]
    if logits.shape[-1] > V:
        logits = logits[..., :V]
    elif logits.shape[-1] < V:
        pad = torch.full((*logits.shape[:-1], V - logits.shape[-1]), float("-inf"), device=logits.device)
        logits = torch.cat([logits.float(), pad], dim=-1)
    if sampling.temperature == 0:
        return torch.softmax(logits.float(), dim=-1)
    return sampling.probs(logits)


def expand_node(tree: DraftTree, node: int, q: torch.Tensor, scheme: str, n: int, temperature: float,
                generator: torch.Generator | None) -> None:
    """Give `node` its children drawn from q by `scheme` (at temperature 0: the top-n tokens of q,
    recorded as deterministic drafts, verified by matching the target's argmax)."""
    if temperature == 0:
        top = torch.topk(q, n)
        add_children(tree, node, top.indices.tolist(), None, top.values.tolist())
        return
    support = int((q > 0).sum())
    n_eff = min(n, support) if scheme in ("without", "greedy") else n
    drafts = sample_drafts(q, n_eff, scheme, generator).tolist()
    add_children(tree, node, drafts, q, [float(q[t]) for t in drafts])


class ModelDrafter(Drafter):
    """A small model sharing the target's tokenizer; keeps its own KV state in sync with the target.

    `stop_below`: a node whose drafter distribution has top probability below this is not expanded
    further (dynamic draft length, like transformers' `assistant_confidence_threshold`): deep trees
    where the drafter is sure, no drafter forwards past the point where it is guessing. None: the
    `TreeShape`'s value; a number: this drafter's own (calibrated for it), whatever the shape says.
    The tree shape depends only on the drafter, so verification stays lossless."""

    def __init__(self, member: Member, stop_below: float | None = None):
        if stop_below is not None and not 0.0 <= stop_below < 1.0:
            raise ValueError(f"stop_below must be in [0, 1), got {stop_below}")
        self.member = member
        self.stop_below = None if stop_below is None else float(stop_below)
        self.name = member.name
        self.state: KVState | None = None
        self.target_vocab: int | None = None

    def __repr__(self) -> str:
        return f"ModelDrafter({self.name!r}, stop_below={self.stop_below})"

    def bind(self, target: Member) -> None:
        check_same_tokenizer(target, self.member)
        self.target_vocab = target.vocab_size

    def reset(self) -> None:
        self.state = None

    def sync(self, contexts: Sequence[Sequence[int] | None]) -> list[bool]:
        """Bring the drafter's rows to `contexts` (longest common prefix, then append the rest).
        Returns which rows are active."""
        active = [c is not None and len(c) > 0 for c in contexts]
        B = len(contexts)
        if self.state is None or self.state.batch_size != B or any(
                a and common_prefix_len(self.state.ids[b], contexts[b]) == 0 for b, a in enumerate(active)):
            self.state = self.member.start([list(c) if c else [0] for c in contexts])
            return active
        st = self.state
        keep, feed = [], []
        for b in range(B):
            if not active[b]:
                keep.append(len(st.ids[b]))
                feed.append([])
                continue
            ctx = contexts[b]
            lcp = common_prefix_len(st.ids[b], ctx)
            if lcp == len(ctx) and lcp < len(st.ids[b]):
                lcp -= 1  # re-feed the last token so its logits are fresh (no separate refresh forward)
            keep.append(max(lcp, 1))
            feed.append(list(ctx[max(lcp, 1):]))
        st.rollback(keep)
        if any(feed):
            st.append(feed, return_logits=False)
        return active

    @torch.no_grad()
    def draft(self, contexts, shape: TreeShape, sampling: SamplingParams, generators=None,
              limit: DraftLimit | None = None) -> list[DraftTree]:
        """Grow each active row's tree to its `limit.depth` (see `Drafter.draft`)."""
        B = len(contexts)
        row_depth = list(resolve_limit(limit, shape, B).depth)
        active = self.sync(contexts)
        if max(row_depth, default=0) < 1 or not any(active):
            return [DraftTree() for _ in range(B)]
        self.state.refresh()  # rows shortened to an exact prefix re-feed their last token
        stop_below = shape.stop_below if self.stop_below is None else self.stop_below
        growth = _Growth(self, shape, sampling, list(generators or [None] * B), row_depth, active)
        return growth.run(stop_below)

    @torch.no_grad()
    def draft_continuations(self, contexts, branches, depth, keep):
        """Greedy chains, one per branch: the branches of all rows go into one tree forward below the
        synced contexts, then each level extends every live chain by its argmax token in one more
        forward (`OpenTree.grow`, nothing re-fed), so `max(depth)` drafter forwards at most."""
        B = len(contexts)
        out: list[list[list[int]]] = [[[] for _ in row] for row in branches]
        live = [(b, i) for b in range(B) for i, br in enumerate(branches[b])
                if contexts[b] is not None and br and depth[b][i] > 0]
        if not live:
            return out
        rows = {b for b, _ in live}
        self.sync([contexts[b] if b in rows else None for b in range(B)])
        st = self.state
        tokens: list[list[int]] = [[] for _ in range(B)]
        parents: list[list[int]] = [[] for _ in range(B)]
        end: dict[tuple[int, int], int] = {}
        for b, i in live:  # each branch its own chain (a row's branches start with distinct tokens)
            for j, tok in enumerate(branches[b][i]):
                parents[b].append(len(tokens[b]) - 1 if j else -1)
                tokens[b].append(int(tok))
            end[(b, i)] = len(tokens[b]) - 1
        count = [len(t) for t in tokens]  # per row, nodes fed so far (tree-wide numbering)
        tree = st.new_tree()
        V = self.target_vocab
        while live:
            at = [[end[k] for k in live if k[0] == b] for b in range(B)]
            tree.add_nodes(tokens, parents)
            logits = tree.grow(at)
            nxt = {k: int(logits[k[0], at[k[0]].index(end[k]), :V].argmax()) for k in live}
            tokens, parents = [[] for _ in range(B)], [[] for _ in range(B)]
            still = []
            for b, i in live:
                draft = out[b][i] + [nxt[(b, i)]]
                if not keep(b, i, draft):
                    continue
                out[b][i] = draft
                if len(draft) < depth[b][i]:
                    parents[b].append(end[(b, i)])
                    tokens[b].append(draft[-1])
                    end[(b, i)] = count[b]
                    count[b] += 1
                    still.append((b, i))
            live = still
        return out


class _Growth:
    """One `ModelDrafter.draft` call: the rows' trees grown level by level.

    While each row's tree is a chain, its nodes are committed to the drafter's state (append: one
    token per row per forward; the next sync rolls rejected ones back); once a row branches, the
    uncommitted nodes go into a tree hanging below the committed chain, open in the drafter's
    state, which each later level extends by its new nodes only (`OpenTree.grow`)."""

    def __init__(self, drafter: ModelDrafter, shape: TreeShape, sampling: SamplingParams, gens: list,
                 row_depth: list[int], active: list[bool]):
        B = len(row_depth)
        self.drafter, self.shape, self.sampling, self.gens, self.row_depth = drafter, shape, sampling, gens, row_depth
        self.st = drafter.state
        self.trees = [DraftTree() for _ in range(B)]
        root_q = draft_distribution(self.st.last_logits, drafter.target_vocab, sampling)
        self.frontier: list[list[int]] = [[0] if active[b] else [] for b in range(B)]
        self.node_q: list[dict[int, torch.Tensor]] = [{0: root_q[b]} for b in range(B)]
        self.budget_left = [shape.node_budget if shape.node_budget else _NO_BUDGET for _ in range(B)]
        self.chain = True
        self.committed: list[set[int]] = [set() for _ in range(B)]
        self.fwd_index: list[dict[int, int]] = [{} for _ in range(B)]
        self.open_node: list[dict[int, int]] = [{} for _ in range(B)]  # draft node -> node of the open tree
        self.tree: OpenTree | None = None   # the drafter state's open tree, once a row branches

    def run(self, stop_below: float) -> list[DraftTree]:
        """Grow every row to its depth (a node below `stop_below` is not expanded); the trees."""
        depth = max(self.row_depth)
        for level in range(depth):
            self.frontier = [self._expand_row(b, level) for b in range(len(self.trees))]
            if level == depth - 1 or not any(self.frontier):
                break
            logits = self._forward_frontier()
            rows = [b for b, f in enumerate(self.frontier) for _ in f]
            cols = [self.fwd_index[b][node] for b, f in enumerate(self.frontier) for node in f]
            qs = draft_distribution(logits[rows, cols], self.drafter.target_vocab, self.sampling)  # one warp for all
            for j, (b, node) in enumerate(zip(rows, (n for f in self.frontier for n in f))):
                self.node_q[b][node] = qs[j]
            if stop_below > 0:
                sure = iter((qs.max(dim=-1).values >= stop_below).tolist())  # same order as `rows`
                self.frontier = [[node for node in f if next(sure)] for f in self.frontier]
        return self.trees

    def _expand_row(self, b: int, level: int) -> list[int]:
        """Expand row b's frontier at `level` within its budget; returns the new frontier."""
        shape, tree = self.shape, self.trees[b]
        budget = shape.node_budget
        cands = self.frontier[b] if level < self.row_depth[b] else []
        if budget:
            cands = sorted(cands, key=lambda i: -tree.path_prob[i])
        levels_left = max(self.row_depth[b] - level, 1)
        allow = self.budget_left[b] if not budget else max(shape.num_drafts, self.budget_left[b] // levels_left)
        new: list[int] = []
        for node in cands:
            if allow <= 0 or self.budget_left[b] <= 0:
                break
            n = min(shape.num_drafts, self.budget_left[b]) if budget else shape.num_drafts
            before = len(tree)
            expand_node(tree, node, self.node_q[b][node], shape.scheme, n, self.sampling.temperature, self.gens[b])
            added = len(tree) - before
            self.budget_left[b] -= added
            allow -= added
            new.extend(range(before, len(tree)))
        return new

    def _forward_frontier(self) -> torch.Tensor:
        """One drafter forward that yields logits at every row's new frontier (`fwd_index` maps a
        frontier node to its column)."""
        frontier, trees, st = self.frontier, self.trees, self.st
        if self.chain and all(len(f) <= 1 for f in frontier):
            logits = st.append([[trees[b].tokens[f[0]]] if f else [] for b, f in enumerate(frontier)])
            for b, f in enumerate(frontier):
                if f:
                    self.fwd_index[b] = {f[0]: 0}
                    self.committed[b].add(f[0])
            return logits
        if self.chain:  # the first branching level opens the tree; later levels grow it
            self.tree = st.new_tree()
        self.chain = False
        toks, pars, new = [], [], []
        for b, t in enumerate(trees):
            opened = self.open_node[b]
            fresh = [i for i in range(1, len(t)) if i not in self.committed[b] and i not in opened]
            tk, pr = [], []
            for i in fresh:
                opened[i] = len(opened)
                tk.append(t.tokens[i])
                pr.append(opened.get(t.parents[i], -1))  # parent committed (chain tip) -> -1
            toks.append(tk)
            pars.append(pr)
            new.append(fresh)
        # LM head only at the frontier (rows without one ask for a new node or nothing)
        at = [[self.open_node[b][node] for node in frontier[b]] or ([self.open_node[b][new[b][0]]] if new[b] else [])
              for b in range(len(trees))]
        self.tree.add_nodes(toks, pars)
        logits = self.tree.grow(at)
        for b in range(len(trees)):
            self.fwd_index[b] = {node: k for k, node in enumerate(frontier[b])}
        return logits


# weight formats a drafter may be compressed to: (torch dtype of the weights, dynamic qconfig)
DRAFTER_FORMATS = ("int8", "fp16")


def quantize_drafter(member: Member, fmt: str = "fp16") -> Member:
    """A copy of `member` whose decoder Linear layers AND LM head run through torch's dynamic
    quantized linears (CPU, fbgemm); the input embeddings stay as they are (a tied head gets its own
    copy). For drafters only: a cheaper q never changes what the target outputs (verification is
    lossless for any q), it only changes acceptance.

    fmt "fp16": weights stored in float16, activations and accumulation in float32 (half the bytes
    a forward streams, the same argmax); "int8": int8 weights per output channel, activations
    quantized per call (a quarter of the bytes, a coarser law). The head matters: it is 28 % of
    Qwen2.5-0.5B's weights (151,936 x 896). Measured on a 2-core AMD EPYC (AVX2 only, 2 threads, one
    token after 300, 2026-12-05): float32 packed 136 ms per forward, fp16 73 ms, int8 46 ms; greedy
    next-token agreement with float32 teacher-forced on 597 GSM8K tokens: fp16 100 %, int8 77.6 %."""
    import copy
    import warnings

    from torch.ao.quantization import float16_dynamic_qconfig, per_channel_dynamic_qconfig

    from runtime.packed_linear import is_packed

    if fmt not in DRAFTER_FORMATS:
        raise ValueError(f"drafter format {fmt!r}: use one of {', '.join(DRAFTER_FORMATS)}")
    if is_packed(member.model):
        raise ValueError(f"{fmt} drafter: {member.name} has packed weights; load it with pack_weights=False")
    if member.device.type != "cpu":
        raise ValueError(f"{fmt} drafter: {member.name} is on {member.device}, and torch's dynamic quantized "
                         f"linear runs on the CPU only; drop '@{fmt}' there (or load the drafter on the CPU)")
    if member.dtype != torch.float32:
        raise ValueError(f"{fmt} drafter: {member.name} is {member.dtype}; quantize it from float32 weights")
    model = copy.deepcopy(member.model)
    inner = getattr(model, "model", None)
    if inner is None:
        raise ValueError(f"{fmt} drafter: expected a *ForCausalLM with a .model decoder")
    dtype, qconfig = ((torch.float16, float16_dynamic_qconfig) if fmt == "fp16"
                      else (torch.qint8, per_channel_dynamic_qconfig))

    def quantize(module: torch.nn.Module) -> torch.nn.Module:
        return torch.ao.quantization.quantize_dynamic(module, {torch.nn.Linear: qconfig}, dtype=dtype)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.model = quantize(inner)
        head = model.get_output_embeddings()
        if isinstance(head, torch.nn.Linear):
            model.set_output_embeddings(quantize(torch.nn.Sequential(head))[0])
    return Member(model, member.tokenizer, name=f"{member.name}-{fmt}", use_chat_template=member.use_chat_template)


def quantize_int8(member: Member) -> Member:
    """`quantize_drafter(member, "int8")`."""
    return quantize_drafter(member, "int8")
