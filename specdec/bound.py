"""The optimal acceptance rate α*(p, q, n, S) of any lossless verifier (docs/algorithms.md §1).

    α* = 1 + min_{H ⊆ Σ} [ p(H) − Q_S(H) ],   Q_S(H) = P(every draft lies in H)

- "with":    Q(H) = q(H)^n; the minimum is over prefixes of Σ sorted by p/q ascending. The ratios
  are bucketed without a sort (`specdec.bound_buckets`); a bucket holding prefixes between H⁻ and
  H⁺ can do no better than p(H⁻) − q(H⁺)^n, so only the buckets whose bound is below the best
  boundary value are sorted and scanned. Exact: the same prefixes a full sort finds the minimum at.
- "greedy":  closed form p(G) + Σ_{x∉G} min(p(x), q'(x)), G = the n−1 most likely tokens of q.
- "without": the same prefixes. Upper bounds on the minimum: Q(H) >= Π_{i<n} (q(H) − m_i)/(1 − m_i)
  (m_i = the i largest q summed) at every boundary, and an exact value at the boundary where that
  bound is lowest. Lower bounds per bucket: Q(H) <= q(H)^n (each
  successive draw lands in H with probability (q(H) − used)/(1 − used) <= q(H)), tightened by
  conditioning on the first draw. Q is then computed only on the window of buckets that can hold
  the minimum (`specdec.bound_without`). |error| on α* ~1e-10 (quadrature).

All computation is float64. Tokens with q = 0 never enter an optimal H (they add p and no Q).
The previous full-sort implementation is `benchmarks/bound_reference.py`, outside the package (tests compare the two).
"""
from __future__ import annotations

import torch

from specdec.bound_buckets import RatioBuckets, candidate_range, pow_kept, ratio_buckets, window
from specdec.bound_without import q_without_window
from specdec.drafts import check_n, check_pair, check_scheme, greedy_set, to_float64

# "without": when α*(with) >= 1 - PRUNE_TOL, α*(without) in [α*(with), 1] is returned as α*(with)
PRUNE_TOL = 1e-10
_HEAVY = 16  # "without": the largest q that the first-draw bound treats one by one


def optimal_acceptance(
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


def _with_bounds(buckets: RatioBuckets, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(value at each bucket boundary [B+1], lower bound of each bucket [B]) for Q(H) = q(H)^n."""
    kept = pow_kept(buckets.r_from, n)  # q(H)^n at each boundary
    return buckets.p_before - kept, buckets.p_before[:-1] - kept[1:]


def _alpha_with(p: torch.Tensor, q: torch.Tensor, n: int, buckets: RatioBuckets | None = None) -> float:
    buckets = buckets if buckets is not None else ratio_buckets(p, q)
    at_edges, lower = _with_bounds(buckets, n)
    best = min(0.0, float(at_edges.min()))
    span = candidate_range(lower < best)  # a bucket bounded at >= best cannot improve on it
    if span is None:
        return 1.0 + best
    w = window(buckets, p, q, *span)
    return 1.0 + min(best, float((w.p_prefix - pow_kept(w.r, n)).min()))


def _alpha_greedy(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    g = greedy_set(q, n)
    q_rest = q.clone()
    q_rest[g] = 0.0
    mass = q_rest.sum()
    if float(mass) <= 0:
        raise ValueError(f"draft_probs has no mass outside its top {n - 1} tokens; greedy scheme needs n <= support")
    p_rest = p.clone()
    p_rest[g] = 0.0  # x in G: min(p, q') = 0 there, p(G) is counted in full
    return float(p[g].sum() + torch.minimum(p_rest, q_rest.div_(mass)).sum())


def _alpha_without(p: torch.Tensor, q: torch.Tensor, n: int, tol: float = PRUNE_TOL) -> float:
    buckets = ratio_buckets(p, q)
    if n == 1:  # one draw: Q(H) = q(H) for both schemes
        return _alpha_with(p, q, 1, buckets)
    at_edges, lower = _with_bounds(buckets, n)
    if 1.0 + float(lower.min()) >= 1.0 - tol:  # α*(with) >= 1 - tol: nothing left to gain
        return _alpha_with(p, q, n, buckets)
    top = torch.topk(q, max(n - 1, min(_HEAVY, q.shape[0] - 1)))  # sorted, largest first
    rest = q.clone()
    rest[top.indices[: n - 1]] = 0.0
    c_glob = float(rest.sum())  # q(Σ) − (n−1 largest q), summed directly (precise when tiny)
    # 1 − m_i (m_i = the i largest q summed, i = 0..n-1) from the small end, so tiny values keep precision
    tail = torch.flip(torch.cumsum(torch.flip(torch.cat([top.values[: n - 1], q.new_zeros(1)]), [0]), 0), [0])
    outside = c_glob + tail  # [1 − m_0, ..., 1 − m_{n-1}]
    # upper bounds from Q(H) >= Π (q(H) − m_i)/(1 − m_i) = Π (1 − q(Σ∖H)/(1 − m_i)), where that is > 0
    first = int(torch.searchsorted(-buckets.r_from, torch.tensor([-c_glob], dtype=torch.float64), right=True))
    factors = 1.0 - buckets.r_from[first:, None] / outside
    upper = buckets.p_before[first:] - factors.clamp(min=0.0).prod(1)
    best, attained = 0.0, 0.0  # an upper bound on the minimum; a value attained (H = ∅)
    if upper.numel() and float(upper.min()) < 0:
        best = float(upper.min())
        b = first + int(upper.argmin())  # an exact value where the bound is lowest: usually near the minimum
        q_b = q_without_window(q, buckets.bucket < b, q.new_zeros(0), buckets.r_from[b: b + 1], n, c_glob)
        attained = min(attained, float(buckets.p_before[b] - q_b[0]))
    best = min(best, attained)
    span = candidate_range(lower <= best + 1e-12)  # every bucket that can hold the minimum (and some slack)
    span = span if span is not None else (0, lower.shape[0] - 1)
    span = _tighter_span(buckets, top, float(outside[1]), n, span, best + 1e-12)
    w = window(buckets, p, q, *span)
    q_pre = q_without_window(q, buckets.bucket < w.first, w.q, w.r, n, c_glob)
    return 1.0 + min(attained, float((w.p_prefix - q_pre).min()))


def _tighter_span(buckets: RatioBuckets, top, top_rest: float, n: int, span: tuple[int, int],
                  best: float) -> tuple[int, int]:
    """Shrink the candidate span with a tighter bound Q(H) <= Σ_{x∈H} q_x ((q(H) − q_x)/(1 − q_x))^(n−1)
    (condition on the first draw x, then the "with" bound for the other n−1 draws from q without x),
    written for the largest q (`top`: torch.topk's values and indices) exactly and q(H)^(n−1) per
    unit mass for the rest. (q(H) − q_x)/(1 − q_x) = 1 − q(Σ∖H)/(1 − q_x), with 1 − q_x of the
    largest q passed in summed from the small end (`top_rest`), so a q near 1 keeps its precision."""
    first, last = span
    r_up = buckets.r_from[first + 1: last + 2]  # q(Σ∖H⁺) of each bucket in the span
    inside = (buckets.bucket[top.indices][None, :] <= torch.arange(first, last + 1)[:, None])  # heavy x in H⁺
    qh = top.values[None, :]
    others = 1.0 - top.values
    others[0] = top_rest
    inner = (1.0 - r_up[:, None] / others).clamp(min=0.0) ** (n - 1)
    kept = 1.0 - r_up
    light = (kept - (qh * inside).sum(1)).clamp(min=0.0)
    q_up = torch.minimum(kept ** (n - 1) * light + (qh * inner * inside).sum(1), pow_kept(r_up, n))
    lower = buckets.p_before[first: last + 1] - q_up
    found = candidate_range(lower <= best)
    return (first + found[0], first + found[1]) if found is not None else span
