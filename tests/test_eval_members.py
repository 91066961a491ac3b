"""The `single` method through the real member runtime: a tiny random model (fast) and, marked slow,
the real smollm2-135m on 2 GSM8K problems (the README's test command fetches it; missing, it fails)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import runtime.member
from conftest import require_data, require_model
from eval import methods
from runtime import testing
from eval.config import parse_config
from eval.runner import evaluate
from eval.testing import make_data

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clear():
    methods.clear_caches()
    yield
    methods.clear_caches()


def test_single_with_tiny_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[tuple[str, str]] = []

    def fake_load(name: str, dtype="float32", **kw):
        loads.append((name, str(dtype).replace("torch.", "")))
        return testing.tiny_member("llama", name=name, seed=len(loads))

    monkeypatch.setattr(runtime.member, "load_member", fake_load)
    data = make_data(tmp_path / "data", n=12)
    cfg = parse_config({"tasks": [{"name": "gsm8k", "num_fewshot": 1}, {"name": "nq_open", "num_fewshot": 1}],
                        "limit": 2, "batch_size": 2, "generation": {"max_new_tokens": 6}, "bootstrap": 50,
                        "output_path": str(tmp_path / "out"), "data_dir": str(data),
                        "runs": [{"name": "tiny", "method": "single", "members": ["tiny-a"]},
                                 {"name": "spec", "method": "single", "members": ["tiny-a"],
                                  "options": {"drafter": "tiny-b", "depth": 2}}]}, "x.yaml")
    results = evaluate(cfg, progress=False, log=None)
    assert loads == [("tiny-a", "float32"), ("tiny-b", "float32")]  # each loaded once, reused across tasks/runs
    for task in ("gsm8k", "nq_open"):  # greedy speculative decoding is lossless: same outputs as plain
        plain, spec = ([json.loads(x)["output"] for x in (tmp_path / "out" / run / task / "predictions.jsonl").read_text().splitlines()]
                       for run in ("tiny", "spec"))
        assert plain == spec
    for m in results:
        assert m["n"] == 2 and m["forward_passes"] and m["generated_tokens"] > 0
    recs = [json.loads(x) for x in (tmp_path / "out" / "tiny" / "gsm8k" / "predictions.jsonl").read_text().splitlines()]
    assert all(r["num_tokens"] <= 6 for r in recs)
    with pytest.raises(Exception, match="does not take option"):
        methods.build_generator("single", ["tiny-a"], beam=3)
    with pytest.raises(Exception, match="rejected by specdec"):
        methods.build_generator("single", ["tiny-a"], drafter="tiny-b", scheme="bogus")


@pytest.mark.slow
def test_single_smollm2_on_two_gsm8k_problems(tmp_path: Path) -> None:
    require_model("smollm2-135m")
    data = require_data()
    cfg = parse_config({"tasks": [{"name": "gsm8k", "num_fewshot": 2}], "limit": 2, "generation": {"max_new_tokens": 64},
                        "output_path": str(tmp_path / "out"), "data_dir": str(data), "bootstrap": 100,
                        "runs": [{"name": "smollm2", "method": "single", "members": ["smollm2-135m"]}]}, "x.yaml")
    (m,) = evaluate(cfg, progress=False, log=None)
    assert m["n"] == 2 and m["forward_passes"]["smollm2-135m"] > 0 and m["tokens_per_s"] > 0
    recs = [json.loads(x) for x in (tmp_path / "out" / "smollm2" / "gsm8k" / "predictions.jsonl").read_text().splitlines()]
    assert all(r["output"] and "Question:" not in r["output"] for r in recs)


@pytest.mark.parametrize("method", ["adafuse", "token-union"])
def test_ensemble_with_tiny_members(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """Ensemble methods through `adafuse.Ensemble` with members of different tokenizers (tiny models)."""
    toks = {"tiny-char": testing.char_tokenizer, "tiny-bpe": testing.bpe_tokenizer}
    monkeypatch.setattr(runtime.member, "load_member", lambda name, dtype="float32", **kw: testing.tiny_member(
        "llama" if name == "tiny-char" else "qwen2", toks[name](), name=name))
    data = make_data(tmp_path / "data", n=10)
    cfg = parse_config({"tasks": [{"name": "nq_open", "num_fewshot": 1}], "limit": 2, "bootstrap": 20,
                        "generation": {"max_new_tokens": 4}, "output_path": str(tmp_path / "out"), "data_dir": str(data),
                        "runs": [{"name": "ens", "method": method, "members": ["tiny-char", "tiny-bpe"]}]}, "x.yaml")
    (m,) = evaluate(cfg, progress=False, log=None)
    assert m["n"] == 2 and set(m["forward_passes"]) == {"tiny-char", "tiny-bpe"}
