"""Drafters: propose a `DraftTree` per row on top of the target's current ids.

- `ModelDrafter(member)` (`specdec.model_drafter`): a small LM with the target's tokenizer.
- `TextDrafter(member)` (`specdec.text_drafter`): a small LM with ANY tokenizer, drafting through
  text; the engine turns a `ModelDrafter` whose tokenizer differs from the target's into one.
- `PromptLookupDrafter` (`specdec.lookup`): model-free. Suffix n-grams of prompt+output matched
  earlier in the same text give up to n distinct continuations, merged into a deterministic trie.
- `CrossRowDrafter` (`specdec.cross_row`): lookup in what the other rows of the same problem wrote.
- `HybridDrafter(model, lookup)`: lookup where it finds a long enough continuation, the model
  elsewhere (a lookup-only step costs no drafter forward).

`make_drafter(spec, load)` builds one from a spec (the grammar of CLI flags and configs, parsed by
`parse_drafter_spec` alone); `default_shape(drafter)` is the tree shape to run it with.
"""
from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

from runtime.errors import ConfigError
from runtime.loader import load as load_model
from runtime.member import Member
from runtime.sampling import SamplingParams
from specdec.config import DEFAULT_SHAPE, DEFAULT_STOP_BELOW, DraftLimit, TreeShape
from specdec.drafter_base import Drafter, drafter_member
from specdec.cross_row import CrossRowDrafter
from specdec.lookup import PromptLookupDrafter
from specdec.model_drafter import DRAFTER_FORMATS, ModelDrafter, check_same_tokenizer, quantize_drafter, quantize_int8
from specdec.text_drafter import TextDrafter
from specdec.tree import DraftTree

__all__ = ["Drafter", "ModelDrafter", "TextDrafter", "PromptLookupDrafter", "HybridDrafter", "DrafterSpec",
           "parse_drafter_spec", "make_drafter", "default_shape", "drafter_member", "check_same_tokenizer",
           "quantize_int8", "quantize_drafter",
           "DEFAULT_SHAPE", "DEFAULT_STOP_BELOW"]


class HybridDrafter(Drafter):
    """Prompt lookup where it finds a continuation of at least `min_match` tokens, else the model
    drafter (rows using lookup this step cost the drafter nothing)."""

    def __init__(self, model: ModelDrafter, lookup: PromptLookupDrafter | None = None, min_match: int = 2):
        self.model = model
        self.lookup = lookup or PromptLookupDrafter(ngram_max=3, ngram_min=2, num_drafts=1, depth=8, min_length=2)
        self.min_match = min_match
        self.name = f"hybrid({self.model.name}+lookup)"

    def __repr__(self) -> str:
        return f"HybridDrafter({self.model!r}, {self.lookup!r}, min_match={self.min_match})"

    def bind(self, target):
        self.model.bind(target)

    def reset(self):
        self.model.reset()

    def draft(self, contexts, shape: TreeShape, sampling: SamplingParams, generators=None,
              limit: DraftLimit | None = None) -> list[DraftTree]:
        """Lookup trees where they reach `min_match` tokens; the model's trees for the other rows."""
        look = self.lookup.draft(contexts, shape, sampling, generators, limit)
        use_model = [c is not None and max(t.depths()) < self.min_match for c, t in zip(contexts, look)]
        if not any(use_model):
            return look
        model_trees = self.model.draft([c if u else None for c, u in zip(contexts, use_model)], shape, sampling,
                                       generators, limit)
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


# ---- specs -------------------------------------------------------------------------------------
class DrafterSpec(NamedTuple):
    """A parsed drafter spec: `kind` and the model it loads (None for kinds that load none).

    kind: "none" | "lookup" | "model" | "model-FMT" | "hybrid" | "hybrid-FMT" (the spec was a
    string; FMT one of `DRAFTER_FORMATS`: "int8", "fp16"), "member" (a `Member`) or "drafter" (a ready `Drafter`)."""

    kind: str
    model: str | None


_GRAMMAR = ("'none', 'lookup', 'rows' (the other rows of the problem, in answer-level methods), a model "
            "(registry name, folder or hub id), 'NAME@fp16' / 'NAME@int8' (its linear layers stored in float16 / "
            "int8) or 'hybrid:NAME' / 'hybrid:NAME@fp16' (lookup, else the model)")


def parse_drafter_spec(spec: Any) -> DrafterSpec:
    """The one reader of the drafter grammar: None / '' / 'none' -> ("none", None); 'lookup' ->
    ("lookup", None); 'rows' -> ("rows", None) (cross-row drafting, `specdec.cross_row`); 'hybrid:NAME' -> ("hybrid", NAME); 'NAME@int8' -> ("model-int8", NAME) (also
    '@fp16'); 'hybrid:NAME@int8' -> ("hybrid-int8", NAME); a model name, folder or hub id -> ("model", NAME);
    a `Member` -> ("member", None); a `Drafter` -> ("drafter", None). ConfigError otherwise."""
    if isinstance(spec, Drafter):
        return DrafterSpec("drafter", None)
    if isinstance(spec, Member):
        return DrafterSpec("member", None)
    if spec is None:
        return DrafterSpec("none", None)
    if not isinstance(spec, str):
        raise ConfigError(f"drafter {spec!r} is invalid: use {_GRAMMAR}, a Member or a Drafter")
    text = spec.strip()
    if text in ("", "none"):
        return DrafterSpec("none", None)
    if text in ("lookup", "rows"):
        return DrafterSpec(text, None)
    if os.path.exists(text):  # a model folder, whatever characters its path holds
        return DrafterSpec("model", text)
    hybrid = text.startswith("hybrid:")
    kind, name = _model_part(text[len("hybrid:"):] if hybrid else text, spec)
    return DrafterSpec(f"hybrid{kind}" if hybrid else f"model{kind}", name)


def _model_part(text: str, spec: str) -> tuple[str, str]:
    """('' or '-FMT', model name) of a spec's model part; ConfigError where it names no model."""
    kind = ""
    if os.path.exists(text):
        return kind, text
    if "@" in text:
        text, suffix = text.rsplit("@", 1)
        if suffix not in DRAFTER_FORMATS:
            raise ConfigError(f"drafter {spec!r}: unknown suffix '@{suffix}'; use '@fp16' or '@int8' (the model "
                              f"drafter's linear layers in float16 / int8), e.g. 'qwen2.5-coder-0.5b@fp16'")
        kind = f"-{suffix}"
    if os.path.exists(text):
        return kind, text
    if ":" in text and not text.startswith("hybrid:"):
        raise ConfigError(f"drafter {spec!r}: '{text.split(':', 1)[0]}:' is no drafter kind (the one kind with "
                          f"a ':' is 'hybrid:NAME'); use {_GRAMMAR}")
    if text in ("", "none", "lookup") or ":" in text or "@" in text:
        raise ConfigError(f"drafter {spec!r} names no model: use {_GRAMMAR}")
    return kind, text


Loader = Callable[..., Member]


def make_drafter(spec: Any, load: Loader | None = None, *, dtype: str = "float32") -> Drafter | None:
    """A drafter from a spec (grammar: `parse_drafter_spec`): None for "none"; the gated prompt
    lookup for "lookup"; a `specdec.cross_row.CrossRowDrafter` for "rows"; a `ModelDrafter` for a model or a `Member`; a `HybridDrafter` for
    "hybrid:NAME"; a `Drafter` as is. Model drafters follow their generator's `TreeShape.stop_below`.

    `load(name)` loads a model (the caller's runtime loader; default `runtime.loader.load`
    with `dtype`); for '@fp16' / '@int8' it is called as `load(name, dtype="float32",
    pack_weights=False)`, since quantization starts from the plain float32 Linear weights.
    ConfigError on a bad spec. A model whose tokenizer differs from the target's drafts through text
    (`TextDrafter`) once a generator binds it."""
    kind, name = parse_drafter_spec(spec)
    if kind == "drafter":
        return spec
    if kind == "member":
        return ModelDrafter(spec)
    if kind == "none":
        return None
    if kind == "lookup":
        return PromptLookupDrafter(ngram_max=3, ngram_min=2, min_length=2)
    if kind == "rows":
        return CrossRowDrafter()
    if load is None:
        def load(model_name: str, **kw) -> Member:
            return load_model(model_name, **{"dtype": dtype, **kw})

    fmt = kind.split("-", 1)[1] if "-" in kind else None
    member = quantize_drafter(load(name, dtype="float32", pack_weights=False), fmt) if fmt else load(name)
    model = ModelDrafter(member)
    return HybridDrafter(model) if kind.startswith("hybrid") else model


def default_shape(drafter: Drafter | None = None) -> TreeShape:
    """The measured default tree shape; today one shape for every drafter (`DEFAULT_SHAPE`)."""
    return DEFAULT_SHAPE
