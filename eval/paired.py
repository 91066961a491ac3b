"""Paired evidence: is run A better than baseline B on the *same* examples?

Pure functions over per-example records of two runs of one task (the `predictions.jsonl` rows):
- `paired_bootstrap`: the difference A − B of a metric with a paired bootstrap percentile interval —
  each draw resamples example ids (the same ids for both runs) and recomputes both scores. Mean
  metrics (exact match, accuracy) average per-example scores; corpus metrics (BLEU, chrF) re-sum
  the per-segment sacreBLEU statistics of the drawn segments (segment-resampled corpus scores).
- `win_tie_loss`: how many examples A scores above / equal to / below B (per-example primary score).
- `mcnemar_exact`: the exact two-sided McNemar p-value of won vs lost examples (ties carry no evidence).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from eval import metrics as M


@dataclass(frozen=True)
class PairedDiff:
    """A − B on n paired examples, with a paired bootstrap (1 − alpha) interval."""

    metric: str
    n: int
    diff: float
    ci_low: float
    ci_high: float

    @property
    def significant(self) -> bool:
        """The interval excludes 0."""
        return self.ci_low > 0 or self.ci_high < 0


def _scorer(metric: str, records: Sequence[dict[str, Any]], metric_kwargs: dict[str, Any]):
    """idx [k] -> the metric over those records (mean of per-example scores, or a corpus score)."""
    if metric in M.CORPUS_METRICS:
        stats = np.asarray([M.record_stats(r, metric) for r in records], dtype=np.int64)
        return lambda idx: M.corpus_score_from_stats(metric, stats[idx], **metric_kwargs)
    values = np.asarray([example_score(r, metric) for r in records], dtype=np.float64)
    return lambda idx: float(values[idx].mean())


def example_score(record: dict[str, Any], metric: str) -> float:
    """One example's score of `metric` (the record's `scores`, else its primary `score`)."""
    scores = record.get("scores") or {}
    return float(scores[metric] if metric in scores else record["score"])


def paired_bootstrap(metric: str, a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], *,
                     n_resamples: int = 1000, seed: int = 0, alpha: float = 0.05,
                     metric_kwargs: dict[str, Any] | None = None) -> PairedDiff:
    """A − B of `metric` over aligned records (a[i] and b[i] are the same example); `metric_kwargs`
    are the task's sacreBLEU options of a corpus metric."""
    if len(a) != len(b):
        raise ValueError(f"paired runs need the same examples: {len(a)} vs {len(b)} records")
    n = len(a)
    if n == 0:
        return PairedDiff(metric, 0, float("nan"), float("nan"), float("nan"))
    score_a, score_b = _scorer(metric, a, metric_kwargs or {}), _scorer(metric, b, metric_kwargs or {})
    everything = np.arange(n)
    diff = score_a(everything) - score_b(everything)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(n_resamples, n))
    diffs = np.asarray([score_a(idx) - score_b(idx) for idx in draws])
    lo, hi = np.quantile(diffs, alpha / 2), np.quantile(diffs, 1 - alpha / 2)
    return PairedDiff(metric, n, float(diff), float(lo), float(hi))


def win_tie_loss(a: Sequence[float], b: Sequence[float], tol: float = 1e-12) -> tuple[int, int, int]:
    """(examples where a > b, a == b, a < b), per aligned example."""
    wins = sum(1 for x, y in zip(a, b) if x > y + tol)
    losses = sum(1 for x, y in zip(a, b) if x < y - tol)
    return wins, len(a) - wins - losses, losses


def mcnemar_exact(wins: int, losses: int) -> float:
    """Exact two-sided McNemar p-value: P(a Binomial(wins + losses, 1/2) count is as far from the
    middle as `wins`), doubled and capped at 1; 1.0 when nothing was won or lost."""
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def align(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """The records of the example ids both runs have, in id order (the last record of an id wins)."""
    by_a = {r["id"]: r for r in a}
    by_b = {r["id"]: r for r in b}
    ids = sorted(set(by_a) & set(by_b))
    return [by_a[i] for i in ids], [by_b[i] for i in ids]


def compare_runs(task_metrics: Sequence[dict[str, Any]], a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], *,
                 n_resamples: int = 1000, seed: int = 0) -> tuple[list[PairedDiff], tuple[int, int, int]]:
    """Every metric of a task (`metric_list` entries: {"metric": name, **sacrebleu options}), A − B
    on the ids both runs have, and win/tie/loss on the primary (first) metric's per-example score."""
    a, b = align(a, b)
    diffs = [paired_bootstrap(spec["metric"], a, b, n_resamples=n_resamples, seed=seed,
                              metric_kwargs={k: v for k, v in spec.items() if k != "metric"})
             for spec in task_metrics]
    primary = task_metrics[0]["metric"]
    wtl = win_tie_loss([example_score(r, primary) for r in a], [example_score(r, primary) for r in b])
    return diffs, wtl
