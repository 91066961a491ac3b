"""What a `runtime.kv_state.KVState` needs of the member it serves, and the member's cost counters.

`ModelRunner` is the protocol (a `runtime.member.Member` satisfies it); keeping it here lets the KV
state depend on this small module rather than on `runtime.member`, which builds states (no import
circle).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class Counters:
    """Running totals of model work for one member (views of a model share their model's)."""

    forward_passes: int = 0
    tokens_processed: int = 0

    def count(self, tokens: int) -> None:
        """One forward that fed `tokens` token positions."""
        self.forward_passes += 1
        self.tokens_processed += tokens

    def snapshot(self) -> tuple[int, int]:
        return self.forward_passes, self.tokens_processed


class ModelRunner(Protocol):
    """The model side of a KV state: the causal LM, where and how it runs, and what it costs."""

    model: Any                      # the causal LM (transformers' contract: input_ids, attention_mask, ...)
    name: str
    counters: Counters
    sliding_window: int | None
    has_sliding: bool
    vocab_size: int
    adapter: Any                    # a view's LoRA adapter (`runtime.lora_views.LoraWeights`) or None

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...
