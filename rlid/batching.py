"""Batched forwards of a causal LM over prompts of different lengths (left padding), and the work
counters the decision model and the token-level policy keep.

`left_pad(seqs, pad_id)`: ids [B, T], attention mask [B, T], position ids [B, T] (each row counts
from 0 at its first real token, so a padded row's positions equal its unbatched ones).
`forward(model, ids, mask, positions, keep, cache)`: one forward returning logits for the last `keep`
positions only (`logits_to_keep`, where the model takes it), extending `cache` (a transformers
`DynamicCache`, `new_cache(model)`) in place when one is given.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from runtime.hf_compat import cache_kwargs, forward_params

__all__ = ["PolicyCounters", "pad_token_id", "left_pad", "new_cache", "forward"]


@dataclass
class PolicyCounters:
    """Running totals of one policy's work: calls, model forwards, decisions (states answered),
    tokens fed, seconds inside the policy."""

    calls: int = 0
    forwards: int = 0
    decisions: int = 0
    tokens: int = 0
    seconds: float = 0.0
    _started: float = field(default=0.0, repr=False)

    def start(self) -> None:
        self._started = time.perf_counter()

    def stop(self, decisions: int) -> None:
        self.calls += 1
        self.decisions += decisions
        self.seconds += time.perf_counter() - self._started

    @property
    def decisions_per_second(self) -> float:
        return self.decisions / self.seconds if self.seconds > 0 else 0.0

    @property
    def forwards_per_decision(self) -> float:
        return self.forwards / self.decisions if self.decisions else 0.0


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id, else its EOS, else 0 (padded positions are masked out anyway)."""
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(value, int):
            return value
    return 0


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device=None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [B, T], attention mask [B, T], position ids [B, T]) with every row right-aligned."""
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("left_pad needs a non-empty batch of non-empty sequences")
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, T - len(s):] = torch.tensor(list(s), dtype=torch.long)
        mask[b, T - len(s):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)


def _takes_logits_to_keep(model) -> bool:
    return "logits_to_keep" in forward_params(model)


def new_cache(model):
    """An empty KV cache for `model` (sliding-window layers included, from its config)."""
    from transformers import DynamicCache

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return DynamicCache(config=base.config)


def forward(model, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, keep: int = 1, cache=None):
    """One forward; `.logits` is [B, keep, V] (the last `keep` positions). With `cache`, the model
    reads and extends it and `mask` covers the cache and the new ids; `positions` the new ids only."""
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=cache is not None)
    if cache is not None:
        kwargs.update(cache_kwargs(model, cache))
    if _takes_logits_to_keep(model):
        kwargs["logits_to_keep"] = keep
    out = model(**kwargs)
    if out.logits.shape[1] != keep:
        out.logits = out.logits[:, -keep:]
    return out
