"""Q(H) under sampling without replacement for a window of nested prefixes (docs/algorithms.md §1).

Q(H) = P(the n smallest exponential clocks E_i / q_i all lie in H). With r = q(Σ∖H) and N_H(t) the
number of H's clocks below t:  1 - Q(H) = ∫ r e^{-rt} P(N_H(t) < n) dt,  a trapezoid rule in
u = log t (step h, error ~exp(-π²/h)); limits from explicit tail bounds (|error| on α* ~1e-10).

The prefixes are H_k = A ∪ {w_1..w_k} (k = 0..W): a large base set A and a short window of tokens.
- The law of N_A(t), truncated at n, is a product Π_{i∈A} (e^{-q_i t} + (1 - e^{-q_i t}) z) mod z^n,
  so token order inside A does not matter. Tokens with q_i t_max > τ ("big", few) are multiplied in
  one by one (rescaled blocks, below); for the rest, log Π (1 + w_i z) = Σ_m (-1)^{m+1} z^m S_m / m with
  w_i = e^{q_i t} - 1 and power sums S_m(t) = Σ_k C[m, k] t^k M_k, C[m, k] the series coefficients of
  (e^x - 1)^m and M_k = Σ q_i^k: K moments over A once, then O(K n) per quadrature point. The
  exponential of that series (f' = G' f) costs O(n²) per point; its rounding error is at most
  ~eps (2e^τ - 1)^n, because e^{-x} h_j(w) <= (2e^τ - 1)^j for the complete symmetric h_j that
  bound the alternating terms. τ is chosen so that factor stays <= 1e3.
- Along the window, d_j(k) = e^{-r_k t} P(N_{H_k}(t) = j) obeys d_j(k) = d_j(k-1) + (e^{q_k t} - 1)
  d_{j-1}(k-1): one cumulative sum per count level, all terms positive. Where r t > 600 the same
  recursion runs in blocks renormalised at each block's end, with clocks sure to have rung counted
  instead of multiplied in (`_scan_rescaled`); the big tokens of A go through those blocks too.
"""
from __future__ import annotations

import functools
import math

import torch

# trapezoid step in u = log t: the integrand's transition sharpens like sqrt(n), so the step shrinks
# as 0.8 / sqrt(n) (capped at 0.4); measured error vs a 0.12 step: <= ~3e-9 for n = 2..16
_STEP_SCALE, _STEP_MAX = 0.8, 0.4
_STEP = None  # tests may pin a fixed step
_LINEAR_T_MAX = 600.0  # above r t = 600 exp(-r t) nears underflow: rescaled blocks
_POINT_CHUNK = 32
_TOKEN_BLOCK = 4096
_TINY = 1e-3  # moments of tokens with q t_max <= this need only n - 1 + few terms
_SURE = 40.0  # a clock with q t > 40 has rung by t but for e^{-40} ~ 4e-18
_SPAN = 300.0  # t Σ q inside one rescaled block stays below 300 + 400 (one more clock) < 709
_CHUNK_RATIO = 10.0  # points scanned together differ by <= this factor in t, so q t_max <= 400 for non-sure q
_NEGLIGIBLE = 1e-30  # points where P(N_A(t) < n) is below this add nothing to any window prefix


def step(n: int) -> float:
    """The trapezoid step in u = log t for n drafts."""
    return _STEP if _STEP is not None else min(_STEP_MAX, _STEP_SCALE / math.sqrt(n))


def quadrature_grid(r_live: torch.Tensor, n: int, c_glob: float) -> tuple[torch.Tensor, float, float]:
    """(t points [P] ascending, h, t_lo) covering every prefix whose tail mass is in r_live (> 0).

    Below t = 1e-14 the integrand is < r t <= 1e-14. Below t_lo, P(N >= n) <= t^n/n!, so replacing
    P(N < n) by 1 there errs by <= t_lo^{n+1}/(n+1)! <= 1e-13. Above T the kernel leaves e^{-rT}, and
    N(t) < n has probability <= P(Gamma(n, c) > t) with c = q(H) - (n-1 largest of H) >= c_glob - r.
    """
    t_lo = math.exp((math.log(1e-13) + math.lgamma(n + 2)) / (n + 1))
    t_kernel = 34.0 / r_live
    gap = (c_glob - r_live).clamp(min=0.0)
    t_gamma = torch.where(gap > 0, (2.0 * n + 40.0) / gap, torch.full_like(gap, float("inf")))
    t_hi = float(torch.minimum(t_kernel, t_gamma).max()) if r_live.numel() else 1.0
    h = step(n)
    u_min, u_hi = math.log(1e-14), math.log(max(t_hi, 1.0))
    num = int(math.ceil((u_hi - u_min) / h)) + 1
    return torch.exp(u_min + h * torch.arange(num, dtype=torch.float64)), h, t_lo


def q_without_window(q: torch.Tensor, in_base: torch.Tensor, q_win: torch.Tensor, r: torch.Tensor, n: int,
                     c_glob: float) -> torch.Tensor:
    """Q(H_k) for H_k = A ∪ {first k window tokens}, k = 0..W, under sampling without replacement.

    q [V] float64 (all tokens), in_base [V] bool marks A, q_win [W] the window tokens in order (all > 0),
    r [W+1] the tail masses q(Σ∖H_k), c_glob = q(Σ) - (n-1 largest q). Prefixes with fewer than n
    tokens get 0, the full support 1. Returns [W+1] float64.
    """
    base_size = int(in_base.sum())
    size = base_size + torch.arange(r.shape[0], dtype=torch.float64)
    live = r > 0
    t_all, h, t_lo = quadrature_grid(r[live], n, c_glob)
    small = t_all <= t_lo
    acc = _small_t_sum(r, t_all[small])
    t_rest = t_all[~small]
    if t_rest.numel():
        flush = torch.is_flush_denormal_enabled() if hasattr(torch, "is_flush_denormal_enabled") else False
        torch.set_flush_denormal(True)  # underflowing exponentials otherwise hit slow denormal paths
        try:
            log_c = base_law(q, in_base, t_rest, n)  # [n, P] log P(N_A(t) = j)
            keep = torch.logsumexp(log_c, 0) > math.log(_NEGLIGIBLE)
            t_rest, log_c = t_rest[keep], log_c[:, keep]
            for start in range(0, t_rest.shape[0], _POINT_CHUNK):
                t = t_rest[start: start + _POINT_CHUNK]
                acc += window_sum(q_win, r, t, log_c[:, start: start + _POINT_CHUNK], n)
        finally:
            torch.set_flush_denormal(flush)
    out = (1.0 - h * acc).clamp(0.0, 1.0)
    out[~live] = 1.0
    out[size < n] = 0.0
    return out


def _small_t_sum(r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Σ_i r t_i e^{-r t_i} for each r [K] over small points t [P] (r t <= ~1.3), as a power series
    in r with precomputed moments Σ_i t_i^{m+1}: O(K · terms) instead of O(K · P) exponentials."""
    if t.numel() == 0:
        return torch.zeros_like(r)
    x_max = float(r.max()) * float(t.max())
    terms, bound = 1, float(t.sum())
    while bound * x_max ** terms / math.factorial(terms) > 1e-18 and terms < 60:
        terms += 1
    coef = [float((t ** (m + 1)).sum()) * (-1) ** m / math.factorial(m) for m in range(terms + 1)]
    out = torch.full_like(r, coef[-1])
    for c in reversed(coef[:-1]):
        out = out * r + c
    return out * r


# ---- the law of N_A(t) ----------------------------------------------------------------------------
def _tau(n: int) -> float:
    """Largest x = q t treated by moments: (2e^τ - 1)^(n-1) <= 1e3, capped at 0.25."""
    if n <= 1:
        return 0.25
    return min(0.25, math.log((1.0 + 1e3 ** (1.0 / (n - 1))) / 2.0))


@functools.lru_cache(maxsize=64)
def _series(n: int, tau: float) -> tuple[int, torch.Tensor]:
    """(K, C [n-1, K]): (e^x - 1)^m = Σ_{k=1..K} C[m-1, k-1] x^k for m < n, truncated where the tail
    Σ_{k>K} (m x)^k / k! <= x · m^{K+1} τ^K e^{mτ} / (K+1)! is below 1e-18 · x for x <= τ."""
    m = n - 1
    k = max(m, 1)
    while (k + 1) * math.log(m) + k * math.log(tau) + m * tau - math.lgamma(k + 2) > math.log(1e-18):
        k += 1
    base = [0.0] + [1.0 / math.factorial(i) for i in range(1, k + 1)]  # e^x - 1
    rows, cur = [], [1.0] + [0.0] * k
    for _ in range(m):
        cur = [sum(cur[i] * base[j - i] for i in range(j + 1)) for j in range(k + 1)]
        rows.append(cur[1:])
    return k, torch.tensor(rows, dtype=torch.float64).reshape(m, k)


def base_law(q: torch.Tensor, in_base: torch.Tensor, t: torch.Tensor, n: int) -> torch.Tensor:
    """log P(N_A(t) = j) for j < n [n, P] at points t [P]; A = tokens where in_base [V] is true."""
    tau = _tau(n)
    t_max = float(t.max())
    y = (q * in_base).mul_(t_max)
    big = (y > tau).nonzero().squeeze(1)
    log_big = _big_law(y[big] / t_max, t, n)  # [n, P]
    y[big] = 0.0  # the rest: x = q t <= y <= τ at every point
    k, coef = _series(n, tau)
    k_tiny = _series(n, _TINY)[0]  # for y <= _TINY the terms past k_tiny are below the same bound
    moments = _moments(y, k_tiny)
    if k > k_tiny:
        moments = torch.cat([moments, _moments(y[y > _TINY], k)[k_tiny:]])
    s = t / t_max  # [P]
    powers = s[None, :] ** torch.arange(1, k + 1, dtype=torch.float64)[:, None]  # [K, P]
    power_sums = coef @ (moments[:, None] * powers)  # S_m(t), m = 1..n-1: [n-1, P]
    m = torch.arange(1, n, dtype=torch.float64)[:, None]
    m_l = power_sums * torch.where(m % 2 == 1, 1.0, -1.0)  # m L_m
    f = [torch.exp(-moments[0] * s)]  # f_0 = e^{-x_small}
    for j in range(1, n):
        f.append(sum(m_l[i - 1] * f[j - i] for i in range(1, j + 1)) / j)
    log_small = torch.log(torch.stack(f).clamp(min=0.0))  # [n, P]
    # product of the two truncated polynomials, in the log domain
    out = torch.full_like(log_small, -math.inf)
    for j in range(n):
        out[j] = torch.logsumexp(log_small[: j + 1] + log_big.flip(0)[n - 1 - j:], 0)
    return out


def _moments(y: torch.Tensor, k: int) -> torch.Tensor:
    """[Σ y, Σ y², ..., Σ y^k] (float64)."""
    out = torch.empty(k, dtype=torch.float64)
    yk = y.clone()
    for i in range(k):
        out[i] = yk.sum()
        if i + 1 < k:
            yk.mul_(y)
    return out


def _big_law(q_big: torch.Tensor, t: torch.Tensor, n: int) -> torch.Tensor:
    """log P(N_B(t) = j) [n, P] for the clocks of the few tokens q_big [L] (rescaled blocks, see
    `_scan_rescaled`: no two large exponents are ever subtracted)."""
    log_c = torch.full((n, t.shape[0]), -math.inf, dtype=torch.float64)
    log_c[0] = 0.0
    if q_big.numel() == 0:
        return log_c
    start = 0
    while start < t.shape[0]:  # t ascending: chunks within a factor _CHUNK_RATIO
        stop = int((t <= t[start] * _CHUNK_RATIO).sum())
        log_c[:, start:stop] = _law_rescaled(q_big, t[start:stop], log_c[:, start:stop], n)
        start = stop
    return log_c


def _law_rescaled(q_s: torch.Tensor, t: torch.Tensor, log_c0: torch.Tensor, n: int) -> torch.Tensor:
    """log P(N = j) [n, P] after multiplying the clocks q_s [L] into the law log_c0 [n, P] (t within a
    factor _CHUNK_RATIO): the blocks of `_scan_rescaled`, keeping only the final state."""
    sure = q_s * float(t.min()) > _SURE
    q_rest = q_s[~sure]
    ids = torch.floor(torch.cumsum(q_rest, 0) * (float(t.max()) / _SPAN))
    cuts = ((ids[1:] != ids[:-1]).nonzero().squeeze(1) + 1).tolist()
    log_c, a = log_c0.clone(), 0
    for b in sorted(set(cuts) | set(range(_TOKEN_BLOCK, q_rest.shape[0], _TOKEN_BLOCK)) | {q_rest.shape[0]} - {0}):
        x = q_rest[None, a:b] * t[:, None]  # [P, L]
        e = torch.expm1(x)
        d = log_c.exp()
        lev = d[0][:, None].expand_as(e)
        ends = [d[0]]
        for j in range(1, n):
            lev = torch.cumsum(e * torch.cat([d[j - 1][:, None], lev[:, :-1]], 1), 1) + d[j][:, None]
            ends.append(lev[:, -1])
        log_c = (torch.log(torch.stack(ends)) - x.sum(1)).clamp(max=0.0)
        a = b
    shift = int(sure.sum())  # each sure clock adds one to the count
    out = torch.full_like(log_c, -math.inf)
    if shift < n:
        out[shift:] = log_c[: n - shift]
    return out


# ---- the window scan ------------------------------------------------------------------------------
def window_sum(q_win: torch.Tensor, r: torch.Tensor, t: torch.Tensor, log_c0: torch.Tensor, n: int) -> torch.Tensor:
    """Σ over points t [P] of r_k t e^{-r_k t} P(N_{H_k}(t) < n) for k = 0..W, given log P(N_A = j) [n, P]."""
    lin = r[0] * t <= _LINEAR_T_MAX
    out = torch.zeros_like(r)
    if bool(lin.any()):
        out += _scan_linear(q_win, r, t[lin], (log_c0[:, lin] - r[0] * t[lin]).exp(), n)
    t_log, c_log = t[~lin], log_c0[:, ~lin]
    start = 0
    while start < t_log.shape[0]:  # chunks of points within a factor _CHUNK_RATIO of each other
        stop = int((t_log <= t_log[start] * _CHUNK_RATIO).sum())
        out += _scan_rescaled(q_win, r, t_log[start:stop], c_log[:, start:stop], n)
        start = stop
    return out


def _scan_linear(q_s: torch.Tensor, r: torch.Tensor, t: torch.Tensor, d0: torch.Tensor, n: int) -> torch.Tensor:
    """Linear-domain scan from d_j(0) = d0 [n, P]; returns Σ_points r_k t min(Σ_j d_j(k), e^{-r_k t}) [W+1].

    Layout [P, L] (tokens contiguous: the cumulative sums run along rows) with buffers reused
    across levels and token blocks."""
    v, p_num = q_s.shape[0], t.shape[0]
    out = torch.empty(v + 1, dtype=torch.float64)
    tt = t[:, None]
    carry = d0.clone()  # d_j at the previous block's last prefix
    out[0] = (r[0] * t * torch.minimum(carry.sum(0), torch.exp(-r[0] * t))).sum()
    block = max(1, min(v, _TOKEN_BLOCK))
    bufs = [torch.empty((p_num, block), dtype=torch.float64) for _ in range(5)]
    for a in range(0, v, block):
        b = min(v, a + block)
        e, terms, d_sum, prev, cur = (x[:, : b - a] for x in bufs)
        torch.mul(q_s[None, a:b], tt, out=e)
        e.expm1_()  # e_l = e^{q_l t} - 1
        torch.mul(e, carry[0][:, None], out=terms)  # level 1: d_0 is constant
        d_sum.copy_(carry[0][:, None].expand_as(d_sum))
        for j in range(1, n):
            if j > 1:  # terms_l = e_l d_{j-1}(l-1): the previous level shifted by one token
                torch.mul(e[:, 1:], prev[:, :-1], out=terms[:, 1:])
                torch.mul(e[:, 0], carry[j - 1], out=terms[:, 0])
                carry[j - 1] = prev[:, -1]
            terms[:, 0] += carry[j]
            torch.cumsum(terms, 1, out=cur)
            d_sum += cur
            prev, cur = cur, prev
        carry[n - 1] = prev[:, -1]
        r_here = r[None, a + 1: b + 1] * tt  # r_k t, reusing the e buffer for e^{-r_k t}
        torch.exp(r_here.neg(), out=e)
        out[a + 1: b + 1] = (r_here * torch.minimum(d_sum, e)).sum(0)
    return out


def _scan_rescaled(q_s: torch.Tensor, r: torch.Tensor, t: torch.Tensor, log_c0: torch.Tensor, n: int) -> torch.Tensor:
    """The scan for points where r t > 600 (e^{-r t} would underflow): Σ_points r_k t e^{-r_k t} P(N_k < n).

    Tokens with q t_min > _SURE have rung by every point here (error <= e^{-_SURE} each): they are
    counted (s_k), not multiplied in. For the rest, D_j(k) = g_k c~_j(k) with g_k = e^{t Σ q} over the
    block so far obeys D_j(k) = D_j(k-1) + (e^{q_k t} - 1) D_{j-1}(k-1); blocks end before that sum
    passes _SPAN, so nothing overflows, and the state crosses blocks as log c~. P(N_k < n) sums the
    levels j < n - s_k. Points whose P(N < n) falls below _NEGLIGIBLE are dropped (N only grows)."""
    v = q_s.shape[0]
    out = torch.zeros(v + 1, dtype=torch.float64)
    out[0] = (r[0] * t * torch.exp(torch.minimum(torch.logsumexp(log_c0, 0) - r[0] * t, -r[0] * t))).sum()
    sure = q_s * float(t.min()) > _SURE
    sure_before = torch.cumsum(sure, 0)  # s_k for k = 1..W
    q_rest = q_s.masked_fill(sure, 0.0)
    ids = torch.floor(torch.cumsum(q_rest, 0) * (float(t.max()) / _SPAN))
    cuts = (ids[1:] != ids[:-1]).nonzero().squeeze(1) + 1
    ends = sorted(set(cuts.tolist()) | set(range(_TOKEN_BLOCK, v, _TOKEN_BLOCK)) | {v} - {0})
    level = torch.arange(n)[:, None]
    log_c, a = log_c0.clone(), 0
    for b in ends:
        tt = t[:, None]
        x = q_rest[None, a:b] * tt  # [P, L]
        e = torch.expm1(x)
        log_g = torch.cumsum(x, 1)
        d = log_c.exp()  # D_j(a) = c~_j(a)
        lev = d[0][:, None].expand_as(e)
        s_k = sure_before[a:b][None, :]
        d_sum = lev * (s_k <= n - 1)
        ends_c = [d[0]]
        for j in range(1, n):
            terms = e * torch.cat([d[j - 1][:, None], lev[:, :-1]], 1)
            lev = torch.cumsum(terms, 1) + d[j][:, None]
            d_sum = d_sum + lev * (s_k <= n - 1 - j)
            ends_c.append(lev[:, -1])
        r_here = r[None, a + 1: b + 1] * tt
        out[a + 1: b + 1] += (r_here * torch.exp(torch.minimum(torch.log(d_sum) - log_g - r_here, -r_here))).sum(0)
        log_c = (torch.log(torch.stack(ends_c)) - log_g[:, -1]).clamp(max=0.0)
        alive = torch.logsumexp(torch.where(level <= n - 1 - int(sure_before[b - 1]), log_c, -math.inf), 0)
        keep = alive > math.log(_NEGLIGIBLE)
        if not bool(keep.any()):
            break
        t, log_c, a = t[keep], log_c[:, keep], b
    return out
