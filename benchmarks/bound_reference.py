"""The previous α* implementation (full sort, full-vocabulary scan), kept as the reference that
tests/test_specdec_bound_fast.py and benchmarks/bound_speed.py compare `specdec.bound` against.
Not used by the library. Its method, as it was documented:

    α* = 1 + min_{H ⊆ Σ} [ p(H) − Q_S(H) ],   Q_S(H) = P(every draft lies in H)

- "with":    Q(H) = q(H)^n; H searched among prefixes of Σ sorted by p/q ascending. O(V log V).
- "greedy":  closed form p(G) + Σ_{x∉G} min(p(x), q'(x)).
- "without": prefixes as for "with"; Q(H) = ∫ r e^{-rt} P(N_H(t) ≥ n) dt, r = q(Σ∖H), N_H(t) the
  number of H's exponential clocks (rates q_i) below t. The count's law, truncated at n, is
  updated along the sorted prefixes with cumulative sums (vectorised over tokens and quadrature
  points); the t-integral is a trapezoid rule in u = log t, whose error decays like
  exp(-π²/h) for these analytic integrands. Truncation limits are chosen from explicit tail
  bounds so the absolute error on α* is ~1e-10.

All computation is float64. Tokens with q = 0 never enter an optimal H (they add p and no Q).
"""
from __future__ import annotations

import math

import torch

from specdec.bound_without import _small_t_sum  # the same series as the library's
from specdec.drafts import check_n, check_pair, check_scheme, greedy_residual_draft, greedy_set, to_float64

# trapezoid step in u = log t: the integrand's transition sharpens like sqrt(n), so the step shrinks
# as 0.8 / sqrt(n) (capped at 0.4); measured error vs a 0.12 step: <= ~3e-9 for n = 2..16
_STEP_SCALE, _STEP_MAX = 0.8, 0.4
_STEP = None  # tests may pin a fixed step


def _step(n: int) -> float:
    return _STEP if _STEP is not None else min(_STEP_MAX, _STEP_SCALE / math.sqrt(n))
_LINEAR_T_MAX = 600.0  # above this exp(t) would overflow: switch to log-domain scans
_POINT_CHUNK = 32
_TOKEN_BLOCK = 8192
# "without": drop low-q tokens of total mass small enough that α* moves by at most this much
PRUNE_TOL = 1e-10


def reference_optimal_acceptance(
    target_probs: torch.Tensor,  # [..., V] target distribution p
    draft_probs: torch.Tensor,  # [..., V] draft distribution q
    n: int,
    scheme: str,
) -> float | torch.Tensor:
    """α* for one position (1-D input -> float) or each row of a batch (-> float64 tensor [...]).

    Raises ValueError on invalid probs/shapes, unknown scheme, or n larger than q's support
    (schemes "without" and "greedy").
    """
    check_pair(target_probs, draft_probs)
    check_scheme(scheme)
    check_n(draft_probs, n, scheme)
    p = to_float64(target_probs)
    q = to_float64(draft_probs)
    fn = {"with": _alpha_with, "without": _alpha_without, "greedy": _alpha_greedy}[scheme]
    if p.dim() == 1:
        return float(fn(p, q, n))
    flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
    out = torch.tensor([fn(a, b, n) for a, b in zip(flat_p, flat_q)], dtype=torch.float64)
    return out.reshape(p.shape[:-1])


def _sorted_support(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens with q > 0 sorted by p/q ascending: (p_sorted [V'], q_sorted [V'], r [V'+1]).

    r[k] = q(Σ∖H_k) for the prefix H_k of the first k sorted tokens, summed from the tail so tiny
    remainders keep full relative precision (r[0] = 1, r[V'] = 0).
    """
    keep = q > 0
    p_s, q_s = p[keep], q[keep]
    order = torch.argsort(p_s / q_s, stable=True)
    p_s, q_s = p_s[order], q_s[order]
    tail = torch.flip(torch.cumsum(torch.flip(q_s, [0]), 0), [0])  # tail[k] = Σ_{i>=k} q_s[i]
    r = torch.cat([tail, tail.new_zeros(1)])
    r = r / r[0]
    return p_s, q_s, r


def _alpha_with(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    p_s, _, r = _sorted_support(p, q)
    p_prefix = torch.cat([p_s.new_zeros(1), torch.cumsum(p_s, 0)])  # [V'+1]
    q_prefix_pow = torch.exp(n * torch.log1p(-r.clamp(max=1.0)))  # (1 - r)^n, exact near 1
    q_prefix_pow[0] = 0.0
    return float(1.0 + torch.min(p_prefix - q_prefix_pow).clamp(max=0.0))


def _alpha_greedy(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    g = greedy_set(q, n)
    q_prime = greedy_residual_draft(q, n)
    in_g = torch.zeros_like(p, dtype=torch.bool)
    in_g[g] = True
    return float(p[in_g].sum() + torch.minimum(p, q_prime)[~in_g].sum())


def q_without_prefixes(q_sorted: torch.Tensor, r: torch.Tensor, n: int) -> torch.Tensor:
    """Q(H_k) for every prefix H_k of `q_sorted` [V'] (all > 0) under sampling without replacement.

    Returns [V'+1] float64: Q(∅) = 0, ..., Q(H_{V'}) = 1. Prefixes with fewer than n tokens get 0.
    `r` [V'+1] is the tail mass q(Σ∖H_k) as returned by `_sorted_support`.
    """
    v = q_sorted.shape[0]
    out = torch.zeros(v + 1, dtype=torch.float64)
    out[v] = 1.0
    if v <= n:  # only the full support can hold n distinct drafts
        return out
    r_k = r[1:v]  # tail masses of the prefixes k = 1..V'-1 (all > 0)
    # 1 - Q(H_k) = ∫ r e^{-rt} P(N_k(t) < n) dt, integrated in u = log t by the trapezoid rule.
    # Range (explicit tail bounds): below t = 1e-14 the integrand is < r t <= 1e-14. Below t_lo,
    # P(N >= n) <= t^n/n! so replacing P(N < n) by 1 there errs by <= t_lo^{n+1}/(n+1)! <= 1e-13.
    # Above T the kernel leaves e^{-rT}, and N(t) < n has probability <= P(Gamma(n, c) > t) with
    # c = q(H) - (n-1 largest of H) >= c_glob - r.
    t_lo = math.exp((math.log(1e-13) + math.lgamma(n + 2)) / (n + 1))
    q_desc = torch.sort(q_sorted, descending=True).values
    c_glob = float(q_desc[n - 1 :].sum())
    t_kernel = 34.0 / r_k
    gap = (c_glob - r_k).clamp(min=0.0)
    t_gamma = torch.where(gap > 0, (2.0 * n + 40.0) / gap, torch.full_like(gap, float("inf")))
    t_hi = float(torch.minimum(t_kernel, t_gamma).max())
    u_min, u_hi = math.log(1e-14), math.log(max(t_hi, 1.0))
    h = _step(n)
    num = int(math.ceil((u_hi - u_min) / h)) + 1
    u = u_min + h * torch.arange(num, dtype=torch.float64)
    t_all = torch.exp(u)
    small = t_all <= t_lo
    t_small = t_all[small]
    # Σ over points of r_k t e^{-r_k t} P(N_k(t) < n)
    acc = _small_t_sum(r_k, t_small)
    t_rest = t_all[~small]
    torch.set_flush_denormal(True)  # underflowing exponentials otherwise hit slow denormal paths
    try:
        _accumulate(acc, q_sorted, r, t_rest, n)
    finally:
        torch.set_flush_denormal(False)
    out[1:v] = (1.0 - h * acc).clamp(0.0, 1.0)
    support_count = torch.arange(1, v, dtype=torch.float64)
    out[1:v][support_count < n] = 0.0
    return out


def _accumulate(acc: torch.Tensor, q_sorted: torch.Tensor, r: torch.Tensor, t_rest: torch.Tensor, n: int) -> None:
    for start in range(0, t_rest.shape[0], _POINT_CHUNK):
        t = t_rest[start : start + _POINT_CHUNK]
        lin = t <= _LINEAR_T_MAX
        if lin.any():
            acc += _scan(q_sorted, r, t[lin], n, log_domain=False)
        if (~lin).any():
            acc += _scan(q_sorted, r, t[~lin], n, log_domain=True)


def _log_expm1(x: torch.Tensor) -> torch.Tensor:
    big = x > 1.0
    return torch.where(big, x + torch.log1p(-torch.exp(-x.clamp(min=1.0))), torch.log(torch.expm1(x.clamp(max=1.0))))


def _scan(q_s: torch.Tensor, r: torch.Tensor, t: torch.Tensor, n: int, log_domain: bool) -> torch.Tensor:
    """Σ over points t [P] of r_k t e^{-r_k t} P(N_k(t) < n) for the prefixes k = 1..V'-1.

    With c_j(k) = P(N_k(t) = j) and d_j(k) = e^{-r_k t} c_j(k):  d_0(k) = e^{-t} and
    d_j(k) = Σ_{l<=k} w_l c_{j-1}(l-1),  w_l = expm1(q_l t) e^{-r_{l-1} t} (= e^{-r_l t} - e^{-r_{l-1} t}),
    so each count level is one cumulative sum over tokens. Tokens are processed in cache-sized
    blocks with carries. `log_domain` does the sums with logcumsumexp (needed once t > ~700).
    """
    v, p_num = q_s.shape[0], t.shape[0]
    f64 = torch.float64
    out = torch.zeros(v, dtype=f64)
    neg_inf = -math.inf
    if log_domain:
        carry_d = torch.full((n, p_num), neg_inf, dtype=f64)  # log d_j at the previous block's end
        last_c = torch.full((n, p_num), neg_inf, dtype=f64)  # log c_j(l-1) at the block start
        last_c[0] = 0.0
    else:
        carry_d = torch.zeros(n, p_num, dtype=f64)
        last_c = torch.zeros(n, p_num, dtype=f64)
        last_c[0] = 1.0
    tt = t[None, :]
    for a in range(0, v, _TOKEN_BLOCK):
        b = min(v, a + _TOKEN_BLOCK)
        qt = q_s[a:b, None] * tt  # [L, P]
        r_prev = r[a:b, None] * tt  # r_{l-1} t
        r_here = r[a + 1 : b + 1, None] * tt  # r_l t
        if log_domain:
            log_w = _log_expm1(qt) - r_prev
            c_prev = r_here - tt  # log c_0(l) = -(1 - r_l) t
            d_sum = (-tt).expand_as(qt).clone()
            for j in range(1, n):
                shifted = torch.cat([last_c[j - 1][None], c_prev[:-1]])
                last_c[j - 1] = c_prev[-1]
                d_j = torch.logaddexp(carry_d[j][None], torch.logcumsumexp(log_w + shifted, dim=0))
                carry_d[j] = d_j[-1]
                d_sum = torch.logaddexp(d_sum, d_j)
                c_prev = (d_j + r_here).clamp(max=0.0)
            lt = torch.exp(torch.minimum(d_sum, -r_here))  # e^{-r t} P(N < n)
        else:
            decay = torch.exp(-r[a : b + 1, None] * tt)  # e^{-r_l t} for l = a..b
            kern = decay[1:]
            w = torch.expm1(qt).mul_(decay[:-1])
            grow = torch.reciprocal(kern)  # e^{r_l t} <= e^{600}
            e_t = torch.exp(-t)[None, :]
            c_prev = grow * e_t
            d_sum = e_t.expand_as(qt).clone()
            for j in range(1, n):
                shifted = torch.cat([last_c[j - 1][None], c_prev[:-1]])
                last_c[j - 1] = c_prev[-1]
                d_j = torch.cumsum(shifted.mul_(w), dim=0).add_(carry_d[j][None])
                carry_d[j] = d_j[-1]
                d_sum += d_j
                c_prev = d_j.mul_(grow).clamp_(max=1.0)
            lt = torch.minimum(d_sum, kern)
        out[a:b] = (r_here * lt).sum(1)
    return out[: v - 1]


def _prune_tail(q: torch.Tensor, n: int, tol: float) -> torch.Tensor:
    """Zero the smallest-q tokens whose total mass δ keeps α*(without) within `tol` (certified).

    Coupling the exponential clocks of q and of q restricted to the kept tokens, the two draft
    sets differ only if a dropped clock is among the n smallest, which has probability
    <= δ E[T_(n)] <= δ n / (c − δ), c = q(Σ) − (n−1 largest q). Every Q(H) then moves by at
    most that, and so does α* (dropped tokens are never drafted, so never join H).
    """
    if tol <= 0:
        return q
    q_desc, order = torch.sort(q, descending=True)
    c = float(q_desc[n - 1 :].sum())
    budget = tol * c / (n + tol)
    tail = torch.flip(torch.cumsum(torch.flip(q_desc, [0]), 0), [0])  # mass from rank i to the end
    drop = tail <= budget
    drop[:n] = False
    if not drop.any():
        return q
    kept = q.clone()
    kept[order[drop]] = 0.0
    return kept / kept.sum()


def _alpha_without(p: torch.Tensor, q: torch.Tensor, n: int, tol: float = PRUNE_TOL) -> float:
    lower = _alpha_with(p, q, n)  # α*(without) >= α*(with): nothing left to gain when it is ~1
    if lower >= 1.0 - tol:
        return lower
    p_s, q_s, r = _sorted_support(p, _prune_tail(q, n, tol))
    p_prefix = torch.cat([p_s.new_zeros(1), torch.cumsum(p_s, 0)])
    q_pre = q_without_prefixes(q_s, r, n)
    return float(1.0 + torch.min(p_prefix - q_pre).clamp(max=0.0))
