"""`adafuse report DIR [DIR...]`: gather every `metrics.json` under the folders, print a markdown
table comparing runs per task, and write a score-vs-cost plot (PNG)."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from runtime.errors import ConfigError

PERCENT_METRICS = ("exact_match", "exact_match_number", "f1")  # shown in %, as the table does


def scale(metric: str) -> float:
    """100 for metrics reported in percent, else 1 (BLEU and chrF are already on a 0-100 scale)."""
    return 100.0 if metric in PERCENT_METRICS else 1.0


COST_AXES = {"forward_passes": "forward passes / example", "wall_s": "wall s / example",
             "tokens_processed": "tokens processed / example"}


def _config_order(folder: Path) -> dict[str, int]:
    """Run name -> position in the folder's saved config.yaml (empty when there is none)."""
    cfg = folder / "config.yaml"
    if not cfg.is_file():
        return {}
    import yaml

    try:
        runs = (yaml.safe_load(cfg.read_text(encoding="utf-8")) or {}).get("runs") or []
        return {str(r.get("name")): i for i, r in enumerate(runs) if isinstance(r, dict)}
    except (yaml.YAMLError, AttributeError):
        return {}


METRICS_KEYS = ("task", "run", "primary_metric", "score")


def _read_metrics(path: Path) -> dict[str, Any]:
    """One metrics.json (with `_path`); a corrupted or foreign file is a one-line ConfigError."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(f"{path} is corrupted (not JSON); delete it and rerun `adafuse eval` on its config "
                          f"(the predictions are kept, only the metrics are computed again)") from None
    missing = [k for k in METRICS_KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise ConfigError(f"{path} is no metrics file of `adafuse eval` (no {', '.join(missing)}); move it out of "
                          f"the folder, or report on the run folders themselves")
    data["_path"] = str(path)
    return data


def collect(dirs: list[str | Path]) -> list[dict[str, Any]]:
    """All metrics.json files under `dirs` (recursively): in the order of the runs in a folder's
    config.yaml when it has one (as `adafuse eval` writes it), else in folder order."""
    rows = []
    for d in dirs:
        d = Path(d)
        if not d.exists():
            raise ConfigError(f"no such folder: {d}")
        order = {} if d.is_file() else _config_order(d)
        paths = [d] if d.is_file() else sorted(
            d.rglob("metrics.json"), key=lambda p: (order.get(p.parent.parent.name, len(order)), str(p)))
        rows += [_read_metrics(path) for path in paths]
    if not rows:
        raise ConfigError(f"no metrics.json found under {', '.join(map(str, dirs))}; run `adafuse eval CONFIG` first")
    return rows


def _num(x: Any, fmt: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, fmt)


def _score(row: dict[str, Any]) -> str:
    k = scale(row["primary_metric"])
    lo, hi = row.get("ci95") or [None, None]
    if row["score"] is None or lo is None or math.isnan(row["score"]):
        return "-"
    return f"{row['score'] * k:.1f} ± {(hi - lo) / 2 * k:.1f}"


def _others(row: dict[str, Any]) -> str:
    """The run's other metrics (e.g. F1 beside exact match, chrF beside BLEU), same scale as the score."""
    out = []
    for name, m in (row.get("metrics") or {}).items():
        if name == row["primary_metric"] or not isinstance(m, dict) or m.get("value") is None:
            continue
        out.append(f"{name} {m['value'] * scale(name):.1f}")
    return ", ".join(out) or "-"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One markdown table: a line per (task, run); scores in % for accuracy-type metrics, ± half the 95% CI."""
    header = ["task", "run", "method", "members", "n", "metric", "score ± CI95", "other metrics", "s/ex", "fwd/ex",
              "tok/s"]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] * 3 + ["---"] + ["--:"] + ["---"] + ["--:"] + ["---"] + ["--:"] * 3) + "|"]
    for r in sorted(rows, key=lambda r: r["task"]):  # stable: runs keep their order within a task
        lines.append("| " + " | ".join([
            r["task"], r["run"], r["method"], ", ".join(r["members"]), str(r["n"]), r["primary_metric"], _score(r),
            _others(r),
            _num(r.get("wall_s_per_example"), ".2f"), _num(r.get("forward_passes_per_example"), ".1f"),
            _num(r.get("tokens_per_s"), ".1f"),
        ]) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str | Path, cost: str = "wall_s") -> Path:
    """Score vs cost per example, one panel per task, one point (with its CI bar) per run, on the
    table's scale (percent for accuracy-type metrics); runs are told apart by colour and marker in
    one legend below the panels, so labels never overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = {"forward_passes": "forward_passes_per_example", "wall_s": "wall_s_per_example",
           "tokens_processed": "tokens_processed_per_example"}[cost]
    tasks = sorted({r["task"] for r in rows})
    runs = list(dict.fromkeys(r["run"] for r in rows))
    colors = {run: plt.get_cmap("tab10")(i % 10) for i, run in enumerate(runs)}  # one colour per run everywhere
    markers = {run: "os^Dv<>pX*"[i % 10] for i, run in enumerate(runs)}
    width = max(6.0, 4.5 * len(tasks))
    ncol = max(1, int(width // 2.6))
    legend_rows = (len(runs) + ncol - 1) // ncol
    fig, axes = plt.subplots(1, len(tasks), figsize=(width, 3.8 + 0.25 * legend_rows), squeeze=False)
    handles: dict[str, Any] = {}
    for ax, task in zip(axes[0], tasks):
        metric = next((r["primary_metric"] for r in rows if r["task"] == task), "score")
        k = scale(metric)
        for r in (r for r in rows if r["task"] == task):
            x, y = r.get(key), r.get("score")
            if x is None or y is None or math.isnan(y):
                continue
            lo, hi = r.get("ci95") or [y, y]
            handles[r["run"]] = ax.errorbar([x], [y * k], yerr=[[max(y - lo, 0) * k], [max(hi - y, 0) * k]],
                                            fmt=markers[r["run"]], capsize=3, color=colors[r["run"]])
        ax.set_title(task)
        ax.set_xlabel(COST_AXES[cost])
        ax.set_ylabel(f"{metric} (%)" if k == 100.0 else metric)
        ax.grid(alpha=0.3)
    fig.legend([handles[r] for r in runs if r in handles], [r for r in runs if r in handles], loc="lower center",
               ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.25 * legend_rows / (3.8 + 0.25 * legend_rows) + 0.02, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _records(row: dict[str, Any]) -> list[dict[str, Any]]:
    path = Path(row["_path"]).parent / "predictions.jsonl"
    if not path.is_file():
        raise ConfigError(f"{path} is missing: paired comparisons need each run's predictions.jsonl")
    from runtime.predictions import parse_predictions

    return parse_predictions(path, ("id", "score"))[0]  # read only: a torn last line (a run in progress) is left out


def examples_of(row: dict[str, Any]) -> tuple[str, str]:
    """Which examples a run's records are: (dataset, split), from its task file and its saved setup
    (a run of another task over the same rows pairs with it)."""
    from eval.task import get_task

    setup = Path(row["_path"]).with_name("setup.json") if row.get("_path") else None
    split = "test"
    if setup is not None and setup.is_file():
        split = (json.loads(setup.read_text(encoding="utf-8")).get("task") or {}).get("split", "test")
    try:
        return get_task(row["task"]).dataset, split
    except ConfigError:
        return row["task"], split


def paired_table(rows: list[dict[str, Any]], baseline: str, n_resamples: int = 1000) -> str:
    """Per task, every other run against `baseline` on the same examples: the paired difference of
    each metric with its paired bootstrap 95 % interval (* where it excludes 0), and win/tie/loss. Where
    the baseline did not run the task, its run of another task over the same examples (dataset and
    split) stands in, on the metrics both tasks score (e.g. the 1.5B's best prompt, task gsm8k_chat,
    against its 4-shot default, task gsm8k)."""
    from eval.paired import compare_runs
    from eval.task import get_task

    runs = {r["run"] for r in rows}
    if baseline not in runs:
        raise ConfigError(f"--baseline {baseline}: no such run (runs: {', '.join(sorted(runs))})")
    lines = [f"Paired against `{baseline}` (same examples; 95 % paired bootstrap, {n_resamples} draws; "
             "* = interval excludes 0):", "",
             "| task | run | n | Δ primary [CI95] | Δ other [CI95] | win / tie / loss |", "|---|---|--:|---|---|---|"]
    bases = [r for r in rows if r["run"] == baseline]
    for task in sorted({r["task"] for r in rows}):
        in_task = [r for r in rows if r["task"] == task and r["run"] != baseline]
        base = next((b for b in bases if b["task"] == task), None) or \
            next((b for b in bases if in_task and examples_of(b) == examples_of(in_task[0])), None)
        if base is None:
            continue
        base_metrics = {m["metric"] for m in get_task(base["task"]).metric_list}
        spec = [m for m in get_task(task).metric_list if m["metric"] in base_metrics]
        if not spec:
            continue
        base_recs = _records(base)
        against = "" if base["task"] == task else f" (its {base['task']})"
        for r in in_task:
            diffs, (w, t, l) = compare_runs(spec, _records(r), base_recs, n_resamples=n_resamples)
            cells = [_diff(d) for d in diffs]
            lines.append(f"| {task} | {r['run']}{against} | {diffs[0].n} | {cells[0]} | {', '.join(cells[1:]) or '-'} | "
                         f"{w} / {t} / {l} |")
    return "\n".join(lines)


def _best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run of the highest primary score; ties go to the better next metrics (e.g. F1 when exact
    match ties), then to the earlier run."""
    def key(r: dict[str, Any]) -> tuple:
        values = [m.get("value") for m in (r.get("metrics") or {}).values() if isinstance(m, dict)]
        nums = [v if isinstance(v, (int, float)) and v == v else -math.inf for v in values]
        return (r["score"] if r["score"] == r["score"] else -math.inf, *nums[1:])
    best = None
    for r in rows:
        if best is None or key(r) > key(best):
            best = r
    return best


def ensemble_table(rows: list[dict[str, Any]], n_resamples: int = 1000) -> str:
    """What each ensemble buys, per task: every run of several members against the best of its own
    members alone (and against the best single run of the table, when that is another model), paired
    on the same examples (`eval.paired.compare_runs`); '' when no ensemble has a member alone beside it."""
    from eval.paired import compare_runs
    from eval.task import get_task

    lines = []
    for task in sorted({r["task"] for r in rows}):
        in_task = [r for r in rows if r["task"] == task]
        singles = [r for r in in_task if r.get("method") == "single"]
        for ens in (r for r in in_task if len(r.get("members") or []) > 1):
            own = _best([s for s in singles if s["members"][0] in ens["members"]])
            overall = _best(singles)
            for base, label in ((own, "its best member"), (overall, "best single of the table")):
                if base is None or (label != "its best member" and base is own):
                    continue
                pool = [s for s in singles if s["members"][0] in ens["members"]] if base is own else singles
                tied = _ties(base, pool)
                if tied:  # every one of them would be "the best": say so rather than name the first listed
                    label += f", tied with {tied} other{'s' if tied > 1 else ''}"
                diffs, (w, t, l) = compare_runs(get_task(task).metric_list, _records(ens), _records(base),
                                                n_resamples=n_resamples)
                cells = [_diff(d) for d in diffs]
                lines.append(f"| {task} | {ens['run']} | {base['run']} ({label}) | {diffs[0].n} | {cells[0]} | "
                             f"{', '.join(cells[1:]) or '-'} | {w} / {t} / {l} |")
    if not lines:
        return ""
    return "\n".join([f"What each ensemble buys (paired on the same examples; 95 % paired bootstrap, {n_resamples} "
                      "draws; * = interval excludes 0):", "",
                      "| task | ensemble | against | n | Δ primary [CI95] | Δ other [CI95] | win / tie / loss |",
                      "|---|---|---|--:|---|---|---|", *lines])


def word_table(rows: list[dict[str, Any]], baseline: str | None = None) -> str:
    """Why ensembled words are won or lost, per word-level run (from each example's `gen_stats`):
    ensembled words per example, how many of them overruled the lead's own word, which member
    proposed the winners (share of ensembled words), and — against `baseline` — the examples the run
    lost / won while overruling the lead at least once (greedy: the first word where an ensemble's
    text leaves its lead's own text is an overruled word)."""
    lines = ["| task | run | ensembled words / ex | overruled / ex | winners proposed by | lost / won with overrules |",
             "|---|---|--:|--:|---|---|"]
    for r in rows:
        recs = _records(r)
        stats = [x.get("gen_stats") or {} for x in recs]
        if not stats or not any("overruled" in s for s in stats):
            continue
        n = len(recs)
        words = sum(s.get("ensembled_words", 0) for s in stats)
        over = sum(s.get("overruled", 0) for s in stats)
        won: dict[str, int] = {}
        for s in stats:
            for name, k in (s.get("won_by") or {}).items():
                won[name] = won.get(name, 0) + k
        share = ", ".join(f"{name} {100 * k / max(words, 1):.0f}%" for name, k in sorted(won.items(), key=lambda x: -x[1]))
        flips = "-"
        base = next((b for b in rows if baseline and b["run"] == baseline and b["task"] == r["task"]), None)
        if base is not None and base is not r:
            by_id = {x["id"]: x for x in _records(base)}
            lost = sum(1 for x in recs if x["id"] in by_id and x["score"] < by_id[x["id"]]["score"]
                       and (x.get("gen_stats") or {}).get("overruled", 0) > 0)
            gained = sum(1 for x in recs if x["id"] in by_id and x["score"] > by_id[x["id"]]["score"]
                         and (x.get("gen_stats") or {}).get("overruled", 0) > 0)
            flips = f"{lost} / {gained}"
        lines.append(f"| {r['task']} | {r['run']} | {words / n:.1f} | {over / n:.1f} | {share or '-'} | {flips} |")
    return "\n".join(lines) if len(lines) > 2 else ""


MIN_PAIRED_N = 10  # fewer paired examples: the difference is shown without an interval or a star


def _diff(d) -> str:
    k, star = scale(d.metric), "*" if d.significant else ""
    if d.n < MIN_PAIRED_N:
        return f"{d.metric} {d.diff * k:+.1f} (n={d.n}: too few for an interval)"
    return f"{d.metric} {d.diff * k:+.1f} [{d.ci_low * k:+.1f}, {d.ci_high * k:+.1f}]{star}"


def _ties(best: dict[str, Any], rows: list[dict[str, Any]]) -> int:
    """How many other runs of `rows` score exactly as `best` on every metric (a tie `_best` broke by order)."""
    def values(r: dict[str, Any]) -> list:
        return [r.get("score")] + [m.get("value") for m in (r.get("metrics") or {}).values() if isinstance(m, dict)]
    return sum(1 for r in rows if r is not best and values(r) == values(best))


def report(dirs: list[str | Path], plot_path: str | Path | None = None, cost: str = "wall_s",
           baseline: str | None = None, draws: int = 1000) -> tuple[str, Path]:
    """Markdown table text (plus the paired table against `baseline`, `draws` bootstrap resamples) and
    the written plot path (default `<first dir>/report.png`)."""
    rows = collect(dirs)
    first = Path(dirs[0])
    out = Path(plot_path) if plot_path else (first.parent if first.is_file() else first) / "report.png"
    table = markdown_table(rows)
    if baseline:
        table += "\n\n" + paired_table(rows, baseline, draws)
    buys = ensemble_table(rows)
    if buys:
        table += "\n\n" + buys
    words = word_table(rows, baseline)
    if words:
        table += "\n\nWhy ensembled words are won or lost:\n\n" + words
    return table, plot(rows, out, cost)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="output folders of `adafuse eval` (searched for metrics.json)")
    parser.add_argument("--plot", default=None, metavar="PNG", help="where to write the score-vs-cost plot (default DIR/report.png)")
    parser.add_argument("--cost", default="wall_s", choices=sorted(COST_AXES), help="x axis of the plot (default wall_s)")
    parser.add_argument("--markdown", default=None, metavar="FILE", help="also write the table to this file")
    parser.add_argument("--baseline", default=None, metavar="RUN",
                        help="add each run's paired difference to RUN (paired bootstrap 95%% CI, win/tie/loss)")
    parser.add_argument("--draws", type=int, default=1000, metavar="N",
                        help="paired bootstrap resamples of the --baseline table (default 1000)")


def run(args: argparse.Namespace) -> int:
    if args.draws < 1:
        raise ConfigError(f"--draws {args.draws}: use a positive number of resamples, e.g. 10000")
    table, png = report(args.dirs, args.plot, args.cost, args.baseline, args.draws)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n", encoding="utf-8")
    print(f"\nplot: {png}")
    return 0
