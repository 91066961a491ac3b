"""Answer-extraction filters, per-example scores and corpus metrics (all pure functions).

Filters map a raw model output to the answer that is scored. Metrics come in two kinds:
`mean` metrics score each example and average; `corpus` metrics (BLEU, chrF) keep per-sentence
sacreBLEU sufficient statistics so that the corpus score and its bootstrap CI are exact.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Sequence

import numpy as np

# ---------------------------------------------------------------------------------------------
# filters

# a number: optional sign (not glued to a word/number, so "3-5" is not -5), optional $, digits
# with thousands separators or plain, optional decimals.
_NUMBER = re.compile(r"(?<![\w.])(-)?\$?\s?(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?!\d)")
_SENTENCE_END = re.compile(r"\n|\.(?!\d)|[!?;]")
_ANSWER_IS = re.compile(r"answer\s+is\b|####", re.IGNORECASE)


def normalize_number(text: str) -> str:
    """Canonical string of a number: "1,000" -> "1000", "$18." -> "18", "18.00" -> "18", "-0.50" -> "-0.5".
    Returns the stripped input when it is not a number."""
    s = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        value = Decimal(s)
    except InvalidOperation:
        return text.strip()
    if not value.is_finite():
        return text.strip()
    out = format(value.normalize(), "f")
    return "0" if out in ("-0", "0") else out


def _numbers(text: str) -> list[str]:
    return [(sign or "") + digits for sign, digits in _NUMBER.findall(text)]


def gsm8k_final_number(output: str) -> str:
    """The number after the first "The answer is" / "####" (in the same sentence) if there is one,
    else the last number in the output; normalised with `normalize_number`; "" if none."""
    for match in _ANSWER_IS.finditer(output):
        rest = _SENTENCE_END.split(output[match.end():], 1)[0]  # the rest of that sentence
        found = _numbers(rest)
        if found:
            return normalize_number(found[0])
    found = _numbers(output)
    return normalize_number(found[-1]) if found else ""


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_LATEX_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_FRACTION = re.compile(r"^\s*(-)?\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")


def boxed_contents(output: str) -> list[str]:
    """The contents of every `\\boxed{...}` in `output`, braces balanced, in order (an unclosed box
    runs to the end of the text)."""
    out = []
    for match in _BOXED.finditer(output):
        depth, i = 1, match.end()
        while i < len(output) and depth:
            depth += {"{": 1, "}": -1}.get(output[i], 0)
            i += 1
        out.append(output[match.end(): i - 1 if depth == 0 else i])
    return out


def boxed_number(output: str) -> str:
    """The number in the last `\\boxed{...}` of the output (Qwen's and DeepSeek's math prompts: "put
    your final answer within \\boxed{}"; LaTeX wrappers like \\text{...}, \\$ and thousands
    separators read through), normalised with `normalize_number`; without a box holding a number,
    `gsm8k_final_number` (the number after "The answer is", else the last number); "" if none."""
    for box in reversed(boxed_contents(output)):
        text = _LATEX_WRAPPERS.sub(r" \1 ", box).replace("\\$", "$").replace("\\%", "%").replace("{,}", ",")
        text = text.replace("\\!", "").replace("\\,", ",")
        fraction = _FRACTION.match(text)
        if fraction and int(fraction.group(3)):
            value = Decimal(int(fraction.group(2))) / Decimal(int(fraction.group(3)))
            return normalize_number(str(-value if fraction.group(1) else value))
        found = _numbers(text)
        if found:
            return normalize_number(found[0])
    return gsm8k_final_number(output)


def first_line(output: str) -> str:
    """The first non-empty line, stripped."""
    for line in output.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


FILTERS: dict[str, Callable[[str], str]] = {
    "gsm8k_final_number": gsm8k_final_number,
    "boxed_number": boxed_number,
    "first_line": first_line,
    "strip": str.strip,
    "none": lambda s: s,
}

# ---------------------------------------------------------------------------------------------
# per-example metrics


def squad_normalize(text: str) -> str:
    """SQuAD answer normalisation: lower-case, drop punctuation, drop articles a/an/the, fold spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD token F1 between two answers after `squad_normalize`."""
    pred_tokens, gold_tokens = squad_normalize(prediction).split(), squad_normalize(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _aliases(gold: str | Sequence[str]) -> list[str]:
    return [gold] if isinstance(gold, str) else list(gold)


def exact_match(prediction: str, gold: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised alias."""
    p = squad_normalize(prediction)
    return float(any(p == squad_normalize(g) for g in _aliases(gold)))


def f1(prediction: str, gold: str | Sequence[str]) -> float:
    """Max token F1 over aliases."""
    return max((token_f1(prediction, g) for g in _aliases(gold)), default=0.0)


def exact_match_number(prediction: str, gold: str) -> float:
    """1.0 if both sides are the same number after `normalize_number` (so "18.00" == "18", "8" != "18")."""
    return float(prediction != "" and normalize_number(prediction) == normalize_number(gold))


MEAN_METRICS: dict[str, Callable[..., float]] = {
    "exact_match": exact_match,
    "f1": f1,
    "exact_match_number": exact_match_number,
}

# ---------------------------------------------------------------------------------------------
# corpus metrics (sacreBLEU)


def _sacrebleu_metric(name: str, **kwargs: Any):
    from sacrebleu.metrics import BLEU, CHRF

    return {"bleu": BLEU, "chrf": CHRF}[STATS_OF.get(name, name)](**kwargs)


CORPUS_METRICS = ("bleu", "chrf", "bleu_bp1")
# metrics computed from another metric's statistics: BLEU with its brevity penalty fixed at 1 (BLEU's
# statistics with the reference length set to the hypothesis length), the length control of an MT claim
STATS_OF = {"bleu_bp1": "bleu"}


def stats_key(name: str) -> str:
    """The name a corpus metric's per-sentence statistics are recorded under (`record["stats"]`)."""
    return STATS_OF.get(name, name)


def record_stats(record: dict[str, Any], name: str) -> list[int]:
    """A prediction record's sufficient statistics of corpus metric `name`."""
    return record["stats"][stats_key(name)]


def corpus_stats(name: str, hyp: str, ref: str, **kwargs: Any) -> list[int]:
    """Per-sentence sufficient statistics of a sacreBLEU corpus metric (summable over sentences)."""
    return [int(x) for x in _sacrebleu_metric(name, **kwargs)._extract_corpus_statistics([hyp], [[ref]])[0]]


def corpus_score_from_stats(name: str, stats: Sequence[Sequence[int]], **kwargs: Any) -> float:
    """Corpus BLEU/chrF from summed per-sentence statistics; equals `sacrebleu.corpus_<name>`
    (`bleu_bp1`: BLEU with the brevity penalty fixed at 1)."""
    if len(stats) == 0:
        return 0.0
    total = [int(x) for x in np.asarray(stats, dtype=np.int64).sum(axis=0)]
    if name == "bleu_bp1":
        total[1] = total[0]  # BLEU's statistics start (hypothesis length, reference length): BP = 1
    return float(_sacrebleu_metric(name, **kwargs)._compute_score_from_stats(total).score)


# ---------------------------------------------------------------------------------------------
# confidence intervals


def bootstrap_ci(values: Sequence[float], *, n_resamples: int = 1000, seed: int = 0, alpha: float = 0.05) -> tuple[float, float]:
    """Percentile bootstrap CI of a mean."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_resamples, len(x)))].mean(axis=1)
    return float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))


def bootstrap_corpus_ci(name: str, stats: Sequence[Sequence[int]], *, n_resamples: int = 1000, seed: int = 0,
                        alpha: float = 0.05, **kwargs: Any) -> tuple[float, float]:
    """Percentile bootstrap CI of a corpus metric, resampling sentences (statistics re-summed per draw)."""
    s = np.asarray(stats, dtype=np.int64)
    if len(s) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    scores = [corpus_score_from_stats(name, s[rng.integers(0, len(s), size=len(s))], **kwargs)
              for _ in range(n_resamples)]
    return float(np.quantile(scores, alpha / 2)), float(np.quantile(scores, 1 - alpha / 2))
