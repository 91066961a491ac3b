"""Faults while writing results: a second process on the same folder, a full disk, torn or corrupted
predictions, a foreign or corrupted setup.json. No models (the fake generator of `eval.testing`)."""
from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from eval.cli import main as adafuse_main
from eval.folder_lock import FolderBusyError, hold
from eval.runner import read_predictions

from runtime import files
from runtime.files import DiskFullError, append_line, write_json_atomic

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
       "OMP_NUM_THREADS": "1"}
EVAL = ("import sys; from eval.testing import register_fake; register_fake();"
        "from eval.cli import main; sys.exit(main(['eval', *sys.argv[1:], '--no_progress']))")
# the same, but imports first and starts only once the file named by $WAIT_FOR has a line
EVAL_AFTER = ("import os, sys, time; from eval.testing import register_fake; register_fake(); from eval.cli import main\n"
              "import eval.runner, eval.report, eval.cli_eval, transformers.utils.logging\n"
              "while not os.path.exists(os.environ['WAIT_FOR']) or not open(os.environ['WAIT_FOR']).read(): time.sleep(0.02)\n"
              "sys.exit(main(['eval', *sys.argv[1:], '--no_progress']))")
HOLD = ("import sys; from eval.folder_lock import hold; shard = tuple(map(int, sys.argv[2].split('/'))) "
        "if len(sys.argv) > 2 else None\nwith hold(sys.argv[1], shard):\n    print('held', flush=True); sys.stdin.read()")


pytestmark = pytest.mark.usefixtures("fake_backend")   # conftest: the fake backend; `data` too


def _config(tmp_path: Path, data: Path, limit: int = 6, delay: float = 0.0, **run) -> Path:
    path = tmp_path / f"c{len(list(tmp_path.glob('c*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({
        "tasks": ["gsm8k"], "limit": limit, "data_dir": str(data), "output_path": str(tmp_path / "out"),
        "bootstrap": 50, "runs": [{"name": "r", "method": "fake", "members": ["m1"],
                                   "options": {"delay": delay} if delay else {}, **run}]}))
    return path


def _eval(argv: list[str], capsys) -> tuple[int, list[str]]:
    rc = adafuse_main(["eval", *argv, "--no_progress"])
    return rc, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _holder(folder: Path, shard: str | None = None) -> subprocess.Popen:
    """Another process holding the folder's lock until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), *([shard] if shard else [])], env=ENV,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _release(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


PRED = Path("out/r/gsm8k/predictions.jsonl")


# ---- two processes on one folder -------------------------------------------------------------
def test_a_second_process_on_a_folder_is_refused_at_once(tmp_path: Path, data: Path, capsys) -> None:
    cfg = _config(tmp_path, data)
    folder = tmp_path / "out" / "r" / "gsm8k"
    other = _holder(folder)
    try:
        t0 = time.perf_counter()
        rc, err = _eval([str(cfg)], capsys)
        assert rc == 2 and len(err) == 1 and time.perf_counter() - t0 < 5
        assert f"{folder} is being written by another adafuse process (pid {other.pid})" in err[0]
        assert "--output_path" in err[0] and "--shard" in err[0]
        assert not (folder / "predictions.jsonl").exists()
        with pytest.raises(FolderBusyError):  # the same holds for a lock taken in-process (e.g. by tune)
            with hold(folder):
                pass
    finally:
        _release(other)
    rc, err = _eval([str(cfg)], capsys)  # once the other is gone, the folder is free again
    assert rc == 0 and not list(folder.glob(".lock*"))
    assert [r["id"] for r in read_predictions(folder / "predictions.jsonl")] == list(range(6))


def test_shards_take_their_own_locks(tmp_path: Path, data: Path, capsys) -> None:
    cfg = _config(tmp_path, data)
    folder = tmp_path / "out" / "r" / "gsm8k"
    other = _holder(folder, "0/2")
    try:
        rc, err = _eval([str(cfg), "--shard", "1/2"], capsys)  # another shard: fine
        assert rc == 0
        rc, err = _eval([str(cfg), "--shard", "0/2"], capsys)  # the same shard: refused
        assert rc == 2 and len(err) == 1 and "shard 0/2 of" in err[0] and "another --shard" in err[0]
        rc, err = _eval([str(cfg)], capsys)  # the whole run while a shard is at work: refused
        assert rc == 2 and len(err) == 1 and "being written by another adafuse process" in err[0]
    finally:
        _release(other)
    assert _eval([str(cfg), "--shard", "0/2"], capsys)[0] == 0
    assert sorted(r["id"] for r in read_predictions(folder / "predictions.jsonl")) == list(range(6))
    assert json.loads((folder / "metrics.json").read_text())["n"] == 6 and not list(folder.glob(".lock*"))


def test_two_real_eval_processes(tmp_path: Path, data: Path) -> None:
    """Two `adafuse eval` processes on one config: the second (started once the first wrote a row)
    stops at once with one line, the first finishes with every example exactly once."""
    cfg = _config(tmp_path, data, limit=8, delay=0.3)
    pred = tmp_path / PRED
    second = subprocess.Popen([sys.executable, "-c", EVAL_AFTER, str(cfg)], cwd=tmp_path,
                              env={**ENV, "WAIT_FOR": str(pred)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    first = subprocess.Popen([sys.executable, "-c", EVAL, str(cfg)], cwd=tmp_path, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert second.wait(timeout=120) == 2
    assert first.poll() is None, "the first process should still be running"
    err = second.stderr.read().strip().splitlines()
    assert len(err) == 1 and "being written by another adafuse process" in err[0], err
    assert first.wait(timeout=120) == 0, first.stderr.read()
    ids = [json.loads(line)["id"] for line in pred.read_text().splitlines()]
    assert ids == list(range(8))


# ---- a full disk ---------------------------------------------------------------------------------
def test_atomic_json_keeps_the_old_file_when_the_disk_is_full(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "metrics.json"
    write_json_atomic(path, {"n": 1})

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(DiskFullError, match=f"cannot write {path}: No space left on device"):
        write_json_atomic(path, {"n": 2, "big": "x" * 10_000})
    assert json.loads(path.read_text()) == {"n": 1} and [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_a_short_append_is_cut_back(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 0}\n')
    real_write = os.write
    calls = []

    def half_then_full(fd, data):  # the disk fills in the middle of the record
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data[: len(data) // 2])

    monkeypatch.setattr(files.os, "write", half_then_full)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        with pytest.raises(DiskFullError, match="No space left on device"):
            append_line(fd, '{"id": 1, "text": "' + "y" * 100 + '"}\n', path)
    finally:
        os.close(fd)
    assert path.read_text() == '{"id": 0}\n'


def test_full_disk_during_eval(tmp_path: Path, data: Path) -> None:
    """A real process whose files may not grow past 3000 bytes (RLIMIT_FSIZE): one line, exit 2,
    predictions.jsonl whole lines only; the rerun without the limit resumes and completes."""
    cfg = _config(tmp_path, data, limit=16)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    proc = subprocess.run([sys.executable, "-c", EVAL, str(cfg)], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=120, preexec_fn=limit)
    err = proc.stderr.strip().splitlines()
    pred = tmp_path / PRED
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert f"cannot write {pred}: File too large" in err[0] and "rerun the same command" in err[0]
    text = pred.read_text()
    assert text.endswith("\n") and 2 < len(text.splitlines()) < 16
    kept = [json.loads(line)["id"] for line in text.splitlines()]
    assert kept == list(range(len(kept)))
    proc = subprocess.run([sys.executable, "-c", EVAL, str(cfg)], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["id"] for line in pred.read_text().splitlines()] == list(range(16))


# ---- torn, corrupted and foreign files -------------------------------------------------------
def _run_once(tmp_path: Path, data: Path, capsys, limit: int = 4) -> tuple[Path, Path]:
    cfg = _config(tmp_path, data, limit=limit)
    assert _eval([str(cfg)], capsys)[0] == 0
    return cfg, tmp_path / PRED


@pytest.mark.parametrize("tail", ['{"id": 9, "prom', '{"id": 9, "prompt": "x"}\n'[:-1], "\x00\x00\x00\n"])
def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path: Path, data: Path, capsys, tail: str) -> None:
    cfg, pred = _run_once(tmp_path, data, capsys)
    good = pred.read_text()
    (pred.parent / "metrics.json").unlink()
    pred.write_text(good + tail)
    warnings: list[str] = []
    assert [r["id"] for r in read_predictions(pred, warn=warnings.append)] == [0, 1, 2, 3]
    assert pred.read_text() == good and len(warnings) == 1 and "line 5 was cut short" in warnings[0]
    pred.write_text(good + tail)
    rc, err = _eval([str(cfg), "--limit", "6"], capsys)
    assert rc == 0 and len(err) == 2 and "line 5 was cut short" in err[0]  # the warning, then the score line
    assert [json.loads(line)["id"] for line in pred.read_text().splitlines()] == list(range(6))


@pytest.mark.parametrize("bad, why", [("not json at all", "not JSON"), ('{"id": 1}', "JSON without 'score'"),
                                      ("[1, 2]", "JSON without 'id'"), ("caf\xe9", "not JSON")])
def test_a_corrupted_line_in_the_middle_is_refused(tmp_path: Path, data: Path, capsys, bad: str, why: str) -> None:
    cfg, pred = _run_once(tmp_path, data, capsys)
    lines = pred.read_text().splitlines()
    pred.write_text("\n".join(lines[:2] + [bad] + lines[2:]) + "\n")
    rc, err = _eval([str(cfg)], capsys)
    assert rc == 2 and len(err) == 1 and f"{pred}: line 3 is not a prediction record ({why}" in err[0]
    assert pred.read_text().count("\n") == 5  # left as it was


def test_non_utf8_line_in_the_middle_is_refused(tmp_path: Path, data: Path, capsys) -> None:
    cfg, pred = _run_once(tmp_path, data, capsys)
    lines = pred.read_bytes().splitlines()
    pred.write_bytes(b"\n".join(lines[:1] + [b'{"id": 7, "x": "\xff\xfe"}'] + lines[1:]) + b"\n")
    rc, err = _eval([str(cfg)], capsys)
    assert rc == 2 and len(err) == 1 and "line 2 is not a prediction record (not UTF-8)" in err[0]


def test_foreign_or_corrupted_setup_is_refused(tmp_path: Path, data: Path, capsys) -> None:
    cfg, pred = _run_once(tmp_path, data, capsys)
    setup = pred.parent / "setup.json"
    # the setup.json of another config (other members and options) in this folder
    other = tmp_path / "other"
    other_cfg = _config(tmp_path, data, limit=4, members=["m2"])
    assert _eval([str(other_cfg), "--output_path", str(other)], capsys)[0] == 0
    setup.write_text((other / "r" / "gsm8k" / "setup.json").read_text())
    rc, err = _eval([str(cfg)], capsys)
    assert rc == 2 and len(err) == 1 and "holds results made with different settings (members" in err[0]
    assert '["m2"] there, ["m1"] now' in err[0]
    for text in ("{not json", "[1, 2]", ""):
        setup.write_text(text)
        rc, err = _eval([str(cfg)], capsys)
        assert rc == 2 and len(err) == 1 and f"{setup} is corrupted" in err[0]
    setup.unlink()
    rc, err = _eval([str(cfg)], capsys)
    assert rc == 2 and len(err) == 1 and "has predictions.jsonl but no setup.json" in err[0]


def test_foreign_predictions_are_refused(tmp_path: Path, data: Path, capsys) -> None:
    """Records made from other prompts (here: nq_open's, under gsm8k's setup) are not reused."""
    cfg, pred = _run_once(tmp_path, data, capsys)
    nq = tmp_path / "nq"
    nq_cfg = tmp_path / "nq.yaml"
    nq_cfg.write_text(yaml.safe_dump({**yaml.safe_load(cfg.read_text()), "tasks": ["nq_open"], "output_path": str(nq)}))
    assert _eval([str(nq_cfg)], capsys)[0] == 0
    (pred.parent / "metrics.json").unlink()
    pred.write_text((nq / "r" / "nq_open" / "predictions.jsonl").read_text())
    rc, err = _eval([str(cfg)], capsys)
    assert rc == 2 and len(err) == 1 and "example 8 was made from another prompt than gsm8k (test rows)" in err[0]
    row = json.loads(pred.read_text().splitlines()[0])
    pred.write_text(json.dumps({**row, "id": 999}) + "\n")  # no row of gsm8k's test split (16 rows here)
    rc, err = _eval([str(cfg)], capsys)
    assert rc == 2 and len(err) == 1 and "example 999 is no row of gsm8k (test rows)" in err[0]
