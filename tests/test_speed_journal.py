"""benchmarks/specdec_speed.py's journal: rows survive a kill, a rerun skips them, another run's
journal is refused with one line."""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import specdec_speed  # noqa: E402

HEADER = {"settings": {"target": "t", "prompts": 2}, "cpu": "Some CPU [avx2]", "omp_threads": "1"}


def row(temp, prompt, method):
    return dict(temperature=temp, task="gsm8k", prompt=prompt, method=method, tokens=3, wall_s=1.0, tok_s=3.0,
                peak_rss_gb=1.0, text="x", block_efficiency=None, acceptance=None, target_forwards=None)


def test_rows_come_back_and_a_torn_line_runs_again(tmp_path):
    path = tmp_path / "speed.jsonl"
    journal = specdec_speed.Journal.open(path, HEADER)
    journal.write(row(0.0, 0, "hf-plain"))
    journal.write(row(0.7, 1, "ours-plain"))
    with open(path, "a") as f:
        f.write('{"temperature": 0.0, "task": "gs')  # killed mid-write
    again = specdec_speed.Journal.open(path, HEADER)
    assert set(again.done) == {(0.0, "gsm8k", 0, "hf-plain"), (0.7, "gsm8k", 1, "ours-plain")}
    assert json.loads(path.read_text().splitlines()[0]) == HEADER


def test_run_methods_skips_journalled_rows(tmp_path):
    path = tmp_path / "speed.jsonl"
    journal = specdec_speed.Journal.open(path, HEADER)
    journal.write(row(0.0, 0, "ours-plain"))
    journal = specdec_speed.Journal.open(path, HEADER)  # the rerun after a kill

    class Target:
        def encode_prompt(self, prompt):
            return [1, 2]

    class Gen:
        calls = 0

        def generate(self, prompts, **kw):
            Gen.calls += 1
            out = type("Out", (), dict(text="y", num_tokens=2, stats={}))
            return [out]

    class Args:
        max_new_tokens, seed = 4, 0

    rows = specdec_speed.run_methods(["ours-plain"], Target(), None, [("gsm8k", "a"), ("gsm8k", "b")], [0.0],
                                     Args(), {"ours-plain": Gen()}, journal)
    assert Gen.calls == 1 and [r["text"] for r in rows] == ["x", "y"]
    assert len(path.read_text().splitlines()) == 3  # header, the old row, the new one


def test_another_runs_journal_is_refused(tmp_path):
    path = tmp_path / "speed.jsonl"
    specdec_speed.Journal.open(path, HEADER)
    other = dict(HEADER, cpu="Another CPU [avx512_bf16]")
    error = specdec_speed.Journal.open(path, other)
    assert isinstance(error, str) and "cpu" in error and "pass another --output" in error
    assert "\n" not in error
