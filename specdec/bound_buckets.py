"""The prefixes of the p/q order without sorting the vocabulary (docs/algorithms.md §1, α*).

α* minimises over the prefixes H_k of the support (q > 0) sorted by p/q ascending, ties by token
id. A non-negative float64's bit pattern, read as an integer, is monotone in its value, so its top
bits bucket the ratios in order (1024 buckets per power of two) with no sort. Two bincounts give
every bucket boundary's masses p(H) and q(Σ∖H). A scheme then bounds each bucket from below (the
best value any prefix ending inside it could have) and needs only the contiguous window of buckets
whose bound does not exceed a value already attained: those tokens alone are sorted, by the same
stable order a full sort would give, so every prefix a full sort would inspect there is inspected.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

_SHIFT = 42  # keep 10 of the 52 mantissa bits: bucket edges 0.1 % apart in ratio


def _key(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0] >> _SHIFT


# ratios below 2^-40 share the first bucket, above 2^40 the last: merged buckets stay exact, only
# a window that reaches them sorts more tokens
_LO_KEY, _HI_KEY = _key(2.0 ** -40), _key(2.0 ** 40)
NUM_BUCKETS = _HI_KEY - _LO_KEY + 1  # bucket NUM_BUCKETS holds the q = 0 tokens (never in H)


@dataclass(frozen=True)
class RatioBuckets:
    """Support tokens bucketed by p/q ascending, with the masses at each of the B + 1 boundaries.

    Boundary b is the prefix made of buckets 0..b-1: p_before[b] = its p mass, r_from[b] = the q mass
    outside it over q's support mass (r_from[0] = 1, r_from[B] = 0).
    """

    ratio: torch.Tensor  # [V] float64 p/q (meaningless where q = 0)
    bucket: torch.Tensor  # [V] long in [0, B]; B for q = 0
    p_before: torch.Tensor  # [B+1] float64
    r_from: torch.Tensor  # [B+1] float64
    q_tail_raw: torch.Tensor  # [B+1] float64: unnormalised q mass of buckets >= b
    q_total: float  # q's support mass (normalises r)

    def __repr__(self) -> str:
        return f"RatioBuckets(V={self.ratio.shape[0]}, B={self.p_before.shape[0] - 1})"


@dataclass(frozen=True)
class Window:
    """The prefixes H_k = (buckets < first) ∪ (first k window tokens), k = 0..W, in ratio order."""

    tokens: torch.Tensor  # [W] long token ids, sorted by p/q (stable)
    q: torch.Tensor  # [W] float64 q of those tokens
    p_prefix: torch.Tensor  # [W+1] float64 p(H_k)
    r: torch.Tensor  # [W+1] float64 q(Σ∖H_k) / q's support mass, summed from the tail
    first: int  # first bucket of the window

    def __repr__(self) -> str:
        return f"Window(first={self.first}, W={self.tokens.shape[0]})"


def ratio_buckets(p: torch.Tensor, q: torch.Tensor) -> RatioBuckets:
    """Bucket the tokens of 1-D float64 p, q (q's support only) by p/q; O(V) passes, no sort."""
    ratio = p / q
    bucket = (ratio.view(torch.int64) >> _SHIFT).clamp_(_LO_KEY, _HI_KEY).sub_(_LO_KEY)  # -0.0 -> first
    if float(q.min()) <= 0:  # 0/0 is a NaN with the sign bit set: these must not land in bucket 0
        bucket.masked_fill_(q <= 0, NUM_BUCKETS)
    p_tot = torch.bincount(bucket, weights=p, minlength=NUM_BUCKETS + 1)[:NUM_BUCKETS]
    q_tot = torch.bincount(bucket, weights=q, minlength=NUM_BUCKETS + 1)[:NUM_BUCKETS]
    p_before = torch.cat([p_tot.new_zeros(1), torch.cumsum(p_tot, 0)])
    tail = torch.flip(torch.cumsum(torch.flip(q_tot, [0]), 0), [0])  # tail sums keep tiny tails precise
    q_tail_raw = torch.cat([tail, tail.new_zeros(1)])
    q_total = float(q_tail_raw[0])
    return RatioBuckets(ratio, bucket, p_before, q_tail_raw / q_total, q_tail_raw, q_total)


def candidate_range(mask: torch.Tensor) -> tuple[int, int] | None:
    """(first, last) index where the bool mask [B] is true, or None."""
    idx = mask.nonzero()
    if idx.numel() == 0:
        return None
    return int(idx[0, 0]), int(idx[-1, 0])


def window(buckets: RatioBuckets, p: torch.Tensor, q: torch.Tensor, first: int, last: int) -> Window:
    """The tokens of buckets first..last in full-sort order, with p(H_k) and q(Σ∖H_k) of each prefix."""
    b = buckets.bucket
    sel = ((b >= first) & (b <= last)).nonzero().squeeze(1)  # ascending ids: a stable sort keeps id order
    order = torch.sort(buckets.ratio[sel], stable=True).indices
    tokens = sel[order]
    p_w, q_w = p[tokens], q[tokens]
    p_prefix = buckets.p_before[first] + torch.cat([p_w.new_zeros(1), torch.cumsum(p_w, 0)])
    suffix = torch.flip(torch.cumsum(torch.flip(q_w, [0]), 0), [0])  # Σ_{l >= k} q_w[l]
    after = buckets.q_tail_raw[last + 1]
    r = torch.cat([suffix + after, after.reshape(1)]) / buckets.q_total
    return Window(tokens, q_w, p_prefix, r, first)


def pow_kept(r: torch.Tensor, n: int) -> torch.Tensor:
    """(1 - r)^n, exact near 1 (log1p), for tail masses r in [0, 1]."""
    return torch.exp(n * torch.log1p(-r.clamp(max=1.0)))
