"""Each member of a `view-vote` (or greedy `sample-rerank`) run, read off the run itself.

A view-vote run writes every member's own greedy answer to each example (the record's `samples`,
scored like the voted output), so the default prompt and each view alone need no runs of their own:
`write_member_runs` writes, beside the vote's `metrics.json`, one run folder per member
(`OUT/<run>/<task>/members/<member>/`: `predictions.jsonl` + `metrics.json`, method `single`,
`derived_from` naming the vote run). `adafuse report` finds them like any run, pairs them with the
vote on the same examples, and "what each ensemble buys" compares the vote with its best member.

Their cost is the vote run's (all members ran as rows of its batches), so their own cost fields are
empty (`forward_passes` {} and no wall time): a member's own cost is its own single run's.
Each member's greedy text is what its single run writes in float32; under bfloat16, rows of a
larger batch can round differently (`benchmarks/view_cost.py` counts how often).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eval.config import RunSpec, TaskSpec
from eval.metrics import CORPUS_METRICS, corpus_score_from_stats, record_stats
from runtime.files import write_json_atomic
from runtime.program_answers import answer_text

MEMBERS_DIR = "members"


def member_folder(by: str) -> str:
    """A member's folder name: its spec, or where that is long or holds a '/' (a view's system prompt),
    the model name and a hash of the view (metrics.json keeps the whole spec)."""
    if len(by.encode()) <= 120 and "/" not in by and not by.startswith("."):
        return by
    import hashlib

    return f"{by.split('[', 1)[0].replace('/', '_')}[view-{hashlib.sha1(by.encode()).hexdigest()[:12]}]"


def sample_records(task, doc, samples: list[Any]) -> list[dict[str, Any]]:
    """What a record keeps of each written answer (`adafuse.methods.answer_level.VoteSample`): who
    wrote it, its text, and its scores as the task scores an output."""
    out = []
    for s in samples:
        program = getattr(s, "program", None)
        extracted = task.extract(answer_text(s.text, program))  # a program's answer: what it printed
        scores, stats = task.score(extracted, doc)
        out.append({"by": s.by, "output": s.text, "extracted": extracted, "scores": scores, "stats": stats,
                    "num_tokens": s.num_tokens, "finish_reason": s.finish, "logprob": s.logprob,
                    **({"cross": s.cross} if s.cross is not None else {}),
                    **({"program": program} if program is not None else {}),
                    **({"prompt": s.prompt} if getattr(s, "prompt", None) is not None else {})})
    return out


def member_records(records: list[dict[str, Any]], by: str, primary: str) -> list[dict[str, Any]]:
    """The records member `by` would have written alone, from a vote run's records."""
    out = []
    for r in records:
        s = next((s for s in r.get("samples") or [] if s["by"] == by), None)
        if s is None:
            return []
        out.append({"id": r["id"], "by": by, "prompt": s.get("prompt", r.get("prompt")),  # the member's own
                    "output": s["output"], "extracted": s["extracted"],
                    "gold": r["gold"], "score": _score(s, primary), "scores": s["scores"], "stats": s["stats"],
                    "num_tokens": s["num_tokens"], "finish_reason": s["finish_reason"], "logprob": s.get("logprob"),
                    **({"cross": s["cross"]} if "cross" in s else {}),
                    **({"program": s["program"]} if "program" in s else {}), "cost": {}, "wall_s": 0.0,
                    "proc": r.get("proc")})
    return out


def _score(sample: dict[str, Any], metric: str) -> float:
    """A sample's score of `metric`: as recorded, or for a corpus metric it was not recorded with (BLEU at
    a fixed brevity penalty on older records), from its statistics."""
    if metric in sample["scores"] or metric not in CORPUS_METRICS:
        return sample["scores"][metric]
    return corpus_score_from_stats(metric, [record_stats(sample, metric)])


def write_member_runs(folder: Path, run: RunSpec, spec: TaskSpec, records: list[dict[str, Any]],
                      summarize) -> list[dict[str, Any]]:
    """Write each member's derived run under `folder/members/` (see the module docstring); returns
    their metrics. Written for view-vote and greedy sample-rerank runs (one answer per member); nothing for
    runs whose records keep no samples."""
    if run.method not in ("view-vote", "sample-rerank") or not records or not records[0].get("samples"):
        return []
    written = []
    # each member's first answer (a sample number after '#' is a further, sampled answer)
    for by in dict.fromkeys(s["by"] for r in records for s in r.get("samples") or [] if "#" not in s["by"]):
        recs = member_records(records, by, spec.task.primary_metric)
        if not recs:
            continue
        member_run = RunSpec(name=f"{by} (in {run.name})", method="single", members=[by], options={})
        metrics = summarize(member_run, spec, recs)
        metrics.update({"derived_from": run.name, "wall_time_s": None, "wall_s_per_example": None,
                        "tokens_per_s": None, "forward_passes_per_example": None,
                        "tokens_processed_per_example": None})
        out = folder / MEMBERS_DIR / member_folder(by)
        out.mkdir(parents=True, exist_ok=True)
        (out / "predictions.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs),
                                               encoding="utf-8")
        write_json_atomic(out / "metrics.json", metrics)
        written.append(metrics)
    return written
