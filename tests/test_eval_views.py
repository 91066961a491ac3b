"""Views in the eval harness: configs name them, the runner gives them their exemplar pool, answer-level
methods vote on the task's answers, tune always scores the default prompt."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.config import parse_config
from eval.methods import clear_caches
from eval.runner import evaluate
from eval.tune_config import parse_tune
from runtime.errors import ConfigError
from runtime.testing import bpe_tokenizer, tiny_member

M = "tiny-qwen"


@pytest.fixture
def tiny_models(monkeypatch):
    """Every model name loads as one tiny qwen2 model (counted), caches cleared around the test."""
    loads: list[str] = []

    def fake_load(spec, dtype, device, pack_weights=True):
        loads.append(spec)
        return tiny_member("qwen2", bpe_tokenizer(), seed=3, name=spec)

    monkeypatch.setattr("runtime.loader._load", fake_load)
    clear_caches()
    yield loads
    clear_caches()


def config(data: Path, out: Path, runs: list[dict], **extra) -> dict:
    return {"tasks": [{"name": "gsm8k", "num_fewshot": 2, "generation": {"max_new_tokens": 6}}], "limit": 3,
            "batch_size": 2, "data_dir": str(data), "output_path": str(out), "runs": runs, **extra}


def test_configs_spell_views_as_mappings_or_brackets(tmp_path):
    cfg = parse_config(config(tmp_path, tmp_path / "o", [
        {"name": "vote", "method": "view-vote",
         "members": [M, {"name": M, "view": {"shots": "2:4"}}, f"{M}[chat=false, shots=seed1x2]"]}],
        dtype="bfloat16"))
    assert cfg.runs[0].members == [M, f"{M}[shots=2:4]", f"{M}[shots=seed1x2,chat=false]"]
    assert cfg.runs[0].options == {"dtype": "bfloat16"}  # the config's dtype, where the run sets none


@pytest.mark.parametrize("member, match", [
    ({"name": M, "view": {"shotz": "0:2"}}, r"members\[1\].*did you mean 'shots'"),
    ({"name": M, "view": {"shots": "3:1"}}, r"members\[1\].*shots='3:1' is invalid"),
    (f"{M}[chat=maybe]", r"members\[1\].*chat='maybe' is invalid"),
])
def test_a_bad_view_is_one_line_naming_its_key(tmp_path, member, match):
    with pytest.raises(ConfigError, match=match) as err:
        parse_config(config(tmp_path, tmp_path / "o", [{"method": "adafuse", "members": [M, member]}]))
    assert "\n" not in str(err.value)


def test_views_run_in_the_harness_with_their_pool_and_the_tasks_answers(tmp_path, data, tiny_models, one_thread):
    runs = [{"name": "vote", "method": "view-vote", "members": [M, f"{M}[shots=2:4]", f"{M}[shots=4:6,chat=false]"]},
            {"name": "sc", "method": "self-consistency", "members": [f"{M}[shots=2:4]"],
             "options": {"samples": 3, "sampling_temperature": 1.0}}]
    results = evaluate(parse_config(config(data, tmp_path / "out", runs)), progress=False, log=None)
    assert [r["n"] for r in results] == [3, 3] and tiny_models == [M]  # one model load for every view
    for name in ("vote", "sc"):
        recs = [json.loads(line) for line in (tmp_path / "out" / name / "gsm8k" / "predictions.jsonl").open()]
        for rec in recs:
            assert rec["prompt"].count("Question:") == 3  # the default prompt is what the record shows
            assert rec["gen_stats"]["samples"] == 3  # 3 samples, or 3 views
        assert set(recs[0]["cost"]["forward_passes"]) == {M}


def test_a_view_beyond_a_fixed_pool_is_refused_before_it_runs(tmp_path, data, tiny_models):
    cfg = parse_config({**config(data, tmp_path / "o", [{"method": "single", "members": [f"{M}[shots=6:9]"]}]),
                        "tasks": [{"name": "nq_open", "num_fewshot": 2}]})
    with pytest.raises(ConfigError, match="views choosing among 9 exemplars but only 8 are reserved"):
        evaluate(cfg, progress=False, log=None)


def test_tune_always_scores_the_default_prompt(tmp_path):
    data = config(tmp_path, tmp_path / "o", [])
    del data["runs"]
    data["tune"] = {"members": [f"{M}[shots=2:4]", {"name": M, "view": {"chat": False}}], "dev_rows": 4,
                    "methods": [{"method": "view-vote"}, {"method": "self-consistency", "options": {"samples": 3}}]}
    cfg = parse_tune(data, "t.yaml")
    assert cfg.tune.members == [M, f"{M}[shots=2:4]", f"{M}[chat=false]"]
    assert [r.members for r in cfg.eval.runs] == [[m] for m in cfg.tune.members]
    from eval.tune import build_candidates

    cands, _ = build_candidates(cfg.tune, {m: 0.5 for m in cfg.tune.members})
    assert sorted(c.method for c in cands) == ["self-consistency"] * 3 + ["view-vote"] * 4
    assert {tuple(c.members) for c in cands if c.method == "self-consistency"} == {(m,) for m in cfg.tune.members}


def test_lm_eval_members_take_views_but_not_their_exemplars():
    from eval.lm_eval_model import LMArgs

    args = LMArgs.parse(members=f"{M}+{M}[chat=false;system=Be brief.]", method="view-vote")
    assert args.members == [M, f"{M}[chat=false;system=Be brief.]"]
    with pytest.raises(ConfigError, match="cannot choose its exemplars"):
        LMArgs.parse(members=f"{M}+{M}[shots=0:2]")


@pytest.mark.parametrize("method", ["view-vote", "sample-rerank"])
def test_a_view_vote_run_writes_each_members_own_run_and_the_report_pairs_them(tmp_path, data, tiny_models, one_thread,
                                                                               method):
    views = [M, f"{M}[shots=2:4]", f"{M}[shots=4:6,chat=false]"]
    runs = [{"name": "vote", "method": method, "members": views},
            *({"name": f"alone{i}", "method": "single", "members": [v]} for i, v in enumerate(views))]
    cfg = config(data, tmp_path / "out", runs, dtype="float32")
    cfg["tasks"][0]["generation"]["max_new_tokens"] = 12
    evaluate(parse_config(cfg), progress=False, log=None)
    task_dir = tmp_path / "out" / "vote" / "gsm8k"
    vote = [json.loads(line) for line in (task_dir / "predictions.jsonl").open()]
    assert [s["by"] for s in vote[0]["samples"]] == views  # the lead (member 0) first, then member order
    for i, v in enumerate(views):
        alone = [json.loads(line) for line in (tmp_path / "out" / f"alone{i}" / "gsm8k" / "predictions.jsonl").open()]
        derived = [json.loads(line) for line in (task_dir / "members" / v / "predictions.jsonl").open()]
        # each member's answer inside the vote is its own greedy run (float32), scored the same
        assert [(r["id"], r["output"], r["score"]) for r in derived] == [(r["id"], r["output"], r["score"]) for r in alone]
        metrics = json.loads((task_dir / "members" / v / "metrics.json").read_text())
        assert metrics["derived_from"] == "vote" and metrics["method"] == "single" and metrics["members"] == [v]
        assert metrics["score"] == json.loads((tmp_path / "out" / f"alone{i}" / "gsm8k" / "metrics.json").read_text())["score"]
    from eval.report import report

    table, _ = report([tmp_path / "out"])
    assert f"| vote | {M} (in vote)" not in table and f"{M}[shots=2:4] (in vote)" in table


def test_an_eval_frees_each_model_after_the_last_run_that_needs_it(tmp_path, data, tiny_models):
    from runtime.loader import default_loader

    runs = [{"name": "a", "method": "single", "members": [M]},
            {"name": "b", "method": "single", "members": ["tiny-other"]},
            {"name": "c", "method": "single", "members": [f"{M}[shots=2:4]"]},   # a view: M's weights again
            {"name": "d", "method": "single", "members": ["tiny-third"]}]
    seen: list[list[str]] = []
    real = default_loader().release

    def spy(keep):
        gone = real(keep)
        seen.append(sorted(m.name for m in default_loader().cached()))
        return gone

    default_loader().release = spy
    try:
        evaluate(parse_config(config(data, tmp_path / "out", runs)), progress=False, log=None)
    finally:
        del default_loader().release
    assert tiny_models == [M, "tiny-other", "tiny-third"]  # M stayed loaded for run c: one load
    # before each run: what is still held (M kept through b for c; b's model gone before c; M before d)
    assert seen == [[], [M], [M], []]


def test_the_models_a_runs_drafters_load_are_read_with_the_drafter_grammar():
    from eval.methods import _drafter_models

    assert _drafter_models({"drafter": "hybrid:qwen2.5-coder-0.5b@fp16"}) == ["qwen2.5-coder-0.5b"]
    assert _drafter_models({"drafters": ["lookup", None, "smollm2-135m@int8"], "lead": 2}) == ["smollm2-135m"]
    assert _drafter_models({"threshold": 0.3}) == []
