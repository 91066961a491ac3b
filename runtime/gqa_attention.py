"""SDPA attention that keeps grouped-query K/V grouped (`enable_gqa`) under an explicit mask.

transformers' `sdpa` attention repeats every key/value head `num_key_value_groups` times whenever a
query has more than one token and a mask is given (the CUDA kernels want it so). Our multi-token
forwards (candidate trees, tree drafts, word completions) always pass a 4D mask, so on a CPU each
layer copied the whole KV cache 3x (SmolLM2), 4x (Gemma 3) or 7x (Qwen2.5) per forward: for 4 rows x
600 cached tokens that was most of a SmolLM2 forward's time. torch's CPU kernel takes the grouped
K/V directly (`enable_gqa=True`), with results equal to the repeated version.

`use_gqa_sdpa(model)` switches a model that uses `sdpa` to this function; everything else (one query
token, no grouping, position bias, softcap) goes through transformers' own `sdpa` unchanged.
"""
from __future__ import annotations

import torch
from torch import nn

NAME = "sdpa_gqa"


def gqa_sdpa_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Same contract as `transformers.integrations.sdpa_attention.sdpa_attention_forward`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

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
