"""Paired evidence: the paired bootstrap of a mean metric and of a corpus metric, pinned against
hand cases, win/tie/loss, and `adafuse report --baseline` on a real results folder."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from eval import methods
from eval.config import parse_config
from eval.metrics import corpus_stats
from eval.paired import _scorer, align, paired_bootstrap, win_tie_loss
from eval.report import collect, paired_table
from eval.runner import evaluate
from eval.testing import make_data, register_fake


def recs(scores, ids=None):
    ids = range(len(scores)) if ids is None else ids
    return [{"id": i, "score": s, "scores": {"exact_match": s}} for i, s in zip(ids, scores)]


def test_mean_metric_hand_case():
    """a - b per example = [1, 0, 0]: the diff is 1/3; resampling 3 of 3 ids, the resampled mean of
    the per-example differences is k/3 with k ~ Binomial(3, 1/3): P(0) = 8/27, P(1) = 1/27, so the
    95 % percentile interval is exactly [0, 1]."""
    d = paired_bootstrap("exact_match", recs([1, 0, 1]), recs([0, 0, 1]), n_resamples=20000, seed=1)
    assert d.n == 3 and d.diff == pytest.approx(1 / 3)
    assert (d.ci_low, d.ci_high) == (0.0, 1.0)
    assert not d.significant
    # the same ids are drawn for both runs: identical runs have a zero-width interval
    same = paired_bootstrap("exact_match", recs([1, 0, 1, 1]), recs([1, 0, 1, 1]))
    assert (same.diff, same.ci_low, same.ci_high) == (0.0, 0.0, 0.0)


def test_paired_is_narrower_than_unpaired():
    """Two runs that agree on most examples: the paired interval of the difference is much narrower
    than the one an unpaired comparison would give (and excludes 0 here, where that would not)."""
    rng = np.random.default_rng(0)
    base = (rng.random(200) < 0.5).astype(float)
    better = base.copy()
    better[np.flatnonzero(base == 0)[:12]] = 1.0  # wins 12, loses none
    d = paired_bootstrap("exact_match", recs(better), recs(base), seed=3)
    assert d.diff == pytest.approx(12 / 200) and d.significant
    draws = rng.integers(0, 200, size=(1000, 200))
    unpaired = better[draws].mean(1) - base[rng.integers(0, 200, size=(1000, 200))].mean(1)
    assert d.ci_high - d.ci_low < 0.5 * (np.quantile(unpaired, 0.975) - np.quantile(unpaired, 0.025))
    assert win_tie_loss(list(better), list(base)) == (12, 188, 0)


def test_corpus_metric_resamples_segments():
    refs = ["the cat sat on the mat", "a dog barks", "it rains today in paris", "we like green tea"]
    hyp_a = ["the cat sat on a mat", "a dog barks", "it rains in paris", "we like tea"]
    hyp_b = ["a cat on the mat", "dogs bark", "rain today", "we like green tea"]

    def records(hyps):
        return [{"id": i, "score": 0.0, "stats": {"bleu": corpus_stats("bleu", h, r)}} for i, (h, r) in
                enumerate(zip(hyps, refs))]

    a, b = records(hyp_a), records(hyp_b)
    d = paired_bootstrap("bleu", a, b, n_resamples=300)
    direct = sacrebleu.corpus_bleu(hyp_a, [refs]).score - sacrebleu.corpus_bleu(hyp_b, [refs]).score
    assert d.diff == pytest.approx(direct, abs=1e-9)
    assert d.ci_low <= d.diff <= d.ci_high
    # a draw re-sums the drawn segments' statistics: the corpus score of those segments, duplicates included
    idx = np.array([2, 2, 0, 3])
    assert _scorer("bleu", a, {})(idx) == pytest.approx(
        sacrebleu.corpus_bleu([hyp_a[i] for i in idx], [[refs[i] for i in idx]]).score, abs=1e-9)


def test_align_keeps_shared_ids_only():
    a, b = align(recs([1, 0, 1], ids=[3, 1, 2]), recs([0, 1], ids=[2, 5]))
    assert [r["id"] for r in a] == [r["id"] for r in b] == [2]


def test_report_baseline_on_a_results_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(methods.METHODS, "fake", methods.METHODS.get("fake"))
    register_fake()
    methods.clear_caches()
    data = make_data(tmp_path / "data", n=16)
    cfg = parse_config({"tasks": ["nq_open", "wmt22_de_en"], "limit": 6, "output_path": str(tmp_path / "out"),
                        "data_dir": str(data), "bootstrap": 50,
                        "runs": [{"name": "gold", "method": "fake", "members": ["m1"]},
                                 {"name": "echo", "method": "fake", "members": ["m1"], "options": {"mode": "echo"}}]},
                       "x.yaml")
    evaluate(cfg, progress=False, log=None)
    table = paired_table(collect([tmp_path / "out"]), "gold", n_resamples=100)
    nq = next(line for line in table.splitlines() if line.startswith("| nq_open | echo"))
    gold = [json.loads(x)["score"] for x in (tmp_path / "out/gold/nq_open/predictions.jsonl").read_text().splitlines()]
    echo = [json.loads(x)["score"] for x in (tmp_path / "out/echo/nq_open/predictions.jsonl").read_text().splitlines()]
    w, t, l = win_tie_loss(echo, gold)
    assert f"| {w} / {t} / {l} |" in nq and "exact_match" in nq
    assert any(line.startswith("| wmt22_de_en | echo") and "bleu" in line and "chrf" in line
               for line in table.splitlines())
    with pytest.raises(Exception, match="no such run"):
        paired_table(collect([tmp_path / "out"]), "nobody")


def test_word_table_counts_overrules_and_flips(tmp_path: Path):
    from eval.report import word_table

    def write(run, recs):
        folder = tmp_path / run / "gsm8k"
        folder.mkdir(parents=True)
        (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        return {"_path": str(folder / "metrics.json"), "task": "gsm8k", "run": run}

    ens = write("ens", [
        {"id": 0, "score": 0.0, "gen_stats": {"ensembled_words": 4, "overruled": 2, "won_by": {"a": 2, "b": 3}}},
        {"id": 1, "score": 1.0, "gen_stats": {"ensembled_words": 2, "overruled": 1, "won_by": {"a": 1, "b": 1}}},
        {"id": 2, "score": 0.0, "gen_stats": {"ensembled_words": 2, "overruled": 0, "won_by": {"a": 2}}}])
    lead = write("lead", [{"id": 0, "score": 1.0}, {"id": 1, "score": 0.0}, {"id": 2, "score": 1.0}])
    table = word_table([ens, lead], baseline="lead")
    row = next(line for line in table.splitlines() if line.startswith("| gsm8k | ens"))
    # 8 ensembled words over 3 examples, 3 overruled; winners a 5/8, b 4/8; lost 1 (id 0, overruled), won 1
    assert row == "| gsm8k | ens | 2.7 | 1.0 | a 62%, b 50% | 1 / 1 |"
    assert "| gsm8k | lead" not in table


def test_ensemble_table_compares_each_ensemble_with_its_best_member(tmp_path: Path):
    from eval.report import ensemble_table

    def write(run, method, members, scores):
        folder = tmp_path / run / "nq_open"
        folder.mkdir(parents=True)
        recs = [{"id": i, "score": s, "metrics": {"exact_match": s, "f1": s}} for i, s in enumerate(scores)]
        (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        return {"_path": str(folder / "metrics.json"), "task": "nq_open", "run": run, "method": method,
                "members": members, "score": sum(scores) / len(scores)}

    rows = [write("a", "single", ["a"], [1, 0, 0, 0, 1, 0]),
            write("b", "single", ["b"], [1, 1, 0, 0, 0, 0]),
            write("big", "single", ["big"], [1, 1, 1, 1, 1, 0]),
            write("ens", "token-union", ["a", "b"], [1, 1, 0, 0, 1, 1])]
    table = ensemble_table(rows, n_resamples=200)
    own = next(line for line in table.splitlines() if "its best member" in line)
    top = next(line for line in table.splitlines() if "best single of the table" in line)
    # a and b score alike: the table says the best member is a tie rather than naming the first listed as if it won;
    # 6 paired examples are too few for an interval (no interval, no star)
    assert own.startswith("| nq_open | ens | a (its best member, tied with 1 other) | 6 |") and "exact_match +33.3" in own
    assert "(n=6: too few for an interval)" in own and "*" not in own
    assert own.endswith("| 2 / 4 / 0 |")                      # ens vs a: rows 1, 5 won, none lost
    assert top.startswith("| nq_open | ens | big (best single of the table) | 6 |") and "exact_match -16.7" in top and top.endswith("| 1 / 3 / 2 |")
    assert ensemble_table(rows[:3]) == ""                      # no ensemble, no table
    from eval.report import _best

    tied = [{"run": "x", "score": 0.0, "metrics": {"exact_match": {"value": 0.0}, "f1": {"value": 0.0}}},
            {"run": "y", "score": 0.0, "metrics": {"exact_match": {"value": 0.0}, "f1": {"value": 0.1}}},
            {"run": "z", "score": 0.0, "metrics": {"exact_match": {"value": 0.0}, "f1": {"value": 0.1}}}]
    assert _best(tied)["run"] == "y"                           # an exact-match tie goes to the better F1, then the first


def test_mcnemar_exact_hand_cases():
    from eval.paired import mcnemar_exact
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)           # 2 * P(X <= 0), X ~ Bin(5, 1/2)
    assert mcnemar_exact(21, 10) == pytest.approx(0.0708, abs=1e-4) == mcnemar_exact(10, 21)
