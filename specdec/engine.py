"""Lossless multi-draft speculative generation for any `Member`.

One step, per row: the drafter proposes a `DraftTree` on top of the row's ids; the target scores the
whole tree in ONE forward (`KVState.forward_tree`; the last emitted token rides along as the tree's
root, so it costs no extra forward); verification walks from the root — at each node the verifier
runs over that node's drafts with the target's p and the drafter's q there; an accepted draft moves
to its child, a rejection emits the verifier's residual token and stops, a leaf emits a bonus token
drawn from p; the cache keeps only the accepted path (`KVState.accept`).

Deterministic drafts (prompt lookup, or any drafts at temperature 0) are verified by the one
lossless rule that fits them: draw y ~ p (argmax at temperature 0) and accept the child whose token
is y, if any. Its acceptance is p(children) = α* for deterministic drafts.

Cost model (measured on the 2-core AVX2 CPU these tests run on, fp32, one torch thread): the
target's forward over N = 2..8 tokens costs ~2.5-3x its one-token forward (MKL's small-N GEMM is far
from the one-token GEMV's memory roofline), and a 0.5B drafter forward ~0.3-0.4x. Speculation pays
only when block efficiency exceeds (target tree cost + drafter forwards) / one-token cost, hence
the narrow defaults (a chain of 3, one lookup continuation). On hardware where a forward over ~10-30
tokens costs about one token (GPUs, wide SIMD with idle cores) wider trees (n = 2-3) win.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from runtime.kv_state import KVState
from runtime.member import Member, check_finished, make_generators
from runtime.outputs import Cost, GenerationOutput, split_batch_cost
from runtime.sampling import logits_to_probs
from specdec.drafters import Drafter, drafter_member
from specdec.tree import DraftTree, forward_inputs

SCHEMES = ("greedy", "with", "without")


# ---- verifiers --------------------------------------------------------------------------------
def _math_layer_verify():
    try:
        from specdec.verifiers import verify  # the one-position math layer
        return verify
    except ImportError:
        return None


def default_verifier(scheme: str) -> str:
    """The lossless verifier each draft scheme is meant for."""
    return {"with": "rrs", "without": "rrs-without", "greedy": "greedy"}[scheme]


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor | None:
    r = (p - q).clamp(min=0)
    s = r.sum()
    return r / s if s > 0 else None


def _draw(probs: torch.Tensor, gen) -> int:
    return int(torch.multinomial(probs, 1, generator=gen))


def _u(gen) -> float:
    return float(torch.rand((), dtype=torch.float64, generator=gen))


def local_verify(target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: Sequence[int], method: str,
                 generator=None) -> tuple[int, int | None]:
    """Fallback verifiers (used when `specdec.verifiers` is not available): RRS with / without
    replacement and the greedy-optimal verifier. Returns (output token, accepted draft index or None).
    target_probs, draft_probs: [V]; drafts: the scheme's draws in draw order."""
    p = target_probs.double()
    q = draft_probs.double()
    p = p / p.sum()
    q = q / q.sum()
    if method == "greedy":
        g, x = list(drafts[:-1]), int(drafts[-1])
        qp = q.clone()
        if g:
            qp[g] = 0
        qp = qp / qp.sum()
        rest = p.clone()
        if g:
            rest[g] = 0  # g in G is handled by the residual
        if _u(generator) < min(1.0, float(p[x] / qp[x])) if qp[x] > 0 else False:
            return x, len(drafts) - 1
        r = (p - torch.minimum(p, qp)).clamp(min=0)
        y = _draw(r / r.sum(), generator)
        idx = g.index(y) if y in g else None
        return y, idx
    method = method.replace("_", "-")
    if method in ("rrs", "rrs-without"):
        for i, x in enumerate(drafts):
            x = int(x)
            if q[x] > 0 and _u(generator) < min(1.0, float(p[x] / q[x])):
                return x, i
            r = _residual(p, q)
            if r is None:
                break
            p = r
            if method == "rrs-without":
                q = q.clone()
                q[x] = 0
                if q.sum() <= 0:
                    break
                q = q / q.sum()
        return _draw(p, generator), None
    raise ValueError(f"unknown local verifier {method!r}")


def make_verify(method: str, scheme: str, params: dict) -> Callable:
    """(target_probs [V], draft_probs [V], drafts [n], generator) -> (token, accepted index or None)."""
    verify = _math_layer_verify()

    def run(p, q, drafts, gen):
        if verify is None:
            return local_verify(p, q, drafts, method, gen)
        out = verify(p, q, torch.as_tensor(list(drafts), dtype=torch.long), method, gen, scheme=scheme, **params)
        token, idx = (out[0], out[1]) if isinstance(out, (tuple, list)) else (out.token, out.index)
        token = int(token)
        idx = None if idx is None or int(idx) < 0 else int(idx)
        return token, idx

    return run


# ---- per-row bookkeeping ----------------------------------------------------------------------
@dataclass
class RowStats:
    """What one row's speculation did: target forwards, tokens, accepts per depth, α* per node."""

    steps: int = 0
    tokens: int = 0
    accepted: int = 0
    attempts_by_depth: list[int] = field(default_factory=list)
    accepts_by_depth: list[int] = field(default_factory=list)
    alpha_star_by_depth: list[float] = field(default_factory=list)
    tree_nodes: int = 0

    def record(self, depth: int, accepted: bool, alpha: float | None) -> None:
        while len(self.attempts_by_depth) <= depth:
            self.attempts_by_depth.append(0)
            self.accepts_by_depth.append(0)
            self.alpha_star_by_depth.append(0.0)
        self.attempts_by_depth[depth] += 1
        self.accepts_by_depth[depth] += int(accepted)
        if alpha is not None:
            self.alpha_star_by_depth[depth] += alpha

    def to_dict(self, with_alpha: bool) -> dict:
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


class SpeculativeGenerator:
    """Speculative decoding of `target` with `drafter` (None: plain decoding through the same loop).

    scheme: "greedy" | "with" | "without" (how n drafts are drawn per expanded node at T > 0);
    num_drafts: n children per expanded node; depth: tree depth; node_budget: expand only the most
    probable nodes, at most this many drafted nodes per step; verifier: a method name of
    `specdec.verify` (default per scheme); track_alpha: also report α* per depth."""

    def __init__(self, target: Member, drafter: Drafter | None = None, scheme: str = "greedy", num_drafts: int = 1,
                 depth: int = 3, verifier: str | None = None, node_budget: int | None = None,
                 track_alpha: bool = False, **verifier_params):
        if scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r}; choose one of {SCHEMES}")
        if num_drafts < 1 or depth < 0:
            raise ValueError("num_drafts must be >= 1 and depth >= 0")
        self.target = target
        self.drafter = drafter
        self.scheme = scheme
        self.num_drafts = num_drafts
        self.depth = depth
        self.node_budget = node_budget
        self.verifier = verifier or default_verifier(scheme)
        self.verifier_params = verifier_params
        self.track_alpha = track_alpha
        self._verify = make_verify(self.verifier, scheme, verifier_params)
        if drafter is not None:
            drafter.bind(target)
        self.last_stats: list[RowStats] = []

    @property
    def drafter_member(self) -> Member | None:
        """The model the drafter runs (None: no drafter, or a model-free one)."""
        return drafter_member(self.drafter)

    def __repr__(self) -> str:
        d = getattr(self.drafter, "name", None)
        return (f"SpeculativeGenerator(target={self.target.name!r}, drafter={d!r}, scheme={self.scheme!r}, "
                f"n={self.num_drafts}, depth={self.depth}, verifier={self.verifier!r})")

    # ---- public API ------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Sequence[str], max_new_tokens: int = 128, stop: Sequence[str] | None = None,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 chat: bool | None = None) -> list[GenerationOutput]:
        """Like `Member.generate` (row i seeded `seed + i`; text excludes EOS and stop strings), with
        `stats` per output: block efficiency, mean accepted length, acceptance per depth."""
        t0 = time.perf_counter()
        tgt = self.target
        snap_t = tgt.counters.snapshot()
        dm = drafter_member(self.drafter)
        snap_d = dm.counters.snapshot() if dm is not None else None
        stop = [s for s in (stop or []) if s]
        prompt_ids = [tgt.encode_prompt(p, chat) for p in prompts]
        gens = make_generators(len(prompts), seed, tgt.device)
        state = tgt.start(prompt_ids)
        if self.drafter is not None:
            self.drafter.reset()
        finish: list[str | None] = [None] * len(prompts)
        texts = [""] * len(prompts)

        def stop_fn(b: int, new: list[int]) -> bool:
            finish[b], texts[b] = check_finished(tgt, new, stop, max_new_tokens)
            return finish[b] is not None

        new_ids = self._decode(state, max_new_tokens, stop_fn, temperature, top_k, top_p, gens, commit_last=False)
        wall = time.perf_counter() - t0
        outs = []
        for b in range(len(prompts)):
            if finish[b] is None:
                finish[b], texts[b] = check_finished(tgt, new_ids[b], stop, max_new_tokens)
            cost = tgt.cost_since(snap_t, wall) if b == 0 else Cost()
            if b == 0 and snap_d is not None:
                cost.merge(dm.cost_since(snap_d))
            outs.append(GenerationOutput(texts[b], len(new_ids[b]), finish[b] or "length", cost,
                                         stats=self.last_stats[b].to_dict(self.track_alpha)))
        return split_batch_cost(outs)

    @torch.no_grad()
    def decode(self, state: KVState, max_new_tokens: int, stop_fn: Callable[[int, list[int]], bool] | None = None,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               generators: list[torch.Generator | None] | None = None, stop_at_eos: bool = True,
               commit_last: bool = True, record_sources: bool = False,
               rows: Sequence[int] | None = None,
               draft_depth: Callable[[int, list[int]], int] | None = None) -> list[list[int]]:
        """Continue every row of an existing target `state`, committing the new tokens into it, until
        `stop_fn(row, new_ids)` is True (checked after every token; the state then holds exactly the
        returned tokens), the row emits EOS (when `stop_at_eos`), or `max_new_tokens`.

        With `record_sources`, `self.last_sources[row][j]` holds (while it runs, and after) the
        target's logits that new token j was drawn from, so `stop_fn` can look at the distribution at
        the point it is asked about.
        `commit_last=False` skips the final forward that commits each row's last token (a caller
        about to roll it back saves that forward): `self.last_uncommitted[row]` then says whether the
        state lacks the row's last returned token. `rows` limits the work to those rows (the others
        get no tokens, no drafts, no tree nodes). `draft_depth(row, new_ids)` caps the row's next draft
        depth where the caller knows how much it can use (cost only: greedy output is the same, and sampled
        output keeps its distribution)."""
        eos = self.target.eos_token_ids

        def fn(b: int, new: list[int]) -> bool:
            if stop_at_eos and new and new[-1] in eos:
                return True
            return bool(stop_fn(b, new)) if stop_fn is not None else False

        return self._decode(state, max_new_tokens, fn, temperature, top_k, top_p, generators, commit_last=commit_last,
                            record_sources=record_sources, rows=rows, draft_depth=draft_depth)

    # ---- the loop --------------------------------------------------------------------------
    def _decode(self, state: KVState, max_new_tokens: int, stop_fn, temperature, top_k, top_p, generators,
                commit_last: bool, record_sources: bool = False, rows: Sequence[int] | None = None,
                draft_depth: Callable[[int, list[int]], int] | None = None) -> list[list[int]]:
        B = state.batch_size
        gens = list(generators) if generators is not None else [None] * B
        state._refresh()
        new: list[list[int]] = [[] for _ in range(B)]
        active = set(range(B)) if rows is None else set(rows)
        done = [max_new_tokens <= 0 or b not in active for b in range(B)]
        pending: list[int | None] = [None] * B
        stats = [RowStats() for _ in range(B)]
        self.last_stats = stats
        sources: list[list[torch.Tensor]] = [[] for _ in range(B)]
        self.last_sources = sources
        while not all(done):
            contexts = [None if done[b] else state.ids[b] + ([pending[b]] if pending[b] is not None else [])
                        for b in range(B)]
            room = [max_new_tokens - len(new[b]) for b in range(B)]
            depth = [max(0, min(self.depth, r - 1, self.depth if draft_depth is None else draft_depth(b, new[b])))
                     if not done[b] else 0 for b, r in enumerate(room)]
            if self.drafter is not None and max(depth) > 0:
                trees = self.drafter.draft(contexts, scheme=self.scheme, num_drafts=self.num_drafts, depth=depth,
                                           node_budget=self.node_budget, temperature=temperature, top_k=top_k,
                                           top_p=top_p, generators=gens,
                                           limit=[max(0, r - 1) if not done[b] else 0 for b, r in enumerate(room)])
            else:
                trees = [DraftTree() for _ in range(B)]
            fw = [forward_inputs(trees[b], pending[b]) if not done[b] else ([], [], [-1]) for b in range(B)]
            logits = None
            if any(f[0] for f in fw):
                logits = state.forward_tree([f[0] for f in fw], [f[1] for f in fw])
            paths: list[list[int]] = [[] for _ in range(B)]
            root_p = None
            if temperature > 0:  # every row visits its root: warp all roots at once
                roots = torch.stack([state.last_logits[b] if fw[b][2][0] < 0 or logits is None
                                     else logits[b, fw[b][2][0]] for b in range(B)])
                root_p = logits_to_probs(roots, temperature, top_k, top_p)
            for b in range(B):
                if done[b]:
                    continue
                tree, index = trees[b], fw[b][2]
                accepted, final = self._walk(b, tree, index, logits, state, temperature, top_k, top_p, gens[b],
                                             stats[b], room[b], None if root_p is None else root_p[b])
                stats[b].steps += 1
                stats[b].tree_nodes += tree.num_drafted
                path = [index[0]] if pending[b] is not None else []
                pending[b] = None
                emitted = [tree.tokens[n] for n in accepted] + [final]
                chain = [0] + accepted  # emitted[j] was drawn at node chain[j]
                for j, tok in enumerate(emitted):
                    new[b].append(tok)
                    if record_sources:
                        node = index[chain[j]]
                        sources[b].append(state.last_logits[b].clone() if node < 0 else logits[b, node])
                    stats[b].tokens += 1
                    stop = stop_fn(b, new[b]) or len(new[b]) >= max_new_tokens
                    if j < len(accepted):
                        path.append(index[accepted[j]])
                        stats[b].accepted += 1
                    else:
                        pending[b] = tok
                    if stop:
                        done[b] = True
                        break
                paths[b] = path
            if logits is not None:
                state.accept(paths)
        self.last_uncommitted = [p is not None and not commit_last for p in pending]
        if commit_last and any(p is not None for p in pending):
            state.append([[p] if p is not None else [] for p in pending], return_logits=False)
        return new

    def _walk(self, b: int, tree: DraftTree, index: list[int], logits, state: KVState, temperature, top_k, top_p,
              gen, st: RowStats, room: int, root_p: torch.Tensor | None = None) -> tuple[list[int], int]:
        """Verify row b's tree from the root. Returns (accepted node indices, final token)."""
        node, accepted = 0, []
        while True:
            raw = state.last_logits[b] if index[node] < 0 else logits[b, index[node]]
            kids = tree.children(node)
            if len(accepted) + 1 >= room:
                kids = {}  # no room for more than one more token: take it from p directly
            depth = len(accepted)
            if temperature == 0:
                y = int(raw.argmax())
                if kids:
                    st.record(depth, y in kids, float(y in kids) if self.track_alpha else None)
                if y in kids:
                    accepted.append(kids[y])
                    node = kids[y]
                    continue
                return accepted, y
            p = root_p if node == 0 and root_p is not None else logits_to_probs(raw, temperature, top_k, top_p)
            if not kids:
                return accepted, int(torch.multinomial(p, 1, generator=gen))
            if tree.draft_probs[node] is None:  # deterministic drafts
                alpha = float(p[list(kids)].sum()) if self.track_alpha else None
                y = int(torch.multinomial(p, 1, generator=gen))
                ok = y in kids
            else:
                q = tree.draft_probs[node]
                alpha = self._alpha(p, q, len(tree.drafts[node])) if self.track_alpha else None
                y, idx = self._verify(p, q, tree.drafts[node], gen)
                ok = idx is not None
            st.record(depth, ok, alpha)
            if not ok:
                return accepted, y
            accepted.append(kids[y])
            node = kids[y]

    def _alpha(self, p: torch.Tensor, q: torch.Tensor, n: int) -> float | None:
        try:
            from specdec.bound import optimal_acceptance
        except ImportError:
            return None
        try:
            return float(optimal_acceptance(p, q, n, self.scheme))
        except Exception:  # noqa: BLE001 - a statistic, never a reason to fail generation
            return None
