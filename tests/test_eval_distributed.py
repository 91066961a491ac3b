"""Data-parallel evaluation through a distributed launcher: `accelerate launch --multi_gpu
--num_processes 2 -m eval.cli eval CONFIG` (on a CPU machine accelerate's torch.distributed launcher)
gives each process its shard of the examples, from the launcher's RANK / WORLD_SIZE."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from eval import methods
from eval.cli_eval import launcher_shard
from eval.config import parse_config
from eval.runner import evaluate, read_predictions
from eval.testing import make_data, register_fake
from runtime.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SCRIPT = ("import sys; from eval.testing import register_fake; register_fake();"
          "from eval.cli import main; sys.exit(main(['eval', *sys.argv[1:], '--no_progress']))")


def test_rank_and_world_size_from_the_launcher() -> None:
    assert launcher_shard({}) is None and launcher_shard({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert launcher_shard({"WORLD_SIZE": "4", "RANK": "3"}) == (3, 4)
    assert launcher_shard({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}) == (1, 2)
    assert launcher_shard({"PMI_SIZE": "3", "PMI_RANK": "0"}) == (0, 3)
    with pytest.raises(ConfigError, match="--shard '5/2' is invalid"):
        launcher_shard({"WORLD_SIZE": "2", "RANK": "5"})


def _launch(cfg: Path, tmp: Path, *extra: str) -> subprocess.Popen:
    script = tmp / "run_eval.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    beside = Path(sys.executable).parent / "accelerate"  # this interpreter's environment, activated or not
    launcher = str(beside) if beside.is_file() else shutil.which("accelerate")
    assert launcher, "accelerate is a dependency: its launcher must be installed"
    return subprocess.Popen([launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                             "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
                             str(script), str(cfg), *extra], cwd=tmp, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(methods.METHODS, "fake", methods.METHODS.get("fake"))
    register_fake()
    methods.clear_caches()
    data = make_data(tmp_path / "data", n=16)
    base = {"tasks": ["gsm8k", "nq_open"], "limit": 8, "data_dir": str(data), "bootstrap": 100, "batch_size": 2,
            "runs": [{"name": "slow", "method": "fake", "members": ["m1"], "options": {"delay": 0.2}}]}
    whole = evaluate(parse_config({**base, "output_path": str(tmp_path / "whole")}, "x.yaml"), progress=False, log=None)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**base, "output_path": str(tmp_path / "dp")}))
    yield tmp_path, cfg, whole
    methods.clear_caches()


def _same_as_one_process(tmp: Path, whole: list[dict]) -> None:
    for m in whole:
        folder = tmp / "dp" / "slow" / m["task"]
        recs = read_predictions(folder / "predictions.jsonl")
        one = read_predictions(tmp / "whole" / "slow" / m["task"] / "predictions.jsonl")
        key = lambda r: r["id"]  # noqa: E731
        assert [(r["id"], r["output"]) for r in sorted(recs, key=key)] == [(r["id"], r["output"]) for r in one]
        merged = json.loads((folder / "metrics.json").read_text())
        assert (merged["n"], merged["score"], merged["ci95"]) == (m["n"], m["score"], m["ci95"])


def test_two_launched_processes_equal_one(setup) -> None:
    tmp, cfg, whole = setup
    proc = _launch(cfg, tmp)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-2000:]
    # two processes, each with its shard: the records name their writer (which one logs "shard k/2 done"
    # depends on which finishes first, and neither does when both finish at once)
    for m in whole:
        recs = read_predictions(tmp / "dp" / "slow" / m["task"] / "predictions.jsonl")
        writers = {r["proc"] for r in recs}
        assert len(writers) == 2, writers
        by_writer = [sorted(r["id"] for r in recs if r["proc"] == w) for w in writers]
        assert sorted(len(ids) for ids in by_writer) == [4, 4]   # every other example each
    _same_as_one_process(tmp, whole)


def test_a_killed_launch_resumes(setup) -> None:
    """Kill the launcher and its two processes mid-run; the same launch again completes the run."""
    tmp, cfg, whole = setup
    proc = _launch(cfg, tmp)
    pred = tmp / "dp" / "slow" / "gsm8k" / "predictions.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not pred.exists() or len(pred.read_text().splitlines()) < 3):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 3 <= len(read_predictions(pred)) < 8
    proc = _launch(cfg, tmp)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-2000:]
    _same_as_one_process(tmp, whole)
    for m in whole:
        ids = [r["id"] for r in read_predictions(tmp / "dp" / "slow" / m["task"] / "predictions.jsonl")]
        assert len(ids) == len(set(ids)) == 8
