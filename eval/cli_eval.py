"""`adafuse eval CONFIG [--limit N] [--output_path DIR] [--seed S] [--batch_size B] [--data_dir D]`:
run every run x task of an experiment config, write predictions/metrics, print the comparison table."""
from __future__ import annotations

import argparse
import os
import sys

from runtime.errors import ConfigError
from eval.config import load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="experiment config YAML (see configs/)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N examples of each task")
    parser.add_argument("--output_path", default=None, metavar="DIR", help="output folder (default: the config's output_path)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: the config's, else 0)")
    parser.add_argument("--batch_size", type=int, default=None, help="prompts per generate() call (default: the config's, else 1)")
    parser.add_argument("--data_dir", default=None, metavar="D", help="benchmark data folder (default $ADAFUSE_DATA or ../shared/data)")
    parser.add_argument("--tasks", default=None, help="comma-separated subset of the config's tasks")
    parser.add_argument("--runs", default=None, help="comma-separated subset of the config's runs")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    parser.add_argument("--write_out", action="store_true", help="print each task's first prompt and stop strings before running")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="evaluate only examples K, K+N, K+2N, ... (0 <= K < N); run N such processes on one "
                             "output folder to split a run; the last to finish writes the metrics")


def _subset(items: list, wanted: str | None, what: str, source: str) -> list:
    if not wanted:
        return items
    names = [w.strip() for w in wanted.split(",") if w.strip()]
    known = list(dict.fromkeys(i.name for i in items))
    missing = [n for n in names if n not in known]
    if missing:
        raise ConfigError(f"{source}: no {what} named {', '.join(missing)} (has: {', '.join(known)})")
    return [i for i in items if i.name in names]


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'K/N' -> (K, N); a one-line error otherwise."""
    if text is None:
        return None
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        k, n = -1, 0
    if not 0 <= k < n:
        raise ConfigError(f"--shard {text!r} is invalid: use K/N with 0 <= K < N, e.g. --shard 0/2")
    return k, n


LAUNCHER_ENV = (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"))


def launcher_shard(env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """(rank, world size) when a distributed launcher started this process (`accelerate launch`,
    `torchrun`, `mpirun`: the first of RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_* that is set), so each
    process takes its shard of the examples; None for a single process."""
    env = os.environ if env is None else env
    for rank_key, size_key in LAUNCHER_ENV:
        if env.get(size_key) and int(env[size_key]) > 1:
            return parse_shard(f"{int(env.get(rank_key, 0))}/{int(env[size_key])}")
    return None


def run(args: argparse.Namespace) -> int:
    from eval.report import collect, ensemble_table, markdown_table, paired_table, plot
    from eval.runner import evaluate

    shard = parse_shard(args.shard) or launcher_shard()

    cfg = load_config(args.config, limit=args.limit, output_path=args.output_path, seed=args.seed,
                      batch_size=args.batch_size, data_dir=args.data_dir)
    all_runs = list(cfg.runs)
    cfg.tasks = _subset(cfg.tasks, args.tasks, "task", args.config)
    cfg.runs = _subset(cfg.runs, args.runs, "run", args.config)
    check_model_names(cfg.runs, args.config)
    check_runs(cfg.runs, args.config)
    check_output_path(cfg.output_path)
    if args.write_out:
        _write_out(cfg)
    try:
        results = evaluate(cfg, progress=not args.no_progress, log=lambda s: print(s, file=sys.stderr),
                           recorded_runs=all_runs, shard=shard)
    except KeyboardInterrupt:
        print(f"interrupted: finished examples are kept in {cfg.output_path}; rerun the same command to resume",
              file=sys.stderr)
        raise
    if not results:
        return 0
    print(markdown_table(results))
    rows = collect([cfg.output_path])
    if cfg.baseline and any(r["run"] == cfg.baseline for r in rows):  # the declared baseline: every run against it
        print("\n" + paired_table(rows, cfg.baseline))
    else:
        buys = ensemble_table(rows)
        if buys:
            print("\n" + buys)
    png = plot(results, f"{cfg.output_path}/report.png")
    print(f"\nresults: {cfg.output_path}  plot: {png}")
    return 0


def check_model_names(runs, source: str) -> None:
    """Every member and drafter model of every run that loads real models, checked before the first
    run starts (a typo in the last run would otherwise surface after the others ran)."""
    from eval.methods import is_builtin
    from runtime.loader import check_spec
    from specdec.drafters import parse_drafter_spec

    for run in runs:
        if not is_builtin(run.method):
            continue  # a registered backend (e.g. a test fake) resolves its own names
        drafters = run.options.get("drafters") or []
        single = run.options.get("drafter")
        names = list(run.members) + [d for d in drafters + [single] if isinstance(d, str)]
        for name in names:
            try:
                kind, model = parse_drafter_spec(name) if name not in run.members else ("model", name)
                if model:
                    check_spec(model)
            except ConfigError as exc:
                raise ConfigError(f"{source}: run '{run.name}': {exc}") from None


def check_runs(runs, source: str) -> None:
    """Every run's method, member count and options, checked as building its generator would, before
    the first run starts and before any model loads (`eval.methods.check_run`)."""
    from eval.methods import check_run
    from runtime.errors import AdafuseError

    for run in runs:
        try:
            check_run(run.method, run.members, run.options)
        except AdafuseError as exc:
            raise ConfigError(f"{source}: run '{run.name}': {exc}") from None


def check_output_path(path: str) -> None:
    """The output folder must be a folder (or not exist yet)."""
    from pathlib import Path

    if Path(path).exists() and not Path(path).is_dir():
        raise ConfigError(f"output path {path} is a file, not a folder; give --output_path DIR")


def _write_out(cfg) -> None:
    """lm-eval's --write_out: show what the models will see."""
    from eval.data import resolve_data_dir

    data_dir = resolve_data_dir(cfg.data_dir)
    for spec in cfg.tasks:
        docs, shots = spec.task.load(data_dir)
        print(f"===== {spec.name} (v{spec.task.version}, {spec.task.num_fewshot}-shot, until={spec.task.until!r}, "
              f"max_new_tokens={spec.max_new_tokens}) first prompt =====", file=sys.stderr)
        print(spec.task.prompt(docs[0], shots), file=sys.stderr)
        print(f"===== gold: {docs[0]['gold']!r}", file=sys.stderr)
