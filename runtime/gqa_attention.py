"""SDPA attention that keeps grouped-query K/V grouped (`enable_gqa`) under an explicit mask.

transformers' `sdpa` attention repeats every key/value head `num_key_value_groups` times whenever a
query has more than one token and a mask is given (the CUDA kernels want it so). Our multi-token
forwards (candidate trees, tree drafts, word completions) always pass a 4D mask, so on a CPU each
layer copied the whole KV cache 3x (SmolLM2), 4x (Gemma 3) or 7x (Qwen2.5) per forward: for 4 rows x
600 cached tokens that was most of a SmolLM2 forward's time. torch's CPU kernel takes the grouped
K/V directly (`enable_gqa=True`), with results equal to the repeated version.

`use_gqa_sdpa(model)` switches a model that uses `sdpa` to this function; everything else (one query
token, no grouping, position bias, softcap) goes through transformers' own `sdpa` unchanged.

Batch-invariant rows (`batch_invariant()`, off by default): inside `valid_queries(valid)` (every
`KVState` forward sets it: which of the [B, N] new tokens are real), each row's attention runs on its own, over exactly the keys its real
queries attend (in slot order) and only its real queries. A row's keys then have the same values,
order and count whether it runs alone or beside other rows, padded or not, so its output is the same
bits (SDPA's sums over a padded key axis round differently: `benchmarks/batch_invariance.py`). With
`runtime.packed_linear`'s batch-invariant GEMMs this makes a row's greedy tokens independent of its
batch in bfloat16 and float32. Cost: attention per row (rows of one shape together) and layer instead
of one call per layer.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

import torch
from torch import nn

NAME = "sdpa_gqa"


class _Queries(threading.local):
    valid: torch.Tensor | None = None
    plans: dict | None = None    # (mask, valid) layout -> its row groups, for the layers of one forward


_queries = _Queries()
# row-wise attention on (`batch_invariant`); default off: it costs 1.1x a batched forward of the 1.5B at 8
# rows of distinct prompts and 1.5x when views run stacked (benchmarks/batch_invariance.py --compare)
ENABLED = os.environ.get("ADAFUSE_BATCH_INVARIANT", "0") not in ("", "0", "false", "no")


def batch_invariant(on: bool = True) -> None:
    """Turn batch-invariant attention on (or off) for every forward of this process; the environment
    variable ADAFUSE_BATCH_INVARIANT=1 turns it on from the start."""
    global ENABLED
    ENABLED = bool(on)


@contextlib.contextmanager
def valid_queries(valid: torch.Tensor | None) -> Iterator[None]:
    """Inside: attention runs row by row over each row's own keys; `valid` [B, N] bool marks the real
    new tokens of the forward (None: the usual batched attention)."""
    before, outermost = _queries.valid, _queries.plans is None
    _queries.valid = valid
    if outermost:
        _queries.plans = {}
    try:
        yield
    finally:
        _queries.valid = before
        if outermost:
            _queries.plans = None


def current_valid() -> torch.Tensor | None:
    """The `valid_queries` mask in force (None outside one)."""
    return _queries.valid


def row_groups(attention_mask: torch.Tensor, valid: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """How `rowwise_attention` cuts a forward: rows with the same number of real queries and attended
    keys go together; per group (rows [G], query slots [G, nq], key slots [G, L], additive mask
    [G, 1, nq, L]). Keys are those any real query of the row attends (the mask's zeros), in slot order."""
    by_shape: dict[tuple[int, int], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    for b in range(valid.shape[0]):
        rows = valid[b].nonzero().squeeze(1)
        if len(rows):
            keys = (attention_mask[b, 0].index_select(0, rows) == 0).any(0).nonzero().squeeze(1)
            by_shape.setdefault((len(rows), len(keys)), []).append((b, rows, keys))
    groups = []
    for members in by_shape.values():
        bs = torch.tensor([b for b, _, _ in members], device=attention_mask.device)
        q = torch.stack([r for _, r, _ in members])
        k = torch.stack([k for _, _, k in members])
        mask = torch.stack([attention_mask[b, 0][r][:, kk] for b, r, kk in members])[:, None]
        groups.append((bs, q, k, mask))
    return groups


def rowwise_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor,
                      valid: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """SDPA row by row: row b's real queries (`valid[b]`) over the keys any of them attends (the
    additive mask's zeros), nothing else; rows of one shape as one call (SDPA computes each row of a
    call alike). query [B, H, N, D], key/value [B, Hkv, K, D], mask [B, 1, N, K] -> [B, N, H, D]
    (zeros at padded queries)."""
    # every layer (of one layer type) of a forward passes the same mask: its groups are cut once
    layout = (attention_mask.data_ptr(), tuple(attention_mask.shape), attention_mask.stride(), valid.data_ptr(),
              tuple(valid.shape), valid.stride())
    plans = _queries.plans if _queries.plans is not None else {}
    if layout not in plans:
        plans[layout] = row_groups(attention_mask, valid)
    B, H, N, D = query.shape
    Hkv = key.shape[1]
    out = query.new_zeros(B, N, H, value.shape[-1])
    for rows, q_slots, k_slots, mask in plans[layout]:
        G = q_slots.shape[0]
        if G == 1:  # (most rows: one copy of just its keys)
            b = rows[:1]
            q = query[b].index_select(2, q_slots[0])
            k, v = key[b].index_select(2, k_slots[0]), value[b].index_select(2, k_slots[0])
        else:
            q = query.index_select(0, rows).gather(2, q_slots[:, None, :, None].expand(-1, H, -1, D))
            at = k_slots[:, None, :, None].expand(-1, Hkv, -1, D)
            k = key.index_select(0, rows).gather(2, at)
            v = value.index_select(0, rows).gather(2, k_slots[:, None, :, None].expand(-1, Hkv, -1, value.shape[-1]))
        out[rows[:, None], q_slots] = _attend(q, k, v, mask, scaling).transpose(1, 2)
    return out


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float | None
            ) -> torch.Tensor:
    """Eager attention of G rows alike (softmax in float32, as transformers' eager attention), grouped
    K/V kept grouped: q [G, H, nq, D], k/v [G, Hkv, L, D], additive mask [G, 1, nq, L] -> [G, H, nq, D].
    Each row's numbers depend on its own inputs only (batched GEMMs compute each matrix alike), and
    for the few keys of a decode step it is several times faster than SDPA's kernel on a CPU."""
    G, H, nq, D = q.shape
    Hkv = k.shape[1]
    scale = scaling if scaling is not None else D ** -0.5
    grouped = q.reshape(G, Hkv, (H // Hkv) * nq, D)               # query head h reads K/V head h // (H / Hkv)
    scores = torch.matmul(grouped, k.transpose(-1, -2)) * scale    # [G, Hkv, g * nq, L]
    scores = scores.view(G, Hkv, H // Hkv, nq, -1) + mask[:, :, None]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs.view(G, Hkv, (H // Hkv) * nq, -1), v).view(G, H, nq, -1)


def gqa_sdpa_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Same contract as `transformers.integrations.sdpa_attention.sdpa_attention_forward`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    valid = current_valid()
    special = kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None or \
        kwargs.get("output_attentions", False) or dropout
    if ENABLED and valid is not None and attention_mask is not None and attention_mask.dim() == 4 and not special \
            and tuple(valid.shape) == (query.shape[0], query.shape[2]):
        return rowwise_attention(query, key, value, attention_mask, valid.to(query.device), scaling), None
    groups = getattr(module, "num_key_value_groups", 1)
    plain = (groups == 1 or query.shape[2] == 1 or kwargs.get("position_bias") is not None
             or kwargs.get("softcap") is not None or kwargs.get("output_attentions", False))
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(attention_mask is None and is_causal)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal,
        enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register the attention function, and sdpa's mask function under the same name (without one,
    transformers builds no mask for it, and its own multi-token cached forwards, e.g. assisted
    generation's verification, would attend causally from the wrong corner)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(NAME, gqa_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_gqa_sdpa(model: nn.Module) -> bool:
    """Switch `model` (on CPU, attention `sdpa`) to `gqa_sdpa_attention`, in place. Returns whether it
    did; a model on another device or with another attention implementation is left alone."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    register()
    model.set_attn_implementation(NAME)
    return True
