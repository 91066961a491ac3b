"""Lossless multi-draft verifiers for one position (docs/algorithms.md §1).

Each verifier maps (p, q, drafts, randomness) to one token y with y ~ p exactly. A draft is
*accepted* when y is among the drafts; `accepted_index` is the first position of y in the drafts
(-1 if none). Two forms per method:

- `verify(...)`: samples y (the algorithm as an engine runs it), batched over leading dims;
- `output_law(...)`: the exact law of y given the drafts (averaged over the verifier's own coins),
  used by the exactness tests and by `expected_acceptance`.

Methods and the draft scheme each one needs:
  "rrs"          with     SpecInfer recursive rejection sampling: accept x_i w.p. min(1, p'(x_i)/q(x_i)),
                          on rejection p' <- norm((p' − q)+); all rejected -> y ~ p'.
  "rrs-without"  without  as "rrs", and after each rejection q <- q without x_i, renormalised.
  "k-seq"        with     SpecTr: accept x_i w.p. min(1, p/(ρ q)); residual chosen so y ~ p.
  "spechub"      greedy   n = 2, SpecHub (Sun et al., EMNLP 2024): hub a = argmax q; the ordered pair is
                          (i, a) w.p. q(i) or (a, i) w.p. q(a) q(i)/(1 − q(a)) — as a set, exactly the
                          greedy scheme with n = 2 (the order is re-drawn: hub first w.p. q(a)).
                          Transport as the authors describe it: i is taken from (i, a) up to
                          min(p, q), then from (a, i) up to what p(i) has left; the pairs' leftover
                          mass goes to the hub up to p(a); the rest to the residual p''.
  "greedy"       greedy   accept x_n w.p. min(1, p/q'); else y ~ norm(p − min(p, q')). Optimal.
  "lp-optimal"   any      y ~ the optimal coupling's conditional given the drafts (LP; small V only).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from runtime.sampling import draw
from specdec.drafts import check_n, check_pair, check_scheme, greedy_residual_draft, greedy_set, to_float64
from specdec.lp import solve_coupling

METHOD_SCHEMES: dict[str, tuple[str, ...]] = {
    "rrs": ("with",),
    "rrs-without": ("without",),
    "k-seq": ("with",),
    "spechub": ("greedy",),
    "greedy": ("greedy",),
    "lp-optimal": ("with", "without", "greedy"),
}
METHODS = tuple(METHOD_SCHEMES)


@dataclass(frozen=True)
class VerifyResult:
    """Output of `verify`: the emitted token and the index of the accepted draft (-1: none)."""

    token: torch.Tensor  # [...] long
    accepted_index: torch.Tensor  # [...] long, in [-1, n)

    def __repr__(self) -> str:
        return f"VerifyResult(token={tuple(self.token.shape)}, accepted_index={tuple(self.accepted_index.shape)})"


def residual(
    target_probs: torch.Tensor,  # [..., V] p
    draft_probs: torch.Tensor,  # [..., V] q
) -> torch.Tensor:  # [..., V] norm((p − q)+), float64
    """The rejection residual norm(max(p − q, 0)). Rows where p <= q everywhere (so p = q and a
    rejection has probability 0) return p, so the result is always a distribution."""
    p = target_probs.to(torch.float64)
    diff = (p - draft_probs.to(torch.float64)).clamp(min=0.0)
    mass = diff.sum(-1, keepdim=True)
    return torch.where(mass > 0, diff / mass.clamp(min=torch.finfo(torch.float64).tiny), p)


def normalize_method(method: str) -> str:
    """A verifier name with underscores read as dashes ("rrs_without" -> "rrs-without")."""
    return method.replace("_", "-") if isinstance(method, str) else method


def check_method(method: str, scheme: str | None, n: int) -> str:
    """Return the draft scheme `method` runs on; ValueError if the method or pairing is invalid.
    Underscores are accepted for dashes ("rrs_without")."""
    method = normalize_method(method)
    if method not in METHOD_SCHEMES:
        raise ValueError(f"unknown verifier {method!r}; choose one of {METHODS}")
    allowed = METHOD_SCHEMES[method]
    if scheme is None:
        if method == "lp-optimal":
            raise ValueError("verifier 'lp-optimal' needs scheme= ('with', 'without' or 'greedy')")
        scheme = allowed[0]
    check_scheme(scheme)
    if scheme not in allowed:
        raise ValueError(f"verifier {method!r} is lossless only for {'/'.join(allowed)} drafts, not {scheme!r} drafts")
    if method == "spechub" and n != 2:
        raise ValueError(f"verifier 'spechub' is defined for n = 2 drafts only, got n = {n}")
    return scheme


def _check_drafts(q: torch.Tensor, drafts: list[int], scheme: str) -> None:
    v, n = q.shape[-1], len(drafts)
    if any(x < 0 or x >= v for x in drafts):
        raise ValueError(f"draft tokens must lie in [0, {v}), got {drafts}")
    if any(q[x] <= 0 for x in drafts):
        raise ValueError(f"drafts {drafts} include a token with draft probability 0: they were not drawn from q")
    if scheme in ("without", "greedy") and len(set(drafts)) != n:
        raise ValueError(f"{scheme!r} drafts must be distinct, got {drafts}")
    if scheme == "greedy" and n > 1:
        g = set(greedy_set(q, n).tolist())
        if set(drafts[:-1]) != g:
            raise ValueError(f"greedy drafts must start with the top {n - 1} tokens of q {sorted(g)}, got {drafts}")


def _first_index(drafts: list[int], y: int) -> int:
    return drafts.index(y) if y in drafts else -1


def _uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), dtype=torch.float64, generator=generator,
                            device=generator.device if generator is not None else "cpu"))


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return draw(probs, generator)


# ----------------------------------------------------------------------------------------------
# K-SEQ helpers
def kseq_rho_star(p: torch.Tensor, q: torch.Tensor, n: int, iters: int = 60) -> float:
    """Smallest ρ in [1, n] with c(ρ) = (1 − (1 − β(ρ))^n) / β(ρ) <= ρ, β(ρ) = Σ min(q, p/ρ):
    the K-SEQ residual is non-negative (the verifier is lossless) exactly when c(ρ) <= ρ.

    One sort of p/q, then each β(ρ) = Σ_{p/q<ρ} p/ρ + Σ_{p/q>=ρ} q is a binary search."""
    ratio = torch.where(q > 0, p / q, torch.full_like(p, math.inf))
    order = torch.argsort(ratio)
    ratio_s = ratio[order].contiguous()
    p_below = torch.cat([p.new_zeros(1), torch.cumsum(p[order], 0)])  # Σ p over the first k
    q_sorted = q[order]
    q_above = torch.cat([torch.flip(torch.cumsum(torch.flip(q_sorted, [0]), 0), [0]), q.new_zeros(1)])

    def excess(rho: float) -> float:
        k = int(torch.searchsorted(ratio_s, torch.tensor([rho], dtype=ratio_s.dtype, device=ratio_s.device)))
        beta = float(p_below[k]) / rho + float(q_above[k])
        c = float(n) if beta <= 0 else (1.0 - (1.0 - beta) ** n) / beta
        return c - rho

    if excess(1.0) <= 0:
        return 1.0
    lo, hi = 1.0, float(n)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if excess(mid) <= 0 else (mid, hi)
    return hi


def _kseq_parts(p: torch.Tensor, q: torch.Tensor, n: int, rho: float | None) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(ρ used, accept prob per token min(1, p/(ρq)) [V], normalised residual [V]).

    A `rho` below the smallest lossless value ρ* is raised to ρ*; None means ρ*."""
    if rho is not None and not (1.0 <= rho <= n):
        raise ValueError(f"k-seq rho must lie in [1, n={n}], got {rho}")
    star = kseq_rho_star(p, q, n)
    rho = star if rho is None else max(float(rho), star)
    taken = torch.minimum(q, p / rho)  # P(draft = x and accepted) per draft
    beta = float(taken.sum())
    scale = float(n) if beta <= 0 else (1.0 - (1.0 - beta) ** n) / beta
    res = (p - taken * scale).clamp(min=0.0)
    mass = res.sum()
    res = res / mass if mass > 0 else p.clone()
    accept = torch.where(q > 0, (p / (rho * q)).clamp(max=1.0), torch.zeros_like(p))
    return rho, accept, res


# ----------------------------------------------------------------------------------------------
# Exact law of y given the drafts (one position)
def output_law(
    target_probs: torch.Tensor,  # [V] p
    draft_probs: torch.Tensor,  # [V] q
    drafts: torch.Tensor | list[int],  # [n] long
    method: str,
    scheme: str | None = None,
    **params,
) -> torch.Tensor:  # [V] float64: P(y = · | drafts)
    """Exact conditional law of the verifier's output given the drafts (its own coins averaged)."""
    check_pair(target_probs, draft_probs)
    if target_probs.dim() != 1:
        raise ValueError("output_law takes one position: 1-D target_probs and draft_probs")
    d = drafts.tolist() if isinstance(drafts, torch.Tensor) else list(drafts)
    scheme = check_method(method, scheme, len(d))
    method = normalize_method(method)
    check_n(draft_probs, len(d), scheme)
    p, q = to_float64(target_probs), to_float64(draft_probs)
    _check_drafts(q, d, scheme)
    law = torch.zeros_like(p)
    if method in ("rrs", "rrs-without"):
        alive, p_cur, q_cur = 1.0, p, q
        for x in d:
            a = min(1.0, float(p_cur[x] / q_cur[x]))
            law[x] += alive * a
            alive *= 1.0 - a
            p_cur = residual(p_cur, q_cur)
            if method == "rrs-without":
                q_cur = q_cur.clone()
                q_cur[x] = 0.0
                q_cur = q_cur / q_cur.sum()
        return law + alive * p_cur
    if method == "k-seq":
        _, accept, res = _kseq_parts(p, q, len(d), params.get("rho"))
        alive = 1.0
        for x in d:
            law[x] += alive * float(accept[x])
            alive *= 1.0 - float(accept[x])
        return law + alive * res
    if method == "greedy":
        q_prime = greedy_residual_draft(q, len(d))
        x = d[-1]
        a = min(1.0, float(p[x] / q_prime[x]))
        law[x] += a
        return law + (1.0 - a) * _greedy_residual(p, q_prime)
    if method == "spechub":
        hub, x = d
        parts = spechub_parts(p, q)
        out = torch.zeros_like(p)
        for first, weight in ((hub, float(q[hub])), (x, 1.0 - float(q[hub]))):
            take_x, take_hub = _spechub_pair(parts, x, hub_first=first == hub)
            out[x] += weight * take_x
            out[hub] += weight * take_hub
            out += weight * (1.0 - take_x - take_hub) * parts.residual
        return out
    return _lp_row(p, q, d, scheme)


def _lp_row(p: torch.Tensor, q: torch.Tensor, d: list[int], scheme: str) -> torch.Tensor:
    """P(y = · | drafts = d) under the optimal coupling (checked inputs, float64)."""
    coupling, index = _coupling(p.cpu(), q.cpu(), len(d), scheme)  # scipy's LP: on the CPU
    k = index.get(tuple(d))
    if k is None:
        raise ValueError(f"drafts {d} have probability 0 under the {scheme!r} scheme")
    return coupling.plan[k] / coupling.plan[k].sum()


def _greedy_residual(p: torch.Tensor, q_prime: torch.Tensor) -> torch.Tensor:
    """norm(p − min(p, q')): keeps the full mass p(g) of every g in G (where q' = 0)."""
    res = p - torch.minimum(p, q_prime)
    mass = res.sum()
    return res / mass if mass > 0 else p.clone()


@dataclass(frozen=True)
class SpecHubParts:
    """SpecHub's transport for one (p, q): per-token masses [V] (hub entries unused) and hub fractions."""

    hub: int
    pair_ia: torch.Tensor  # Q(i, a) = q(i)
    pair_ai: torch.Tensor  # Q(a, i) = q(a) q(i) / (1 − q(a))
    take_ia: torch.Tensor  # mass of (i, a) sent to i: min(p(i), q(i))
    take_ai: torch.Tensor  # mass of (a, i) sent to i: min(p(i) − take_ia(i), Q(a, i))
    hub_frac_ia: float  # share of each (i, a) leftover sent to the hub
    hub_frac_ai: float  # share of each (a, i) leftover sent to the hub
    residual: torch.Tensor  # [V] law of y when neither: ∝ p(i) − take_ia − take_ai

    def __repr__(self) -> str:
        return f"SpecHubParts(hub={self.hub}, V={self.residual.shape[-1]})"


def spechub_parts(p: torch.Tensor, q: torch.Tensor) -> SpecHubParts:
    """Precompute SpecHub's transport plan for target p [V] and draft q [V] (float64)."""
    hub = int(greedy_set(q, 2)[0])
    others = torch.ones_like(p)
    others[hub] = 0.0
    pair_ia = q * others
    pair_ai = q[hub] * q / (1.0 - q[hub]) * others
    take_ia = torch.minimum(p, q) * others
    p1 = p * others - take_ia
    take_ai = torch.minimum(p1, pair_ai)
    left_ia, left_ai = float((pair_ia - take_ia).sum()), float((pair_ai - take_ai).sum())
    hub_ai = min(float(p[hub]), left_ai)
    hub_ia = min(float(p[hub]) - hub_ai, left_ia)
    rest = (p1 - take_ai).clamp(min=0.0)
    mass = float(rest.sum())
    residual = rest / mass if mass > 0 else p.clone()
    return SpecHubParts(hub, pair_ia, pair_ai, take_ia, take_ai,
                        hub_ia / left_ia if left_ia > 0 else 0.0, hub_ai / left_ai if left_ai > 0 else 0.0, residual)


def _spechub_pair(parts: SpecHubParts, x: int, hub_first: bool) -> tuple[float, float]:
    """(P(y = x), P(y = hub)) given the ordered pair (hub, x) if hub_first else (x, hub)."""
    if hub_first:
        take = float(parts.take_ai[x] / parts.pair_ai[x])
        return take, (1.0 - take) * parts.hub_frac_ai
    take = float(parts.take_ia[x] / parts.pair_ia[x])
    return take, (1.0 - take) * parts.hub_frac_ia


_COUPLINGS: dict[tuple, object] = {}


def _coupling(p: torch.Tensor, q: torch.Tensor, n: int, scheme: str):
    """Optimal coupling for (p, q, n, scheme), memoised (the LP is solved once per distribution pair)."""
    if p.shape[-1] > 12:
        raise ValueError(f"'lp-optimal' solves an LP over draft tuples: V <= 12 only, got V = {p.shape[-1]}")
    key = (p.numpy().tobytes(), q.numpy().tobytes(), n, scheme)
    if key not in _COUPLINGS:
        if len(_COUPLINGS) > 256:
            _COUPLINGS.clear()
        coupling = solve_coupling(p, q, n, scheme)
        _COUPLINGS[key] = (coupling, {tuple(t): k for k, t in enumerate(coupling.tuples.tolist())})
    return _COUPLINGS[key]


# ----------------------------------------------------------------------------------------------
# Sampling verifiers
def verify(
    target_probs: torch.Tensor,  # [..., V] p
    draft_probs: torch.Tensor,  # [..., V] q
    drafts: torch.Tensor,  # [..., n] long, from sample_drafts(draft_probs, n, scheme)
    method: str,
    generator: torch.Generator | None = None,
    scheme: str | None = None,
    **params,
) -> VerifyResult:
    """Run a lossless verifier on each row: returns the emitted token and accepted draft index.

    `scheme` defaults to the method's own scheme (required for "lp-optimal"); `rho` (k-seq)
    defaults to the smallest lossless value. ValueError on invalid probs/shapes/drafts or a method
    that does not fit the scheme.
    """
    check_pair(target_probs, draft_probs)
    if not isinstance(drafts, torch.Tensor) or drafts.dtype not in (torch.int64, torch.int32):
        raise ValueError("drafts must be an integer torch.Tensor of shape [..., n]")
    if drafts.dim() != target_probs.dim() or drafts.shape[:-1] != target_probs.shape[:-1]:
        raise ValueError(
            f"drafts {tuple(drafts.shape)} must have shape [..., n] matching probs {tuple(target_probs.shape)}"
        )
    n = drafts.shape[-1]
    scheme = check_method(method, scheme, n)
    method = normalize_method(method)
    check_n(draft_probs, n, scheme)
    v = target_probs.shape[-1]
    ps = to_float64(target_probs).reshape(-1, v)
    qs = to_float64(draft_probs).reshape(-1, v)
    ds = drafts.reshape(-1, n).tolist()
    tokens, indices = [], []
    for p, q, d in zip(ps, qs, ds):
        _check_drafts(q, d, scheme)
        y = _VERIFY_ROW[method](p, q, d, generator, scheme, params)
        tokens.append(y)
        indices.append(_first_index(d, y))
    shape = target_probs.shape[:-1]
    return VerifyResult(torch.tensor(tokens, dtype=torch.long).reshape(shape), torch.tensor(indices, dtype=torch.long).reshape(shape))


# One row each: (p [V], q [V] float64, drafts, generator, scheme, params) -> the emitted token.
def _verify_rrs(p, q, d, gen, scheme, params) -> int:
    p_cur, q_cur = p, q
    for x in d:
        if _uniform(gen) < float(p_cur[x] / q_cur[x]):
            return x
        p_cur = residual(p_cur, q_cur)
        if scheme == "without":
            q_cur = q_cur.clone()
            q_cur[x] = 0.0
            q_cur = q_cur / q_cur.sum()
    return _sample(p_cur, gen)


def _verify_kseq(p, q, d, gen, scheme, params) -> int:
    _, accept, res = _kseq_parts(p, q, len(d), params.get("rho"))
    for x in d:
        if _uniform(gen) < float(accept[x]):
            return x
    return _sample(res, gen)


def _verify_greedy(p, q, d, gen, scheme, params) -> int:
    q_prime = greedy_residual_draft(q, len(d))
    x = d[-1]
    if _uniform(gen) < float(p[x] / q_prime[x]):
        return x
    return _sample(_greedy_residual(p, q_prime), gen)


def _verify_spechub(p, q, d, gen, scheme, params) -> int:
    hub, x = d
    parts = spechub_parts(p, q)
    take_x, take_hub = _spechub_pair(parts, x, hub_first=_uniform(gen) < float(q[hub]))
    u = _uniform(gen)
    if u < take_x:
        return x
    if u < take_x + take_hub:
        return hub
    return _sample(parts.residual, gen)


def _verify_lp(p, q, d, gen, scheme, params) -> int:
    return _sample(_lp_row(p, q, d, scheme), gen)


_VERIFY_ROW = {
    "rrs": _verify_rrs,
    "rrs-without": _verify_rrs,
    "k-seq": _verify_kseq,
    "greedy": _verify_greedy,
    "spechub": _verify_spechub,
    "lp-optimal": _verify_lp,
}
