"""How much memory a batch of prompts takes beyond the weights, and batches cut to fit in it.

`batch_bytes(member, prompt_lengths, max_new_tokens)` is an upper estimate for one member decoding
the rows together: the KV cache of every row at its full length (rows are padded to the longest),
the prefill's transient activations (the MLP's intermediate and the attention scores of one layer at
a time, in float32) and the next-token logits. `fitting_batches(costs, budget)` cuts a batch into
consecutive sub-batches whose estimates fit in `budget` bytes; a row that does not fit alone raises a
one-line `InsufficientMemoryError`. `memory_budget()` is the free RAM the runner may fill: 80 % of
what the OS reports available, or `$ADAFUSE_MEMORY_BUDGET_GIB`.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from runtime.errors import InsufficientMemoryError

GIB = 2 ** 30


def _config(member: Any) -> Any:
    cfg = member.model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def kv_bytes_per_token(member: Any) -> int:
    """Bytes of keys + values one token of one row keeps in `member`'s cache (all layers)."""
    cfg = _config(member)
    heads = int(getattr(cfg, "num_attention_heads", 1))
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    width = member.dtype.itemsize
    return int(cfg.num_hidden_layers) * 2 * kv_heads * head_dim * width


def batch_bytes(member: Any, prompt_lengths: Sequence[int], max_new_tokens: int) -> int:
    """Upper estimate (bytes) of what decoding these rows together takes in `member` beyond its weights."""
    if not prompt_lengths:
        return 0
    cfg = _config(member)
    rows, longest = len(prompt_lengths), max(prompt_lengths)
    kv = rows * (longest + max_new_tokens) * kv_bytes_per_token(member)
    hidden = int(cfg.hidden_size)
    inner = int(getattr(cfg, "intermediate_size", None) or 4 * hidden)
    heads = int(getattr(cfg, "num_attention_heads", 1))
    prefill = rows * longest * 4 * (4 * hidden + 2 * inner) + rows * heads * longest * longest * 4
    logits = rows * int(member.vocab_size) * 4 * 2
    return kv + prefill + logits


def fitting_batches(costs: Callable[[Sequence[int]], int], n: int, budget: int,
                    describe: Callable[[int], str] = lambda i: f"prompt #{i}") -> list[range]:
    """Consecutive ranges covering 0..n-1, each as long as it can be while `costs(rows)` (bytes of
    those rows decoded together) stays within `budget`. One-line `InsufficientMemoryError` when a
    single row does not fit."""
    out: list[range] = []
    start = 0
    while start < n:
        end = start + 1
        need = costs(range(start, end))
        if need > budget:
            raise InsufficientMemoryError(
                f"{describe(start)} alone needs ~{need / GIB:.1f} GiB beyond the weights (KV cache and activations), "
                f"{budget / GIB:.1f} GiB may be used; lower max_new_tokens, shorten the prompt or use dtype bfloat16")
        while end < n and costs(range(start, end + 1)) <= budget:
            end += 1
        out.append(range(start, end))
        start = end
    return out


def memory_budget(available: int | None = None) -> int:
    """Bytes a batch may take: $ADAFUSE_MEMORY_BUDGET_GIB if set, else 80 % of the available RAM."""
    env = os.environ.get("ADAFUSE_MEMORY_BUDGET_GIB")
    if env:
        return int(float(env) * GIB)
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    return int(0.8 * available)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed (torch's CPU allocator, or Python's MemoryError)."""
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "allocate" in str(exc)
                                            and ("memory" in str(exc) or "bytes" in str(exc)))
