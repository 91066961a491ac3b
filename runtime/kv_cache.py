"""A KV cache that grows in place: new keys/values are written into spare capacity.

transformers' `DynamicLayer` appends by `torch.cat`, which allocates and copies the whole cache of
every layer at every forward. On a CPU with an 8-shot prompt (~1,300 tokens) that copy, and the
page faults of the fresh allocation, took 36 % of a SmolLM2-135M one-token forward, 31 % of
Gemma-3-270M's and 15 % of Qwen2.5-0.5B's. `GrowableLayer` keeps each layer's keys and values at the
front of a buffer with room to spare (capacity grows geometrically), so an append copies only the
new tokens; `crop` only shortens the visible length.

`keys` / `values` are views of the first `length` positions of the buffers, so everything that
reads a `DynamicLayer` reads this one unchanged. Assigning them (`compact()` does) adopts the new
tensors; a buffer that came from outside is never written in place (the next append copies it into
a fresh buffer of its own), so a tensor someone else holds is never modified.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 64  # positions


def grown_capacity(needed: int, current: int) -> int:
    """Capacity for `needed` positions when `current` is too small: at least 1.5x (amortised O(1) per
    position), at least `MIN_CAPACITY`."""
    return max(needed, current + current // 2, MIN_CAPACITY)


class GrowableLayer(DynamicLayer):
    """`DynamicLayer` with in-place appends. Same contract: `update` returns all keys/values so far."""

    def __init__(self, **kwargs):
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None
        self._length = 0
        self._owned = False  # the buffers were allocated here (may be written in place)
        super().__init__(**kwargs)

    # keys / values: views of the filled part; assignment adopts a tensor (read-only until regrown)
    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._key_buf is None else self._key_buf[:, :, : self._length]

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._key_buf, self._owned = tensor, False
        self._length = 0 if tensor is None or tensor.dim() < 4 else tensor.shape[-2]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._value_buf is None else self._value_buf[:, :, : self._length]

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._value_buf, self._owned = tensor, False
        if tensor is not None and tensor.dim() == 4 and self._key_buf is not None and tensor.shape[-2] != self._length:
            raise ValueError("keys and values of a cache layer must have the same length")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._key_buf = self._value_buf = None
        self._length, self._owned = 0, False
        self.is_initialized = True

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        """Make the buffers ours, shaped like the new states, with room for `needed` positions."""
        kb, vb = self._key_buf, self._value_buf
        fits = (self._owned and kb is not None and kb.dim() == 4 and kb.shape[-2] >= needed
                and kb.shape[:2] == key_states.shape[:2] and vb.shape[:2] == value_states.shape[:2])
        if fits:
            return
        current = kb.shape[-2] if self._owned and kb is not None and kb.dim() == 4 else 0
        capacity = grown_capacity(needed, current)
        B, H = key_states.shape[:2]
        new_k = key_states.new_empty(B, H, capacity, key_states.shape[-1])
        new_v = value_states.new_empty(B, value_states.shape[1], capacity, value_states.shape[-1])
        if self._length:
            new_k[:, :, : self._length].copy_(kb[:, :, : self._length])
            new_v[:, :, : self._length].copy_(vb[:, :, : self._length])
        self._key_buf, self._value_buf, self._owned = new_k, new_v, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, n = self._length, key_states.shape[-2]
        self._reserve(key_states, value_states, start + n)
        self._key_buf[:, :, start: start + n].copy_(key_states)
        self._value_buf[:, :, start: start + n].copy_(value_states)
        self._length = start + n
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `-tokens_to_remove` positions (a negative count, as in `DynamicLayer.crop`)."""
        if tokens_to_remove > 0:
            raise ValueError("crop() takes a negative number of positions to remove")
        if tokens_to_remove and self.is_initialized:
            self._length = max(self._length + tokens_to_remove, 0)


class GrowableCache(DynamicCache):
    """`DynamicCache` whose layers are `GrowableLayer`s (created lazily, one per attention layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = GrowableLayer
