"""Our strict task metrics as a Hugging Face `evaluate` module, loadable from a local path (no hub).

    import evaluate
    from eval.adafuse_strict import PATH
    gsm8k = evaluate.load(PATH, "gsm8k")
    gsm8k.compute(predictions=["... so the answer is 18."], references=["18"])  # {'exact_match_number': 1.0}

The config name is a task of ours (`eval.task.available_tasks()`: gsm8k, nq_open, wmt22_de_en, wmt22_en_zh, ...;
"wmt" = wmt22_de_en). Scores are computed by that task itself — its answer filter (`Task.extract`), per-row
`Task.score` and `Task.values` — so they are the numbers `adafuse eval` writes to metrics.json (EM/F1 as
fractions, BLEU/chrF 0-100 as sacreBLEU). nq_open takes a list of gold aliases per row. `raw_outputs=False`
scores the predictions as given (no answer extraction); `tokenize="zh"` sets BLEU's tokenizer.
"""
from __future__ import annotations

import datasets
import evaluate

from eval.task import Task, available_tasks, get_task

PATH = __file__
ALIASES = {"wmt": "wmt22_de_en"}
LIST_GOLD = {"nq_open"}  # tasks whose gold is a list of aliases


def _task(config_name: str) -> Task:
    name = ALIASES.get(config_name, config_name)
    if name not in available_tasks():
        raise ValueError(f"unknown adafuse_strict config {config_name!r}; use one of "
                         f"{sorted(set(available_tasks()) - {'_wmt22'} | set(ALIASES))}")
    return get_task(name)


class AdafuseStrict(evaluate.Metric):
    """adafuse's strict task metrics; config name = task."""

    def _info(self) -> evaluate.MetricInfo:
        task = _task(self.config_name)
        gold = datasets.Sequence(datasets.Value("string")) if task.name in LIST_GOLD else datasets.Value("string")
        return evaluate.MetricInfo(
            description="adafuse's strict task metrics (GSM8K final-number match, NQ-open EM/F1 over aliases, "
                        "WMT corpus BLEU/chrF), identical to `adafuse eval`'s scores.",
            citation="", inputs_description=__doc__,
            features=datasets.Features({"predictions": datasets.Value("string"), "references": gold}))

    def _compute(self, predictions, references, raw_outputs: bool = True, tokenize: str | None = None
                 ) -> dict[str, float]:
        task = _task(self.config_name)
        if tokenize:
            task = task.with_overrides(metric_list=[{**spec, "tokenize": tokenize} if spec["metric"] == "bleu" else spec
                                                    for spec in task.metric_list])
        records = []
        for prediction, gold in zip(predictions, references):
            scores, stats = task.score(task.extract(prediction) if raw_outputs else prediction, {"gold": gold})
            records.append({"scores": scores, "stats": stats})
        return task.values(records)
