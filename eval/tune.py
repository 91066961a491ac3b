"""`adafuse tune CONFIG`: choose, per task and on dev rows only, which members vote, how much, and
with which method settings; write a tuned eval config for the test rows (config format:
`eval.tune_config`).

Per task (`Tuner.tune_task`): stage 0 scores every member alone on all `dev_rows` dev rows (the
compatibility prior; `eval.data` fixes where dev rows start, disjoint from the test rows). Members far
below the best are pruned; ensembles are built over subsets of the rest x lead x weights x the option
grid; successive halving scores them on `min_rows`, keeps the best 1/eta, grows the rows by eta, up to
`dev_rows`. The finalists and the singles meet on all dev rows: the best wins, ties (and gains not
above `min_gain`) go to the cheaper run (fewer members, then fewer forward passes), so the choice is
never worse on dev than the best single.

Every candidate is an ordinary `eval.runner.run_task` run into `OUT/candidates/<name>/<task>/`, so a
killed tune resumes where it was and growing the rows computes only the new ones. Outputs in OUT:
`tune.jsonl` (events, as it goes), `dev_table.md` (`eval.tune_report`) and `tuned.yaml` (one task)
or `tuned_<task>.yaml` (several): an eval config with the chosen run and each member alone.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

from runtime.errors import ConfigError
from runtime.files import append_line
from eval import methods as eval_methods
from eval.config import TaskSpec
from eval.data import resolve_data_dir
from eval.runner import PREDICTIONS, read_predictions, run_task
from eval.tune_config import MethodGrid, TuneConfig, TuneSpec
from eval.tune_report import write_outputs
from eval.tune_results import Candidate, Round, Scored, TaskResult


# ---------------------------------------------------------------------------------------------
# candidates


def single(member: str) -> Candidate:
    """`member` alone, named after it."""
    return Candidate(name=member, method="single", members=[member], label="alone")


def ensemble(method: str, members: Iterable[str], options: dict[str, Any], label: str, prior: float) -> Candidate:
    """A candidate named `method-m1+m2-<8 hex>`: the hash of (method, members, options), so the same
    settings always find the same folder and different ones never share it."""
    members = list(members)
    digest = hashlib.sha1(json.dumps([method, members, options], sort_keys=True).encode()).hexdigest()[:8]
    joined = "+".join(members)
    if len(joined) > 120:  # views spell long names; the digest keeps the folder unique
        joined = joined[:120]
    return Candidate(f"{method}-{joined}-{digest}", method, members, dict(options), label, prior)


def dev_weights(scores: list[float], floor: float = 0.1) -> list[float] | None:
    """Weights proportional to the members' dev scores (each at least `floor` x the best), summing to
    about 1, rounded to 0.1 (so a slightly different budget keeps the same weights, and the same
    candidate folders); None (uniform) when they would all be equal."""
    best = max(scores)
    if best <= 0:
        return None
    raw = [max(s, floor * best) for s in scores]
    weights = [max(0.1, round(w / sum(raw), 1)) for w in raw]
    return None if len(set(weights)) == 1 else weights


def build_candidates(spec: TuneSpec, prior: dict[str, float],
                     rank: dict[str, tuple] | None = None) -> tuple[list[Candidate], list[str]]:
    """(ensembles to search, members kept): subsets (sizes >= 2) of the members whose dev score alone
    is >= prune_ratio x the best, x lead x weights x each method's grid; duplicates dropped; at most
    `max_candidates`, the highest prior (mean member score) first, kept in generation order.
    `lead: best` leads with the subset's member of the highest `rank` (default: its prior; e.g. the
    task's metrics in order, so a tie on exact match goes to the better F1), the first on ties."""
    best = max(prior.values())
    kept = [m for m in spec.members if prior[m] >= spec.prune_ratio * best]
    sizes = spec.subset_sizes or range(2, len(kept) + 1)
    found: dict[str, Candidate] = {}
    ensembles = [mg for mg in spec.methods if not _one_member(mg.method)]
    for size in sizes:
        for subset in itertools.combinations(kept, size):
            for mg in ensembles:
                for cand in _subset_candidates(mg, list(subset), prior, rank or {}, spec):
                    found.setdefault(cand.name, cand)
    for mg in (mg for mg in spec.methods if _one_member(mg.method)):  # self-consistency: each member alone
        for m in kept:
            for cand in _subset_candidates(mg, [m], prior, rank or {}, spec):
                found.setdefault(cand.name, cand)
    cands = list(found.values())
    if spec.max_candidates is not None and len(cands) > spec.max_candidates:
        top = {c.name for c in sorted(cands, key=lambda c: -c.prior)[: spec.max_candidates]}
        cands = [c for c in cands if c.name in top]
    return cands, kept


def _one_member(method: str) -> bool:
    """Whether `method` runs on one member (self-consistency), not on an ensemble."""
    from adafuse.methods import METHODS as ADAFUSE_METHODS

    return method in ADAFUSE_METHODS and method != "single" and ADAFUSE_METHODS[method].min_members == 1


def _subset_candidates(mg: MethodGrid, subset: list[str], prior: dict[str, float], rank: dict[str, tuple],
                       spec: TuneSpec) -> list[Candidate]:
    scores = [prior[m] for m in subset]
    best = max(range(len(subset)), key=lambda i: (rank.get(subset[i], (scores[i],)), -i))
    leads = [best] if (mg.lead or spec.lead) == "best" else list(range(len(subset)))
    out = []
    for lead in leads:
        for mode in mg.weights or spec.weights:
            weights = dev_weights(scores) if mode == "dev" else None
            for combo in mg.combos():
                options = {**combo, "lead": lead, **({"weights": weights} if weights else {})}
                label = ", ".join([f"lead={subset[lead]}", f"weights={weights}" if weights else "weights=uniform",
                                   *(f"{k}={v}" for k, v in combo.items())])
                out.append(ensemble(mg.method, subset, options, label, sum(scores) / len(scores)))
    return out


# ---------------------------------------------------------------------------------------------
# successive halving


def _key(score: float | None) -> float:
    """A sortable score: NaN / None rank last."""
    return -math.inf if score is None or math.isnan(score) else score


def halving_schedule(n: int, min_rows: int, eta: int, max_rows: int) -> list[tuple[int, int]]:
    """(candidates, rows) per round of `successive_halving` on n candidates (its exact plan)."""
    plan, rows = [], min(min_rows, max_rows)
    while n:
        plan.append((n, rows))
        if rows >= max_rows:
            break
        n = max(1, math.ceil(n / eta))
        rows = max_rows if n == 1 else min(rows * eta, max_rows)
    return plan


def successive_halving(names: list[str], score: Callable[[str, int], float], *, min_rows: int, eta: int,
                       max_rows: int, tiebreak: Callable[[str], tuple] = lambda name: ()) -> list[Round]:
    """Score every name on `min_rows` rows, keep the best ceil(n / eta) (ties: `tiebreak`, then the
    name), grow the rows by eta (straight to `max_rows` once one is left) and repeat; the last round
    scores the finalists on `max_rows` rows and keeps them all. `score(name, rows)` is called once per
    name and round, with rows growing, so a caching scorer only computes the new rows."""
    rounds: list[Round] = []
    for index, (_, rows) in enumerate(halving_schedule(len(names), min_rows, eta, max_rows)):
        alive = rounds[-1].kept if rounds else list(names)
        scores = {n: score(n, rows) for n in alive}
        ranked = sorted(alive, key=lambda n: (-_key(scores[n]), tiebreak(n), n))
        keep = len(ranked) if rows >= max_rows else max(1, math.ceil(len(ranked) / eta))
        rounds.append(Round(index, rows, ranked, ranked[:keep], scores))
    return rounds


# ---------------------------------------------------------------------------------------------
# the search


def choose(singles: list[Scored], finalists: list[Scored], min_gain: float = 0.0) -> tuple[Scored, Scored]:
    """(chosen, best single) on the same dev rows: the highest score, ties to the cheaper run; an
    ensemble must beat the best single by more than `min_gain`, so the choice is never worse on dev."""
    best_single = min(singles, key=lambda s: (-_key(s.score), s.cost_key()))
    ranked = sorted([*singles, *finalists], key=lambda s: (-_key(s.score), s.cost_key()))
    top = ranked[0]
    if not top.cand.is_single and not _key(top.score) > _key(best_single.score) + min_gain:
        top = best_single
    return top, best_single


def choose_on(metrics: dict[str, Any], metric: str | None) -> dict[str, Any]:
    """A run's metrics with `score` / `primary_metric` set to the metric the tune chooses on (the
    task's own primary when `metric` is None); the file on disk is not changed."""
    if metric is None or metric == metrics["primary_metric"]:
        return metrics
    return {**metrics, "score": metrics["metrics"][metric]["value"], "primary_metric": metric}


class Tuner:
    """Runs `tune_task` for each task of a `TuneConfig`, into `cfg.eval.output_path`; `log` gets the
    progress lines, `tune.jsonl` the events."""

    def __init__(self, cfg: TuneConfig, *, log: Callable[[str], None] | None = print, progress: bool = False) -> None:
        self.cfg, self.log, self.progress = cfg, log or (lambda s: None), progress
        self.out = Path(cfg.eval.output_path)
        self.data_dir = resolve_data_dir(cfg.eval.data_dir)

    def event(self, kind: str, **data: Any) -> None:
        """Append one event to OUT/tune.jsonl (one write per line, flushed)."""
        self.out.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"event": kind, "time": round(time.time(), 3), **data}, ensure_ascii=False, default=str)
        path = self.out / "tune.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            append_line(fd, line + "\n", path)
        finally:
            os.close(fd)

    def dev_spec(self, spec: TaskSpec) -> tuple[TaskSpec, list[Any]]:
        """The task on its dev split limited to `dev_rows`, and those rows' ids; a one-line error if
        the dev split has fewer rows."""
        dev = replace(spec, task=spec.task.with_overrides(split="dev"), limit=self.cfg.tune.dev_rows)
        docs, _ = dev.task.load(self.data_dir)
        if len(docs) < dev.limit:
            raise ConfigError(f"{self.cfg.source}: tune.dev_rows={dev.limit} but {spec.name} has {len(docs)} dev rows")
        return dev, [d["id"] for d in docs[: dev.limit]]

    def score(self, cand: Candidate, dev: TaskSpec, rows: int, stage: str) -> Scored:
        """`cand` on the first `rows` dev rows, through the runner (resumes, computes only new rows)."""
        t0 = time.perf_counter()
        run = cand.run()
        run.options = self.cfg.eval.run_options(run)  # the config's dtype, where the candidate sets none
        metrics = run_task(run, replace(dev, limit=rows), self.out / "candidates" / cand.name / dev.name, self.data_dir,
                           get_generator=lambda: eval_methods.build_generator(run.method, run.members, **run.options),
                           seed=self.cfg.eval.seed, batch_size=self.cfg.eval.batch_size, bootstrap=self.cfg.eval.bootstrap,
                           progress=self.progress)
        metrics = choose_on(metrics, self.cfg.tune.metric)
        self.event("score", task=dev.name, stage=stage, candidate=cand.name, method=cand.method, members=cand.members,
                   options=cand.options, rows=rows, score=metrics["score"], metric=metrics["primary_metric"])
        self.log(f"[{dev.name}] {stage}: {cand.name} ({cand.label}) {metrics['primary_metric']} = "
                 f"{metrics['score']:.4g} on {rows} dev rows ({time.perf_counter() - t0:.1f} s)")
        return Scored(cand, rows, metrics)

    def records(self, s: Scored, dev: TaskSpec, ids: list[Any]) -> list[dict]:
        """The candidate's prediction records of the dev rows `ids`, in that order."""
        by_id = {r["id"]: r for r in read_predictions(self.out / "candidates" / s.cand.name / dev.name / PREDICTIONS)}
        return [by_id[i] for i in ids]

    def tune_task(self, spec: TaskSpec) -> TaskResult:
        """Stage 0 (each member alone on every dev row), pruning, successive halving, the choice."""
        tune = self.cfg.tune
        dev, ids = self.dev_spec(spec)
        singles = [self.score(single(m), dev, tune.dev_rows, "stage 0") for m in tune.members]
        prior = {s.cand.members[0]: _key(s.score) for s in singles}
        order = [tune.metric] if tune.metric else []
        order += [m for m in dev.task.metric_names if m not in order]
        rank = {s.cand.members[0]: tuple(_key(s.metrics["metrics"][m]["value"]) for m in order) for s in singles}
        cands, kept = build_candidates(tune, prior, rank)
        plan = halving_schedule(len(cands), tune.min_rows, tune.eta, tune.dev_rows)
        self.event("plan", task=spec.name, prior=prior, kept=kept, candidates=[c.name for c in cands], rounds=plan)
        self.log(f"[{spec.name}] kept {', '.join(kept)} of {len(tune.members)} members; {len(cands)} ensembles; "
                 f"rounds (candidates x rows): {', '.join(f'{n}x{r}' for n, r in plan) or 'none'}")
        scored: dict[str, Scored] = {s.cand.name: s for s in singles}
        by_name = {c.name: c for c in cands}

        round_of = {rows: i for i, (_, rows) in enumerate(plan)}

        def score(name: str, rows: int) -> float:
            scored[name] = self.score(by_name[name], dev, rows, f"round {round_of[rows]}")
            return scored[name].score

        rounds = successive_halving([c.name for c in cands], score, min_rows=tune.min_rows, eta=tune.eta,
                                    max_rows=tune.dev_rows, tiebreak=lambda n: scored[n].cost_key())
        for r in rounds:
            self.event("round", task=spec.name, round=r.index, rows=r.rows, ranked=r.ranked, kept=r.kept)
            for name in r.ranked[len(r.kept):]:
                scored[name].outcome = f"dropped at round {r.index} ({r.rows} rows)"
        finalists = [scored[n] for n in rounds[-1].kept] if rounds else []
        chosen, best_single = choose(singles, finalists, tune.min_gain)
        result = TaskResult(spec, ids, singles, kept, scored, rounds, chosen, best_single)
        result.paired = self.paired(result, dev)
        self.event("chosen", task=spec.name, candidate=chosen.cand.name, score=chosen.score,
                   best_single=best_single.cand.name, best_single_score=best_single.score, paired=result.paired)
        self.log(f"[{spec.name}] chosen {chosen.cand.name}: {chosen.metrics['primary_metric']} {chosen.score:.4g} on "
                 f"{tune.dev_rows} dev rows (best single {best_single.cand.name}: {best_single.score:.4g})")
        return result

    def paired(self, result: TaskResult, dev: TaskSpec) -> dict[str, Any]:
        """The chosen run minus the best single on the same dev rows (`eval.paired.compare_runs`)."""
        from eval.paired import compare_runs

        a = self.records(result.chosen, dev, result.dev_ids)
        b = self.records(result.best_single, dev, result.dev_ids)
        diffs, (win, tie, loss) = compare_runs(dev.task.metric_list, a, b, n_resamples=self.cfg.eval.bootstrap,
                                               seed=self.cfg.eval.seed)
        return {"n": len(a), "win": win, "tie": tie, "loss": loss,
                "diffs": [{"metric": d.metric, "diff": d.diff, "ci_low": d.ci_low, "ci_high": d.ci_high} for d in diffs]}

    def run(self) -> list[TaskResult]:
        """Tune every task; write `dev_table.md` and the tuned config(s) once all are done."""
        self.event("start", config=self.cfg.source, tasks=[t.name for t in self.cfg.eval.tasks],
                   members=self.cfg.tune.members, dev_rows=self.cfg.tune.dev_rows)
        results = [self.tune_task(spec) for spec in self.cfg.eval.tasks]
        paths = write_outputs(self.cfg, results)
        for path in paths:
            self.log(f"wrote {path}")
        self.event("done", outputs=[str(p) for p in paths])
        return results

