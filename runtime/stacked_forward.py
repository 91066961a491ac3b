"""Several `KVState`s of one model through the model in one forward, each keeping its own KV cache.

Views of one model (`runtime.views`) are separate members with separate caches, but on a CPU that
decodes memory-bound a forward over 3 rows costs little more than over 1: the weights are read
once. `run_stacked(requests)` feeds every request's rows as rows of one batch:

- tokens, position ids and validity are padded to the longest request (N tokens);
- the cache is a `StackedCache`: each layer's new keys/values are split by request and written
  into that request's own cache (only its own N_i positions, so every state ends exactly as if it
  had run alone); it hands the attention a `SegmentedKV`, each request's whole keys/values;
- attention runs per request (`segmented_attention`, wrapping the model's own attention function):
  request i's queries see only its own cache, under its own mask (the masks ride in one padded
  4-D tensor, request i's in the top-left corner of its rows);
- the LM head computes the union of the positions the requests want (`LogitsPlan`), and each
  request gets back what its own model call would have returned (`split_logits`).

Packed layers (`runtime.packed_linear.only_tokens`) skip the padding, so a stacked forward costs the
real tokens of every row in each linear layer, and its weights are read once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from runtime.gqa_attention import current_valid, valid_queries
from runtime.logits_plan import LogitsPlan
from runtime.tree_mask import FULL, TreeInputs

PREFIX = "segmented_"


@dataclass
class StackedRequest:
    """One state's part of a stacked forward: its cache, its inputs and which logits it wants."""

    cache: Any                 # the state's own GrowableCache
    inputs: TreeInputs         # [B_i, N_i] tokens, masks over its S_i past slots + N_i new
    plan: LogitsPlan           # which logits it wants, as its own forward would ask


class SegmentedKV(list):
    """Per request, the whole keys (or values) of its cache for one layer, [B_i, H, S_i + N_i, D]:
    what `StackedCache.update` hands to `segmented_attention` in place of one tensor; `bounds` holds
    each request's (first row, end row, new tokens) in the stacked batch."""

    def __init__(self, bounds: Sequence[tuple[int, int, int]]):
        super().__init__()
        self.bounds = list(bounds)


class StackedCache:
    """The cache of one stacked forward: routes each layer's new keys/values to the requests' own
    caches (rows `bounds[i]`, first `n_new[i]` positions) and returns them as `SegmentedKV`s."""

    def __init__(self, caches: Sequence[Any], bounds: Sequence[tuple[int, int]], n_new: Sequence[int]):
        self.caches, self.bounds, self.n_new = list(caches), list(bounds), list(n_new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        bounds = [(r0, r1, n) for (r0, r1), n in zip(self.bounds, self.n_new)]
        keys, values = SegmentedKV(bounds), SegmentedKV(bounds)
        for cache, (r0, r1), n in zip(self.caches, self.bounds, self.n_new):
            k, v = cache.update(key_states[r0:r1, :, :n], value_states[r0:r1, :, :n], layer_idx)
            keys.append(k)
            values.append(v)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max((c.get_seq_length(layer_idx) for c in self.caches), default=0)


def segmented_attention(inner):
    """An attention function (transformers' `AttentionInterface` contract) that runs `inner` once per
    request when the keys are a `SegmentedKV` (request i: its rows, its first N_i queries, its own
    keys and its corner of the padded mask), and `inner` unchanged otherwise."""

    def attention(module: nn.Module, query: torch.Tensor, key, value, attention_mask, *args, **kwargs):
        if not isinstance(key, SegmentedKV):
            return inner(module, query, key, value, attention_mask, *args, **kwargs)
        out = None
        valid = current_valid()  # (row-wise attention: each request's own corner of the real tokens)
        for (r0, r1, n), k, v in zip(key.bounds, key, value):
            mask = None if attention_mask is None else attention_mask[r0:r1, :, :n, : k.shape[-2]]
            with valid_queries(None if valid is None else valid[r0:r1, :n]):
                o, _ = inner(module, query[r0:r1, :, :n], k, v, mask, *args, **kwargs)
            if out is None:
                out = o.new_zeros(query.shape[0], query.shape[2], *o.shape[2:])
            out[r0:r1, :n] = o
        return out, None

    return attention


def enable_segmented_attention(model: nn.Module) -> bool:
    """Wrap `model`'s attention function in `segmented_attention` (idempotent). Returns False for a
    model whose attention is not a registered function (it cannot run stacked forwards)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    config = getattr(model, "config", None)
    name = getattr(config, "_attn_implementation", None)
    if name is None:
        return False
    if name.startswith(PREFIX):
        return True
    if name == "eager":
        from transformers.models.llama.modeling_llama import eager_attention_forward

        inner = eager_attention_forward
    elif name in ALL_ATTENTION_FUNCTIONS:
        inner = ALL_ATTENTION_FUNCTIONS[name]
    else:
        return False
    wrapped = PREFIX + name
    AttentionInterface.register(wrapped, segmented_attention(inner))
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS[name] if name in ALL_MASK_ATTENTION_FUNCTIONS else \
        ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    ALL_MASK_ATTENTION_FUNCTIONS.register(wrapped, mask_fn)
    model.set_attn_implementation(wrapped)
    return True


def stack_masks(inputs: Sequence[TreeInputs], dtype: torch.dtype, device, width: int
                ) -> torch.Tensor | dict[str, torch.Tensor]:
    """The requests' additive masks in one padded [B, 1, N, K] tensor per layer type (request i's
    [B_i, 1, N_i, S_i + N_i] in the top-left corner of its rows; the rest masked)."""
    neg = torch.finfo(dtype).min
    B = sum(int(x.tokens.shape[0]) for x in inputs)
    K = max(int(x.masks[FULL].shape[-1]) for x in inputs)
    out: dict[str, torch.Tensor] = {}
    for kind in inputs[0].masks:
        allowed = torch.zeros(B, 1, width, K, dtype=torch.bool)
        r0 = 0
        for x in inputs:
            m = x.masks[kind]
            allowed[r0: r0 + m.shape[0], 0, : m.shape[1], : m.shape[2]] = m
            r0 += m.shape[0]
        out[kind] = torch.zeros(B, 1, width, K, dtype=dtype).masked_fill(~allowed, neg).to(device)
    return out if len(out) > 1 else out[FULL]


def _pad(t: torch.Tensor, width: int, value: int | bool = 0) -> torch.Tensor:
    if t.shape[1] == width:
        return t
    return torch.cat([t, torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype)], dim=1)


def _wanted_columns(plan: LogitsPlan, n_new: int) -> list[int]:
    """The positions (columns) of a request's own forward whose logits it may read."""
    if plan.keep == "none":
        return []
    if plan.keep == "all":
        return list(range(n_new))
    return [int(c) for c in torch.as_tensor(plan.logits_to_keep).reshape(-1).tolist()]


def split_logits(logits: torch.Tensor, compacted: bool, plans: Sequence[LogitsPlan], heads: Sequence[torch.Tensor],
                 columns: Sequence[list[int]], union: list[int], bounds: Sequence[tuple[int, int, int]]
                 ) -> list[tuple[torch.Tensor | None, bool]]:
    """Per request, (logits, compacted) as its own model call would have returned them: compacted
    [1, n_i, V] for "at"/"last" (or [B_i, K_i, V]), [B_i, N_i, V] for "all", None for "none".
    `heads[i]` [B_i, K_union] marks its wanted (row, union column) pairs; `columns[i]` its own
    kept positions."""
    out: list[tuple[torch.Tensor | None, bool]] = []
    offset = 0
    where = {c: k for k, c in enumerate(union)}
    for plan, head, cols, (r0, r1, n) in zip(plans, heads, columns, bounds):
        count = int(head.sum())
        if plan.keep == "none":
            out.append((None, False))
        elif compacted:
            mine = logits[:, offset: offset + count]
            if plan.compact:
                out.append((mine, True))
            else:  # "all": scatter the wanted positions into zeros, as an unpacked head would fill them
                full = mine.new_zeros(r1 - r0, n, mine.shape[-1])
                full[plan.head] = mine[0]
                out.append((full, False))
        else:
            idx = torch.tensor([where[c] for c in cols], dtype=torch.long, device=logits.device)
            out.append((logits[r0:r1].index_select(1, idx), False))
        offset += count
    return out


@torch.no_grad()
def run_stacked(model: nn.Module, requests: Sequence[StackedRequest], dtype: torch.dtype, device,
                model_call) -> list[tuple[torch.Tensor | None, bool]]:
    """One forward of `model` over every request's rows; per request what its own call would return
    ((logits, compacted), see `split_logits`). `model_call(input_ids, attention_mask, position_ids,
    cache, logits_to_keep, valid, head, compact)` runs the model (`KVState`'s own call, so hooks,
    packing and cache keywords stay in one place) and returns (logits, compacted)."""
    width = max(int(r.inputs.tokens.shape[1]) for r in requests)
    bounds, r0 = [], 0
    for r in requests:
        b, n = r.inputs.tokens.shape
        bounds.append((r0, r0 + int(b), int(n)))
        r0 += int(b)
    tokens = torch.cat([_pad(r.inputs.tokens, width) for r in requests])
    valid = torch.cat([_pad(r.inputs.valid, width, False) for r in requests])
    positions = torch.cat([_pad(r.inputs.position_ids, width) for r in requests])
    columns = [_wanted_columns(r.plan, int(r.inputs.tokens.shape[1])) for r in requests]
    union = sorted({c for cols in columns for c in cols}) or [0]
    where = {c: k for k, c in enumerate(union)}
    heads = []
    for r, cols in zip(requests, columns):
        head = torch.zeros(r.inputs.tokens.shape[0], len(union), dtype=torch.bool)
        if cols:
            head[:, [where[c] for c in cols]] = r.plan.head
        heads.append(head)
    head = torch.cat(heads)
    mask = stack_masks([r.inputs for r in requests], dtype, device, width)
    cache = StackedCache([r.cache for r in requests], [(a, b) for a, b, _ in bounds], [n for _, _, n in bounds])
    logits, compacted = model_call(tokens.to(device), mask, positions.to(device), cache,
                                   torch.tensor(union).to(device), valid.to(device), head.to(device), True)
    return split_logits(logits, compacted, [r.plan for r in requests], heads, columns, union, bounds)
