"""The uncertainty gate of adaptive word-level ensembling: pure functions over probability tensors."""
from __future__ import annotations

import torch


def top2_margin(
    probs: torch.Tensor,  # [B, V] next-token distribution of the proposing member, rows sum to 1
) -> torch.Tensor:  # [B] float32: p(top-1) - p(top-2), in [0, 1]
    """Margin m = p1 - p2 of each row's distribution (top-1 minus top-2 probability)."""
    top = torch.topk(probs.float(), k=min(2, probs.shape[-1]), dim=-1).values
    if top.shape[-1] == 1:
        return top[:, 0]
    return top[:, 0] - top[:, 1]


def is_confident(margin: float, threshold: float) -> bool:
    """Confident iff m >= threshold (the paper's gate; threshold 0.7 by default)."""
    return margin >= threshold


GATE_DECISIONS = ("off", "uncertain", "forced", "confident")


def gate_decision(margin: float, streak: int, threshold: float, span: int, gate: bool = True) -> str:
    """A row's decision at a word start, the one rule every path applies (the step's gate, the lead's
    multi-word runs, its speculative runs): "off" (the gate is off: every word is ensembled),
    "uncertain" (margin below `threshold`), "forced" (`streak` confident words since the last
    ensembled word have used up `span`) or "confident" (the lead writes the word alone)."""
    if not gate:
        return "off"
    if not is_confident(margin, threshold):
        return "uncertain"
    if streak >= span:
        return "forced"
    return "confident"
