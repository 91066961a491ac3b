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

from runtime.sampling import draw

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


CALIBRATIONS = ("none", "softmax")


def fuse_scores(
    scores: torch.Tensor,  # [M, C] per member, per candidate (normalised log-probs)
    weights: Sequence[float] | torch.Tensor | None = None,  # [M]
    calibration: str = "none",
) -> torch.Tensor:  # [C] fused score (higher is better)
    """Fuse members' candidate scores.

    - "none":    weighted mean of the normalised log-probs (the paper). One member that rates the
                 others' candidates very low can veto them (self-preference).
    - "softmax": each member's scores become its distribution over the candidate union
                 (softmax over candidates), the fused score is log of the weighted mixture. Each
                 member then contributes at most its weight of probability mass, so a
                 self-confident member cannot outvote a majority that mildly prefers another word.
    """
    if calibration not in CALIBRATIONS:
        raise ValueError(f"unknown calibration '{calibration}'; use one of {', '.join(CALIBRATIONS)}")
    if calibration == "none":
        return combine_scores(scores, weights)
    return combine_scores(scores.float().softmax(dim=-1), weights).clamp_min(1e-30).log()


def choose(
    fused: torch.Tensor,  # [C] fused scores
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> int:
    """Index of the chosen candidate: argmax (first on ties) at temperature 0, else a draw from
    softmax(fused / temperature) using `generator` (reproducible with a seeded generator)."""
    if temperature <= 0:
        return int(torch.argmax(fused))
    probs = torch.softmax(fused.float() / temperature, dim=-1)
    return draw(probs, generator)
