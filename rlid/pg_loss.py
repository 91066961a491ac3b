"""Policy-gradient losses: pure functions over log-probability tensors, no model.

Decision plane (π a small categorical over each state's menu, so KL and entropy are exact sums):
  loss = −(1/N) Σ_n A_n log π(a_n | s_n) + β (1/N) Σ_n KL(π_n ‖ π_ref,n) − c (1/N) Σ_n H(π_n),
  where a row n given option values V_n (a last move whose every option's reward is known) uses the
  exact expectation over its menu instead: −Σ_a π(a | s_n) V_n(a), whose gradient is
  E_{a~π}[V_n(a) ∇log π(a | s_n)] — the sampled term's mean, with no sampling variance.
  An auxiliary exact term (`aux_values` R_n on rows `aux`, weight λ) adds −λ (1/N) Σ_n Σ_a π(a | s_n) R_n(a)
  to either: the expected immediate reward over the whole menu, every option's reward known.
  KL(π ‖ π_ref) = Σ_a π(a) (log π(a) − log π_ref(a)), H(π) = −Σ_a π(a) log π(a).
Token level (the action written as text y_1..y_T; the advantage goes to every generated token):
  loss = −(1/N) Σ_n A_n Σ_t log p(y_{n,t}) + β (1/N) Σ_n Σ_t k3_{n,t},
  k3 = exp(d) − d − 1 with d = log p_ref(y_t) − log p(y_t) on the sampled tokens (Schulman's
  estimator, as TRL's GRPOTrainer): E_p[k3] = KL(p ‖ p_ref), never negative. Given one log-prob per
  sequence (the sum over its tokens), k3 of the sums is the same estimator of the sequence-level KL
  (unbiased, noisier than the per-token sum).
`normaliser` (default N) divides the sums, so a batch split into chunks whose losses are
backpropagated one by one adds up to the loss of the whole batch.
"""
from __future__ import annotations

from typing import Sequence

import torch


def pad_log_probs(menus: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack per-state log π over menus of different sizes into [N, M_max], padding with −inf."""
    if not menus:
        raise ValueError("no decisions to stack")
    width = max(int(m.numel()) for m in menus)
    rows = [torch.cat([m.reshape(-1), m.new_full((width - m.numel(),), float("-inf"))]) for m in menus]
    return torch.stack(rows)


def _masked(log_pi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mask of real options, log π with padding set to 0, π with padding 0) for [N, M] −inf-padded."""
    mask = torch.isfinite(log_pi)
    safe = log_pi.masked_fill(~mask, 0.0)
    return mask, safe, safe.exp().masked_fill(~mask, 0.0)


def menu_kl(log_pi: torch.Tensor, ref_log_pi: torch.Tensor) -> torch.Tensor:
    """Exact KL(π ‖ π_ref) per state, [N], for −inf-padded [N, M] log-probs over the same menus."""
    mask, safe, probs = _masked(log_pi)
    ref_safe = ref_log_pi.masked_fill(~mask, 0.0)
    return (probs * (safe - ref_safe)).sum(dim=-1)


def menu_entropy(log_pi: torch.Tensor) -> torch.Tensor:
    """Exact entropy H(π) per state, [N], for −inf-padded [N, M] log-probs."""
    _, safe, probs = _masked(log_pi)
    return -(probs * safe).sum(dim=-1)


def decision_pg_loss(log_pi: torch.Tensor,            # [N, M] log π over each menu, −inf padded
                     actions: torch.Tensor,           # [N] chosen menu index (long)
                     advantages: torch.Tensor,        # [N] advantage of each decision
                     ref_log_pi: torch.Tensor | None = None,  # [N, M] log π_ref, same padding
                     beta: float = 0.0, entropy_coef: float = 0.0, normaliser: int | None = None,
                     option_values: torch.Tensor | None = None,  # [N, M] V_n(a) (0 padded), rows used where `exact`
                     exact: torch.Tensor | None = None,          # [N] bool: rows scored by their exact expectation
                     aux_values: torch.Tensor | None = None,     # [N, M] R_n(a) (0 padded), rows used where `aux`
                     aux: torch.Tensor | None = None,            # [N] bool: rows that add the auxiliary term
                     aux_weight: float = 0.0,
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """The decision-plane loss (module docstring) and its parts as floats (means over the N given)."""
    n = log_pi.shape[0]
    norm = float(normaliser if normaliser is not None else n)
    adv = advantages.to(log_pi.dtype)
    chosen = log_pi.gather(1, actions.long().view(-1, 1)).squeeze(1)
    terms = adv * chosen
    if option_values is not None and exact is not None:
        _, _, probs = _masked(log_pi)
        expected = (probs * option_values.to(log_pi.dtype)).sum(dim=-1)
        terms = torch.where(exact, expected, terms)
    if aux_values is not None and aux is not None and aux_weight:
        _, _, probs = _masked(log_pi)
        expected = (probs * aux_values.to(log_pi.dtype)).sum(dim=-1)
        terms = terms + aux_weight * torch.where(aux, expected, torch.zeros_like(expected))
    pg = -terms.sum() / norm
    loss = pg
    stats = {"pg_loss": float(pg.detach()), "logp_chosen": float(chosen.detach().mean()) if n else 0.0}
    if ref_log_pi is not None:
        kl = menu_kl(log_pi, ref_log_pi)
        loss = loss + beta * kl.sum() / norm
        stats["kl"] = float(kl.detach().mean()) if n else 0.0
    entropy = menu_entropy(log_pi)
    if entropy_coef:
        loss = loss - entropy_coef * entropy.sum() / norm
    stats["entropy"] = float(entropy.detach().mean()) if n else 0.0
    stats["loss"] = float(loss.detach())
    return loss, stats


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """k3 = exp(d) − d − 1, d = ref − log p, per sequence [N]: elementwise for [N], summed over the
    (masked) tokens for [N, T]."""
    d = ref_log_probs - log_probs
    k3 = torch.expm1(d) - d
    if k3.dim() == 1:
        return k3
    if mask is not None:
        k3 = k3 * mask.to(k3.dtype)
    return k3.sum(dim=-1)


def token_pg_loss(log_probs: torch.Tensor,            # [N] Σ_t log p(y_t), or [N, T] per token
                  advantages: torch.Tensor,           # [N]
                  ref_log_probs: torch.Tensor | None = None,  # same shape as log_probs
                  beta: float = 0.0, mask: torch.Tensor | None = None,  # [N, T] real tokens
                  normaliser: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The token-level loss (module docstring) and its parts as floats (means over the N given)."""
    n = log_probs.shape[0]
    norm = float(normaliser if normaliser is not None else n)
    seq = log_probs
    if log_probs.dim() == 2:
        seq = (log_probs * mask.to(log_probs.dtype) if mask is not None else log_probs).sum(dim=-1)
    adv = advantages.to(seq.dtype)
    pg = -(adv * seq).sum() / norm
    loss = pg
    stats = {"pg_loss": float(pg.detach()), "logp_chosen": float(seq.detach().mean()) if n else 0.0}
    if ref_log_probs is not None:
        kl = k3_kl(log_probs, ref_log_probs, mask)
        loss = loss + beta * kl.sum() / norm
        stats["kl"] = float(kl.detach().mean()) if n else 0.0
    stats["loss"] = float(loss.detach())
    return loss, stats
