"""Exact moments of policy-gradient estimators on a one-state bandit, by enumeration (pure math).

The bandit has K options with rewards r(k). A text policy writes option k as one of R realisations
(e.g. a 2-token text whose first token is one of R spellings, the second the option's label), with
joint law p(s, k) over (realisation, option); the option law is the marginal π(k) = Σ_s p(s, k).
For a parameter vector θ and a constant baseline b (advantage A(k) = (r(k) − b) / scale):
- decision-plane estimator  g_D = A(k) ∇ log π(k),     k ~ π;
- token-level estimator      g_T = A(k) ∇ log p(s, k),  (s, k) ~ p.
Both have mean ∇ E_π[r]; since ∇ log p(s, k) = ∇ log π(k) + ∇ log p(s | k) and E[∇ log p(s | k) | k] = 0,
g_D = E[g_T | k]: marginalising drops the zero-mean component A(k) ∇ log p(s | k), so
Var g_T = Var g_D + E ‖A(k) ∇ log p(s | k)‖² (total variance = trace of the covariance).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.autograd.functional import jacobian

JointLaw = Callable[[torch.Tensor], torch.Tensor]  # θ [P] -> p(s, k) [R, K]


def two_token_law(num_spellings: int, num_options: int) -> JointLaw:
    """θ = [first-token logits (R), second-token logits given the first (R·K)] ->
    p(s, k) = softmax(θ_first)[s] · softmax(θ_second[s])[k]."""
    def law(theta: torch.Tensor) -> torch.Tensor:
        first = torch.softmax(theta[:num_spellings], dim=0)
        second = torch.softmax(theta[num_spellings:].view(num_spellings, num_options), dim=1)
        return first[:, None] * second
    return law


@dataclass(frozen=True)
class Moments:
    """Exact mean [P] and total variance E‖g − E g‖² of an estimator g."""

    mean: torch.Tensor
    variance: float


def _moments(probs: torch.Tensor, values: torch.Tensor) -> Moments:
    """Moments of g taking `values[i]` [n, P] with probability `probs[i]` [n]."""
    mean = (probs[:, None] * values).sum(0)
    second = float((probs * (values ** 2).sum(1)).sum())
    return Moments(mean, second - float(mean @ mean))


def advantages(law: JointLaw, theta: torch.Tensor, rewards: torch.Tensor, baseline: float | None = None,
               scale: float = 1.0) -> torch.Tensor:
    """A(k) = (r(k) − b) / scale, b = E_π[r] at θ unless given (a constant: both estimators stay unbiased)."""
    pi = law(theta).sum(0).detach()
    b = float(pi @ rewards) if baseline is None else baseline
    return (rewards - b) / scale


def exact_gradient(law: JointLaw, theta: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """∇_θ E_π[r] = ∇ Σ_k π(k) r(k), by autograd."""
    return jacobian(lambda t: law(t).sum(0) @ rewards, theta)


def decision_moments(law: JointLaw, theta: torch.Tensor, adv: torch.Tensor) -> Moments:
    """Moments of g_D = A(k) ∇ log π(k), k ~ π, by enumerating the K options."""
    pi = law(theta).sum(0).detach()
    grads = jacobian(lambda t: law(t).sum(0).log(), theta)              # [K, P]
    return _moments(pi, adv[:, None] * grads)


def token_moments(law: JointLaw, theta: torch.Tensor, adv: torch.Tensor) -> Moments:
    """Moments of g_T = A(k) ∇ log p(s, k), (s, k) ~ p, by enumerating the R·K texts."""
    joint = law(theta).detach()
    grads = jacobian(lambda t: law(t).log(), theta)                     # [R, K, P]
    values = adv[None, :, None] * grads
    return _moments(joint.reshape(-1), values.reshape(-1, theta.numel()))


def zero_mean_component(law: JointLaw, theta: torch.Tensor, adv: torch.Tensor) -> tuple[torch.Tensor, float]:
    """c = A(k) ∇ log p(s | k): its conditional means E[c | k] [K, P] (zero) and E‖c‖², the variance
    the token-level estimator carries on top of the decision-plane one."""
    joint = law(theta).detach()
    cond = jacobian(lambda t: (law(t) / law(t).sum(0, keepdim=True)).log(), theta)  # [R, K, P]
    c = adv[None, :, None] * cond
    p_s_given_k = joint / joint.sum(0, keepdim=True)
    cond_mean = (p_s_given_k[:, :, None] * c).sum(0)
    return cond_mean, float((joint * (c ** 2).sum(-1)).sum())
