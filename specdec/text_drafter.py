"""`TextDrafter`: a model with ANY tokenizer drafts for the target through their shared text.

Per step and row: the target's ids (committed + pending) become text (`runtime.retokenize.TextOfIds`,
only the new ids decoded), the text becomes the drafter's ids (`IdsOfText`, only the tail after the
last stable boundary re-encoded), and a `ModelDrafter` over the drafter's own tokens grows its tree
there, keeping its KV cache across steps (its sync rolls the cache back to the longest common prefix
with the new ids and feeds only the tail: what the target accepted costs the drafter nothing where
it drafted those tokens itself, and a re-tokenised boundary is re-fed once). Each leaf's drafter
tokens become text (`appended_text`), then target ids continuing the committed ones
(`continuation_ids`: the committed ids never change; a boundary that would re-tokenise them is
repaired once), cut to the row's depth, and all of them are merged into one deterministic
target-token trie (`tree_from_sequences`, as prompt lookup does).

Lossless at any temperature without the drafter's probabilities: the engine verifies deterministic
nodes by drawing y ~ p and accepting the child whose token is y (a draft x accepted with probability
p(x)); at temperature 0, the target's argmax. The drafter decodes greedily by default (`sample`: draw
its tree from its own warped distribution instead; still lossless, the tree is drawn before the
target's draw).

`fit_drafter(drafter, target)` is what the engine calls: a `ModelDrafter` (or the model inside a
`HybridDrafter`) whose tokenizer differs from the target's becomes a `TextDrafter` of the same member.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from runtime.member import Member
from runtime.retokenize import REPLACEMENT, IdsOfText, TextOfIds, appended_text, continuation_ids, special_prefix
from runtime.sampling import SamplingParams
from specdec.config import DraftLimit, TreeShape
from specdec.drafter_base import Drafter, resolve_limit
from specdec.model_drafter import ModelDrafter, same_tokenizer
from specdec.tree import DraftTree, leaf_paths, tree_from_sequences

GREEDY = SamplingParams()


class _Row:
    """One row's views of the shared text: the target's ids -> text, the text -> the drafter's ids."""

    def __init__(self, target: Member, drafter: Member, target_prefix: list[int]):
        self.target = TextOfIds(target, target_prefix)
        self.drafter = IdsOfText(drafter)


class TextDrafter(Drafter):
    """`member` (any tokenizer) drafts for the target through text; see the module docstring.

    stop_below: as `ModelDrafter`'s (None: the shape's), on the drafter's own distribution.
    extra_depth: drafter tokens drafted beyond the row's depth (tokenisations differ in length; the
    target ids are cut to the depth). sample: draw the drafter's tree at the target's sampling
    parameters instead of greedily."""

    def __init__(self, member: Member, stop_below: float | None = None, extra_depth: int = 1, sample: bool = False):
        if extra_depth < 0:
            raise ValueError(f"extra_depth must be >= 0, got {extra_depth}")
        self.member = member
        self.inner = ModelDrafter(member, stop_below)
        self.extra_depth, self.sample = int(extra_depth), bool(sample)
        self.name = f"text({member.name})"
        self.target: Member | None = None
        self.rows: list[_Row] = []

    def __repr__(self) -> str:
        return (f"TextDrafter({self.member.name!r}, stop_below={self.stop_below}, extra_depth={self.extra_depth}, "
                f"sample={self.sample})")

    @property
    def stop_below(self) -> float | None:
        return self.inner.stop_below

    def bind(self, target: Member) -> None:
        self.target = target
        self.inner.target_vocab = min(self.member.vocab_size, len(self.member.tokenizer))
        self._target_prefix = special_prefix(target)
        self._drafter_start = len(special_prefix(self.member))
        self._eos = {e: _eos_in_target(self.member, target, e) for e in self.member.eos_token_ids}
        self.reset()

    def reset(self) -> None:
        self.inner.reset()
        self.rows = []

    def _views(self, contexts, depth: Sequence[int]) -> list[list[int] | None]:
        """Each drafting row's drafter ids of its shared text (None: no draft for the row)."""
        if len(self.rows) != len(contexts):
            self.reset()
            self.rows = [_Row(self.target, self.member, self._target_prefix) for _ in contexts]
        out: list[list[int] | None] = []
        for row, ctx, k in zip(self.rows, contexts, depth):
            if ctx is None or k <= 0:
                out.append(None)
                continue
            text = row.target.update(ctx)
            if text.endswith(REPLACEMENT):  # ends inside a character: nothing to continue as text
                out.append(None)
                continue
            out.append(row.drafter.update(text) or None)
        return out

    def draft(self, contexts, shape: TreeShape, sampling: SamplingParams, generators=None,
              limit: DraftLimit | None = None) -> list[DraftTree]:
        """One deterministic target-token trie per row (see `Drafter.draft`)."""
        if self.target is None:
            raise RuntimeError("TextDrafter.draft() before bind(target)")
        B = len(contexts)
        lim = resolve_limit(limit, shape, B)
        views = self._views(contexts, lim.depth)
        if not any(v is not None for v in views):
            return [DraftTree() for _ in range(B)]
        k = [d + self.extra_depth if v is not None else 0 for d, v in zip(lim.depth, views)]
        inner_shape = replace(shape, depth=max(k))
        trees = self.inner.draft(views, inner_shape, sampling if self.sample else GREEDY, generators, DraftLimit(k, k))
        out = []
        for b, tree in enumerate(trees):
            seqs = [] if views[b] is None else [self._target_ids(b, views[b], path, lim.depth[b])
                                                for path in leaf_paths(tree)]
            out.append(tree_from_sequences([s for s in seqs if s]))
        return out

    def _target_ids(self, b: int, drafter_ids: list[int], path: list[int], depth: int) -> list[int]:
        """The target ids of one drafted path of row b (at most `depth`), [] where it has none."""
        eos = next((i for i, t in enumerate(path) if t in self._eos), None)
        tail = self._eos[path[eos]] if eos is not None else None
        added = appended_text(self.member, drafter_ids, path[:eos], start=self._drafter_start)
        if added is None:
            return []
        view = self.rows[b].target
        ids = continuation_ids(self.target, view.ids, view.text, added, start=view.start)
        if ids is None:
            return []
        if tail is not None and eos is not None and (ids or not added):
            ids = ids + [tail]
        return ids[:depth]


def _eos_in_target(drafter: Member, target: Member, eos: int) -> int | None:
    """The target's EOS / end-of-turn id spelled like the drafter's `eos` (None: the draft stops before it)."""
    ids = target.encode(drafter.decode([eos]))
    return ids[0] if len(ids) == 1 and ids[0] in target.eos_token_ids else None


def fit_drafter(drafter: Drafter, target: Member) -> Drafter:
    """`drafter` bound to `target`, where its model speaks another tokenizer through a `TextDrafter`
    of the same member: a `ModelDrafter` is replaced, a drafter holding one as `.model` (a
    `HybridDrafter`) gets one in its place. Returns the drafter to use."""
    if isinstance(drafter, ModelDrafter) and not same_tokenizer(target, drafter.member):
        drafter = TextDrafter(drafter.member, stop_below=drafter.stop_below)
    model = getattr(drafter, "model", None)
    if isinstance(model, ModelDrafter) and not same_tokenizer(target, model.member):
        drafter.model = TextDrafter(model.member, stop_below=model.stop_below)
    drafter.bind(target)
    return drafter
