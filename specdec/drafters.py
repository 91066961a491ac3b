"""Drafters: propose a `DraftTree` per row on top of the target's current ids.

- `ModelDrafter(member)`: a small LM with the target's tokenizer. Expands the tree level by level,
  one drafter forward per depth (all frontier nodes of all rows in one `forward_tree`), n children
  per expanded node drawn by the scheme from that node's warped q. At temperature 0 it takes the
  top-n tokens of the drafter's logits (any drafts are lossless there). With `node_budget` only the
  most probable frontier nodes are expanded.
- `PromptLookupDrafter`: model-free. Suffix n-grams of prompt+output matched earlier in the same
  text give up to n distinct continuations, merged into a deterministic trie.
- `HybridDrafter(lookup, model)`: lookup where it finds a long enough continuation, the model
  elsewhere (a lookup-only step costs no drafter forward).

Contexts passed to `draft` are the full token ids of each row (committed + a pending token), or
None for rows that are finished.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from runtime.text_state import common_prefix_len
from runtime.errors import TokenizerMismatchError
from runtime.kv_state import KVState
from runtime.member import Member
from runtime.sampling import logits_to_probs
from specdec.tree import DraftTree, add_children, tree_from_sequences


class Drafter:
    """Base class. Subclasses implement `draft`."""

    name = "drafter"

    def bind(self, target: Member) -> None:
        """Called once by the engine with the target; raise if the pair cannot work."""

    def reset(self) -> None:
        """Forget any cached state (a new batch starts)."""

    def draft(self, contexts: Sequence[Sequence[int] | None], *, scheme: str, num_drafts: int,
              depth: int | Sequence[int],
              node_budget: int | None, temperature: float, top_k: int, top_p: float,
              generators: list[torch.Generator | None], limit: Sequence[int] | None = None) -> list[DraftTree]:
        """One tree per row. `depth`: the engine's tree depth per row; `limit`: the most tokens a row
        may still draft (a drafter with its own depth, like prompt lookup, stays within it)."""
        raise NotImplementedError

    def draft_continuations(self, contexts: Sequence[Sequence[int] | None], branches: Sequence[Sequence[Sequence[int]]],
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


def kept_prefix(tokens: Sequence[int], keep: Callable[[list[int]], bool]) -> list[int]:
    """The longest prefix of `tokens` every prefix of which (non-empty) satisfies `keep`."""
    out: list[int] = []
    for tok in tokens:
        if not keep(out + [int(tok)]):
            break
        out.append(int(tok))
    return out


def per_row(depth: int | Sequence[int], batch_size: int) -> list[int]:
    """A depth per row (the engine caps each row's depth by the tokens it may still emit)."""
    return [int(depth)] * batch_size if isinstance(depth, int) else [int(d) for d in depth]


def check_same_tokenizer(target: Member, drafter: Member) -> None:
    """Raise TokenizerMismatchError unless both members map the same strings to the same ids."""
    tv, dv = target.tokenizer.get_vocab(), drafter.tokenizer.get_vocab()
    if tv != dv:
        raise TokenizerMismatchError(
            f"drafter '{drafter.name}' and target '{target.name}' use different tokenizers "
            f"({len(dv)} vs {len(tv)} tokens); use a drafter from the target's family "
            f"(e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b) or the model-free --drafter lookup")


class ModelDrafter(Drafter):
    """A small model sharing the target's tokenizer; keeps its own KV state in sync with the target.

    `stop_below`: a node whose drafter distribution has top probability below this is not expanded
    further (dynamic draft length, like transformers' `assistant_confidence_threshold`): deep trees
    where the drafter is sure, no drafter forwards past the point where it is guessing. The tree
    shape depends only on the drafter, so verification stays lossless."""

    def __init__(self, member: Member, stop_below: float = 0.0):
        if not 0.0 <= stop_below < 1.0:
            raise ValueError(f"stop_below must be in [0, 1), got {stop_below}")
        self.member = member
        self.stop_below = float(stop_below)
        self.name = member.name
        self.state: KVState | None = None
        self.target_vocab: int | None = None

    def bind(self, target: Member) -> None:
        check_same_tokenizer(target, self.member)
        self.target_vocab = target.vocab_size

    def reset(self) -> None:
        self.state = None

    # ---- state sync ------------------------------------------------------------------------
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
    def draft_continuations(self, contexts, branches, depth, keep):
        """Greedy chains, one per branch: the branches of all rows go into one tree forward below the
        synced contexts, then each level extends every live chain by its argmax token in one more
        forward (`forward_tree(extend=True)`), so `max(depth)` drafter forwards at most."""
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
        extend = False
        V = self.target_vocab
        while live:
            at = [[end[k] for k in live if k[0] == b] for b in range(B)]
            logits = st.forward_tree(tokens, parents, logits_at=at, extend=extend)
            extend = True
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

    def _probs(self, logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
        """[..., V_target] draft distribution: the drafter's logits warped like the target's
        (temperature 0: the plain softmax, used only to rank drafts)."""
        V = self.target_vocab or logits.shape[-1]
        if logits.shape[-1] > V:
            logits = logits[..., :V]
        elif logits.shape[-1] < V:
            pad = torch.full((*logits.shape[:-1], V - logits.shape[-1]), float("-inf"), device=logits.device)
            logits = torch.cat([logits.float(), pad], dim=-1)
        if temperature == 0:
            return torch.softmax(logits.float(), dim=-1)
        return logits_to_probs(logits, temperature, top_k, top_p)

    def _expand(self, tree: DraftTree, node: int, q: torch.Tensor, scheme: str, n: int, temperature: float,
                generator) -> None:
        from specdec.drafts import sample_drafts

        if temperature == 0:
            top = torch.topk(q, n)
            add_children(tree, node, top.indices.tolist(), None, top.values.tolist())
            tree.draft_probs[node] = None  # deterministic drafts: verified by matching argmax p
            return
        support = int((q > 0).sum())
        n_eff = min(n, support) if scheme in ("without", "greedy") else n
        drafts = sample_drafts(q, n_eff, scheme, generator).tolist()
        add_children(tree, node, drafts, q, [float(q[t]) for t in drafts])

    @torch.no_grad()
    def draft(self, contexts, *, scheme, num_drafts, depth, node_budget, temperature, top_k, top_p, generators,
              limit=None):
        B = len(contexts)
        row_depth = per_row(depth, B)
        depth = max(row_depth, default=0)
        active = self.sync(contexts)
        trees = [DraftTree() for _ in range(B)]
        if depth < 1 or not any(active):
            return trees
        gens = generators or [None] * B
        st = self.state
        st._refresh()  # rows shortened to an exact prefix re-feed their last token
        root_q = self._probs(st.last_logits, temperature, top_k, top_p)
        frontier = [[0] if active[b] else [] for b in range(B)]
        node_q = [{0: root_q[b]} for b in range(B)]
        budget_left = [node_budget if node_budget else 10 ** 9 for _ in range(B)]
        chain = True
        committed: list[set[int]] = [set() for _ in range(B)]
        fwd_index: list[dict[int, int]] = [{} for _ in range(B)]
        open_node: list[dict[int, int]] = [{} for _ in range(B)]  # draft node -> node of the state's open tree
        for level in range(depth):
            new_frontier: list[list[int]] = [[] for _ in range(B)]
            for b in range(B):
                cands = frontier[b] if level < row_depth[b] else []
                if node_budget:
                    cands = sorted(cands, key=lambda i: -trees[b].path_prob[i])
                levels_left = max(row_depth[b] - level, 1)
                allow = budget_left[b] if not node_budget else max(num_drafts, budget_left[b] // levels_left)
                for node in cands:
                    if allow <= 0 or budget_left[b] <= 0:
                        break
                    n = min(num_drafts, budget_left[b]) if node_budget else num_drafts
                    before = len(trees[b])
                    self._expand(trees[b], node, node_q[b][node], scheme, n, temperature, gens[b])
                    added = len(trees[b]) - before
                    budget_left[b] -= added
                    allow -= added
                    new_frontier[b].extend(range(before, len(trees[b])))
            frontier = new_frontier
            if level == depth - 1 or not any(frontier):
                break
            # one drafter forward gives q at the new frontier of every row. While each row's tree is
            # a chain, its nodes are committed (append: one token per row per forward; the next
            # sync rolls rejected ones back); once a row branches, the uncommitted nodes go into a
            # tree hanging below the committed chain, open in the drafter's state, which each later
            # level extends by its new nodes only (`forward_tree(extend=True)`).
            if chain and all(len(f) <= 1 for f in frontier):
                logits = st.append([[trees[b].tokens[f[0]]] if f else [] for b, f in enumerate(frontier)])
                for b, f in enumerate(frontier):
                    if f:
                        fwd_index[b] = {f[0]: 0}
                        committed[b].add(f[0])
            else:
                extend, chain = not chain, False
                toks, pars, new = [], [], []
                for b, t in enumerate(trees):
                    tk, pr = [], []
                    fresh = [i for i in range(1, len(t)) if i not in committed[b] and i not in open_node[b]]
                    for i in fresh:
                        open_node[b][i] = len(open_node[b])
                        tk.append(t.tokens[i])
                        pr.append(open_node[b].get(t.parents[i], -1))  # parent committed (chain tip) -> -1
                    toks.append(tk)
                    pars.append(pr)
                    new.append(fresh)
                # LM head only at the frontier (rows without one ask for a new node or nothing)
                at = [[open_node[b][node] for node in frontier[b]] or ([open_node[b][new[b][0]]] if new[b] else [])
                      for b in range(B)]
                logits = st.forward_tree(toks, pars, logits_at=at, extend=extend)
                for b in range(B):
                    fwd_index[b] = {node: k for k, node in enumerate(frontier[b])}
            rows = [b for b in range(B) for _ in frontier[b]]
            cols = [fwd_index[b][node] for b in range(B) for node in frontier[b]]
            qs = self._probs(logits[rows, cols], temperature, top_k, top_p)  # one warp for all rows
            for j, (b, node) in enumerate(zip(rows, (n for b in range(B) for n in frontier[b]))):
                node_q[b][node] = qs[j]
            if self.stop_below > 0:
                sure = iter((qs.max(dim=-1).values >= self.stop_below).tolist())  # same order as `rows`
                frontier = [[node for node in f if next(sure)] for f in frontier]
        return trees


class PromptLookupDrafter(Drafter):
    """Model-free drafts: continuations of earlier occurrences of the context's last n-gram
    (n from `ngram_max` down to `ngram_min`), most recent first, up to `num_drafts` distinct ones of
    up to `depth` tokens (both default to the engine's values)."""

    name = "lookup"

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1, num_drafts: int | None = None,
                 depth: int | None = None, min_length: int = 1):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.num_drafts, self.depth, self.min_length = num_drafts, depth, min_length

    def continuations(self, ctx: Sequence[int], num_drafts: int, depth: int) -> list[list[int]]:
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

    def draft(self, contexts, *, scheme, num_drafts, depth, node_budget, temperature, top_k, top_p, generators,
              limit=None):
        n = self.num_drafts or num_drafts
        depths = per_row(depth, len(contexts))
        limits = per_row(limit, len(contexts)) if limit is not None else depths
        ks = [min(self.depth, lim) if self.depth else d for d, lim in zip(depths, limits)]
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


class HybridDrafter(Drafter):
    """Prompt lookup where it finds a continuation of at least `min_match` tokens, else the model
    drafter (rows using lookup this step cost the drafter nothing)."""

    def __init__(self, model: ModelDrafter, lookup: PromptLookupDrafter | None = None, min_match: int = 2):
        self.model = model
        self.lookup = lookup or PromptLookupDrafter(ngram_max=3, ngram_min=2, num_drafts=1, depth=8, min_length=2)
        self.min_match = min_match
        self.name = f"hybrid({self.model.name}+lookup)"

    def bind(self, target):
        self.model.bind(target)

    def reset(self):
        self.model.reset()

    def draft(self, contexts, **kw):
        look = self.lookup.draft(contexts, **kw)
        use_model = [c is not None and max(t.depths()) < self.min_match for c, t in zip(contexts, look)]
        if not any(use_model):
            return look
        model_trees = self.model.draft([c if u else None for c, u in zip(contexts, use_model)], **kw)
        return [m if u else t for m, t, u in zip(model_trees, look, use_model)]

    def draft_continuations(self, contexts, branches, depth, keep):
        """Lookup drafts where they are at least `min_match` tokens (or the branch needs fewer), the
        model's for the other branches."""
        look = self.lookup.draft_continuations(contexts, branches, depth, keep)
        rest = [[0 if len(d) >= min(self.min_match, k) else k for d, k in zip(row, ks)] for row, ks in zip(look, depth)]
        if not any(any(r) for r in rest):
            return look
        model = self.model.draft_continuations(contexts, branches, rest, keep)
        return [[m if k else d for d, m, k in zip(lr, mr, ks)] for lr, mr, ks in zip(look, model, rest)]


def quantize_int8(member: Member) -> Member:
    """A copy of `member` whose decoder Linear layers are dynamically quantized to int8 (CPU, fbgemm);
    embeddings and the LM head stay as they are. For drafters only: a cheaper q never changes what
    the target outputs (verification is lossless for any q), it only changes acceptance."""
    import copy
    import warnings

    from runtime.packed_linear import is_packed

    if is_packed(member.model):
        raise ValueError(f"int8 drafter: {member.name} has packed weights; load it with pack_weights=False")
    model = copy.deepcopy(member.model)
    inner = getattr(model, "model", None)
    if inner is None:
        raise ValueError("int8 drafter: expected a *ForCausalLM with a .model decoder")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.model = torch.ao.quantization.quantize_dynamic(inner, {torch.nn.Linear}, dtype=torch.qint8)
    return Member(model, member.tokenizer, name=f"{member.name}-int8", use_chat_template=member.use_chat_template)


# Measured on the Qwen 1.5B/0.5B pair on a 2-core AVX2 CPU (benchmarks/specdec_speed.py, docs/results/specdec/):
# with packed weights a target forward over 9 tokens costs ~1.4x a one-token forward while every 0.5B drafter
# forward costs ~0.3x one, so one chain beats wider trees: up to 8 tokens, cut where the drafter's top
# probability is below 0.4. Prompt lookup: one gated continuation (a >= 2-gram match, >= 2 tokens) of up to 8.
DEFAULT_STOP_BELOW = 0.4
DEFAULT_SHAPE = dict(scheme="greedy", num_drafts=1, depth=8)  # the same measured winner for both kinds


def default_shape(drafter: Drafter | None = None) -> dict:
    """The measured default tree shape (scheme, num_drafts, depth); today one shape for every drafter."""
    return dict(DEFAULT_SHAPE)


def make_drafter(spec, dtype: str = "float32", stop_below: float = DEFAULT_STOP_BELOW,
                 load: Callable[[str], Member] | None = None) -> Drafter | None:
    """A drafter from a spec: None/'none' -> None; 'lookup' -> gated prompt lookup; 'hybrid:NAME' ->
    lookup, else the model; a registry name / folder / hub id or a `Member` -> a model drafter; a
    trailing '@int8' on a name quantizes the drafter's decoder layers to int8 (CPU); a `Drafter` is
    returned as is. `load(name)` loads members (default `runtime.member.load_member`)."""
    if isinstance(spec, Drafter):
        return spec
    if isinstance(spec, Member):
        return ModelDrafter(spec, stop_below=stop_below)
    if not spec or spec == "none":
        return None
    if spec == "lookup":
        return PromptLookupDrafter(ngram_max=3, ngram_min=2, min_length=2)
    from runtime.member import load_member

    def model(name: str) -> ModelDrafter:
        if name.endswith("@int8"):
            m = quantize_int8(load_member(name[: -len("@int8")], dtype=dtype, pack_weights=False))
        else:
            m = load(name) if load is not None else load_member(name, dtype=dtype)
        return ModelDrafter(m, stop_below=stop_below)

    if spec.startswith("hybrid:"):
        return HybridDrafter(model(spec.split(":", 1)[1]))
    return model(spec)
