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


def test_collect_with_tiny_members_uses_cache(tmp_path, monkeypatch):
    from runtime import member as member_mod
    from runtime.testing import bpe_tokenizer, tiny_member

    data = tmp_path / "data"
    (data / "gsm8k").mkdir(parents=True)
    (data / "nq_open").mkdir()
    (data / "wmt22").mkdir()
    (data / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "What is 2 + 3?", "answer": "#### 5"}) + "\n")
    (data / "nq_open" / "dev.jsonl").write_text(json.dumps({"question": "who wrote the origin of species", "answer": ["Darwin"]}) + "\n")
    (data / "wmt22" / "de-en.src").write_text("Guten Morgen.\n")
    tok = bpe_tokenizer(300)
    loads = []

    def fake_load(name, dtype="float32", **kw):
        loads.append(name)
        return tiny_member("qwen2", tok, seed=0 if name == "T" else 1, name=name)

    monkeypatch.setattr(member_mod, "load_member", fake_load)
    args = _args(tmp_path, target="T", draft="D", num_prompts=3, positions=4, data_dir=str(data), ns=[2],
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
