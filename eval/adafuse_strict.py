"""Our strict task metrics as a Hugging Face `evaluate` module, loadable from a local path (no hub).

    import evaluate
    from eval.adafuse_strict import PATH
    gsm8k = evaluate.load(PATH, "gsm8k")
    gsm8k.compute(predictions=["... so the answer is 18."], references=["18"])  # {'exact_match_number': 1.0}

Configs (the scores `adafuse eval` writes to metrics.json, from the same functions in `eval.metrics`:
EM/F1 as fractions, BLEU/chrF 0-100 as sacreBLEU):
- "gsm8k": the final number of each output (`gsm8k_final_number`) against the gold number
  (`exact_match_number`: "18.00" == "18", "8" != "18");
- "nq_open": the output's first line (`first_line`) against a list of gold aliases, SQuAD
  normalisation, `exact_match` and `f1` (max over aliases);
- "wmt": corpus `bleu` and `chrf` (sacreBLEU defaults, one reference per segment) of the first lines;
  `tokenize="zh"` for BLEU into Chinese.
`raw_outputs=False` scores the predictions as given (no answer extraction).
"""
from __future__ import annotations

import datasets
import evaluate

from eval.metrics import (corpus_score_from_stats, corpus_stats, exact_match, exact_match_number, f1, first_line,
                          gsm8k_final_number)

PATH = __file__

_FEATURES = {
    "gsm8k": datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
    "nq_open": datasets.Features({"predictions": datasets.Value("string"),
                                  "references": datasets.Sequence(datasets.Value("string"))}),
    "wmt": datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
}


class AdafuseStrict(evaluate.Metric):
    """adafuse's strict GSM8K / NQ-open / WMT metrics; config name = task."""

    def _info(self) -> evaluate.MetricInfo:
        if self.config_name not in _FEATURES:
            raise ValueError(f"unknown adafuse_strict config {self.config_name!r}; use one of {sorted(_FEATURES)}")
        return evaluate.MetricInfo(
            description="adafuse's strict task metrics (GSM8K final-number match, NQ-open EM/F1 over aliases, "
                        "WMT corpus BLEU/chrF), identical to `adafuse eval`'s scores.",
            citation="", inputs_description=__doc__, features=_FEATURES[self.config_name])

    def _compute(self, predictions, references, raw_outputs: bool = True, tokenize: str | None = None
                 ) -> dict[str, float]:
        task = self.config_name
        if task == "gsm8k":
            answers = [gsm8k_final_number(p) if raw_outputs else p for p in predictions]
            return {"exact_match_number": _mean([exact_match_number(a, g) for a, g in zip(answers, references)])}
        answers = [first_line(p) if raw_outputs else p for p in predictions]
        if task == "nq_open":
            return {"exact_match": _mean([exact_match(a, g) for a, g in zip(answers, references)]),
                    "f1": _mean([f1(a, g) for a, g in zip(answers, references)])}
        bleu = {"tokenize": tokenize} if tokenize else {}  # e.g. "zh" for English -> Chinese, as wmt22_en_zh.yaml
        return {name: corpus_score_from_stats(name, [corpus_stats(name, a, r, **kw) for a, r in zip(answers, references)], **kw)
                for name, kw in (("bleu", bleu), ("chrf", {}))}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
