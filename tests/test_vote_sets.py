"""eval.vote_sets: the view-vote rule read off single runs' answers (dev-row set choice)."""
import json

import pytest

from eval.vote_sets import compare_sets, main, read_run, vote_outcomes


def _run(answers, gold):
    return {i: {"id": i, "extracted": a, "score": float(a == g)} for i, (a, g) in enumerate(zip(answers, gold))}


GOLD = ["1", "2", "3", "4"]
A = _run(["1", "9", "7", None], GOLD)   # the lead
B = _run(["5", "2", "8", "4"], GOLD)
C = _run(["5", "2", "3", "6"], GOLD)


def test_majority_wins_and_ties_go_to_the_lead_then_member_order():
    voted = vote_outcomes([A, B, C], [0, 1, 2], lead=0)
    # ex 0: B and C agree on 5 (wrong) over the lead; ex 1: 2 by majority; ex 2: all differ -> lead's 7;
    # ex 3: the lead has no answer, B's 4 and C's 6 tie -> the next member in order (B)
    assert [r["extracted"] for r in voted] == ["5", "2", "7", "4"]
    voted = vote_outcomes([A, B, C], [0, 1, 2], lead=2)
    assert [r["extracted"] for r in voted] == ["5", "2", "3", "6"]


def test_compare_sets_pairs_each_set_with_the_baseline():
    rows = compare_sets([A, B, C], [[0, 1, 2], [1, 2]], lead=2, baseline=0)
    assert rows[0]["score"] == pytest.approx(50) and rows[0]["diff"] == pytest.approx(25)   # on a 0-100 scale
    assert rows[0]["ci"][0] <= 25 <= rows[0]["ci"][1]                                      # the interval too
    assert rows[0]["win_tie_loss"] == (2, 1, 1)
    assert rows[1]["members"] == [1, 2] and rows[1]["n"] == 4


def test_the_lead_must_vote():
    with pytest.raises(ValueError, match="lead"):
        vote_outcomes([A, B, C], [1, 2], lead=0)


def test_cli_reads_run_folders_and_rejects_bad_sets(tmp_path, capsys):
    dirs = []
    for name, run in zip("abc", (A, B, C)):
        d = tmp_path / name / "gsm8k"
        d.mkdir(parents=True)
        (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.values()))
        dirs.append(str(tmp_path / name))
    assert read_run(dirs[0])[3]["extracted"] is None
    assert main(dirs + ["--sets", "0,1,2", "--lead", "2"]) == 0
    assert "majority [0, 1, 2]: 50.0" in capsys.readouterr().out
    for args, says in ((["--sets", "0,5"], "outside 0..2"), (["--sets", "a,b"], "run indices"),
                       (["--sets", "0,1", "--votes", "weighted"], "written without them"),   # no log-probs recorded
                       (["--sets", "0,1", "--baseline", "3"], "outside 0..2")):
        with pytest.raises(SystemExit) as info:
            main(dirs + args)
        err = capsys.readouterr().err
        assert info.value.code == 2 and says in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path), "--sets", "0"])             # three predictions files under it
    assert info.value.code == 2 and "expected one predictions.jsonl" in capsys.readouterr().err


def test_confidence_votes_and_a_view_vote_run_read_as_one_run_per_view(tmp_path, capsys):
    def sample(by, a, g, lp, n):
        return {"by": by, "output": a, "extracted": a, "scores": {"exact_match_number": float(a == g)}, "stats": {},
                "num_tokens": n, "finish_reason": "eos", "logprob": lp}
    records = [{"id": 0, "gold": "1", "samples": [sample("lead", "1", "1", -4.0, 2), sample("b", "2", "1", -0.2, 2),
                                                  sample("c", "3", "1", -0.4, 2)]},
               {"id": 1, "gold": "2", "samples": [sample("lead", "5", "2", -0.1, 1), sample("b", "2", "2", -1.0, 1),
                                                  sample("c", "2", "2", -3.0, 1)]}]
    d = tmp_path / "vv" / "gsm8k"
    (d / "members" / "lead").mkdir(parents=True)
    (d / "members" / "lead" / "predictions.jsonl").write_text("")   # derived folders are not read
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    main([str(tmp_path / "vv"), "--sets", "0,1,2", "--votes", "majority,weighted,confident"])
    out = capsys.readouterr().out
    assert "[1] " in out and ":: b: 50.0" in out
    # majority: ex 0 all differ -> the lead's 1 (right); ex 1: 2 wins 2-1 (right) -> 100
    # weighted: ex 0: e^-0.1 for 2 beats e^-2 for 1 (wrong); ex 1: e^-1 + e^-3 = 0.42 < e^-0.1 -> 5 (wrong)
    # confident: ex 0 -> b's 2 (wrong); ex 1 -> the lead's 5 (wrong)
    assert "majority [0, 1, 2]: 100.0" in out and "weighted [0, 1, 2]: 0.0" in out and "confident [0, 1, 2]: 0.0" in out
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path / "vv"), "--sets", "0,1", "--votes", "median"])
    assert info.value.code == 2 and "use majority, consensus, weighted" in capsys.readouterr().err


def _write(folder, run):
    d = folder / "gsm8k"
    d.mkdir(parents=True)
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.values()))
    return str(folder)


def _shifted(run, by):
    return {i + by: {**r, "id": i + by} for i, r in run.items()}


def test_pooled_folders_join_disjoint_rows_and_refuse_shared_ids(tmp_path, capsys):
    first = [_write(tmp_path / "p1" / n, r) for n, r in zip("abc", (A, B, C))]
    second = [_write(tmp_path / "p2" / n, _shifted(r, 10)) for n, r in zip("abc", (A, B, C))]
    pooled = [f"{x}+{y}" for x, y in zip(first, second)]
    assert main(pooled + ["--sets", "0,1,2", "--lead", "2", "--level", "0.9706", "--draws", "200"]) == 0
    out = capsys.readouterr().out
    # the same four examples twice over: the same score, n doubled, won / lost doubled
    assert "majority [0, 1, 2]: 50.0" in out and "n=8" in out and "(4, 2, 2)" in out and "97.06 %" in out
    with pytest.raises(SystemExit) as info:
        main([f"{first[0]}+{first[0]}", "--sets", "0"])
    assert info.value.code == 2 and "share example ids" in capsys.readouterr().err
    for args, says in ((["--level", "95"], "between 0 and 1"), (["--draws", "0"], "positive number")):
        with pytest.raises(SystemExit) as info:
            main(first + ["--sets", "0,1,2"] + args)
        assert info.value.code == 2 and says in capsys.readouterr().err


def _mt_sample(by, text, ref, cross):
    from sacrebleu.metrics import BLEU

    from eval.metrics import corpus_stats
    return {"by": by, "output": text, "extracted": text, "scores": {"bleu": BLEU().sentence_score(text, [ref]).score},
            "stats": {"bleu": corpus_stats("bleu", text, ref)}, "num_tokens": 3, "finish_reason": "eos", "logprob": None, "cross": cross}


def test_rerank_and_consensus_read_off_a_sample_rerank_run_with_corpus_bleu(tmp_path, capsys):
    refs = ["the cat sat on the mat", "a dog ran in the park"]
    # per example, each writer's translation and every scorer's normalised log-prob of it
    texts = [["the cat sat on a mat", "the cat sat on the mat", "cat mat"],
             ["a dog ran in a park", "one dog runs", "a dog ran in the park"]]
    cross = [[{"a": -0.5, "b": -0.9, "c": -0.2}, {"a": -0.6, "b": -0.1, "c": -0.5}, {"a": -0.1, "b": -2.0, "c": -0.1}],
             [{"a": -0.2, "b": -0.3, "c": -0.4}, {"a": -0.9, "b": -0.1, "c": -0.9}, {"a": -0.3, "b": -0.2, "c": -0.1}]]
    records = [{"id": i, "gold": refs[i], "samples": [_mt_sample(by, texts[i][k], refs[i], cross[i][k])
                                                      for k, by in enumerate("abc")]} for i in range(2)]
    d = tmp_path / "rr" / "wmt22_de_en"
    d.mkdir(parents=True)
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    from eval.vote_sets import read_runs
    runs = [r for _, r in read_runs(tmp_path / "rr", "bleu")]
    # rerank over a, b, c: ex 0 means -0.533, -0.4, -0.733 -> b's; ex 1 -0.3, -0.633, -0.2 -> c's
    assert [r["extracted"] for r in vote_outcomes(runs, [0, 1, 2], 0, "rerank")] == [texts[0][1], texts[1][2]]
    # over a, c only (writers and scorers): ex 0 -0.35, -0.1 -> c's "cat mat"; ex 1 -0.3, -0.2 -> c's
    assert [r["extracted"] for r in vote_outcomes(runs, [0, 2], 0, "rerank")] == [texts[0][2], texts[1][2]]
    assert main([str(tmp_path / "rr"), "--metric", "bleu", "--sets", "0,1,2", "--votes", "rerank,consensus"]) == 0
    out = capsys.readouterr().out
    assert "rerank [0, 1, 2]: 100.0" in out          # both references chosen: corpus BLEU 100
    with pytest.raises(SystemExit) as info:          # single runs keep no cross scores
        main([_write(tmp_path / "plain", A), "--sets", "0", "--votes", "rerank"])
    assert info.value.code == 2 and "sample-rerank run" in capsys.readouterr().err
