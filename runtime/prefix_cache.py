"""Prompt-prefix KV, reused across rows and calls: an LRU of per-chunk keys/values.

Every full chunk of `Member.prefix_chunk` tokens of a prompt (all but a last partial chunk) is keyed
by the prompt's ids up to the chunk's end and computed on a miss by one batch-1 forward of exactly
that chunk after the earlier ones (`Member.prefix_chunks`), so a chunk's KV does not depend on the
batch it is in or on the prompts before it; k-shot prompts share their exemplars and an evaluation
prefills them once. `KVState.load_prefix` puts the chunks of a batch into a state's cache.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch

# per layer (keys, values) of one chunk of one prompt prefix, [1, heads, chunk, head_dim] (None for a
# layer that keeps no cache of its own)
ChunkKV = list[tuple[torch.Tensor, torch.Tensor] | None]


class PrefixCache:
    """LRU map: prompt ids up to a chunk's end -> that chunk's `ChunkKV`. Memory: `max_chunks`
    chunks of K/V, e.g. ~200 MB for qwen2.5-coder-0.5b and ~470 MB for the 1.5B at 128 x 64 tokens."""

    def __init__(self, max_chunks: int = 128):
        self.max_chunks = max_chunks
        self._chunks: OrderedDict[tuple[int, ...], ChunkKV] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def get(self, key: tuple[int, ...]) -> ChunkKV | None:
        kv = self._chunks.get(key)
        if kv is None:
            self.misses += 1
            return None
        self.hits += 1
        self._chunks.move_to_end(key)
        return kv

    def put(self, key: tuple[int, ...], kv: ChunkKV) -> None:
        self._chunks[key] = kv
        self._chunks.move_to_end(key)
        while len(self._chunks) > self.max_chunks:
            self._chunks.popitem(last=False)

    def clear(self) -> None:
        self._chunks.clear()


def chunk_of(cache, first: int, size: int) -> ChunkKV:
    """Copies of the keys/values at slots first..first+size-1 of every layer of a batch-1 `cache`."""
    return [None if layer.keys is None or layer.keys.numel() == 0 else
            (layer.keys[:, :, first: first + size].clone(), layer.values[:, :, first: first + size].clone())
            for layer in cache.layers]


def stacked_layer(chunks: Sequence[Sequence[ChunkKV]], lengths: Sequence[int], layer: int, width: int
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Layer `layer`'s keys and values [B, heads, width, head_dim] of each row's chunks in order
    (row b's first lengths[b] positions; zeros after); None when no chunk has that layer."""
    ref = next((kv[layer] for row in chunks for kv in row if kv[layer] is not None), None)
    if ref is None:
        return None
    k0, v0 = ref
    B = len(chunks)
    keys = k0.new_zeros(B, k0.shape[1], width, k0.shape[3])
    values = v0.new_zeros(B, v0.shape[1], width, v0.shape[3])
    for b, row in enumerate(chunks):
        if row:
            keys[b, :, : lengths[b]] = torch.cat([kv[layer][0][0] for kv in row], dim=1)
            values[b, :, : lengths[b]] = torch.cat([kv[layer][1][0] for kv in row], dim=1)
    return keys, values
