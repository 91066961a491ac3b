"""End-to-end evaluation with a fake generator: outputs, resume after a real interruption, the CLI
and the report (no models)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from eval.cli import main as adafuse_main
from runtime.errors import ConfigError
from eval import methods
from eval.config import parse_config
from eval.report import collect, markdown_table, report
from eval.runner import evaluate, read_predictions
from eval.testing import FakeGenerator

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fake_backend")   # conftest: the fake backend; `data` too


def _cfg(data: Path, out: Path, tasks=("gsm8k",), limit=6, **extra) -> dict:
    return {"tasks": list(tasks), "limit": limit, "output_path": str(out), "data_dir": str(data), "bootstrap": 100,
            "runs": [{"name": "fake1", "method": "fake", "members": ["m1"]}], **extra}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_outputs_and_metrics(tmp_path: Path, data: Path) -> None:
    cfg = parse_config(_cfg(data, tmp_path / "out", tasks=("gsm8k", "nq_open", "wmt22_de_en", "wmt22_en_zh"),
                            runs=[{"name": "fake1", "method": "fake", "members": ["m1"]},
                                  {"name": "ens", "method": "fake", "members": ["m1", "m2"], "options": {"mode": "echo"}}]),
                       "x.yaml")
    results = evaluate(cfg, progress=False, log=None)
    assert len(results) == 8
    recs = _lines(tmp_path / "out" / "fake1" / "gsm8k" / "predictions.jsonl")
    assert [r["id"] for r in recs] == list(range(6))
    assert {"prompt", "output", "extracted", "gold", "score", "cost", "wall_s"} <= set(recs[0])
    metrics = json.loads((tmp_path / "out" / "fake1" / "gsm8k" / "metrics.json").read_text())
    assert metrics["score"] == 1.0 and metrics["n"] == 6 and metrics["ci95"] == [1.0, 1.0]
    assert metrics["forward_passes"]["m1"] > 0 and metrics["forward_passes_per_example"] > 0
    nq = json.loads((tmp_path / "out" / "fake1" / "nq_open" / "metrics.json").read_text())
    assert nq["metrics"]["exact_match"]["value"] == 1.0 and nq["metrics"]["f1"]["value"] == 1.0
    ens = json.loads((tmp_path / "out" / "ens" / "wmt22_de_en" / "metrics.json").read_text())
    assert set(ens["forward_passes"]) == {"m1", "m2"} and set(ens["metrics"]) == {"bleu", "chrf", "bleu_bp1"}
    resolved = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert resolved["data_dir"] == str(data.resolve()) and len(resolved["runs"]) == 2
    # corpus BLEU in metrics equals sacrebleu over the saved outputs
    import sacrebleu

    wmt = _lines(tmp_path / "out" / "fake1" / "wmt22_en_zh" / "predictions.jsonl")
    expected = sacrebleu.corpus_bleu([r["extracted"] for r in wmt], [[r["gold"] for r in wmt]], tokenize="zh").score
    got = json.loads((tmp_path / "out" / "fake1" / "wmt22_en_zh" / "metrics.json").read_text())
    assert got["score"] == pytest.approx(expected)
    # BLEU with the brevity penalty fixed at 1: sacreBLEU's score over its brevity penalty
    bleu = sacrebleu.corpus_bleu([r["extracted"] for r in wmt], [[r["gold"] for r in wmt]], tokenize="zh")
    assert got["metrics"]["bleu_bp1"]["value"] == pytest.approx(bleu.score / bleu.bp)


def test_resume_after_keyboard_interrupt(tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"fail_after": 2}

    def build(members, **options):
        return FakeGenerator(members, fail_after=state["fail_after"])

    monkeypatch.setitem(methods.METHODS, "flaky", build)
    raw = _cfg(data, tmp_path / "out", limit=7, batch_size=2,
               runs=[{"name": "r", "method": "flaky", "members": ["m1"]}])
    with pytest.raises(KeyboardInterrupt):
        evaluate(parse_config(raw, "x.yaml"), progress=False, log=None)
    pred = tmp_path / "out" / "r" / "gsm8k" / "predictions.jsonl"
    assert [r["id"] for r in _lines(pred)] == [0, 1, 2, 3]          # two batches done, third lost in flight
    assert not (pred.parent / "metrics.json").exists()
    state["fail_after"] = None
    methods.clear_caches()
    (metrics,) = evaluate(parse_config(raw, "x.yaml"), progress=False, log=None)
    ids = [r["id"] for r in _lines(pred)]
    assert ids == list(range(7)) and metrics["n"] == 7 and metrics["score"] == 1.0
    # a finished run is not regenerated (the generator is never even built)
    state["fail_after"] = 0
    methods.clear_caches()
    (again,) = evaluate(parse_config(raw, "x.yaml"), progress=False, log=None)
    assert again["n"] == 7 and len(_lines(pred)) == 7


def test_resume_after_sigkill(tmp_path: Path, data: Path) -> None:
    """A real process, killed mid-run, then resumed: no duplicates, full coverage."""
    out = tmp_path / "out"
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(_cfg(data, out, limit=8, runs=[
        {"name": "slow", "method": "fake", "members": ["m1"], "options": {"delay": 0.15}}])))
    script = ("import sys; from eval.testing import register_fake; register_fake();"
              "from eval.cli import main; sys.exit(main(['eval', sys.argv[1], '--no_progress']))")
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", script, str(cfg_path)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pred = out / "slow" / "gsm8k" / "predictions.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and (not pred.exists() or len(pred.read_text().splitlines()) < 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(read_predictions(pred))
    assert 3 <= killed_at < 8, killed_at
    with open(pred, "a") as f:  # simulate a torn final line as well
        f.write('{"id": 99, "prom')
    assert adafuse_main(["eval", str(cfg_path), "--no_progress"]) == 0
    ids = [r["id"] for r in _lines(pred)]
    assert sorted(ids) == list(range(8)) and len(ids) == len(set(ids))
    metrics = json.loads((pred.parent / "metrics.json").read_text())
    assert metrics["n"] == 8 and metrics["processes"] == 2  # the killed process's records, then this one's


def test_resume_with_changed_settings_is_refused(tmp_path: Path, data: Path) -> None:
    evaluate(parse_config(_cfg(data, tmp_path / "out", limit=2), "x.yaml"), progress=False, log=None)
    changed = _cfg(data, tmp_path / "out", limit=2, generation={"max_new_tokens": 7})
    with pytest.raises(ConfigError, match="different settings.*max_new_tokens"):
        evaluate(parse_config(changed, "x.yaml"), progress=False, log=None)
    # a larger --limit extends, a smaller one reports on the subset
    (m,) = evaluate(parse_config(_cfg(data, tmp_path / "out", limit=4), "x.yaml"), progress=False, log=None)
    assert m["n"] == 4
    (m,) = evaluate(parse_config(_cfg(data, tmp_path / "out", limit=1), "x.yaml"), progress=False, log=None)
    assert m["n"] == 1


def test_cli_eval_and_report(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture) -> None:
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(_cfg(data, tmp_path / "ignored", tasks=("gsm8k", "nq_open"), runs=[
        {"name": "a", "method": "fake", "members": ["m1"]},
        {"name": "b", "method": "fake", "members": ["m1", "m2"], "options": {"mode": "echo"}}])))
    out = tmp_path / "cli_out"
    assert adafuse_main(["eval", str(cfg_path), "--limit", "3", "--output_path", str(out), "--seed", "1",
                         "--batch_size", "2", "--data_dir", str(data), "--no_progress", "--write_out"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "===== gsm8k" in captured.err and "Question: What is twice 1?\nAnswer:" in captured.err
    assert "| gsm8k | a | fake | m1 | 3 |" in printed and "| nq_open | b |" in printed
    assert (out / "report.png").stat().st_size > 0 and not (tmp_path / "ignored").exists()
    png = tmp_path / "plot.png"
    assert adafuse_main(["report", str(out), "--plot", str(png), "--cost", "forward_passes"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("\n| ") == 4 and "score ± CI95" in printed and png.stat().st_size > 0
    rows = collect([out])
    assert len(rows) == 4
    assert [r["run"] for r in rows if r["task"] == "gsm8k"] == ["a", "b"]  # the config's order
    table, path = report([out])
    assert table == markdown_table(rows) and path == out / "report.png"


def test_a_declared_baseline_pairs_every_run_also_across_tasks_over_the_same_rows(tmp_path: Path, data: Path,
                                                                                   capsys: pytest.CaptureFixture) -> None:
    """`baseline: RUN`: every run against it on the same examples; a run of another task over the same
    rows (the 4-shot default, task gsm8k) against the baseline's own task (gsm8k_chat), never across splits."""
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(_cfg(data, tmp_path / "out", tasks=("gsm8k", "gsm8k_chat"), baseline="best",
                                            runs=[{"name": "best", "method": "fake", "members": ["m1"],
                                                   "tasks": ["gsm8k_chat"]},
                                                  {"name": "default", "method": "fake", "members": ["m1"],
                                                   "tasks": ["gsm8k"]},
                                                  {"name": "ens", "method": "fake", "members": ["m1", "m2"],
                                                   "options": {"mode": "echo"}, "tasks": ["gsm8k_chat"]}])))
    assert adafuse_main(["eval", str(cfg_path), "--no_progress"]) == 0
    printed = capsys.readouterr().out
    assert "Paired against `best`" in printed and "What each ensemble buys" not in printed
    assert "| gsm8k | default (its gsm8k_chat) | 6 |" in printed and "| gsm8k_chat | ens | 6 |" in printed
    bad = yaml.safe_load(cfg_path.read_text())
    bad["baseline"] = "bset"
    cfg_path.write_text(yaml.safe_dump(bad))
    assert adafuse_main(["eval", str(cfg_path), "--no_progress"]) == 2
    assert "key 'baseline' names no run ('bset'); did you mean 'best'?" in capsys.readouterr().err


def test_cli_errors_are_one_line(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: [gsm8k]\nruns:\n  - {method: single, membrs: [x]}\n")
    assert adafuse_main(["eval", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown key 'runs[0].membrs' (did you mean 'members'?)" in err
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(_cfg(tmp_path / "missing", tmp_path / "o")))
    assert adafuse_main(["eval", str(good)]) == 2
    err = capsys.readouterr().err.strip()
    assert "data folder not found" in err and "--data_dir" in err and str(tmp_path / "missing") in err
    assert adafuse_main(["report", str(tmp_path / "o2")]) == 2


def test_single_takes_one_member() -> None:
    with pytest.raises(ConfigError, match="exactly one member"):
        methods.build_generator("single", ["a", "b"])


def test_report_rows_follow_the_config_order(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "config.yaml").parent.mkdir(parents=True)
    (out / "config.yaml").write_text(yaml.safe_dump({"runs": [{"name": "zeta"}, {"name": "alpha"}]}))
    for run in ("alpha", "zeta"):
        folder = out / run / "nq_open"
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({
            "task": "nq_open", "run": run, "method": "single", "members": ["m"], "n": 2, "primary_metric": "exact_match",
            "score": 0.5, "ci95": [0.0, 1.0], "metrics": {"exact_match": {"value": 0.5}, "f1": {"value": 0.625}}}))
    rows = collect([out])
    assert [r["run"] for r in rows] == ["zeta", "alpha"]
    table = markdown_table(rows)
    assert table.index("| zeta |") < table.index("| alpha |") and "| f1 62.5 |" in table


def test_running_a_subset_keeps_the_config_order(tmp_path: Path, data: Path) -> None:
    """`--runs b` then `--runs a`: config.yaml still lists the whole config, so the report keeps a, b."""
    cfg_path = tmp_path / "c.yaml"
    out = tmp_path / "out"
    cfg_path.write_text(yaml.safe_dump(_cfg(data, out, runs=[
        {"name": "a", "method": "fake", "members": ["m1"]},
        {"name": "b", "method": "fake", "members": ["m1", "m2"], "options": {"mode": "echo"}}])))
    for which in ("b", "a"):
        assert adafuse_main(["eval", str(cfg_path), "--limit", "2", "--runs", which, "--data_dir", str(data),
                             "--no_progress"]) == 0
    assert [r["name"] for r in yaml.safe_load((out / "config.yaml").read_text())["runs"]] == ["a", "b"]
    assert [r["run"] for r in collect([out])] == ["a", "b"]


def test_a_run_limited_to_some_tasks(tmp_path: Path, data: Path) -> None:
    """`tasks:` on a run: it is evaluated on those tasks only, and two runs may share a name on
    disjoint tasks (e.g. each task's tuned ensemble as one report row)."""
    out = tmp_path / "out"
    cfg = parse_config(_cfg(data, out, tasks=("gsm8k", "nq_open"), limit=2, runs=[
        {"name": "alone", "method": "fake", "members": ["m1"]},
        {"name": "tuned", "method": "fake", "members": ["m1", "m2"], "tasks": ["gsm8k"]},
        {"name": "tuned", "method": "fake", "members": ["m2"], "options": {"mode": "echo"}, "tasks": ["nq_open"]}]), "c.yaml")
    results = evaluate(cfg, progress=False, log=None)
    assert [(m["run"], m["task"]) for m in results] == [("alone", "gsm8k"), ("alone", "nq_open"),
                                                         ("tuned", "gsm8k"), ("tuned", "nq_open")]
    assert sorted(p.name for p in (out / "tuned").iterdir()) == ["gsm8k", "nq_open"]
    assert all(len(_lines(out / "tuned" / t / "predictions.jsonl")) == 2 for t in ("gsm8k", "nq_open"))
    saved = yaml.safe_load((out / "config.yaml").read_text())["runs"]
    assert "tasks" not in saved[0] and saved[2]["tasks"] == ["nq_open"]
    with pytest.raises(ConfigError, match="used twice on task gsm8k"):
        parse_config(_cfg(data, out, runs=[{"name": "t", "method": "fake", "members": ["m1"]},
                                           {"name": "t", "method": "fake", "members": ["m2"], "tasks": ["gsm8k"]}]), "c.yaml")
    with pytest.raises(ConfigError, match=r"runs\[0\].tasks' must list tasks of this config \(gsm8k\)"):
        parse_config(_cfg(data, out, runs=[{"name": "t", "method": "fake", "members": ["m1"], "tasks": ["wmt"]}]), "c.yaml")


def test_shards_split_a_run_over_processes(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture) -> None:
    whole = evaluate(parse_config(_cfg(data, tmp_path / "whole", limit=7), "x.yaml"), progress=False, log=None)
    cfg_path = tmp_path / "c.yaml"
    out = tmp_path / "sharded"
    cfg_path.write_text(yaml.safe_dump(_cfg(data, out, limit=7)))
    pred = out / "fake1" / "gsm8k" / "predictions.jsonl"
    assert adafuse_main(["eval", str(cfg_path), "--shard", "1/2", "--no_progress", "--batch_size", "2"]) == 0
    assert [r["id"] for r in _lines(pred)] == [1, 3, 5] and not (pred.parent / "metrics.json").exists()
    assert "shard 1/2 done" in capsys.readouterr().err
    # a second process (concurrently or later) takes the rest; the last one writes metrics over all
    assert adafuse_main(["eval", str(cfg_path), "--shard", "0/2", "--no_progress"]) == 0
    assert sorted(r["id"] for r in _lines(pred)) == list(range(7))
    metrics = json.loads((pred.parent / "metrics.json").read_text())
    assert metrics["n"] == 7 and metrics["score"] == whole[0]["score"] and metrics["ci95"] == whole[0]["ci95"]
    for bad in ("2/2", "a/b", "1"):
        assert adafuse_main(["eval", str(cfg_path), "--shard", bad]) == 2
        assert "--shard" in capsys.readouterr().err


def test_model_names_are_checked_before_any_run(tmp_path: Path, data: Path, capsys) -> None:
    """A typo in the last run's members (or in a drafter's model) fails at once, before the first run
    writes anything: one line naming the run and the closest registry name, exit 2."""
    for bad in ({"members": ["smollm2-135m", "gemma3-27m"]},
                {"members": ["smollm2-135m", "gemma3-270m"], "options": {"drafters": [None, "hybrid:qwen-0.5b"]}}):
        cfg = tmp_path / "typo.yaml"
        cfg.write_text(yaml.safe_dump({"tasks": ["gsm8k"], "limit": 2, "data_dir": str(data),
                                       "output_path": str(tmp_path / "out"),
                                       "runs": [{"name": "first", "method": "single", "members": ["smollm2-135m"]},
                                                {"name": "last", "method": "adafuse", **bad}]}))
        assert adafuse_main(["eval", str(cfg), "--no_progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert "run 'last'" in err and "unknown model" in err and "\n" not in err
        assert not (tmp_path / "out" / "first").exists()


def test_offset_evaluates_a_later_slice_of_rows(tmp_path: Path, data: Path) -> None:
    """`offset` (a task key) skips the first rows: a replication on rows nobody has looked at."""
    cfg = parse_config(_cfg(data, tmp_path / "out", tasks=[{"name": "gsm8k", "offset": 3, "limit": 2}]), "x.yaml")
    evaluate(cfg, progress=False, log=None)
    recs = _lines(tmp_path / "out" / "fake1" / "gsm8k" / "predictions.jsonl")
    assert [r["id"] for r in recs] == [3, 4]
    assert yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())["tasks"][0]["offset"] == 3
    with pytest.raises(ConfigError, match=r"x.yaml: key 'tasks\[0\].offset' must be >= 0, got -1"):
        parse_config(_cfg(data, tmp_path / "o2", tasks=[{"name": "gsm8k", "offset": -1}]), "x.yaml")
