"""Advantages for policy gradients: pure functions of rewards, no model.

- `group_advantages(rewards)`: GRPO's group-normalised advantages. `rewards[g, i]` is the return of
  rollout i of group g (G rollouts from the same start state); A = (r − mean_g) / (std_g + eps), std
  over the group (unbiased, as TRL's GRPOTrainer); a group whose rewards are all equal gets zeros
  (it says nothing about which choice was better, and its std is 0 or undefined).
- `RunningBaseline`: REINFORCE with a baseline, A = r − b where b is the running mean of the returns
  seen before this batch (cumulative mean, or an exponential one with `momentum`); `.update` gives the
  next baseline, so the state is a small value that checkpoints as JSON.
- `decision_returns(step_rewards, gamma, to_go)`: the return credited to each decision of one episode:
  the episode's (discounted) return for every decision, or with `to_go` the discounted reward from
  that decision on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


def group_advantages(rewards: torch.Tensor | Sequence[Sequence[float]], eps: float = 1e-6) -> torch.Tensor:
    """(r − mean) / (std + eps) within each row of `rewards` [groups, G]; all-equal rows give zeros.
    A row of one rollout (G = 1) is all-equal, so zero. Returns float64 [groups, G]."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if r.dim() != 2:
        raise ValueError(f"rewards must be [groups, G], got shape {tuple(r.shape)}")
    if r.shape[1] < 2:
        return torch.zeros_like(r)
    flat = (r.max(dim=1).values - r.min(dim=1).values) == 0
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, keepdim=True)
    adv = (r - mean) / (std + eps)
    return torch.where(flat[:, None], torch.zeros_like(adv), adv)


@dataclass(frozen=True)
class RunningBaseline:
    """b = running mean of past returns; `momentum=None`: cumulative mean over all `count` returns,
    else b ← momentum·b + (1 − momentum)·mean(batch). Before any return, b = `value` (0 by default)."""

    value: float = 0.0
    count: int = 0
    momentum: float | None = None

    def advantages(self, rewards: torch.Tensor | Sequence[float]) -> torch.Tensor:
        """A = r − b with the baseline of the returns seen before this batch (float64, shape of r)."""
        return torch.as_tensor(rewards, dtype=torch.float64) - self.value

    def update(self, rewards: torch.Tensor | Sequence[float]) -> "RunningBaseline":
        """The baseline after seeing `rewards` (this object is unchanged)."""
        r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
        if r.numel() == 0:
            return self
        if self.momentum is None or self.count == 0:
            total = self.value * self.count + float(r.sum())
            return RunningBaseline(total / (self.count + r.numel()), self.count + r.numel(), self.momentum)
        value = self.momentum * self.value + (1.0 - self.momentum) * float(r.mean())
        return RunningBaseline(value, self.count + r.numel(), self.momentum)


def decision_returns(step_rewards: Sequence[float], gamma: float = 1.0, to_go: bool = False) -> list[float]:
    """The return credited to each of an episode's decisions (rewards r_0..r_{T-1} in order).
    `to_go=False`: every decision gets R = Σ_k γ^k r_k (the episode's return; γ = 1: the plain sum);
    `to_go=True`: decision t gets Σ_{k≥t} γ^(k−t) r_k."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if not to_go:
        total = sum(r * gamma ** k for k, r in enumerate(step_rewards))
        return [total] * len(step_rewards)
    out: list[float] = []
    acc = 0.0
    for r in reversed(step_rewards):
        acc = r + gamma * acc
        out.append(acc)
    return out[::-1]
