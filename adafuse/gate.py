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
