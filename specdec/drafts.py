"""Draft sampling schemes for one position with n drafts (pure functions over prob tensors).

Schemes (see docs/algorithms.md §1):
  - "with":    n i.i.d. draws from q.
  - "without": successive sampling without replacement, via exponential clocks E_i / q_i.
  - "greedy":  the n-1 most likely tokens of q (set G), then one draw from q' = q restricted to
               Σ∖G, renormalised. Drafts are returned as (g_1 .. g_{n-1}, x_n).
"""
from __future__ import annotations

import math

import torch

from runtime.sampling import on_generator

SCHEMES = ("with", "without", "greedy")

_SUM_TOL = {torch.float64: 1e-6}
_DEFAULT_SUM_TOL = 1e-4


def check_probs(probs: torch.Tensor, name: str) -> None:
    """Raise ValueError unless `probs` [..., V] is a float tensor of non-negative rows summing to 1."""
    if not isinstance(probs, torch.Tensor) or not probs.is_floating_point():
        raise ValueError(f"{name} must be a floating-point torch.Tensor, got {type(probs).__name__}")
    if probs.dim() < 1 or probs.shape[-1] < 1:
        raise ValueError(f"{name} must have shape [..., V] with V >= 1, got {tuple(probs.shape)}")
    sums = probs.sum(-1, dtype=torch.float64)
    low = float(probs.min())  # NaN propagates; with finite row sums it also rules out +-inf
    # two reductions instead of four passes: the exact checks run only when these two look wrong
    if not (math.isfinite(low) and bool(torch.isfinite(sums).all())) and not bool(torch.isfinite(probs).all()):
        raise ValueError(f"{name} contains NaN or inf")
    if low < 0:
        raise ValueError(f"{name} has negative entries (min {low:.3g})")
    tol = _SUM_TOL.get(probs.dtype, _DEFAULT_SUM_TOL)
    worst = (sums - 1).abs().max().item()
    if worst > tol:
        raise ValueError(f"{name} rows must sum to 1 (worst |sum-1| = {worst:.3g} > {tol:g}); normalise first")


def check_pair(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> None:
    """Validate a (target, draft) pair: both valid probs with identical shapes."""
    check_probs(target_probs, "target_probs")
    check_probs(draft_probs, "draft_probs")
    if target_probs.shape != draft_probs.shape:
        raise ValueError(
            f"target_probs {tuple(target_probs.shape)} and draft_probs {tuple(draft_probs.shape)} must have the same shape"
        )


def check_scheme(scheme: str) -> None:
    """Raise ValueError unless `scheme` is one of `SCHEMES`."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown draft scheme {scheme!r}; choose one of {SCHEMES}")


def check_n(draft_probs: torch.Tensor, n: int, scheme: str) -> None:
    """n >= 1 always; for "without" and "greedy" n may not exceed the support of q (every row)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if scheme in ("without", "greedy"):
        support = int(torch.count_nonzero(draft_probs, dim=-1).min())  # entries are >= 0 (checked)
        if n > support:
            raise ValueError(f"n={n} drafts exceed the support of draft_probs ({support} tokens) for scheme {scheme!r}")


def to_float64(probs: torch.Tensor) -> torch.Tensor:
    """Cast to float64 and renormalise rows exactly (inputs already checked to sum to ~1)."""
    p = probs.to(torch.float64)
    return p / p.sum(-1, keepdim=True)


def greedy_set(draft_probs: torch.Tensor, n: int) -> torch.Tensor:
    """The n-1 most likely tokens of q, ties broken by lower token id. [..., V] -> [..., n-1] (long).

    A top-(n) selection instead of a full sort (a full sort of a 150k vocabulary per draft node was
    15 % of a speculative step); the full stable sort only when a tie straddles the cut."""
    k = n - 1
    if k <= 0:
        return torch.zeros((*draft_probs.shape[:-1], 0), dtype=torch.long, device=draft_probs.device)
    if k >= draft_probs.shape[-1]:
        return torch.sort(draft_probs, dim=-1, descending=True, stable=True).indices[..., :k]
    top = torch.topk(draft_probs, k + 1, dim=-1)
    if bool((top.values[..., k - 1] == top.values[..., k]).any()):
        return torch.sort(draft_probs, dim=-1, descending=True, stable=True).indices[..., :k]
    ids, perm = top.indices[..., :k].sort(dim=-1)  # ascending ids, then a stable sort by value
    order = torch.sort(top.values[..., :k].gather(-1, perm), dim=-1, descending=True, stable=True).indices
    return ids.gather(-1, order)


def greedy_residual_draft(draft_probs: torch.Tensor, n: int) -> torch.Tensor:
    """q' = q restricted to Σ∖G and renormalised, G = greedy_set(q, n). [..., V] -> [..., V] float64."""
    q = to_float64(draft_probs)
    g = greedy_set(q, n)
    q_rest = q.scatter(-1, g, 0.0)
    mass = q_rest.sum(-1, keepdim=True)
    if (mass <= 0).any():
        raise ValueError(f"draft_probs has no mass outside its top {n - 1} tokens; greedy scheme needs n <= support")
    return q_rest / mass


def sample_drafts(
    draft_probs: torch.Tensor,  # [..., V] draft distribution q
    n: int,
    scheme: str,
    generator: torch.Generator | None = None,
) -> torch.Tensor:  # [..., n] long: draft tokens in draw order
    """Draw n drafts per row of q by `scheme` ("with" | "without" | "greedy").

    "without" returns tokens in the order of successive sampling (ascending exponential clocks);
    "greedy" returns the n-1 most likely tokens (descending q) followed by one draw from q'.
    Raises ValueError on invalid probs, unknown scheme or n larger than the support (without/greedy).
    """
    check_probs(draft_probs, "draft_probs")
    check_scheme(scheme)
    check_n(draft_probs, n, scheme)
    batch_shape = draft_probs.shape[:-1]
    q = on_generator(to_float64(draft_probs).reshape(-1, draft_probs.shape[-1]), generator)  # [B, V]
    if scheme == "with":
        out = torch.multinomial(q, n, replacement=True, generator=generator)
    elif scheme == "without":
        u = torch.rand(q.shape, dtype=torch.float64, generator=generator, device=q.device)
        clocks = -torch.log1p(-u) / q  # E_i / q_i; q_i = 0 -> inf (never drawn)
        out = torch.topk(clocks, n, dim=-1, largest=False, sorted=True).indices
    else:
        g = greedy_set(q, n)  # [B, n-1]
        q_prime = greedy_residual_draft(q, n)
        last = torch.multinomial(q_prime, 1, generator=generator)
        out = torch.cat([g, last], dim=-1)
    return out.reshape(*batch_shape, n)
