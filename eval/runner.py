"""Run an `EvalConfig`: for each run x task, generate, score and append one JSON line per example to
`OUT/<run>/<task>/predictions.jsonl` (flushed as it goes), then write `metrics.json`.

Resume: rows already in predictions.jsonl (keyed by example `id`) are kept and skipped; a last line
cut short (a kill, a full disk) is dropped with a warning, a bad line anywhere else is a one-line
error naming it. A killed run loses at most the batch in flight. The saved `setup.json`
fingerprints prompt/decoding settings; resuming with different ones (or unknown ones: no or a
corrupted setup.json, records made from other prompts) is refused. JSON files are replaced
atomically and appends never leave half a record behind (`runtime.files`); a full disk is a
one-line error. Each run/task folder is locked while it is written (`eval.folder_lock`).
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from runtime.errors import ConfigError
from eval.vote_members import sample_records, write_member_runs
from runtime.files import append_line, write_json_atomic, write_text_atomic
from runtime.heap import HeapTrimmer
from runtime.outputs import GenerationOutput
from runtime.program_answers import answer_text
from runtime.views import exemplars_needed
from eval.config import EvalConfig, RunSpec, TaskSpec
from eval.data import Doc, resolve_data_dir
from eval.folder_lock import hold, hold_all
from runtime.predictions import PREDICTIONS, read_predictions
from eval.batch_fit import batch_parts, generate_in_parts
from eval.methods import Generator, build_generator, release_models

__all__ = ["METRICS", "PREDICTIONS", "SETUP", "evaluate", "read_predictions", "run_task", "summarize"]

METRICS = "metrics.json"
SETUP = "setup.json"


def _setup(run: RunSpec, spec: TaskSpec, seed: int) -> dict[str, Any]:
    return {"run": run.name, "method": run.method, "members": run.members, "options": run.options,
            "max_new_tokens": spec.max_new_tokens, "temperature": spec.temperature, "seed": seed,
            "task": spec.task.fingerprint()}


def _read_setup(path: Path) -> dict[str, Any] | None:
    """The saved setup, or None when the file is not a setup (corrupted, foreign)."""
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return old if isinstance(old, dict) else None


def _check_setup(folder: Path, setup: dict[str, Any]) -> None:
    """Refuse a folder whose predictions were made with other settings (or with unknown ones: no
    setup.json, or one that is not a setup); then record `setup`."""
    path, preds = folder / SETUP, folder / PREDICTIONS
    fix = "use another --output_path or delete that folder"
    if preds.exists() and preds.stat().st_size > 0:
        if not path.exists():
            raise ConfigError(f"{folder} has {PREDICTIONS} but no {SETUP}, so the settings they were made with are "
                              f"unknown; {fix}")
        old = _read_setup(path)
        if old is None:
            raise ConfigError(f"{path} is corrupted (not a JSON setup); {fix}")
        new = json.loads(json.dumps(setup))
        diff = [k for k in new if old.get(k) != new.get(k)] + [k for k in old if k not in new]
        if diff:
            first = diff[0]
            raise ConfigError(f"{folder} holds results made with different settings ({', '.join(diff)}; "
                              f"{first}: {_short(old.get(first))} there, {_short(new.get(first))} now); {fix}")
    write_json_atomic(path, setup)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_records(path: Path, records: list[dict], docs: list[Doc], task, shots: list[Doc]) -> None:
    """Refuse saved records that are not this task's: an id that is no row of the split, or one
    made from another prompt than the task gives now (a foreign or mixed-up file)."""
    by_id = {d["id"]: d for d in docs}
    for rec in records:
        doc = by_id.get(rec["id"])
        if doc is None or ("prompt" in rec and rec["prompt"] != task.prompt(doc, shots)):
            why = "is no row of" if doc is None else "was made from another prompt than"
            raise ConfigError(f"{path}: the record of example {rec['id']!r} {why} {task.name} ({task.split} rows) "
                              f"gives; use another --output_path or delete that folder")


def _cost_totals(records: list[dict]) -> tuple[dict[str, int], dict[str, int]]:
    fwd: dict[str, int] = {}
    tok: dict[str, int] = {}
    for r in records:
        for k, v in r["cost"].get("forward_passes", {}).items():
            fwd[k] = fwd.get(k, 0) + v
        for k, v in r["cost"].get("tokens_processed", {}).items():
            tok[k] = tok.get(k, 0) + v
    return fwd, tok


def summarize(run: RunSpec, spec: TaskSpec, records: list[dict], *, bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    """metrics.json content: scores with bootstrap 95% CIs, n, wall time, cost per member, tokens/s."""
    task = spec.task
    scores = task.aggregate(records, n_resamples=bootstrap, seed=seed)
    n = len(records)
    wall = sum(r["wall_s"] for r in records)
    gen_tokens = sum(r["num_tokens"] for r in records)
    fwd, tok = _cost_totals(records)
    primary = scores[task.primary_metric]
    return {
        "task": task.name, "task_version": task.version, "run": run.name, "method": run.method,
        "members": run.members, "options": run.options, "n": n,
        "primary_metric": task.primary_metric, "score": primary["value"],
        "ci95": [primary["ci_low"], primary["ci_high"]], "metrics": scores,
        "wall_time_s": round(wall, 4), "wall_s_per_example": round(wall / n, 4) if n else None,
        "generated_tokens": gen_tokens, "tokens_per_s": round(gen_tokens / wall, 3) if wall > 0 else None,
        "forward_passes": fwd, "tokens_processed": tok,
        "forward_passes_per_example": round(sum(fwd.values()) / n, 3) if n else None,
        "tokens_processed_per_example": round(sum(tok.values()) / n, 3) if n else None,
        "num_fewshot": task.num_fewshot, "max_new_tokens": spec.max_new_tokens, "temperature": spec.temperature,
        "finish_reasons": {k: sum(r["finish_reason"] == k for r in records) for k in sorted({r["finish_reason"] for r in records})},
        # >1: the records come from several processes (a resumed run): its wall-time figures mix them
        "processes": len({r.get("proc") for r in records}),
    }


def _progress(total: int, initial: int, desc: str, enabled: bool):
    """A progress bar on a terminal; in a log (stderr not a terminal) a plain line at most once a
    minute and at the end (`LineProgress`), not a bar redrawn with carriage returns."""
    import sys

    if enabled and not sys.stderr.isatty():
        return LineProgress(total, initial, desc)
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True, unit="ex")


class LineProgress:
    """tqdm's `update` / `set_postfix` / `close`, printed as whole lines (for logs)."""

    def __init__(self, total: int, initial: int, desc: str, every_s: float = 60.0):
        self.total, self.n, self.desc, self.every_s = total, initial, desc, every_s
        self.t0 = self.last = time.perf_counter()
        self.start = self.printed = initial
        self.postfix = ""

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.perf_counter() - self.last >= self.every_s or self.n >= self.total:
            self._line()

    def set_postfix(self, values: dict[str, Any]) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if self.n != self.printed:
            self._line()

    def _line(self) -> None:
        import sys

        self.last, self.printed = time.perf_counter(), self.n
        done = self.n - self.start
        rate = f", {(self.last - self.t0) / done:.1f} s/ex" if done else ""
        print(f"{self.desc}: {self.n}/{self.total} ex{rate}{', ' + self.postfix if self.postfix else ''}",
              file=sys.stderr, flush=True)


def run_task(run: RunSpec, spec: TaskSpec, folder: Path, data_dir: Path, *, get_generator: Callable[[], Generator],
             seed: int = 0, batch_size: int = 1, bootstrap: int = 1000, progress: bool = True,
             shard: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """Evaluate one run on one task into `folder`, resuming what is there; returns the metrics.
    `shard=(k, n)`: only examples k, k+n, k+2n, ... of the task (processes with different k can
    share the folder); metrics are written (and returned) once every example is in, else None.
    The folder is locked meanwhile (`eval.folder_lock`): a second process on it is refused."""
    task = spec.task
    all_docs, shots = task.load(data_dir, pool=exemplars_needed(run.members))
    docs = all_docs[spec.offset:][: spec.limit]  # (limit None: to the end)
    with hold(folder, shard):
        _check_setup(folder, _setup(run, spec, seed))
        pred_path = folder / PREDICTIONS
        wanted = {d["id"] for d in docs}
        saved = read_predictions(pred_path)
        _check_records(pred_path, saved, all_docs, task, shots)
        done = {r["id"]: r for r in saved if r["id"] in wanted}
        mine = docs if shard is None else docs[shard[0]:: shard[1]]
        todo: list[Doc] = [d for d in mine if d["id"] not in done]
        records = [done[d["id"]] for d in docs if d["id"] in done]
        bar = _progress(len(docs), len(records), f"{run.name}/{task.name}", progress)
        if records:
            bar.set_postfix(_running(task, records))
        try:
            if todo:
                _generate(run, spec, todo, shots, pred_path, get_generator(), seed, batch_size, records, bar)
        finally:
            bar.close()
        if shard is not None:  # the other shards' records too
            done = {r["id"]: r for r in read_predictions(pred_path) if r["id"] in wanted}
            if len(done) < len(docs):
                return None
            records = [done[d["id"]] for d in docs]
        order = {d["id"]: i for i, d in enumerate(docs)}
        records.sort(key=lambda r: order[r["id"]])  # same order (and bootstrap draws) whether resumed or not
        metrics = summarize(run, spec, records, bootstrap=bootstrap, seed=seed)
        write_member_runs(folder, run, spec, records, lambda r, sp, recs: summarize(r, sp, recs, bootstrap=bootstrap,
                                                                                     seed=seed))
        write_json_atomic(folder / METRICS, metrics)
        return metrics


def _generate(run: RunSpec, spec: TaskSpec, todo: list[Doc], shots: list[Doc], pred_path: Path, generator: Generator,
              seed: int, batch_size: int, records: list[dict], bar) -> None:
    """Generate `todo` in batches, appending each record to `pred_path` (and `records`) as it comes."""
    task = spec.task
    # one O_APPEND write per record: records of processes sharing the file never interleave
    trimmer = HeapTrimmer()  # long runs: freed heap handed back to the OS about once a minute
    # answer-level methods vote on the task's answers (e.g. GSM8K's final number)
    answer = {"answer": task.extract} if getattr(generator, "takes_answer", False) else {}
    with open(pred_path, "ab", buffering=0) as f:
        for start in range(0, len(todo), batch_size):
            batch = todo[start: start + batch_size]
            prompts = [task.prompt(d, shots) for d in batch]
            t0 = time.perf_counter()
            outputs = generate_in_parts(
                prompts, seed + int(batch[0]["id"]), parts=batch_parts(generator, prompts, spec.max_new_tokens),
                generate=lambda ps, s: generator.generate(ps, max_new_tokens=spec.max_new_tokens, stop=list(task.until),
                                                          temperature=spec.temperature, seed=s, **answer))
            wall = time.perf_counter() - t0
            if len(outputs) != len(batch):
                raise RuntimeError(f"{run.method} returned {len(outputs)} outputs for {len(batch)} prompts")
            for doc, prompt, out in zip(batch, prompts, outputs):
                rec = _record(task, doc, prompt, out, wall / len(batch))
                append_line(f.fileno(), json.dumps(rec, ensure_ascii=False) + "\n", pred_path)
                records.append(rec)
            bar.update(len(batch))
            bar.set_postfix(_running(task, records))
            trimmer.maybe()


def _running(task, records: list[dict]) -> dict[str, str]:
    """The primary metric so far, on the scale the tables print (percent for accuracy-type metrics)."""
    from eval.report import scale

    k = scale(task.primary_metric)
    return {task.primary_metric: f"{task.running_score(records) * k:.1f}" if k != 1 else
            f"{task.running_score(records):.2f}"}


# which process wrote a record: a resumed run's wall-time figures mix processes (and machine loads)
PROCESS = f"{os.getpid()}-{int(time.time())}"


def _record(task, doc: Doc, prompt: str, out: GenerationOutput, wall_s: float) -> dict[str, Any]:
    extracted = task.extract(answer_text(out.text, out.program))  # a program: what it printed
    scores, stats = task.score(extracted, doc)
    cost = out.cost.to_dict()
    return {
        "id": doc["id"], "prompt": prompt, "output": out.text, "extracted": extracted, "gold": doc["gold"],
        "score": scores[task.primary_metric], "scores": scores, "stats": stats,
        "num_tokens": out.num_tokens, "finish_reason": out.finish_reason, "cost": cost,
        "wall_s": round(wall_s, 6),  # measured around generate(), batch time split evenly
        "proc": PROCESS,
        **({"gen_stats": out.stats} if out.stats else {}),
        **({"program": out.program} if out.program is not None else {}),  # the sandbox's verdict on it
        # answer-level methods: every written answer, scored (`eval.vote_members`)
        **({"samples": sample_records(task, doc, out.trace.samples)} if hasattr(out.trace, "samples") else {}),
    }


def evaluate(cfg: EvalConfig, *, progress: bool = True, log: Callable[[str], None] | None = print,
             recorded_runs: list[RunSpec] | None = None, shard: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Run every run x task of `cfg` into `cfg.output_path`; returns the metrics dicts.
    `recorded_runs` (default: cfg.runs) are the runs written to the folder's config.yaml — the whole
    config's runs when only some of them are run now (`--runs`), so reports keep its order.
    `shard=(k, n)`: this process takes every n-th example from the k-th (see `run_task`)."""
    data_dir = resolve_data_dir(cfg.data_dir)
    out = Path(cfg.output_path)
    out.mkdir(parents=True, exist_ok=True)
    resolved = {**cfg.to_dict(), "data_dir": str(data_dir)}
    if recorded_runs is not None:
        resolved["runs"] = [r.to_dict() for r in recorded_runs]
    with hold_all([out / run.name / spec.name for run in cfg.runs for spec in cfg.tasks if run.runs_on(spec.name)], shard):
        write_text_atomic(out / "config.yaml", yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True))
        return _evaluate_runs(cfg, data_dir, out, progress, log, shard)


def _evaluate_runs(cfg: EvalConfig, data_dir: Path, out: Path, progress: bool, log: Callable[[str], None] | None,
                   shard: tuple[int, int] | None) -> list[dict[str, Any]]:
    results = []
    for i, run in enumerate(cfg.runs):
        # models no run from here on needs are freed (a config of many runs holds few models at once)
        release_models([(r.method, r.members, r.options) for r in cfg.runs[i:]])
        cache: dict[str, Generator] = {}

        def get_generator(run: RunSpec = run) -> Generator:  # built only when there is work left
            if "g" not in cache:
                cache["g"] = build_generator(run.method, run.members, **run.options)
            return cache["g"]

        for spec in (t for t in cfg.tasks if run.runs_on(t.name)):
            folder = out / run.name / spec.name
            metrics = run_task(run, spec, folder, data_dir, get_generator=get_generator, seed=cfg.seed,
                               batch_size=cfg.batch_size, bootstrap=cfg.bootstrap, progress=progress, shard=shard)
            if metrics is None:
                if log:
                    log(f"{run.name}/{spec.name}: shard {shard[0]}/{shard[1]} done; metrics when every shard is")
                continue
            if log:
                lo, hi = metrics["ci95"]
                mixed = (f" (records from {metrics['processes']} processes: its time and cost figures mix them)"
                         if metrics.get("processes", 1) > 1 else "")
                log(f"{run.name}/{spec.name}: {metrics['primary_metric']} = {_fmt(metrics['score'])} "
                    f"[{_fmt(lo)}, {_fmt(hi)}] n={metrics['n']} -> {folder / METRICS}{mixed}")
            results.append(metrics)
    return results


def _fmt(x: float | None) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4g}"
