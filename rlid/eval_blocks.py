"""Held-out evaluation of one RLiD policy that writes as it goes and resumes after a kill.

The seeds run in blocks of `batch` (each block one lockstep rollout, `rlid.evaluate`); every episode
is appended to `<policy>.episodes.jsonl` as soon as its block ends (one record per seed: the episode,
its share of the block's wall time, its `LiveCounts`), a progress line follows each block, and a rerun
rolls out only the seeds not yet in the file. The summary is computed from the records alone, so a
resumed evaluation reports what an uninterrupted one does (wall time aside)."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from runtime.predictions import read_predictions
from rlid.evaluate import EvalResult, LiveCounts, live_counts, wilson_interval
from rlid.types import Environment, Episode
from runtime.errors import ConfigError
from runtime.files import append_line

EPISODE_KEYS = ("id", "source", "success", "reward", "invalid", "steps", "wall_s", "live")


def episode_record(ep: Episode) -> dict[str, Any]:
    """An episode as one JSONL record: seed, success, reward, invalid count, the chosen actions."""
    return {"env": ep.env, "seed": ep.seed, "success": ep.success, "reward": ep.total_reward, "invalid": ep.invalid,
            "steps": len(ep.transitions),
            "actions": [t.state.actions[t.action] if t.action >= 0 else None for t in ep.transitions]}


def summarize_episodes(records: Sequence[dict]) -> dict:
    """The summary `EvalResult.summary()` gives (plus the `live_moves` fields where measured), from
    episode records in seed order, and `per_seed` (1.0 solved / 0.0 not)."""
    n = len(records)
    solved = sum(1 for r in records if r["success"])
    lo, hi = wilson_interval(solved, n)
    decisions = sum(r["steps"] for r in records)
    wall = sum(r["wall_s"] for r in records)
    solved_steps = [r["steps"] for r in records if r["success"]]
    out = {"episodes": n, "success": solved / n if n else 0.0, "success_lo": lo, "success_hi": hi,
           "mean_reward": sum(r["reward"] for r in records) / max(1, n),
           "steps_to_success": sum(solved_steps) / len(solved_steps) if solved_steps else None, "decisions": decisions,
           "invalid": sum(r["invalid"] for r in records), "wall_s": wall,
           "decisions_per_s": decisions / wall if wall > 0 else float("inf")}
    if records and all(r["live"] is not None for r in records):
        total = LiveCounts()
        for r in records:
            total = total + LiveCounts(**r["live"])
        out.update(total.summary() or {})
    out["per_seed"] = [1.0 if r["success"] else 0.0 for r in records]
    return out


def evaluate_in_blocks(rollout: Callable[[list[int]], EvalResult], make_env: Callable[[], Environment],
                       seeds: Sequence[int], path: Path, *, source: str, batch: int, label: str,
                       block_fields: Sequence[str] = (), log: Callable[[str], None] = print) -> dict:
    """Roll out the `seeds` not yet recorded in `path` (blocks of `batch` seeds, `rollout(block)` each),
    appending one record per episode as each block ends; return `summarize_episodes` over all of them.
    `rollout` is only called when seeds are left. `source` names the policy evaluated (its model or
    adapter folder); records of another source are refused in one line (a resume never mixes two).
    `block_fields`: counts `rollout` puts in its result's `extra` (e.g. the ensemble's consultations),
    each spread evenly over its block's records like the wall time, and summed into the summary."""
    wanted = set(seeds)
    saved = read_predictions(path, required=EPISODE_KEYS)
    other = next((r["source"] for r in saved if r["source"] != source), None)
    if other is not None:
        raise ConfigError(f"{path} holds episodes of {other}, not of {source}; rerun with --force to evaluate "
                          f"from scratch")
    done = {r["id"]: r for r in saved if r["id"] in wanted}
    todo = [s for s in seeds if s not in done]
    if todo:
        env, start = make_env(), time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            for i in range(0, len(todo), batch):
                block = todo[i: i + batch]
                result = rollout(block)
                for ep in result.episodes:
                    counts = live_counts(env, ep)
                    rec = {"id": ep.seed, "source": source, **episode_record(ep), "wall_s": result.wall_s / len(block),
                           "live": asdict(counts) if counts is not None else None,
                           **{k: result.extra[k] / len(block) for k in block_fields}}
                    append_line(fd, json.dumps(rec) + "\n", path)
                    done[ep.seed] = rec
                solved = sum(1 for r in done.values() if r["success"])
                log(f"{label}: {len(done)} / {len(seeds)} seeds, {solved} solved, "
                    f"{time.perf_counter() - start:.0f} s")
        finally:
            os.close(fd)
    records = [done[s] for s in seeds]
    return {**summarize_episodes(records), **{k: sum(r[k] for r in records) for k in block_fields}}
