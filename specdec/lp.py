"""Reference oracles for small V: the draft-tuple law, the primal optimal-transport LP (HiGHS) and
brute-force subset minimisation. Exponential in V and n: meant for V <= 8, n <= 3.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from specdec.drafts import check_n, check_pair, check_scheme, greedy_residual_draft, greedy_set, to_float64

MAX_TUPLES = 200_000


def draft_law(
    draft_probs: torch.Tensor,  # [V] draft distribution q
    n: int,
    scheme: str,
) -> tuple[torch.Tensor, torch.Tensor]:  # tuples [K, n] long, probs [K] float64 (all > 0)
    """Every ordered draft tuple with positive probability under `scheme`, and that probability."""
    check_scheme(scheme)
    check_n(draft_probs, n, scheme)
    q = to_float64(draft_probs)
    v = q.shape[-1]
    support = [i for i in range(v) if q[i] > 0]
    tuples: list[tuple[int, ...]] = []
    probs: list[float] = []
    if scheme == "greedy":
        g = greedy_set(q, n).tolist()
        qp = greedy_residual_draft(q, n)
        for x in range(v):
            if qp[x] > 0:
                tuples.append(tuple(g) + (x,))
                probs.append(float(qp[x]))
    else:
        count = len(support) ** n
        if count > MAX_TUPLES:
            raise ValueError(f"draft_law would enumerate {count} tuples (> {MAX_TUPLES}); use small V and n")
        for tup in itertools.product(support, repeat=n):
            if scheme == "with":
                pr = float(np.prod([q[i].item() for i in tup]))
            else:
                if len(set(tup)) < n:
                    continue
                pr, left = 1.0, list(support)
                for i in tup:  # remaining mass summed directly: 1 - used would cancel for peaked q
                    pr *= q[i].item() / sum(sorted(q[j].item() for j in left))
                    left.remove(i)
            if pr > 0:
                tuples.append(tup)
                probs.append(pr)
    return torch.tensor(tuples, dtype=torch.long).reshape(-1, n), torch.tensor(probs, dtype=torch.float64)


@dataclass(frozen=True)
class Coupling:
    """Optimal coupling of the draft-tuple law and p: plan[k, y] = P(drafts = tuples[k], y)."""

    tuples: torch.Tensor  # [K, n] long
    tuple_probs: torch.Tensor  # [K] float64
    plan: torch.Tensor  # [K, V] float64
    value: float  # Σ plan[k, y] 1[y ∈ tuples[k]] = α*

    def __repr__(self) -> str:
        return f"Coupling(tuples={tuple(self.tuples.shape)}, plan={tuple(self.plan.shape)}, value={self.value:.6f})"


def solve_coupling(
    target_probs: torch.Tensor,  # [V] p
    draft_probs: torch.Tensor,  # [V] q
    n: int,
    scheme: str,
) -> Coupling:
    """Solve max P(y ∈ drafts) over couplings of (draft tuple law, p) with scipy's HiGHS LP."""
    from scipy.optimize import linprog

    check_pair(target_probs, draft_probs)
    if target_probs.dim() != 1:
        raise ValueError("solve_coupling takes one position: 1-D target_probs and draft_probs")
    p = to_float64(target_probs)
    tuples, probs = draft_law(draft_probs, n, scheme)
    k, v = tuples.shape[0], p.shape[0]
    hit = np.zeros((k, v))
    for i, tup in enumerate(tuples.tolist()):
        hit[i, tup] = 1.0
    c = -hit.reshape(-1)
    # "<=" marginals: any sub-coupling completes to a full one without lowering the objective, and
    # inequalities stay feasible under rounding where equalities of two float sums may not
    a_rows = np.kron(np.eye(k), np.ones((1, v)))  # Σ_y plan[k, y] <= Q_k
    a_cols = np.kron(np.ones((1, k)), np.eye(v))  # Σ_k plan[k, y] <= p_y
    a_ub = np.vstack([a_rows, a_cols])
    b_ub = np.concatenate([probs.numpy(), p.numpy()])
    res = linprog(
        c, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    if res.status != 0:
        raise RuntimeError(f"LP failed: {res.message}")
    plan = torch.from_numpy(np.clip(res.x, 0.0, None).reshape(k, v))
    over = (plan.sum(0) / p).nan_to_num(0.0).clamp(min=1.0)  # undo tolerance-sized overshoots
    plan = plan / over
    over = (plan.sum(1) / probs).clamp(min=1.0)
    plan = plan / over[:, None]
    row_def = (probs - plan.sum(1)).clamp(min=0.0)
    col_def = (p - plan.sum(0)).clamp(min=0.0)
    if float(col_def.sum()) > 0:  # complete with the product of the deficits
        plan = plan + torch.outer(row_def, col_def) / col_def.sum()
    return Coupling(tuples, probs, plan, float(-res.fun))


def lp_optimal_acceptance(target_probs: torch.Tensor, draft_probs: torch.Tensor, n: int, scheme: str) -> float:
    """α* from the primal LP (reference oracle)."""
    return solve_coupling(target_probs, draft_probs, n, scheme).value


def brute_force_acceptance(target_probs: torch.Tensor, draft_probs: torch.Tensor, n: int, scheme: str) -> float:
    """α* = 1 + min over all 2^V subsets H of p(H) − Q(H), Q from the enumerated draft law."""
    check_pair(target_probs, draft_probs)
    p = to_float64(target_probs)
    v = p.shape[0]
    if v > 16:
        raise ValueError("brute_force_acceptance enumerates 2^V subsets: V <= 16 only")
    tuples, probs = draft_law(draft_probs, n, scheme)
    masks = torch.zeros(tuples.shape[0], dtype=torch.long)
    for j in range(n):
        masks |= 1 << tuples[:, j]
    best = 0.0
    p_list = p.tolist()
    for h in range(1 << v):
        ph = sum(p_list[i] for i in range(v) if h >> i & 1)
        qh = float(probs[(masks & ~h) == 0].sum())
        best = min(best, ph - qh)
    return 1.0 + best
