"""Lossless multi-draft speculative generation for any `Member`.

One step, per row: the drafter proposes a `DraftTree` on top of the row's ids; the target scores the
whole tree in ONE forward (`KVState.forward_tree`; the last emitted token rides along as the tree's
root, so it costs no extra forward); verification walks from the root — at each node the verifier
runs over that node's drafts with the target's p and the drafter's q there; an accepted draft moves
to its child, a rejection emits the verifier's residual token and stops, a leaf emits a bonus token
drawn from p; the cache keeps only the accepted path (`KVState.accept`).

Deterministic drafts (prompt lookup, a `TextDrafter`'s drafts from a model with another tokenizer,
or any drafts at temperature 0) are verified by the one lossless rule that fits them: draw y ~ p
(argmax at temperature 0) and accept the child whose token is y, if any. Its acceptance is
p(children) = α* for deterministic drafts; it makes the same draws as plain sampling, so with the
same generators the output is the plain one, token for token.

Cost model (measured on the 2-core AVX2 CPU these tests run on, fp32, one torch thread): the
target's forward over N = 2..8 tokens costs ~2.5-3x its one-token forward (MKL's small-N GEMM is far
from the one-token GEMV's memory roofline), and a 0.5B drafter forward ~0.3-0.4x. Speculation pays
only when block efficiency exceeds (target tree cost + drafter forwards) / one-token cost; with
packed weights (`runtime.packed_linear`) one chain of up to 8 tokens cut where the drafter is unsure
wins (`specdec.config.DEFAULT_SHAPE`). On hardware where a forward over ~10-30 tokens costs about
one token (GPUs, wide SIMD with idle cores) wider trees (n = 2-3) win. A CPU forward at batch 1
streams every weight once, so the drafter's bytes are its cost: with its weights stored in float16
(`NAME@fp16`, `specdec.model_drafter.quantize_drafter`) the 0.5B drafts the same tokens at about
half the time (2-core AMD EPYC, AVX2, 2 threads, 2026-12-05: 1.5B packed 347 / 424 / 524 ms for
1 / 4 / 8 tokens; 0.5B drafter 136 ms float32 packed, 73 ms fp16).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from runtime.finish import FinishRule
from runtime.kv_state import KVState
from runtime.member import Member
from runtime.outputs import CostMeter, GenerationOutput, batch_outputs
from runtime.sampling import SamplingParams, draw
from specdec.bound import optimal_acceptance
from specdec.config import DEFAULT_SHAPE, DecodeControl, DraftLimit, TreeShape
from specdec.drafter_base import Drafter, drafter_member
from specdec.results import DecodeResult, RowResult, RowStats
from specdec.text_drafter import fit_drafter
from specdec.tree import DraftTree, forward_inputs
from specdec.verifiers import check_method, verify

GREEDY = SamplingParams()
NodeVerifier = Callable[[torch.Tensor, torch.Tensor, Sequence[int], "torch.Generator | None"], "tuple[int, int | None]"]


def default_verifier(scheme: str) -> str:
    """The lossless verifier each draft scheme is meant for."""
    return {"with": "rrs", "without": "rrs-without", "greedy": "greedy"}[scheme]


def node_verifier(method: str, scheme: str, params: dict) -> NodeVerifier:
    """(target p [V], draft q [V], the node's drafts in draw order, generator) -> (emitted token,
    index of the accepted draft or None): `specdec.verifiers.verify` at one tree node."""

    def run(p, q, drafts, gen):
        out = verify(p, q, torch.as_tensor(list(drafts), dtype=torch.long), method, gen, scheme=scheme, **params)
        idx = int(out.accepted_index)
        return int(out.token), (None if idx < 0 else idx)

    return run


# the keywords a SpeculativeGenerator takes besides target / drafter / shape (config options of a
# speculative member), and `rho`, the one verifier parameter (k-seq); kept beside the constructor
SPECULATIVE_OPTIONS = ("scheme", "num_drafts", "depth", "node_budget", "stop_below", "verifier", "track_alpha", "rho")


@dataclass
class TargetScores:
    """The target's scores of one row's draft tree (vLLM's `SpeculativeScores`): the logits after
    each tree node, read from the tree's forward (`forward_logits` [N, V]) at the node's forward
    position `index[node]`, or from the row's committed last token (`last_logits` [V]) where the
    node is the root that sits on it (index -1)."""

    last_logits: torch.Tensor
    forward_logits: torch.Tensor | None
    index: list[int]

    def logits(self, node: int) -> torch.Tensor:
        i = self.index[node]
        return self.last_logits if i < 0 else self.forward_logits[i]

    def __repr__(self) -> str:
        shape = None if self.forward_logits is None else tuple(self.forward_logits.shape)
        return f"TargetScores(nodes={len(self.index)}, forward_logits={shape})"


class SpeculativeGenerator:
    """Speculative decoding of `target` with `drafter` (None: plain decoding through the same loop).

    shape: the draft tree (`TreeShape`; default `DEFAULT_SHAPE`); the keywords scheme, num_drafts,
    depth, node_budget, stop_below, where given, replace those fields of it. verifier: a method of
    `specdec.verifiers.verify` (default per scheme), with `verifier_params` (e.g. `rho` for k-seq);
    track_alpha: also report α* per depth. ValueError on a bad shape or a verifier that does not fit
    the scheme. A model drafter with another tokenizer than the target's drafts through text
    (`specdec.text_drafter.fit_drafter`: `self.drafter` is then a `TextDrafter` of its member)."""

    def __init__(self, target: Member, drafter: Drafter | None = None, shape: TreeShape | None = None, *,
                 scheme: str | None = None, num_drafts: int | None = None, depth: int | None = None,
                 node_budget: int | None = None, stop_below: float | None = None, verifier: str | None = None,
                 track_alpha: bool = False, **verifier_params):
        given = dict(scheme=scheme, num_drafts=num_drafts, depth=depth, node_budget=node_budget, stop_below=stop_below)
        self.shape = replace(shape or DEFAULT_SHAPE, **{k: v for k, v in given.items() if v is not None})
        self.target = target
        self.drafter = fit_drafter(drafter, target) if drafter is not None else None
        self.verifier = verifier or default_verifier(self.shape.scheme)
        check_method(self.verifier, self.shape.scheme, 2)  # the method fits the scheme (n is checked per node)
        self.verifier_params = verifier_params
        self.track_alpha = track_alpha
        self._verify: NodeVerifier = node_verifier(self.verifier, self.shape.scheme, verifier_params)

    @property
    def drafter_member(self) -> Member | None:
        """The model the drafter runs (None: no drafter, or a model-free one)."""
        return drafter_member(self.drafter)

    @property
    def stop_below(self) -> float:
        """The cut the model drafter applies: its own `stop_below` where it has one, else the shape's."""
        for d in (self.drafter, getattr(self.drafter, "model", None)):
            own = getattr(d, "stop_below", None)
            if own is not None:
                return own
        return self.shape.stop_below

    def __repr__(self) -> str:
        d = getattr(self.drafter, "name", None)
        s = self.shape
        return (f"SpeculativeGenerator(target={self.target.name!r}, drafter={d!r}, scheme={s.scheme!r}, "
                f"n={s.num_drafts}, depth={s.depth}, stop_below={self.stop_below}, verifier={self.verifier!r})")

    # ---- public API ------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Sequence[str], max_new_tokens: int = 128, stop: Sequence[str] | None = None,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 chat: bool | None = None) -> list[GenerationOutput]:
        """Like `Member.generate` (row i seeded `seed + i`; text excludes EOS and stop strings), with
        `stats` per output: block efficiency, mean accepted length, acceptance per depth."""
        tgt = self.target
        meter = CostMeter([tgt, self.drafter_member])
        sampling = SamplingParams(temperature, top_k, top_p, seed)
        prompt_ids = [tgt.encode_prompt(p, chat) for p in prompts]
        gens = sampling.generators(len(prompts), tgt.device)
        state = tgt.start(prompt_ids, room=max_new_tokens)
        if self.drafter is not None:
            self.drafter.reset()
        rule = FinishRule(tgt, len(prompts), stop, max_new_tokens)

        def stop_row(b: int, row: RowResult) -> bool:
            return rule.after_tokens(b, row.ids) is not None

        result = self._run(state, max_new_tokens, sampling, gens, DecodeControl(commit_last=False), stop_row)
        for b, row in enumerate(result.rows):
            if rule.reasons[b] is None and rule.after_tokens(b, row.ids) is None:
                rule.finish(b, "length")
        return batch_outputs(meter.cost(), rule.texts, [len(row.ids) for row in result.rows], rule.reasons,
                             stats=[row.stats.to_dict(self.track_alpha) for row in result.rows])

    @torch.no_grad()
    def decode(self, state: KVState, max_new_tokens: int, sampling: SamplingParams = GREEDY,
               generators: Sequence[torch.Generator | None] | None = None,
               control: DecodeControl | None = None) -> DecodeResult:
        """Continue every row of an existing target `state`, committing the new tokens into it, until
        `control.stop(row, result)` is True (checked after every token; the state then holds exactly
        the row's tokens), the row emits EOS (with `control.stop_at_eos`), or `max_new_tokens`.

        Row b draws its random numbers from `generators[b]` (default: `sampling.generators`, seeded
        `sampling.seed + b`, or torch's global generator without a seed). `control` (a
        `DecodeControl`) also picks the rows, caps draft depths and says whether to commit the last
        token and record source logits. Returns a `DecodeResult`, one `RowResult` per row."""
        control = control or DecodeControl()
        gens = generators if generators is not None else sampling.generators(state.batch_size, state.member.device)
        eos = self.target.eos_token_ids

        def stop_row(b: int, row: RowResult) -> bool:
            if control.stop_at_eos and row.ids and row.ids[-1] in eos:
                return True
            return bool(control.stop(b, row)) if control.stop is not None else False

        return self._run(state, max_new_tokens, sampling, gens, control, stop_row)

    # ---- the loop --------------------------------------------------------------------------
    def _run(self, state: KVState, max_new_tokens: int, sampling: SamplingParams, generators,
             control: DecodeControl, stop_row: Callable[[int, RowResult], bool]) -> DecodeResult:
        """The decode loop: draft, score the trees in one target forward, verify, commit."""
        B = state.batch_size
        gens = list(generators) if generators is not None else [None] * B
        state.refresh()
        result = DecodeResult([RowResult(sources=[] if control.record_sources else None) for _ in range(B)])
        active = set(range(B)) if control.rows is None else set(control.rows)
        done = [max_new_tokens <= 0 or b not in active for b in range(B)]
        pending: list[int | None] = [None] * B
        while not all(done):
            trees = self._draft(state, pending, done, result, max_new_tokens, sampling, gens, control)
            fw = [forward_inputs(trees[b], pending[b]) if not done[b] else ([], [], [-1]) for b in range(B)]
            logits = None
            if any(f[0] for f in fw):
                logits = state.forward_tree([f[0] for f in fw], [f[1] for f in fw])
            root_p = self._root_probs(state, logits, [f[2] for f in fw], sampling)
            paths: list[list[int]] = [[] for _ in range(B)]
            for b in range(B):
                if done[b]:
                    continue
                index = fw[b][2]
                scores = TargetScores(state.last_logits[b], logits[b] if logits is not None else None, index)
                room = max_new_tokens - len(result.rows[b].ids)
                accepted, final = self._walk(trees[b], scores, sampling, gens[b], result.rows[b].stats, room,
                                             None if root_p is None else root_p[b])
                paths[b], pending[b], done[b] = self._emit(b, trees[b], index, accepted, final, pending[b],
                                                           scores, result.rows[b], stop_row, max_new_tokens)
            if logits is not None:
                state.accept(paths)
        for b, row in enumerate(result.rows):
            row.uncommitted = pending[b] is not None and not control.commit_last
        if control.commit_last and any(p is not None for p in pending):
            state.append([[p] if p is not None else [] for p in pending], return_logits=False)
        return result

    def _draft(self, state: KVState, pending: list[int | None], done: list[bool], result: DecodeResult,
               max_new_tokens: int, sampling: SamplingParams, gens: list, control: DecodeControl) -> list[DraftTree]:
        """This step's tree per row (empty for finished rows, or without a drafter)."""
        B = state.batch_size
        contexts = [None if done[b] else state.ids[b] + ([pending[b]] if pending[b] is not None else [])
                    for b in range(B)]
        room = [max_new_tokens - len(row.ids) for row in result.rows]
        full = self.shape.depth
        caps = [full if control.draft_depth is None or done[b] else control.draft_depth(b, result.rows[b])
                for b in range(B)]
        depth = [max(0, min(full, r - 1, c)) if not done[b] else 0 for b, (r, c) in enumerate(zip(room, caps))]
        if self.drafter is None or max(depth) <= 0:
            return [DraftTree() for _ in range(B)]
        limit = DraftLimit(depth, [max(0, r - 1) if not done[b] else 0 for b, r in enumerate(room)])
        return self.drafter.draft(contexts, self.shape, sampling, gens, limit)

    @staticmethod
    def _root_probs(state: KVState, logits: torch.Tensor | None, index: list[list[int]],
                    sampling: SamplingParams) -> torch.Tensor | None:
        """[B, V] p at every row's root, warped in one call (temperature > 0; None at temperature 0)."""
        if sampling.temperature <= 0:
            return None
        roots = torch.stack([state.last_logits[b] if idx[0] < 0 or logits is None else logits[b, idx[0]]
                             for b, idx in enumerate(index)])
        return sampling.probs(roots)

    @staticmethod
    def _emit(b: int, tree: DraftTree, index: list[int], accepted: list[int], final: int, pending: int | None,
              scores: "TargetScores", row: RowResult, stop_row, max_new_tokens: int
              ) -> tuple[list[int], int | None, bool]:
        """Append row b's accepted tokens and its final token to `row`, stopping where `stop_row`
        or `max_new_tokens` says. Returns (forward positions of the path to commit, the new pending
        token or None, whether the row is done)."""
        stats = row.stats
        stats.steps += 1
        stats.tree_nodes += tree.num_drafted
        path = [index[0]] if pending is not None else []
        pending = None
        emitted = [tree.tokens[n] for n in accepted] + [final]
        chain = [0] + accepted  # emitted[j] was drawn at node chain[j]
        for j, tok in enumerate(emitted):
            row.ids.append(tok)
            if row.sources is not None:
                node = chain[j]
                row.sources.append(scores.logits(node).clone() if index[node] < 0 else scores.logits(node))
            stats.tokens += 1
            stop = stop_row(b, row) or len(row.ids) >= max_new_tokens
            if j < len(accepted):
                path.append(index[accepted[j]])
                stats.accepted += 1
            else:
                pending = tok
            if stop:
                return path, pending, True
        return path, pending, False

    def _walk(self, tree: DraftTree, scores: "TargetScores", sampling: SamplingParams, gen,
              st: RowStats, room: int, root_p: torch.Tensor | None = None) -> tuple[list[int], int]:
        """Verify one row's tree from the root (`scores.logits(node)`: the target's logits after the
        node). Returns (accepted node indices, final token)."""
        node, accepted = 0, []
        while True:
            raw = scores.logits(node)
            kids = tree.children(node)
            if len(accepted) + 1 >= room:
                kids = {}  # no room for more than one more token: take it from p directly
            depth = len(accepted)
            if sampling.temperature == 0:
                y = int(raw.argmax())
                if kids:
                    st.record(depth, y in kids, float(y in kids) if self.track_alpha else None)
                if y not in kids:
                    return accepted, y
                accepted.append(kids[y])
                node = kids[y]
                continue
            p = root_p if node == 0 and root_p is not None else sampling.probs(raw)
            if not kids:
                return accepted, draw(p, gen)
            if tree.is_deterministic(node):
                alpha = float(p[list(kids)].sum()) if self.track_alpha else None
                y = draw(p, gen)
                ok = y in kids
            else:
                q = tree.draft_probs[node]
                q = q.to(p.device) if q is not None else q  # the drafter may run on another device
                alpha = self._alpha(p, q, len(tree.drafts[node])) if self.track_alpha else None
                y, idx = self._verify(p, q, tree.drafts[node], gen)
                ok = idx is not None
            st.record(depth, ok, alpha)
            if not ok:
                return accepted, y
            accepted.append(kids[y])
            node = kids[y]

    def _alpha(self, p: torch.Tensor, q: torch.Tensor, n: int) -> float:
        """α* at a node with n drafts drawn from q (raises where `optimal_acceptance` does)."""
        return float(optimal_acceptance(p, q, n, self.shape.scheme))

