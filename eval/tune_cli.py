"""`adafuse tune CONFIG [--dev_rows N] [--limit N] [--output_path DIR] [--data_dir D] [--seed S]
[--batch_size B] [--tasks T,...] [--dry_run] [--no_progress]`: choose each task's members, weights and
method settings on dev rows (`eval.tune`), write `dev_table.md` and a tuned eval config; rerunning the
same command resumes (finished rows are never computed again)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from eval.cli_eval import _subset, check_model_names, check_output_path
from eval.tune_config import TuneConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The verb's options (underscored; `eval.cli` adds the dashed spellings)."""
    parser.add_argument("config", metavar="CONFIG", help="tune config YAML (see experiments/tune_*/)")
    parser.add_argument("--dev_rows", type=int, default=None, help="dev row budget per task (default: tune.dev_rows)")
    parser.add_argument("--limit", type=int, default=None, help="test rows the tuned config evaluates (default: the config's)")
    parser.add_argument("--output_path", default=None, metavar="DIR", help="output folder (default: the config's output_path)")
    parser.add_argument("--data_dir", default=None, metavar="D", help="benchmark data folder (default $ADAFUSE_DATA or ../shared/data)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: the config's, else 0)")
    parser.add_argument("--batch_size", type=int, default=None, help="prompts per generate() call (default: the config's, else 1)")
    parser.add_argument("--tasks", default=None, help="comma-separated subset of the config's tasks")
    parser.add_argument("--dry_run", action="store_true",
                        help="print the plan (members, candidates if no member is pruned, rounds, rows to compute) and stop")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")


def plan_lines(cfg: TuneConfig) -> list[str]:
    """The search plan with every member kept (the most it can cost): candidates and rounds, and the
    rows computed per task (each row once per candidate: later rounds reuse the earlier rows). Leads
    and dev weights are shown as if the members alone ranked in the listed order."""
    from eval.tune import build_candidates, halving_schedule

    tune = cfg.tune
    n = len(tune.members)
    cands, _ = build_candidates(replace(tune, prune_ratio=0.0), {m: float(n - i) for i, m in enumerate(tune.members)})
    rounds = halving_schedule(len(cands), tune.min_rows, tune.eta, tune.dev_rows)
    ensemble_rows = sum(n * (r - prev) for (n, r), prev in zip(rounds, [0] + [r for _, r in rounds]))
    tasks = ", ".join(t.name for t in cfg.eval.tasks)
    lines = [f"{cfg.source}: tasks {tasks}; members {', '.join(tune.members)}; {tune.dev_rows} dev rows per task",
             f"at most {len(cands)} ensembles; rounds (candidates x rows): "
             f"{', '.join(f'{n}x{r}' for n, r in rounds) or 'none'}",
             f"rows to compute per task: {len(tune.members) * tune.dev_rows} single + at most {ensemble_rows} ensemble"]
    lines += [f"  {c.name}: {c.method} [{', '.join(c.members)}] {c.label}" for c in cands]
    return lines


def run(args: argparse.Namespace) -> int:
    """Tune (or print the plan); our errors propagate as `ConfigError`s for `eval.cli` (one line, exit 2)."""
    from eval.tune import Tuner
    from eval.tune_config import load_tune

    cfg = load_tune(args.config, dev_rows=args.dev_rows, limit=args.limit, output_path=args.output_path,
                    data_dir=args.data_dir, seed=args.seed, batch_size=args.batch_size)
    cfg.eval.tasks = _subset(cfg.eval.tasks, args.tasks, "task", args.config)
    check_model_names(cfg.eval.runs, args.config)  # tune.members, each alone
    check_output_path(cfg.eval.output_path)
    if args.dry_run:
        print("\n".join(plan_lines(cfg)))
        return 0
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    try:
        results = Tuner(cfg, log=log, progress=not args.no_progress).run()
    except KeyboardInterrupt:
        print(f"interrupted: finished rows are kept in {cfg.eval.output_path}; rerun the same command to resume",
              file=sys.stderr)
        raise
    from eval.tune_report import summary, tuned_path

    for result in results:
        print(f"{result.task.name}: {summary(cfg, result)}")
        print(f"  on the test rows: adafuse eval {tuned_path(Path(cfg.eval.output_path), result.task.name, len(results))}")
    return 0
