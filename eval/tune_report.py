"""What `adafuse tune` leaves behind (from `eval.tune.TaskResult`s, pure apart from `write_outputs`):

- `dev_table.md`: per task, every candidate with the rows it was scored on, its dev score, its
  forward passes per example and its outcome (kept/pruned prior, dropped at round k, finalist,
  chosen), and the chosen run minus the best single on the same dev rows (paired bootstrap).
- `tuned.yaml` (a config with one task) or `tuned_<task>.yaml` (several): an eval config for the
  *test* rows with each member alone and, when an ensemble won on dev, the chosen run as `tuned`,
  so `adafuse eval tuned.yaml` compares them in one run.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from runtime.files import write_text_atomic
from eval.tune_results import Scored, TaskResult
from eval.tune_config import TuneConfig

TUNED_RUN = "tuned"


def _fmt(x: float | None) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4g}"


def _signed(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:+.3g}"


def tuned_path(out: Path, task: str, n_tasks: int) -> Path:
    """OUT/tuned.yaml for a one-task tune config, else OUT/tuned_<task>.yaml."""
    return out / ("tuned.yaml" if n_tasks == 1 else f"tuned_{task}.yaml")


def summary(cfg: TuneConfig, result: TaskResult) -> str:
    """One line: what was chosen on how many dev rows, against the best single, with the paired diff."""
    c, b = result.chosen, result.best_single
    metric = c.metrics["primary_metric"]
    line = (f"chosen {c.cand.name} ({c.cand.method}; {c.cand.label}): dev {metric} {_fmt(c.score)} on "
            f"{len(result.dev_ids)} rows vs best single {b.cand.name} {_fmt(b.score)}")
    if c.cand.name == b.cand.name:
        return line + " (the best single itself)"
    p = result.paired
    diffs = "; ".join(f"{d['metric']} {_signed(d['diff'])} [{_signed(d['ci_low'])}, {_signed(d['ci_high'])}]"
                      for d in p.get("diffs", []))
    return line + f"; paired diff (95% CI) {diffs}; win/tie/loss {p.get('win')}/{p.get('tie')}/{p.get('loss')}"


def tuned_config(cfg: TuneConfig, result: TaskResult) -> dict[str, Any]:
    """The tuned eval config of one task: its test rows (`limit`), each member alone, and `tuned`."""
    runs: list[dict[str, Any]] = [{"name": m, "method": "single", "members": [m]} for m in cfg.tune.members]
    c = result.chosen.cand
    if not c.is_single:
        runs.append({"name": TUNED_RUN, "method": c.method, "members": list(c.members), "options": dict(c.options)})
    ev = cfg.eval
    return {"description": f"tuned on dev by `adafuse tune {cfg.source}`: {summary(cfg, result)}"[:1000],
            "output_path": str(Path(ev.output_path) / "test"), **({"data_dir": ev.data_dir} if ev.data_dir else {}),
            "seed": ev.seed, "batch_size": ev.batch_size, "bootstrap": ev.bootstrap,
            **({"dtype": ev.dtype} if ev.dtype else {}), "tasks": [result.task.to_dict()], "runs": runs}


def _outcome(s: Scored, result: TaskResult, ratio: float) -> str:
    if s.cand.name == result.chosen.cand.name:
        return "**chosen**"
    if s.cand.is_single:
        best = " (best single)" if s.cand.name == result.best_single.cand.name else ""
        kept = "kept for ensembles" if s.cand.members[0] in result.kept else f"pruned from ensembles (< {ratio} x best)"
        return f"alone{best}; {kept}"
    return (s.outcome or "finalist").replace("(1 rows)", "(1 row)")


def dev_table(cfg: TuneConfig, results: list[TaskResult]) -> str:
    """The markdown dev table of every task (see the module docstring)."""
    tune = cfg.tune
    parts = [f"# Dev table: `adafuse tune {cfg.source}`", "",
             f"Members: {', '.join(tune.members)}. Dev rows: {tune.dev_rows}; halving from {tune.min_rows} rows, "
             f"eta {tune.eta}; prune ratio {tune.prune_ratio}; lead {tune.lead}; weights {', '.join(tune.weights)}; "
             f"min gain {tune.min_gain}. Settings are chosen on these dev rows only.", ""]
    for result in results:
        metric = result.chosen.metrics["primary_metric"]
        ids = result.dev_ids
        rounds = ", ".join(f"round {r.index}: {len(r.ranked)} x {r.rows} rows" for r in result.rounds) or "no ensembles"
        parts += [f"## {result.task.name}", "",
                  f"Dev rows: ids {ids[0]}..{ids[-1]} ({len(ids)}); {rounds}.", "", summary(cfg, result) + ".", "",
                  f"| candidate | method | members | settings | rows | dev {metric} | fwd / ex | outcome |",
                  "|---|---|---|---|--:|--:|--:|---|"]
        order = [*result.singles, *sorted((s for s in result.scored.values() if not s.cand.is_single),
                                          key=lambda s: (-s.rows, -(s.score if not math.isnan(s.score) else -1e9),
                                                         s.cand.name))]
        for s in order:
            fwd = s.metrics.get("forward_passes_per_example")
            parts.append(f"| {s.cand.name} | {s.cand.method} | {', '.join(s.cand.members)} | {s.cand.label} | {s.rows} "
                         f"| {_fmt(s.score)} | {_fmt(fwd)} | {_outcome(s, result, tune.prune_ratio)} |")
        parts.append("")
    return "\n".join(parts)


def write_outputs(cfg: TuneConfig, results: list[TaskResult]) -> list[Path]:
    """Write `dev_table.md` and the tuned config(s) into the tune's output folder; returns the paths."""
    out = Path(cfg.eval.output_path)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "dev_table.md"
    write_text_atomic(table, dev_table(cfg, results))
    paths = [table]
    for result in results:
        path = tuned_path(out, result.task.name, len(results))
        header = (f"# Tuned on dev rows only by `adafuse tune {cfg.source}` (see {table.name}).\n"
                  f"# Evaluate on the test rows:  adafuse eval {path}\n")
        write_text_atomic(path, header + yaml.safe_dump(tuned_config(cfg, result), sort_keys=False, allow_unicode=True))
        paths.append(path)
    return paths
