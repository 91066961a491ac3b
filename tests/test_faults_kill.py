"""SIGKILL several times in a row (benchmarks/faults.py, small): `adafuse eval` (T = 0 and a seeded
T > 0 task), `adafuse tune`, `adafuse bound` (its measured positions) and `adafuse rlid train` (a
tiny LM) resume to the uninterrupted result with nothing lost but the batch in flight; the judge itself catches a lost or duplicated record; the fake's seeded sampling mode."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import faults  # noqa: E402
from eval.testing import FakeGenerator  # noqa: E402


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[faults.Outcome]]:
    root = tmp_path_factory.mktemp("faults")
    return root, faults.run_all({"eval": 3, "tune": 2, "bound": 2, "rlid": 2}, seed=0, root=root)


def test_killed_runs_resume_to_the_uninterrupted_result(killed) -> None:
    root, outcomes = killed
    table = faults.table(outcomes)
    assert table.count("\n| SIGKILL") == 4, table
    for o in outcomes:
        assert o.kills >= 1 and not o.notes, table
        assert o.lost == 0 and o.duplicates == 0 and o.outputs_equal and o.metrics_equal, table
        assert 0 <= o.redone <= o.kills * o.scenario.batch_size, table
    ev = outcomes[0]
    assert any(0 < sum(map(len, snap.values())) < 32 for snap in ev.after_kill), table   # killed mid-run
    sampled = [json.loads(line)["output"] for line in
               (root / "eval_killed" / "sampled" / "nq_open" / "predictions.jsonl").read_text().splitlines()]
    assert any("guess" in s for s in sampled) and not all("guess" in s for s in sampled)   # T > 0 really sampled


def test_the_judge_sees_lost_and_duplicated_records(killed) -> None:
    root, outcomes = killed
    ev = outcomes[0]
    ref_rows = faults._lines(root / "eval_ref.log")
    pred = root / "eval_killed" / "greedy" / "gsm8k" / "predictions.jsonl"
    lines = pred.read_text().splitlines(keepends=True)
    try:
        pred.write_text("".join(lines[1:] + lines[-1:]))   # the first record lost, the last one twice
        bad = faults.judge(faults.Outcome(ev.scenario, after_kill=[{"greedy/gsm8k/predictions.jsonl": [0]}]),
                           root / "eval_ref", ref_rows, root)
    finally:
        pred.write_text("".join(lines))
    assert bad.lost == 1 and bad.duplicates == 1 and not bad.outputs_equal


def test_fake_sampling_follows_the_seed() -> None:
    gen = FakeGenerator(["m"], mode="sample")
    prompts = [f"Q: capital number {i}?\nA:" for i in range(12)]

    def texts(seed, temperature=0.8):
        return [o.text for o in gen.generate(prompts, max_new_tokens=9, stop=["\n"], temperature=temperature, seed=seed)]

    assert texts(3) == texts(3) and texts(3) != texts(4)
    assert texts(None, 0.0) == texts(5, 0.0) == [" CAPITAL NUMBER " + str(i) for i in range(12)]
    # row i of a call seeded s draws as a one-row call seeded s + i (batch-invariant, like runtime.sampling)
    one = [gen.generate([p], max_new_tokens=9, stop=["\n"], temperature=0.8, seed=3 + i)[0].text
           for i, p in enumerate(prompts)]
    assert one == texts(3)
