"""Cross-member scoring of candidate texts: pure functions over per-token log-probs.

Members tokenise the same text differently, so a raw sum of log-probs favours coarse tokenizers
and per-token means favour fine ones in other ways. `normalised_score` offers:
- "token": mean log-prob per token of the member's own tokenisation (the AdaFuse paper);
- "byte":  total log-prob divided by the UTF-8 byte length of the text (tokenizer-independent unit);
- "char":  total log-prob per character;
- "sum":   the raw total.
"""
from __future__ import annotations

from typing import Sequence

import torch

NORMALISATIONS = ("token", "byte", "char", "sum")


def normalised_score(token_logprobs: torch.Tensor, text: str, mode: str = "byte") -> float:
    """Score of one candidate under one member: `token_logprobs` [T] are the member's log-probs of
    its own tokens of `text` given the shared prefix."""
    if mode not in NORMALISATIONS:
        raise ValueError(f"unknown normalisation '{mode}'; use one of {', '.join(NORMALISATIONS)}")
    total = float(token_logprobs.sum())
    if mode == "sum":
        return total
    if mode == "token":
        return total / max(int(token_logprobs.numel()), 1)
    if mode == "byte":
        return total / max(len(text.encode("utf-8")), 1)
    return total / max(len(text), 1)


def combine_scores(
    scores: torch.Tensor,  # [M, C] per member, per candidate (normalised log-probs)
    weights: Sequence[float] | torch.Tensor | None = None,  # [M], need not sum to 1
) -> torch.Tensor:  # [C] weighted mean over members
    """Weighted average of members' candidate scores."""
    M = scores.shape[0]
    w = torch.ones(M, dtype=scores.dtype) if weights is None else torch.as_tensor(weights, dtype=scores.dtype)
    if w.shape != (M,) or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ValueError(f"weights must be {M} non-negative numbers with a positive sum, got {w.tolist()}")
    return (w[:, None] * scores).sum(0) / w.sum()
