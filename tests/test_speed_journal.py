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


def test_a_crash_of_transformers_assisted_generation_is_a_row_not_the_end(monkeypatch):
    """hf-assisted raising (transformers' universal assisted generation crashed on one prompt in 5.25)
    leaves an `error` row; the run goes on, and the x hf-assisted column pairs only completed prompts."""
    def fake_hf_generate(target, assistant, ids, max_new, temperature, seed):
        if assistant is not None and seed == 0:
            raise RuntimeError("cannot reshape tensor of 0 elements\nmore")
        return "z", 4

    monkeypatch.setattr(specdec_speed, "hf_generate", fake_hf_generate)

    class Target:
        def encode_prompt(self, prompt):
            return [1, 2]

    class Args:
        max_new_tokens, seed = 4, 0

    rows = specdec_speed.run_methods(["hf-plain", "hf-assisted"], Target(), object(), [("gsm8k", "a"), ("wmt", "b")],
                                     [0.0], Args(), {})
    assert [r.get("error") for r in rows] == [None, "RuntimeError: cannot reshape tensor of 0 elements", None, None]
    assert rows[1]["tokens"] == 0 and rows[1]["text"] is None
    # hand-set times: plain 4 tok in 1 s and 4 tok in 2 s; assisted only on prompt 1, 4 tok in 1 s
    for r, wall in zip(rows, [1.0, 5.0, 2.0, 1.0]):
        r["wall_s"] = wall
    table = specdec_speed.summarize(rows, ["hf-plain", "hf-assisted"], [0.0])
    plain_line = next(l for l in table.splitlines() if "| hf-plain |" in l)
    # hf-plain: 8 tok / 3 s overall = 2.67 tok/s; on the completed prompt 2 tok/s against 4 -> 0.50
    assert "| 8 | 2.67 | 1.00 | 0.50 |" in plain_line
    assert "hf-assisted crashed on gsm8k#0 (RuntimeError: cannot reshape" in table


def test_quantized_drafter_methods_share_one_quantized_copy(monkeypatch):
    """ours-model16 / hf-assisted16 (and ...8) run on the drafter quantized once from its float32
    weights (float16 / int8 linears and head); the plain methods keep the float32 drafter."""
    from runtime.testing import tiny_member
    from specdec.drafters import ModelDrafter

    target, drafter = tiny_member(seed=0), tiny_member(seed=1)
    methods = ["hf-plain", "hf-assisted", "hf-assisted16", "ours-model16:greedy:1:2", "ours-model8:greedy:1:2"]
    monkeypatch.setattr(specdec_speed, "_QUANTIZED", specdec_speed.quantize_if_needed(methods, drafter))
    assert sorted(specdec_speed._QUANTIZED) == ["16", "8"]
    assert specdec_speed.quantize_if_needed(["hf-plain", "ours-model:greedy:1:2"], drafter) == {}
    gen16 = specdec_speed.parse_method("ours-model16:greedy:1:2", target, drafter)
    gen32 = specdec_speed.parse_method("ours-model:greedy:1:2", target, drafter)
    assert isinstance(gen16.drafter, ModelDrafter) and gen16.drafter.member is specdec_speed._QUANTIZED["16"]
    assert gen16.drafter.member.name.endswith("-fp16") and gen32.drafter.member is drafter
    seen = []
    monkeypatch.setattr(specdec_speed, "hf_generate",
                        lambda t, assistant, *a: seen.append(assistant) or ("z", 1))

    class Args:
        max_new_tokens, seed = 2, 0

    specdec_speed.run_methods(["hf-plain", "hf-assisted", "hf-assisted16"], target, drafter, [("gsm8k", "a")],
                              [0.0], Args(), {})
    assert seen == [None, drafter, specdec_speed._QUANTIZED["16"]]


def test_the_assisted_column_divides_by_the_quantized_assistant_run_when_only_it_ran():
    """Without a float32 `hf-assisted` run, the x hf-assisted column is taken against `hf-assisted16`
    (transformers given the same quantized assistant ours drafts with), and its header says so."""
    rows = [row(0.0, 0, "hf-plain"), row(0.0, 0, "hf-assisted16"), row(0.0, 0, "ours-model16:greedy:1:8")]
    for r, wall in zip(rows, [3.0, 2.0, 1.0]):
        r["wall_s"] = wall
    table = specdec_speed.summarize(rows, [r["method"] for r in rows], [0.0])
    assert "| x hf-assisted16 |" in table
    ours = next(l for l in table.splitlines() if "| ours-model16" in l)
    assert "| 3 | 3.00 | 3.00 | 2.00 |" in ours  # 3 tok/s: 3x hf-plain (1 tok/s), 2x hf-assisted16 (1.5 tok/s)
    both = specdec_speed.summarize(rows + [row(0.0, 0, "hf-assisted")], ["hf-plain", "hf-assisted", "hf-assisted16"],
                                   [0.0])
    assert "| x hf-assisted |" in both
