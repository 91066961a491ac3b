"""`adafuse bound` on synthetic pairs and on tiny in-process members (no downloads)."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from specdec import bound_cli


def _args(tmp_path, **over):
    parser = argparse.ArgumentParser()
    bound_cli.add_arguments(parser)
    args = parser.parse_args([])
    args.output_dir = str(tmp_path / "out")
    for k, v in over.items():
        setattr(args, k, v)
    return args


def test_fake_source_report(tmp_path, capsys):
    args = _args(tmp_path, source="fake", num_prompts=2, positions=3, fake_vocab=300, ns=[2, 3], temperatures=[0.7, 1.0],
                 num_samples=256)
    assert bound_cli.run(args) == 0
    out = capsys.readouterr().out
    assert "| T | n | verifier |" in out and "rrs-without" in out
    data = json.loads((tmp_path / "out" / "bound.json").read_text())
    assert (tmp_path / "out" / "bound.png").stat().st_size > 0
    rows = data["rows"]
    assert data["meta"]["positions"] == 6
    bounds = {(r["temperature"], r["n"], r["scheme"]): r["alpha_star"] for r in rows if r["method"] == "alpha*"}
    for r in rows:
        if r["method"] == "alpha*":
            continue
        assert r["acceptance"] <= r["alpha_star"] + 4 * r["stderr_mc"] + 1e-9
        if r["method"] == "greedy":
            assert r["gap"] == pytest.approx(0.0, abs=1e-9)
        if r["method"] == "spechub":
            assert r["n"] == 2
    for (temp, n, scheme), value in bounds.items():
        if scheme == "without":
            assert value >= bounds[(temp, n, "with")] - 1e-9


def tiny_models(tmp_path, monkeypatch) -> tuple[str, list[str]]:
    """A data folder with one prompt per dataset, and `load_member` faked by tiny members "T" (target)
    and "D" (draft) sharing a BPE; returns (data folder, the names loaded, in order)."""
    from runtime import member as member_mod
    from runtime.loader import default_loader
    from runtime.testing import bpe_tokenizer, tiny_member

    default_loader().clear()
    data = tmp_path / "data"
    for sub in ("gsm8k", "nq_open", "wmt22"):
        (data / sub).mkdir(parents=True)
    (data / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "What is 2 + 3?", "answer": "#### 5"}) + "\n")
    (data / "nq_open" / "dev.jsonl").write_text(json.dumps({"question": "who wrote the origin of species", "answer": ["Darwin"]}) + "\n")
    (data / "wmt22" / "de-en.src").write_text("Guten Morgen.\n")
    tok, loads = bpe_tokenizer(300), []

    def fake_load(name, dtype="float32", **kw):
        loads.append(name)
        return tiny_member("qwen2", tok, seed=0 if name == "T" else 1, name=name)

    monkeypatch.setattr(member_mod, "load_member", fake_load)
    return str(data), loads


def test_collect_with_tiny_members_uses_cache(tmp_path, monkeypatch):
    data, loads = tiny_models(tmp_path, monkeypatch)
    args = _args(tmp_path, target="T", draft="D", num_prompts=3, positions=4, data_dir=data, ns=[2],
                 temperatures=[1.0], num_samples=128, cache_dtype="float32")
    assert bound_cli.run(args) == 0
    assert loads == ["T", "D"]
    cached = sorted((tmp_path / "out" / "cache").glob("*.pt"))
    assert len(cached) == 3
    rec = torch.load(cached[0], weights_only=False)
    assert rec["target_logits"].shape == rec["draft_logits"].shape
    assert rec["target_logits"].shape[0] == len(rec["continuation"])
    # the stored target logits reproduce the greedy continuation
    assert rec["target_logits"].float().argmax(-1).tolist() == rec["continuation"]
    # second run: everything from the cache, no model loads
    assert bound_cli.run(args) == 0
    assert loads == ["T", "D"]


def test_missing_data_dir_is_a_clear_error(tmp_path):
    from runtime.errors import ConfigError

    with pytest.raises(ConfigError, match="data_dir"):
        bound_cli.data_dir(str(tmp_path / "nowhere"))


# ---- resume after a kill -------------------------------------------------------------------------
def _pairs():
    return list(bound_cli.positions_of(bound_cli.fake_pairs(2, 3, 200, seed=0)))


def test_measure_resumed_from_a_journal_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    from specdec.bound_journal import MeasureJournal

    pairs, kw = _pairs(), dict(ns=[2, 3], temperatures=[0.7, 1.0], methods=["rrs", "rrs-without", "greedy"],
                              num_samples=64, seed=3, progress=False)
    whole = bound_cli.measure(pairs, **kw)
    path = tmp_path / "measure.jsonl"
    real, calls = bound_cli.measure_position, []

    def dies_after_five(*a, **k):
        if len(calls) == 5:
            raise KeyboardInterrupt  # a kill after five positions
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(bound_cli, "measure_position", dies_after_five)
    journal = MeasureJournal(path, "k")
    with pytest.raises(KeyboardInterrupt):
        bound_cli.measure(pairs, journal=journal, **kw)
    journal.close()
    with open(path, "ab") as fh:
        fh.write(b'{"t": 0, "j": 5, "alp')  # torn mid-write
    monkeypatch.setattr(bound_cli, "measure_position", lambda *a, **k: calls.append(2) or real(*a, **k))
    journal = MeasureJournal(path, "k")
    assert sorted(journal.done) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)]
    resumed = bound_cli.measure(pairs, journal=journal, **kw)
    journal.close()
    assert calls.count(2) == 2 * len(pairs) - 5  # only the missing positions are measured
    assert resumed == whole                       # exactly: same values, same Monte Carlo draws
    assert len(path.read_text().splitlines()) == 1 + 2 * len(pairs)
    # other settings: the journal is set aside, everything measured again
    journal = MeasureJournal(path, "other")
    assert journal.done == {} and (tmp_path / "measure.jsonl.other").exists()
    journal.close()


def test_bound_rerun_after_a_kill_reports_the_same(tmp_path, monkeypatch):
    args = _args(tmp_path, source="fake", num_prompts=2, positions=3, fake_vocab=200, ns=[2], temperatures=[1.0],
                 num_samples=64)
    assert bound_cli.run(args) == 0
    whole = json.loads((tmp_path / "out" / "bound.json").read_text())["rows"]
    (tmp_path / "out" / "bound.json").unlink()
    lines = (tmp_path / "out" / "measure.jsonl").read_text().splitlines()
    (tmp_path / "out" / "measure.jsonl").write_text("\n".join(lines[:3]) + "\n")  # as if killed after two
    measured = []
    real = bound_cli.measure_position
    monkeypatch.setattr(bound_cli, "measure_position", lambda *a, **k: measured.append(1) or real(*a, **k))
    assert bound_cli.run(args) == 0
    assert len(measured) == 6 - 2
    assert json.loads((tmp_path / "out" / "bound.json").read_text())["rows"] == whole


def test_unreadable_or_half_cache_files_are_recomputed_not_used(tmp_path, monkeypatch, capsys):
    from runtime.loader import default_loader

    data, loads = tiny_models(tmp_path, monkeypatch)
    args = _args(tmp_path, target="T", draft="D", num_prompts=3, positions=4, data_dir=data, ns=[2],
                 temperatures=[1.0], num_samples=32, cache_dtype="float32")
    assert bound_cli.run(args) == 0
    whole = json.loads((tmp_path / "out" / "bound.json").read_text())["rows"]
    cache = sorted((tmp_path / "out" / "cache").glob("*.pt"))
    # a truncated record (a kill mid-write of an old, non-atomic cache) and a target half whose draft
    # half never came (a kill between the two phases)
    cache[0].write_bytes(cache[0].read_bytes()[:100])
    rec = torch.load(cache[1], weights_only=False)
    del rec["draft_logits"]
    torch.save(rec, cache[1].with_name(cache[1].name.replace(".pt", ".target.pt")))
    cache[1].unlink()
    (tmp_path / "out" / "measure.jsonl").unlink()
    default_loader().clear()  # models load again only where something is missing
    loads.clear()
    assert bound_cli.run(args) == 0
    assert f"cache file {cache[0]} is unusable" in capsys.readouterr().err
    assert loads == ["T", "D"]  # the target redoes only the truncated prompt; the draft scores both
    assert sorted((tmp_path / "out" / "cache").glob("*.pt")) == cache
    assert json.loads((tmp_path / "out" / "bound.json").read_text())["rows"] == whole
