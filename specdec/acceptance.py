"""Expected acceptance P(y ∈ drafts) of a verifier for one (p, q) pair.

What is exact and what is Monte Carlo (all in float64):
  rrs          exact closed form, O(nV): the residual chain p_1 = p, p_{i+1} = norm((p_i − q)+) does
               not depend on the drafts, so P(all rejected) = Π_i (1 − Σ min(p_i, q)).
  k-seq        exact closed form, O(V): with r(x) = q(x) − min(q(x), p(x)/ρ) and β = Σ min(q, p/ρ),
               P(accept) = 1 − (1−β)^n + Σ_x res(x) [(1−β)^n − (1−β−r(x))^n] / (1−β)^n
               (the residual may emit a drafted token; that counts as accepted).
  greedy       exact closed form p(G) + Σ_{x∉G} min(p, q') (= α*(greedy)).
  spechub      exact closed form, O(V): Σ take_ia + Σ take_ai + min(p(a), leftover mass).
  lp-optimal   = α*(scheme) (the optimal coupling attains the bound).
  rrs-without  exact enumeration when the number of ordered draft tuples is <= `exact_limit`;
               otherwise Monte Carlo over draft tuples with the verifier's coins integrated out
               (Rao-Blackwellised): the residual after i rejections is norm((p − Λ_i q)+), a scalar
               Λ_i that depends on the drafts only through their q-mass, so each sample costs
               O(n log V). Returns the mean and its standard error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.bound import optimal_acceptance
from specdec.drafts import check_n, check_pair, to_float64
from specdec.lp import draft_law
from specdec.verifiers import _kseq_parts, check_method, normalize_method, output_law, residual, spechub_parts


@dataclass(frozen=True)
class Acceptance:
    """An acceptance probability; `stderr` is 0 when `exact`."""

    value: float
    stderr: float = 0.0
    exact: bool = True

    def __float__(self) -> float:
        return self.value


def expected_acceptance(
    target_probs: torch.Tensor,  # [V] p
    draft_probs: torch.Tensor,  # [V] q
    n: int,
    scheme: str,
    method: str,
    *,
    num_samples: int = 4096,
    exact_limit: int = 20_000,
    generator: torch.Generator | None = None,
    **params,
) -> Acceptance:
    """P(verifier `method` emits one of the n drafts drawn by `scheme`) for one position.

    ValueError if the method does not fit the scheme or the inputs are invalid (see module doc for
    which methods are exact). `params`: `rho` for k-seq.
    """
    check_pair(target_probs, draft_probs)
    if target_probs.dim() != 1:
        raise ValueError("expected_acceptance takes one position: 1-D target_probs and draft_probs")
    scheme = check_method(method, scheme, n)
    method = normalize_method(method)
    check_n(draft_probs, n, scheme)
    p, q = to_float64(target_probs), to_float64(draft_probs)
    if method == "rrs":
        return Acceptance(_rrs_with(p, q, n))
    if method == "k-seq":
        return Acceptance(_kseq(p, q, n, params.get("rho")))
    if method == "greedy":
        return Acceptance(optimal_acceptance(p, q, n, "greedy"))
    if method == "spechub":
        return Acceptance(_spechub(p, q))
    if method == "lp-optimal":
        return Acceptance(optimal_acceptance(p, q, n, scheme))
    support = int((q > 0).sum())
    if math.perm(support, n) <= exact_limit:
        return Acceptance(_exact_by_enumeration(p, q, n, scheme, method))
    return _rrs_without_mc(p, q, n, num_samples, generator)


def _exact_by_enumeration(p: torch.Tensor, q: torch.Tensor, n: int, scheme: str, method: str) -> float:
    """Σ over every draft tuple of P(tuple) · P(y ∈ tuple | tuple) (exact; small supports only)."""
    tuples, probs = draft_law(q, n, scheme)
    total = 0.0
    for tup, pr in zip(tuples.tolist(), probs.tolist()):
        law = output_law(p, q, tup, method, scheme=scheme)
        total += pr * float(law[list(set(tup))].sum())
    return total


def _rrs_with(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    reject, p_cur = 1.0, p
    for _ in range(n):
        reject *= 1.0 - float(torch.minimum(p_cur, q).sum())
        p_cur = residual(p_cur, q)
    return 1.0 - reject


def _kseq(p: torch.Tensor, q: torch.Tensor, n: int, rho: float | None) -> float:
    rho, _, res = _kseq_parts(p, q, n, rho)
    taken = torch.minimum(q, p / rho)
    beta = float(taken.sum())
    none = (1.0 - beta) ** n
    if none <= 0:
        return 1.0
    rej = q - taken  # P(draft = x and rejected)
    hit = 1.0 - ((1.0 - beta - rej).clamp(min=0.0) / (1.0 - beta)) ** n  # P(x drafted | all rejected)
    return 1.0 - none + none * float((res * hit).sum())


def _spechub(p: torch.Tensor, q: torch.Tensor) -> float:
    """Σ_i take_ia + Σ_i take_ai + min(p(a), all leftovers): the residual never emits a pair member."""
    parts = spechub_parts(p, q)
    left = float((parts.pair_ia - parts.take_ia).sum() + (parts.pair_ai - parts.take_ai).sum())
    return float(parts.take_ia.sum() + parts.take_ai.sum()) + min(float(p[parts.hub]), left)


def _rrs_without_mc(p: torch.Tensor, q: torch.Tensor, n: int, num_samples: int, generator) -> Acceptance:
    """Monte Carlo over successive-sampling draft tuples; coins integrated out exactly."""
    v = p.shape[0]
    ratio = torch.where(q > 0, p / q, torch.full_like(p, math.inf))
    order = torch.argsort(ratio, descending=True)
    ratio_s, p_s, q_s = ratio[order], p[order], q[order]
    cum_p, cum_q = torch.cumsum(p_s, 0), torch.cumsum(q_s, 0)
    neg_ratio = -ratio_s  # ascending, for searchsorted

    def residual_mass(lam: torch.Tensor) -> torch.Tensor:  # Σ (p − Λ q)+ for each Λ in lam [S]
        k = torch.searchsorted(neg_ratio, -lam, right=False)  # count of tokens with ratio > Λ
        k_idx = (k - 1).clamp(min=0)
        mass = torch.where(k > 0, cum_p[k_idx] - lam * cum_q[k_idx], torch.zeros_like(lam))
        return mass.clamp(min=0.0)

    # successive sampling by inverse CDF over q with the earlier drafts' intervals skipped: O(n log V)
    # per draft instead of V clocks per tuple
    cq = torch.cumsum(q, 0)
    starts = cq - q
    s = max(2, int(num_samples))
    drafts = torch.zeros(s, n, dtype=torch.long)
    lam = torch.zeros(s, dtype=torch.float64)  # Λ_{i-1}
    used = torch.zeros(s, dtype=torch.float64)  # q-mass of earlier drafts
    reject = torch.ones(s, dtype=torch.float64)
    total = float(cq[-1])
    for i in range(n):
        u = torch.rand(s, dtype=torch.float64, generator=generator, device=used.device) * (total - used)
        if i > 0:
            prev = drafts[:, :i]
            st, idx = torch.sort(starts[prev], dim=1)
            lens = q[prev].gather(1, idx)
            for m in range(i):
                u = torch.where(u >= st[:, m], u + lens[:, m], u)
        x = torch.searchsorted(cq, u, right=True).clamp(max=v - 1)
        drafts[:, i] = x
        m_i = residual_mass(lam) if i > 0 else torch.ones(s, dtype=torch.float64)  # mass of R_i
        lam_step = m_i / (total - used)  # q_i = q / (1 − used) off the earlier drafts
        # p_i(x)/q_i(x) = (p(x) − Λ q(x))+ / m_i * (1 − used) / q(x) = (ratio(x) − Λ)+ / λ_i
        a = torch.where(lam_step > 0, ((ratio[x] - lam).clamp(min=0.0) / lam_step).clamp(max=1.0), torch.ones_like(lam))
        reject = reject * (1.0 - a)
        lam = lam + lam_step
        used = used + q[x]
    vals = 1.0 - reject
    return Acceptance(float(vals.mean()), float(vals.std(unbiased=True) / math.sqrt(vals.numel())), exact=False)
