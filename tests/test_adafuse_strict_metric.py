"""`evaluate.load` of our strict metrics from a local path gives the scores our harness computes."""
from __future__ import annotations

import json
from pathlib import Path

import evaluate
import pytest
import sacrebleu

from eval.adafuse_strict import PATH
from eval.metrics import exact_match, f1, first_line


def test_gsm8k_final_number_match():
    m = evaluate.load(PATH, "gsm8k")
    out = m.compute(predictions=["She has 3 + 15 = 18 eggs.\nThe answer is 18.00", "so 8 left", "no number"],
                    references=["18", "18", "7"])
    assert out == {"exact_match_number": pytest.approx(1 / 3)}


def test_nq_open_em_and_f1_over_aliases_on_the_first_line():
    preds = ["The Eiffel Tower\nmore text", "paris france", "London"]
    refs = [["Eiffel Tower", "the tower"], ["Paris"], ["Rome"]]
    out = evaluate.load(PATH, "nq_open").compute(predictions=preds, references=refs)
    assert out["exact_match"] == pytest.approx(1 / 3)
    expect_f1 = sum(f1(first_line(p), r) for p, r in zip(preds, refs)) / 3
    assert expect_f1 == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert out["f1"] == pytest.approx(expect_f1)
    assert exact_match("The Eiffel Tower", ["Eiffel Tower"]) == 1.0


def test_wmt_corpus_scores_equal_sacrebleu():
    hyps = ["The cat sat on the mat.\nextra", "A dog barks loudly."]
    refs = ["The cat sat on the mat.", "The dog barks loud."]
    out = evaluate.load(PATH, "wmt").compute(predictions=hyps, references=refs)
    lines = [first_line(h) for h in hyps]
    assert out["bleu"] == pytest.approx(sacrebleu.corpus_bleu(lines, [refs]).score)
    assert out["chrf"] == pytest.approx(sacrebleu.corpus_chrf(lines, [refs]).score)
    zh = evaluate.load(PATH, "wmt").compute(predictions=["猫坐在垫子上。"], references=["猫坐在垫子上了。"], tokenize="zh")
    assert zh["bleu"] == pytest.approx(sacrebleu.corpus_bleu(["猫坐在垫子上。"], [["猫坐在垫子上了。"]], tokenize="zh").score)


def test_unknown_config_is_named():
    with pytest.raises(ValueError, match="unknown adafuse_strict config 'squad'"):
        evaluate.load(PATH, "squad")


RESULTS = Path(__file__).resolve().parents[1] / "experiments"


@pytest.mark.parametrize("folder, config", [("table_gsm8k/qwen2.5-coder-0.5b/gsm8k", "gsm8k"),
                                            ("table_nq/gemma3-270m/nq_open", "nq_open"),
                                            ("table_wmt/gemma3-270m/wmt22_de_en", "wmt")])
def test_equals_the_committed_tables(folder, config):
    """On a committed run's raw outputs, the module's scores equal that run's metrics.json."""
    rows = [json.loads(line) for line in (RESULTS / folder / "predictions.jsonl").read_text().splitlines()]
    metrics = json.loads((RESULTS / folder / "metrics.json").read_text())
    out = evaluate.load(PATH, config).compute(predictions=[r["output"] for r in rows],
                                              references=[r["gold"] for r in rows])
    assert len(rows) == metrics["n"]
    # (the WMT tasks gained BLEU at a fixed brevity penalty after these tables were written)
    assert {k: out[k] for k in metrics["metrics"]} == {k: pytest.approx(v["value"], abs=1e-9)
                                                       for k, v in metrics["metrics"].items()}
