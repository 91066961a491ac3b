"""Logits -> probabilities, exactly as transformers' warpers do (temperature, then top-k, then top-p).

Pure functions: tensors in, tensors out. Temperature 0 means greedy: a one-hot at the argmax
(first index on ties, as `torch.argmax` and transformers' greedy search pick).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def warp_logits(
    logits: torch.Tensor,  # [..., V]
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:  # [..., V] float32 logits, -inf where filtered
    """Apply TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper (transformers' order)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    scores = logits.float()
    if temperature > 0 and temperature != 1.0:
        scores = scores / temperature
    if top_k and top_k > 0:
        k = min(int(top_k), scores.shape[-1])
        kth = torch.topk(scores, k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scores, descending=False, dim=-1)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - top_p)
        remove_sorted[..., -1:] = False  # min_tokens_to_keep = 1
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def logits_to_probs(
    logits: torch.Tensor,  # [..., V]
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:  # [..., V] float32, rows sum to 1
    """Next-token distribution after warping; temperature 0 gives the greedy one-hot."""
    if temperature == 0:
        idx = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, idx, 1.0)
    return warp_logits(logits, temperature, top_k, top_p).softmax(dim=-1)


def on_generator(t: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """`t` on `generator`'s device (a seeded draw happens where its generator lives: a CUDA generator
    cannot draw for a CPU tensor, nor the reverse); as is without a generator."""
    return t if generator is None else t.to(generator.device)


def draw(
    probs: torch.Tensor,  # [V] one row's distribution
    generator: torch.Generator | None = None,
) -> int:
    """One token from one row's distribution, with the row's generator when it has one (seeded draws
    happen on the generator's device), else torch's global generator: every single draw goes here."""
    return int(torch.multinomial(on_generator(probs, generator), 1, generator=generator))


def sample(
    probs: torch.Tensor,  # [B, V]
    generators: list[torch.Generator | None] | None = None,
) -> torch.Tensor:  # [B] long
    """One token per row; row b draws from `generators[b]` when given (seeded, batch-invariant)."""
    if generators is None:
        return torch.multinomial(probs, 1).squeeze(-1)
    out = [torch.multinomial(on_generator(probs[b], g), 1, generator=g).squeeze(-1).to(probs.device)
           for b, g in enumerate(generators)]
    return torch.stack(out)


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn (transformers' `GenerationConfig` names): temperature 0 is greedy; row i
    of a batch samples from its own generator seeded `seed + i`, so a batched run equals per-row
    runs (`seed=None`: torch's global generator)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature={t!r} is invalid: a finite number >= 0")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} is invalid: an integer >= 0 (0: off)")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p!r} is invalid: a number in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generators(self, n: int, device="cpu") -> list[torch.Generator] | None:
        """One generator per row, seeded `seed + row` (None without a seed)."""
        if self.seed is None:
            return None
        return [torch.Generator(device=device).manual_seed(int(self.seed) + i) for i in range(n)]

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits_to_probs` with these parameters."""
        return logits_to_probs(logits, self.temperature, self.top_k, self.top_p)
