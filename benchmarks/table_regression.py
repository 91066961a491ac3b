"""Are greedy outputs unchanged? Compare the predictions of evaluation folders run by two code versions.

    # the first 10 examples of each committed table run, with the code of this checkout:
    adafuse eval experiments/table_nq/table_nq.yaml --limit 10 --output_path /tmp/after/table_nq --runs adafuse,...
    python benchmarks/table_regression.py /tmp/after/table_nq experiments/table_nq [--limit 10]

For every run x task folder present in both, prints how many of the first `limit` example ids have
the same output text in both, and lists the ids that differ. Exit 1 if any differs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_outputs(path: Path) -> dict[int, str]:
    """id -> output text of a `predictions.jsonl` (the last row of an id wins, as resume keeps it)."""
    out: dict[int, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                out[row["id"]] = row["output"]
    return out


def compare(new_dir: Path, ref_dir: Path, limit: int | None) -> list[tuple[str, int, int, list[int]]]:
    """Per run/task folder in both: (name, identical, compared, differing ids)."""
    rows = []
    for pred in sorted(new_dir.glob("*/*/predictions.jsonl")):
        rel = pred.relative_to(new_dir)
        ref = ref_dir / rel
        if not ref.exists():
            continue
        new, old = read_outputs(pred), read_outputs(ref)
        ids = sorted(set(new) & set(old))[:limit]
        diff = [i for i in ids if new[i] != old[i]]
        rows.append((str(rel.parent), len(ids) - len(diff), len(ids), diff))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("new", type=Path, help="results folder of the new code")
    p.add_argument("reference", type=Path, help="results folder to compare with (e.g. the committed table)")
    p.add_argument("--limit", type=int, default=None, help="compare only the first N shared ids of each run")
    args = p.parse_args(argv)
    rows = compare(args.new, args.reference, args.limit)
    if not rows:
        print("no run/task folder in common", file=sys.stderr)
        return 2
    print("| run/task | identical | differing ids |\n|---|--:|---|")
    for name, same, n, diff in rows:
        print(f"| {name} | {same}/{n} | {', '.join(map(str, diff)) or '-'} |")
    return 1 if any(diff for *_, diff in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
