"""Which views, and which vote, read off dev runs: `view-vote`'s rules applied to the views' answers.

A view's greedy answer to an example does not depend on which other views vote, so on dev rows the
vote of any set of views can be read off one single run per view (`predictions.jsonl` with
`extracted` and `score`), or off one `view-vote` run whose records keep every view's answer (its
`samples`: each becomes a run, `eval.vote_members.member_records`), without a vote run per set.
`vote_outcomes` applies `adafuse.voting.view_pick`, the rule `view-vote` itself calls (majority: ties
to the lead, then member order; "weighted" / "confident": the views' recorded log-probabilities) and
returns the chosen answer's record per example; `compare_sets` pairs each (set, vote) with a baseline run.
A run argument `A+B` pools the records of run folders of the same runs on disjoint rows (a second look
at a declared test: give it the level the declaration names, `--level`).

This is a dev-row tool for choosing a set before a test run (`docs/results/views.md`): test tables
come from `view-vote` runs themselves (in bfloat16 a view's rows in a larger batch can round
differently from its single run, so the two can differ on a few examples).

    python -m eval.vote_sets RUN_DIR [RUN_DIR ...] --sets "0,1,2;0,1,2,3,4" [--lead I] [--baseline I]
        [--votes majority,weighted,confident] [--level 0.95] [--draws 1000]
        (a view-vote run's folder counts as one run per view; `DIR_A+DIR_B` pools disjoint rows)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from adafuse.voting import CONFIDENCE_VOTES, rerank_pick, view_pick
from eval.cli import OneLineParser
from eval.metrics import CORPUS_METRICS, corpus_score_from_stats, record_stats
from eval.paired import example_score, mcnemar_exact, paired_bootstrap, win_tie_loss
from eval.vote_members import member_records

SET_VOTES = ("majority", "consensus", *CONFIDENCE_VOTES, "prove", "longest", "rerank")


def read_runs(folder: str | Path, metric: str = "exact_match_number") -> list[tuple[str, dict[Any, dict[str, Any]]]]:
    """[(name, id -> record)] of a run folder: a single run is one, a `view-vote` run one per view (from
    its records' samples, scored by `metric`). The folder holds one `predictions.jsonl` (a vote run's
    `members/` folders are not read)."""
    files = [f for f in sorted(Path(folder).rglob("predictions.jsonl")) if "members" not in f.relative_to(folder).parts]
    if len(files) != 1:
        raise ValueError(f"{folder}: expected one predictions.jsonl under it, found {len(files)}; "
                         f"pass a run's folder")
    records = [json.loads(line) for line in files[0].read_text(encoding="utf-8").splitlines()]
    if records and records[0].get("samples"):
        return [(f"{folder} :: {s['by']}", {r["id"]: r for r in member_records(records, s["by"], metric)})
                for s in records[0]["samples"]]
    return [(str(folder), {r["id"]: r for r in records})]


def read_pooled(spec: str, metric: str = "exact_match_number") -> list[tuple[str, dict[Any, dict[str, Any]]]]:
    """`read_runs` of a folder, or of `A+B+...`: the same runs' records over the folders' rows pooled
    (each folder must hold the same runs, on rows no other folder has)."""
    if Path(spec).exists() or "+" not in spec:
        return read_runs(spec, metric)
    parts = [read_runs(f, metric) for f in spec.split("+")]
    if len({len(p) for p in parts}) != 1:
        raise ValueError(f"{spec}: the pooled folders hold different numbers of runs "
                         f"({', '.join(str(len(p)) for p in parts)}); pool folders of the same runs")
    pooled = []
    for runs in zip(*parts):
        merged: dict[Any, dict[str, Any]] = {}
        for _, recs in runs:
            if merged.keys() & recs.keys():
                raise ValueError(f"{spec}: the pooled folders share example ids; pool disjoint rows only")
            merged.update(recs)
        pooled.append((" + ".join(name for name, _ in runs), merged))
    return pooled


def read_run(folder: str | Path) -> dict[Any, dict[str, Any]]:
    """id -> record of a single run's folder (see `read_runs`)."""
    return read_runs(folder)[0][1]


def vote_outcomes(runs: Sequence[dict[Any, dict[str, Any]]], members: Sequence[int], lead: int,
                  vote: str = "majority") -> list[dict[str, Any]]:
    """Per example (ids every run has, in the lead's order): the record `view-vote` with `vote` over
    `members` (indices into `runs`, the lead first) would keep: the chosen view's record."""
    if lead not in members:
        raise ValueError(f"the lead {lead} must be one of the voting members {list(members)}")
    order = [lead] + [m for m in members if m != lead]
    ids = [i for i in runs[order[0]] if all(i in runs[m] for m in order)]
    out = []
    for i in ids:
        recs = [runs[m][i] for m in order]
        if vote == "rerank":
            if any("cross" not in r for r in recs):
                raise ValueError("vote 'rerank' reads every view's scores of every answer: pass a sample-rerank "
                                 "run's folder (its records keep them)")
            out.append(recs[rerank_pick([r["cross"] for r in recs], [r["by"] for r in recs])])
        else:
            out.append(recs[view_pick(vote, [r.get("extracted") for r in recs], [r.get("logprob") for r in recs],
                                      [r.get("num_tokens", 0) for r in recs], ["program" in r for r in recs])])
    return out


def points(metric: str) -> float:
    """What turns `metric` into points on a 0-100 scale: 1 for corpus scores (BLEU, chrF), else 100."""
    return 1.0 if metric in CORPUS_METRICS else 100.0


def metric_value(metric: str, records: Sequence[dict[str, Any]]) -> float:
    """`metric` over `records` in points: a corpus score from the records' statistics, else the mean
    per-example score."""
    if metric in CORPUS_METRICS:
        return corpus_score_from_stats(metric, [record_stats(r, metric) for r in records])
    return points(metric) * sum(example_score(r, metric) for r in records) / max(len(records), 1)


def compare_sets(runs: Sequence[dict[Any, dict[str, Any]]], sets: Sequence[Sequence[int]], lead: int,
                 baseline: int, metric: str = "exact_match_number", votes: Sequence[str] = ("majority",),
                 level: float = 0.95, draws: int = 1000) -> list[dict[str, Any]]:
    """Each (set, vote)'s score, and its paired difference with run `baseline` (same ids): a `level`
    paired bootstrap interval over `draws` resamples, won / tied / lost and McNemar's exact p."""
    rows = []
    for members, vote in [(m, v) for m in sets for v in votes]:
        voted = vote_outcomes(runs, members, lead if lead in members else members[0], vote)
        base = [runs[baseline][r["id"]] for r in voted]
        d = paired_bootstrap(metric, voted, base, n_resamples=draws, alpha=1 - level)
        wtl = win_tie_loss([example_score(r, metric) for r in voted], [example_score(r, metric) for r in base])
        scale = points(metric)
        rows.append({"members": list(members), "vote": vote, "n": len(voted), "score": metric_value(metric, voted),
                     "diff": scale * d.diff, "ci": (scale * d.ci_low, scale * d.ci_high), "win_tie_loss": wtl,
                     "mcnemar_p": mcnemar_exact(wtl[0], wtl[2])})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = OneLineParser(prog="python -m eval.vote_sets", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="runs' folders: a single run is one view, a view-vote run one per view "
                                           "(indices 0, 1, ... below, in the order listed); A+B pools disjoint rows")
    p.add_argument("--sets", required=True, help='";"-separated sets of run indices, e.g. "0,1,2;0,1,2,3,4"')
    p.add_argument("--lead", type=int, default=0, help="index of the run that wins ties (default 0)")
    p.add_argument("--baseline", type=int, default=0, help="index of the run each vote is paired with")
    p.add_argument("--metric", default="exact_match_number")
    p.add_argument("--votes", default="majority", help="comma-separated: majority, consensus (MBR with chrF), "
                                                      "weighted, confident, rerank (sample-rerank runs)")
    p.add_argument("--level", type=float, default=0.95, help="the intervals' confidence level (default 0.95)")
    p.add_argument("--draws", type=int, default=1000, help="paired bootstrap resamples (default 1000)")
    args = p.parse_args(argv)
    if not 0 < args.level < 1:
        p.error(f"--level {args.level}: use a confidence level between 0 and 1, e.g. 0.95")
    if args.draws < 1:
        p.error(f"--draws {args.draws}: use a positive number of resamples, e.g. 10000")
    votes = [v.strip() for v in args.votes.split(",") if v.strip()]
    if any(v not in SET_VOTES for v in votes):
        p.error(f"--votes {args.votes!r}: use {', '.join(SET_VOTES)}")
    try:
        sets = [[int(x) for x in s.split(",")] for s in args.sets.split(";") if s.strip()]
    except ValueError:
        p.error(f"--sets {args.sets!r}: use run indices, e.g. \"0,1,2;0,1,2,3,4\"")
    try:
        named = [run for f in args.runs for run in read_pooled(f, args.metric)]
        runs = [r for _, r in named]
        if any(not 0 <= m < len(runs) for m in [args.lead, args.baseline, *(m for s in sets for m in s)]):
            raise ValueError(f"--sets, --lead or --baseline names a run index outside 0..{len(runs) - 1}")
        rows = compare_sets(runs, sets, args.lead, args.baseline, args.metric, votes, args.level, args.draws)
    except (ValueError, KeyError) as exc:  # a bad folder, index or lead; records without what a vote needs
        p.error(str(exc).strip("'\""))
    for i, (name, run) in enumerate(named):
        recs = list(run.values())
        print(f"[{i}] {name}: {metric_value(args.metric, recs):.1f} (n={len(recs)})")
    for row in rows:
        lo, hi = row["ci"]
        print(f"{row['vote']} {row['members']}: {row['score']:.1f}  vs [{args.baseline}]: {row['diff']:+.1f} "
              f"[{lo:+.1f}, {hi:+.1f}] ({100 * args.level:g} %)  w/t/l {row['win_tie_loss']}  "
              f"McNemar p={row['mcnemar_p']:.3f}  n={row['n']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
