"""Tasks declared in YAML (`eval/tasks/*.yaml`, lm-evaluation-harness style) and their registry.

A task file names a dataset loader (`eval.data.DATASETS`), a prompt template (`doc_to_text`,
`doc_to_target` as `str.format` templates over doc fields), stop strings (`until`), an
answer-extraction filter (`eval.metrics.FILTERS`), a metric list and a version. `include: FILE`
merges a base file (the including file wins). Files whose name starts with `_` are bases only.
`split` ("test", the default, or "dev": the rows `adafuse tune` chooses settings on; see
`eval.data`) picks which rows of the dataset are evaluated.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from runtime.errors import ConfigError
from runtime.prompts import FewShotPrompt
from eval import metrics as M
from eval.data import DATASETS, SPLITS, Doc, check_range
from runtime.schema import Field, validate

TASK_DIR = Path(__file__).resolve().parent / "tasks"

TASK_SCHEMA: dict[str, Field] = {
    "include": Field((str,)),
    "task": Field((str,), required=True),
    "version": Field((int, float, str), required=True),
    "dataset": Field((str,), required=True, choices=tuple(DATASETS)),
    "dataset_kwargs": Field((dict,)),
    "num_fewshot": Field((int,)),
    "fewshot_reserved": Field((int,)),
    "description": Field((str,)),
    "doc_to_text": Field((str,), required=True),
    "doc_to_target": Field((str,)),
    "target_delimiter": Field((str,)),
    "fewshot_delimiter": Field((str,)),
    "until": Field((list,), item=Field((str,))),
    "filter": Field((str,), choices=tuple(M.FILTERS)),
    "metric_list": Field((list,), required=True, item=Field((dict,))),
    "generation_kwargs": Field((dict,), fields={"max_new_tokens": Field((int,)), "temperature": Field((float,))}),
    "split": Field((str,), choices=SPLITS),
}


@dataclass
class Task:
    """A loaded task: how to build prompts, extract answers and score them."""

    name: str
    version: str
    dataset: str
    doc_to_text: str
    metric_list: list[dict[str, Any]]
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    num_fewshot: int = 0
    fewshot_reserved: int | None = None
    description: str = ""
    doc_to_target: str = "{target}"
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    until: list[str] = field(default_factory=list)
    filter: str = "strip"
    generation_kwargs: dict[str, Any] = field(default_factory=dict)
    split: str = "test"

    @property
    def metric_names(self) -> list[str]:
        return [m["metric"] for m in self.metric_list]

    @property
    def primary_metric(self) -> str:
        return self.metric_names[0]

    def with_overrides(self, **overrides: Any) -> "Task":
        """A copy with e.g. `num_fewshot` or `until` replaced (None values are ignored)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def check_range(self, limit: int | None) -> None:
        """One-line `ConfigError` if the exemplars or the first `limit` test rows would reach the dev rows."""
        check_range(self.dataset, self.split, limit, self.num_fewshot, self.fewshot_reserved)

    def load(self, data_dir: Path, pool: int = 0) -> tuple[list[Doc], list[Doc]]:
        """(the `split`'s docs, the exemplar docs: the `num_fewshot` a prompt shows, or the first `pool`
        of the reserved exemplars where views choose among more); exemplars never come from the
        evaluated rows, test rows never from the dev rows. GSM8K's exemplars are train rows, so its
        pool grows as asked; the other tasks' pool is their `fewshot_reserved` rows."""
        need = max(self.num_fewshot, pool)
        reserved = self.fewshot_reserved
        if self.dataset == "gsm8k" and need > (reserved or 0):
            reserved = need
        docs, found = DATASETS[self.dataset](data_dir, need if self.dataset == "gsm8k" else self.num_fewshot, reserved,
                                             split=self.split, **self.dataset_kwargs)
        if need > len(found):
            what = f"num_fewshot={self.num_fewshot}" if need == self.num_fewshot else f"views choosing among {need}"
            raise ConfigError(f"task {self.name}: {what} exemplars but only {len(found)} are reserved (rows "
                              f"0..{len(found) - 1}; the evaluated rows start after them): choose exemplars in that "
                              f"range, or raise fewshot_reserved in the task file")
        return docs, found[:need]

    def prompt(self, doc: Doc, shots: list[Doc]) -> str:
        """description + the first `num_fewshot` solved exemplars of `shots` + the doc's question,
        lm-eval style; also as chat turns. The prompt keeps every exemplar of `shots` as its pool
        (`runtime.prompts.FewShotPrompt`), so a view can show others."""
        pairs = [(self.doc_to_text.format(**s), self.doc_to_target.format(**s)) for s in shots]
        # chat members see the exemplars as user/assistant turns (lm-eval's fewshot_as_multiturn)
        return FewShotPrompt(self.doc_to_text.format(**doc), pairs, range(min(self.num_fewshot, len(pairs))),
                             self.description, self.target_delimiter, self.fewshot_delimiter)

    def extract(self, output: str) -> str:
        return M.FILTERS[self.filter](output)

    def score(self, extracted: str, doc: Doc) -> tuple[dict[str, float], dict[str, list[int]]]:
        """Per-example scores of mean metrics and (for BLEU/chrF) sentence-level scores plus corpus statistics."""
        scores: dict[str, float] = {}
        stats: dict[str, list[int]] = {}
        for spec in self.metric_list:
            name, kwargs = spec["metric"], {k: v for k, v in spec.items() if k != "metric"}
            if name in M.CORPUS_METRICS:
                key = M.stats_key(name)  # (BLEU at a fixed brevity penalty reads BLEU's statistics)
                stats[key] = stats.get(key) or M.corpus_stats(name, extracted, doc["gold"], **kwargs)
                scores[name] = M.corpus_score_from_stats(name, [stats[key]], **kwargs)
            else:
                scores[name] = M.MEAN_METRICS[name](extracted, doc["gold"])
        return scores, stats

    def aggregate(self, records: list[dict], *, n_resamples: int = 1000, seed: int = 0) -> dict[str, dict[str, float]]:
        """{metric: {"value", "ci_low", "ci_high"}} over prediction records (corpus metrics exact, CI by bootstrap)."""
        out: dict[str, dict[str, float]] = {}
        for spec in self.metric_list:
            name, kwargs = spec["metric"], {k: v for k, v in spec.items() if k != "metric"}
            if name in M.CORPUS_METRICS:
                lo, hi = M.bootstrap_corpus_ci(name, [M.record_stats(r, name) for r in records], n_resamples=n_resamples,
                                               seed=seed, **kwargs)
            else:
                lo, hi = M.bootstrap_ci([r["scores"][name] for r in records], n_resamples=n_resamples, seed=seed)
            out[name] = {"value": _metric_value(spec, records), "ci_low": lo, "ci_high": hi}
        return out

    def values(self, records: list[dict]) -> dict[str, float]:
        """{metric: value} over prediction records (the `value`s of `aggregate`, without intervals)."""
        return {spec["metric"]: _metric_value(spec, records) for spec in self.metric_list}

    def running_score(self, records: list[dict]) -> float:
        """The primary metric over the records so far (for the progress bar)."""
        return _metric_value(self.metric_list[0], records)

    def fingerprint(self) -> dict[str, Any]:
        """What must match for saved predictions to be reused on resume."""
        return {"task": self.name, "version": self.version, "num_fewshot": self.num_fewshot,
                "fewshot_reserved": self.fewshot_reserved, "doc_to_text": self.doc_to_text, "until": self.until,
                "filter": self.filter, "dataset_kwargs": self.dataset_kwargs,
                **({"split": self.split} if self.split != "test" else {})}  # test: as before splits existed


def _metric_value(spec: dict[str, Any], records: list[dict]) -> float:
    """One metric over records: a corpus metric from summed statistics, a mean metric as the mean (nan if none)."""
    name, kwargs = spec["metric"], {k: v for k, v in spec.items() if k != "metric"}
    if not records:
        return float("nan")
    if name in M.CORPUS_METRICS:
        return M.corpus_score_from_stats(name, [M.record_stats(r, name) for r in records], **kwargs)
    return float(sum(r["scores"][name] for r in records) / len(records))


def _read_task_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if path in seen:
        raise ConfigError(f"{path}: include cycle")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a task file must be a mapping")
    if "include" in data:
        base = _read_task_yaml((path.parent / str(data["include"])).resolve(), seen + (path,))
        data = {**base, **{k: v for k, v in data.items() if k != "include"}}
    return data


def load_task_file(path: str | Path) -> Task:
    """Parse and validate one task YAML file."""
    path = Path(path).resolve()
    data = _read_task_yaml(path)
    validate(data, TASK_SCHEMA, str(path))
    for i, spec in enumerate(data["metric_list"]):
        name = spec.get("metric")
        if name not in M.MEAN_METRICS and name not in M.CORPUS_METRICS:
            known = ", ".join([*M.MEAN_METRICS, *M.CORPUS_METRICS])
            raise ConfigError(f"{path}: metric_list[{i}].metric must be one of {known}, got {name!r}")
    kwargs = {k: v for k, v in data.items() if k not in ("task", "version", "include")}
    return Task(name=data["task"], version=str(data["version"]), **kwargs)


def available_tasks() -> dict[str, Path]:
    """Task name -> YAML file, for the built-in tasks."""
    out: dict[str, Path] = {}
    for path in sorted(TASK_DIR.glob("*.yaml")):
        if not path.name.startswith("_"):
            data = _read_task_yaml(path)
            out[str(data.get("task", path.stem))] = path
    return out


def get_task(name: str, **overrides: Any) -> Task:
    """A built-in task by name, or a task YAML file by path; `overrides` replace task fields."""
    tasks = available_tasks()
    if name in tasks:
        task = load_task_file(tasks[name])
    elif name.endswith((".yaml", ".yml")) and Path(name).is_file():
        task = load_task_file(name)
    else:
        import difflib

        close = difflib.get_close_matches(name, list(tasks), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"unknown task '{name}'{hint}; available: {', '.join(tasks)} (or a path to a task .yaml)")
    return task.with_overrides(**overrides)
