"""Run an `EvalConfig`: for each run x task, generate, score and append one JSON line per example to
`OUT/<run>/<task>/predictions.jsonl` (flushed as it goes), then write `metrics.json`.

Resume: rows already in predictions.jsonl (keyed by example `id`) are kept and skipped; a torn last
line from a killed process is dropped. A killed run loses at most the batch in flight. The saved
`setup.json` fingerprints prompt/decoding settings; resuming with different ones is refused.
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
from runtime.outputs import GenerationOutput
from eval.config import EvalConfig, RunSpec, TaskSpec
from eval.data import Doc, resolve_data_dir
from eval.methods import Generator, build_generator

PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.json"
SETUP = "setup.json"


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_predictions(path: Path) -> list[dict]:
    """Complete records of a predictions file, first occurrence of each id; rewrites the file if it had
    a torn line or duplicates so that appending stays valid JSONL."""
    if not path.exists():
        return []
    records: dict[Any, dict] = {}
    dirty = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
                if not line.endswith("\n") or not isinstance(rec, dict) or "id" not in rec:
                    raise ValueError("torn or foreign line")
            except ValueError:
                dirty = True
                continue
            if rec["id"] in records:
                dirty = True
                continue
            records[rec["id"]] = rec
    if dirty:
        tmp = path.with_suffix(".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for rec in records.values():
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    return list(records.values())


def _setup(run: RunSpec, spec: TaskSpec, seed: int) -> dict[str, Any]:
    return {"run": run.name, "method": run.method, "members": run.members, "options": run.options,
            "max_new_tokens": spec.max_new_tokens, "temperature": spec.temperature, "seed": seed,
            "task": spec.task.fingerprint()}


def _check_setup(folder: Path, setup: dict[str, Any]) -> None:
    path = folder / SETUP
    if path.exists() and (folder / PREDICTIONS).exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        old_norm, new_norm = json.loads(json.dumps(old)), json.loads(json.dumps(setup))
        if old_norm != new_norm:
            diff = [k for k in new_norm if old_norm.get(k) != new_norm.get(k)]
            raise ConfigError(f"{folder} holds results made with different settings ({', '.join(diff)}); "
                              f"use another --output_path or delete that folder")
    _write_json_atomic(path, setup)


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
    }


def _progress(total: int, initial: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True, unit="ex")


def run_task(run: RunSpec, spec: TaskSpec, folder: Path, data_dir: Path, *, get_generator: Callable[[], Generator],
             seed: int = 0, batch_size: int = 1, bootstrap: int = 1000, progress: bool = True,
             shard: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """Evaluate one run on one task into `folder`, resuming what is there; returns the metrics.
    `shard=(k, n)`: only examples k, k+n, k+2n, ... of the task (processes with different k can
    share the folder); metrics are written (and returned) once every example is in, else None."""
    task = spec.task
    docs, shots = task.load(data_dir)
    if spec.limit is not None:
        docs = docs[: spec.limit]
    folder.mkdir(parents=True, exist_ok=True)
    _check_setup(folder, _setup(run, spec, seed))
    pred_path = folder / PREDICTIONS
    wanted = {d["id"] for d in docs}
    done = {r["id"]: r for r in read_predictions(pred_path) if r["id"] in wanted}
    mine = docs if shard is None else docs[shard[0]:: shard[1]]
    todo: list[Doc] = [d for d in mine if d["id"] not in done]
    records = [done[d["id"]] for d in docs if d["id"] in done]
    bar = _progress(len(docs), len(records), f"{run.name}/{task.name}", progress)
    if records:
        bar.set_postfix({task.primary_metric: f"{task.running_score(records):.3f}"})
    try:
        if todo:
            generator = get_generator()
            # one O_APPEND write per record: records of processes sharing the file never interleave
            with open(pred_path, "ab", buffering=0) as f:
                for start in range(0, len(todo), batch_size):
                    batch = todo[start: start + batch_size]
                    prompts = [task.prompt(d, shots) for d in batch]
                    t0 = time.perf_counter()
                    outputs = generator.generate(prompts, max_new_tokens=spec.max_new_tokens, stop=list(task.until),
                                                 temperature=spec.temperature, seed=seed + int(batch[0]["id"]))
                    wall = time.perf_counter() - t0
                    if len(outputs) != len(batch):
                        raise RuntimeError(f"{run.method} returned {len(outputs)} outputs for {len(batch)} prompts")
                    for doc, prompt, out in zip(batch, prompts, outputs):
                        rec = _record(task, doc, prompt, out, wall / len(batch))
                        os.write(f.fileno(), (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
                        records.append(rec)
                    bar.update(len(batch))
                    bar.set_postfix({task.primary_metric: f"{task.running_score(records):.3f}"})
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
    _write_json_atomic(folder / METRICS, metrics)
    return metrics


def _record(task, doc: Doc, prompt: str, out: GenerationOutput, wall_s: float) -> dict[str, Any]:
    extracted = task.extract(out.text)
    scores, stats = task.score(extracted, doc)
    cost = out.cost.to_dict()
    return {
        "id": doc["id"], "prompt": prompt, "output": out.text, "extracted": extracted, "gold": doc["gold"],
        "score": scores[task.primary_metric], "scores": scores, "stats": stats,
        "num_tokens": out.num_tokens, "finish_reason": out.finish_reason, "cost": cost,
        "wall_s": round(wall_s, 6),  # measured around generate(), batch time split evenly
        **({"gen_stats": out.stats} if out.stats else {}),
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
    (out / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True), encoding="utf-8")
    results = []
    for run in cfg.runs:
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
                log(f"{run.name}/{spec.name}: {metrics['primary_metric']} = {_fmt(metrics['score'])} "
                    f"[{_fmt(lo)}, {_fmt(hi)}] n={metrics['n']} -> {folder / METRICS}")
            results.append(metrics)
    return results


def _fmt(x: float | None) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4g}"
