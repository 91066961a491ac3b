"""Answer extraction, normalisation and metrics of the evaluation harness (no models)."""
from __future__ import annotations

import pytest
import sacrebleu

from eval import metrics as M
from eval.data import gsm8k_cot, gsm8k_gold


@pytest.mark.parametrize("output, expected", [
    ("She pays 3 * 6 = 18 dollars. The answer is 18.", "18"),
    ("The answer is $1,000.", "1000"),
    ("The answer is 1,000,000", "1000000"),
    ("so 5 + 3 = 8 and then 18", "18"),                      # last number, whole number only
    ("He has 18 apples. The answer is 8.", "8"),             # "The answer is" wins over later/earlier numbers
    ("The answer is 8. Question: 18 more", "8"),
    ("The answer is: 42", "42"),
    ("the final answer is **-3**.", "-3"),
    ("The answer is -$5.", "-5"),
    ("The answer is 2.50", "2.5"),
    ("The answer is 18.00", "18"),
    ("#### 72", "72"),
    ("blah 3\n#### 1,234", "1234"),
    ("The answer is eighteen. Earlier we had 7 and 12", "12"),  # no number after the phrase -> last number
    ("from 3-5 people", "5"),                                # a range's dash is not a minus sign
    ("costs $0.5 each", "0.5"),
    ("It rose by 50%.", "50"),
    ("no digits here", ""),
    ("The answer is 12.\nQuestion: 99", "12"),
])
def test_gsm8k_final_number(output: str, expected: str) -> None:
    assert M.gsm8k_final_number(output) == expected


def test_exact_match_number_is_numeric_and_whole() -> None:
    assert M.exact_match_number("18", "18") == 1.0
    assert M.exact_match_number("18.00", "18") == 1.0
    assert M.exact_match_number("8", "18") == 0.0
    assert M.exact_match_number("18", "8") == 0.0
    assert M.exact_match_number("", "0") == 0.0
    assert M.exact_match_number(M.gsm8k_final_number("The answer is $1,000."), "1000") == 1.0
    assert M.normalize_number("-0.0") == "0"
    assert M.normalize_number("100") == "100"


def test_gsm8k_gold_and_cot_reformat() -> None:
    answer = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nSo 48+24 = <<48+24=72>>72 in all.\n#### 1,072"
    assert gsm8k_gold(answer) == "1072"
    cot = gsm8k_cot(answer)
    assert "<<" not in cot and "####" not in cot and "\n" not in cot
    assert cot.endswith("The answer is 1072.")
    assert M.gsm8k_final_number(cot) == "1072"


@pytest.mark.parametrize("text, expected", [
    ("The Beatles!", "beatles"),
    ("  An   apple,  a day ", "apple day"),
    ("Theatre", "theatre"),                                  # articles only as whole words
    ("U.S.A.", "usa"),
])
def test_squad_normalize(text: str, expected: str) -> None:
    assert M.squad_normalize(text) == expected


def test_nq_exact_match_and_f1() -> None:
    gold = ["14 December 1972 UTC", "December 1972"]
    assert M.exact_match("december 1972.", gold) == 1.0
    assert M.exact_match("In December 1972", gold) == 0.0
    assert M.f1("In December 1972", gold) == pytest.approx(0.8)   # max over aliases: P=2/3, R=1
    assert M.f1("nothing", gold) == 0.0
    assert M.f1("the", ["a"]) == 1.0                               # both empty after normalisation
    assert M.token_f1("x y z", "x y") == pytest.approx(0.8)
    assert M.first_line("\n  Paris \nQ: next") == "Paris"


HYPS = ["The cat sat on the mat .", "A quick brown fox", "hello world", ""]
REFS = ["The cat is on the mat .", "The quick brown fox jumps", "hello there world", "nothing"]


@pytest.mark.parametrize("tokenize", ["13a", "zh"])
def test_bleu_chrf_equal_sacrebleu(tokenize: str) -> None:
    kwargs = {"tokenize": tokenize}
    stats = [M.corpus_stats("bleu", h, r, **kwargs) for h, r in zip(HYPS, REFS)]
    assert M.corpus_score_from_stats("bleu", stats, **kwargs) == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS], **kwargs).score)
    cstats = [M.corpus_stats("chrf", h, r) for h, r in zip(HYPS, REFS)]
    assert M.corpus_score_from_stats("chrf", cstats) == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)


def test_chinese_bleu_uses_zh_tokenizer() -> None:
    hyp, ref = ["我们今天去公园玩"], ["我们今天去公园散步"]
    stats = [M.corpus_stats("bleu", hyp[0], ref[0], tokenize="zh")]
    assert M.corpus_score_from_stats("bleu", stats, tokenize="zh") == pytest.approx(
        sacrebleu.corpus_bleu(hyp, [ref], tokenize="zh").score)
    assert M.corpus_score_from_stats("bleu", stats, tokenize="zh") > 0


def test_bootstrap_ci_brackets_the_mean() -> None:
    values = [1.0] * 30 + [0.0] * 70
    lo, hi = M.bootstrap_ci(values, n_resamples=500, seed=1)
    assert lo < 0.3 < hi and 0.1 < lo and hi < 0.5
    assert M.bootstrap_ci([1.0, 1.0], n_resamples=50) == (1.0, 1.0)
    stats = [M.corpus_stats("bleu", h, r) for h, r in zip(HYPS, REFS)]
    lo, hi = M.bootstrap_corpus_ci("bleu", stats, n_resamples=200, seed=0)
    assert 0 <= lo <= M.corpus_score_from_stats("bleu", stats) <= hi <= 100


@pytest.mark.parametrize("output, expected", [
    (r"So \(\boxed{5}\).", "5"), (r"\[\boxed{1,260}\]", "1260"), (r"\boxed{\$18.00}", "18"),
    (r"\boxed{18 \text{ km}}", "18"), (r"\boxed{\dfrac{15}{4}}", "3.75"), (r"\boxed{-\frac{3}{4}}", "-0.75"),
    (r"\boxed{1{,}000}", "1000"), (r"\boxed{1\,000}", "1000"), (r"first \boxed{3} then \boxed{4}", "4"),
    (r"\boxed{\text{no number}} The answer is 7.", "7"),   # a box without a number: the fallback
    ("no box; the answer is 12. Later 13", "12"), ("just 3 and 8", "8"), ("nothing", ""),
    (r"\boxed{x + \frac{1}{2}}", "1"),                      # not a leading fraction: the box's first number
])
def test_boxed_number_reads_the_last_box_then_falls_back(output: str, expected: str) -> None:
    assert M.boxed_number(output) == expected


def test_bleu_at_a_fixed_brevity_penalty_is_bleu_over_its_penalty() -> None:
    hyps, refs = ["the cat sat on the mat", "a dog"], ["the cat sat on the mat today", "a big dog barked loudly"]
    stats = [M.corpus_stats("bleu_bp1", h, r) for h, r in zip(hyps, refs)]
    assert stats == [M.corpus_stats("bleu", h, r) for h, r in zip(hyps, refs)]  # BLEU's own statistics
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    assert bleu.bp < 0.9
    assert M.corpus_score_from_stats("bleu_bp1", stats) == pytest.approx(bleu.score / bleu.bp)
    long = [M.corpus_stats("bleu", r + " and more words", r) for r in refs]  # longer than the references: BP 1
    assert M.corpus_score_from_stats("bleu_bp1", long) == pytest.approx(M.corpus_score_from_stats("bleu", long))
