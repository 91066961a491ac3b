"""Issue 60's dev search on GSM8K: the best single prompt of qwen2.5-coder-1.5b, and every candidate
ensemble read off the dev pool (`dev_gsm8k.yaml`'s runs) with the rules `view-vote` itself applies
(`adafuse.methods.answer_draws.answer_order` / `draw_batches`, the early-stop test and `view_pick`).

A candidate is views x answers each + a vote + an early stop. Answer 0 of a view is its greedy answer
(`greedy-views`, or the single run of the 4-shot default); answer j >= 1 of the model-card CoT or the
program view is sample j of `cot-samples` / `pot-samples`, which a view-vote with `samples` > 1 draws
with the same seed, prompt and temperature. Cost: the new tokens of the answers drawn, per problem,
over the best single prompt's (the dev proxy of s / problem; the test tables time it).

    python experiments/beat_the_model/dev_search.py [--pool DIR] [--top 25]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from adafuse.methods.answer_draws import answer_order, draw_batches  # noqa: E402
from adafuse.methods.answer_level import ViewVoteOptions, _stops, VoteSample  # noqa: E402
from adafuse.voting import view_pick  # noqa: E402
from eval.paired import paired_bootstrap  # noqa: E402

HERE = Path(__file__).resolve().parent
VIEWS = {"cot": "qwen2.5-coder-1.5b", "pot": "Write a Python program", "cot-check": "careful math tutor",
         "pot-function": "function solution()"}
SAMPLED = {"cot": "cot-samples", "pot": "pot-samples"}   # the views whose answers j >= 1 are in the pool


def _read(path: Path) -> dict[Any, dict]:
    return {r["id"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())} if path.is_file() else {}


def load_pool(pool: Path) -> tuple[dict[str, dict[Any, dict]], list[Any]]:
    """{source: {id: answer record}}: "cot", "pot", ... (greedy) and "cot#j", "pot#j" (samples), plus
    "default-4shot"; and the ids every greedy view has."""
    out: dict[str, dict[Any, dict]] = {}
    greedy = _read(pool / "greedy-views" / "gsm8k_chat" / "predictions.jsonl")
    for view, marker in VIEWS.items():
        out[view] = {i: next(s for s in r["samples"] if (s["by"] == marker if view == "cot" else marker in s["by"]))
                     for i, r in greedy.items()}
    for view, run in SAMPLED.items():
        for i, r in _read(pool / run / "gsm8k_chat" / "predictions.jsonl").items():
            for s in r["samples"]:
                out.setdefault(f"{view}#{s['by'].rsplit('#', 1)[1]}", {})[i] = s
    default = _read(pool / "default-4shot" / "gsm8k" / "predictions.jsonl")
    if default:
        out["default-4shot"] = {i: {**r, "scores": r["scores"]} for i, r in default.items()}
    return out, sorted(greedy)


def simulate(pool: dict[str, dict[Any, dict]], ids: list[Any], views: list[str], counts: list[int],
             options: ViewVoteOptions) -> tuple[list[dict], float]:
    """Per-problem records of the candidate (score, answers drawn, tokens) and its mean tokens."""
    order = answer_order(counts, lead=0)
    batches = draw_batches(order, options.draw) if options.early_stop is not None else [order]
    records = []
    for i in ids:
        drawn: list[tuple[VoteSample, dict]] = []
        for batch in batches:
            for slot in batch:
                view = views[slot.member]
                rec = pool[view if slot.sample == 0 else f"{view}#{slot.sample}"][i]
                drawn.append((VoteSample(rec["output"], rec["extracted"] or None, view, rec["finish_reason"],
                                         rec["num_tokens"], rec.get("logprob"), program=rec.get("program")), rec))
            if _stops(options, [s for s, _ in drawn], len(order) - len(drawn)):
                break
        samples = [s for s, _ in drawn]
        chosen = view_pick(options.vote, [s.answer for s in samples], [s.logprob for s in samples],
                           [s.num_tokens for s in samples], [s.program is not None for s in samples])
        records.append({"id": i, "score": drawn[chosen][1]["scores"]["exact_match_number"],
                        "scores": {"exact_match_number": drawn[chosen][1]["scores"]["exact_match_number"]},
                        "drawn": len(drawn), "tokens": sum(s.num_tokens for s in samples)})
    return records, sum(r["tokens"] for r in records) / len(records)


def candidates(pool: dict[str, dict]) -> list[tuple[str, list[str], list[int], ViewVoteOptions]]:
    """The grid: sets of greedy views; the CoT and program views with k answers each; each with the
    votes and early stops that apply."""
    grid = []
    greedy = [v for v in VIEWS if v in pool]
    for n in range(2, len(greedy) + 1):
        for views in itertools.combinations(greedy, n):
            if views[0] == "cot":
                grid.append((list(views), [1] * n))
    most = {v: 1 + sum(1 for k in pool if k.startswith(v + "#") and k != v + "#0") for v in SAMPLED}
    for k_cot in range(1, most["cot"] + 1):
        for k_pot in range(0, most["pot"] + 1):
            if k_cot + k_pot >= 2:
                grid.append((["cot", "pot"][: 1 + (k_pot > 0)], [k_cot] + ([k_pot] if k_pot else [])))
    out, seen = [], set()
    for views, counts in grid:
        if (tuple(views), tuple(counts)) in seen:  # (cot+pot comes from both families)
            continue
        seen.add((tuple(views), tuple(counts)))
        for vote in ("majority", "weighted", "prove"):
            if vote == "prove" and not any(v.startswith("pot") for v in views):
                continue
            stops = [(None, None), (2, [2])] + ([("decided", [2])] if vote != "prove" else [])
            for stop, draw in stops:
                if stop is not None and sum(counts) <= 2:
                    continue
                name = "+".join(f"{v}x{c}" if c > 1 else v for v, c in zip(views, counts))
                name += f" {vote}" + (f" stop={stop}" if stop else "")
                out.append((name, views, counts, ViewVoteOptions(vote=vote, samples=counts, early_stop=stop, draw=draw)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", default=str(HERE / "dev_gsm8k"))
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    pool, ids = load_pool(Path(args.pool))
    singles = {name: [pool[name][i] for i in ids] for name in [*VIEWS, "default-4shot"] if name in pool and
               all(i in pool[name] for i in ids)}
    n = len(ids)
    print(f"dev rows: n = {n} (ids {ids[0]}..{ids[-1]})\n\n| single prompt | accuracy % | new tokens / problem |\n|---|--:|--:|")
    for name, recs in sorted(singles.items(), key=lambda kv: -sum(r["scores"]["exact_match_number"] for r in kv[1])):
        acc = 100 * sum(r["scores"]["exact_match_number"] for r in recs) / n
        print(f"| {name} | {acc:.1f} | {sum(r['num_tokens'] for r in recs) / n:.0f} |")
    best = max(singles, key=lambda k: sum(r["scores"]["exact_match_number"] for r in singles[k]))
    base_tokens = sum(r["num_tokens"] for r in singles[best]) / n
    rows = []
    for name, views, counts, options in candidates(pool):
        if not all(all(i in pool[v if j == 0 else f"{v}#{j}"] for i in ids) for v, c in zip(views, counts)
                   for j in range(c)):
            continue
        recs, tokens = simulate(pool, ids, views, counts, options)
        diff = paired_bootstrap("exact_match_number", recs, singles[best], n_resamples=2000)
        rows.append((diff.diff, name, diff, tokens / base_tokens, sum(r["drawn"] for r in recs) / n))
    print(f"\nensembles against the best single prompt ({best}), paired 95 % bootstrap; cost = new tokens / "
          f"the single prompt's\n\n| ensemble | accuracy % | Δ [CI95] | answers / problem | cost |\n|---|--:|---|--:|--:|")
    base_acc = 100 * sum(r["scores"]["exact_match_number"] for r in singles[best]) / n
    for d, name, diff, cost, drawn in sorted(rows, key=lambda r: -r[0])[: args.top]:
        print(f"| {name} | {base_acc + 100 * d:.1f} | {100 * d:+.1f} [{100 * diff.ci_low:+.1f}, {100 * diff.ci_high:+.1f}]"
              f" | {drawn:.2f} | {cost:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
