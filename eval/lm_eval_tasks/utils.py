"""Data and scoring of the lm-eval tasks in this folder, so that they ask and score exactly what
our harness's tasks (`eval/tasks/*.yaml`) do. lm-eval imports this file by path (`!function
utils.NAME` in the task YAMLs); importing it also registers `--model adafuse`, so the stock
`lm_eval` command finds the model when these tasks are given as YAML paths.

- `local_json`: the task's `dataset_kwargs.data_files` (paths relative to the data folder) read by
  `datasets`' json builder from local files only, each split cut to `dataset_kwargs.rows`
  ([start, stop) row indices of its file, kept as the doc `id`). The data folder: `--metadata
  '{"data_dir": "DIR"}'`, else `$ADAFUSE_DATA`, else `../shared/data` (`eval.data.resolve_data_dir`).
- `gsm8k_docs`, `nq_open_docs`: the fields our harness's docs have (`gold`, `target`).
- `gsm8k_results`, `nq_open_results`: our harness's answer filter and metrics, by its task files.
"""
from __future__ import annotations

import functools
from typing import Any

import eval.lm_eval_model  # noqa: F401  (registers --model adafuse)
from eval.data import gsm8k_cot, gsm8k_gold, resolve_data_dir
from eval.task import get_task


def local_json(data_files: dict[str, str], rows: dict[str, list[int]] | None = None, data_dir: str | None = None,
               **_metadata: Any):
    """A `datasets.DatasetDict` of the local JSON-lines files (see the module docstring)."""
    import datasets

    root = resolve_data_dir(data_dir)
    splits = {}
    for split, rel in data_files.items():
        path = root / rel
        if not path.is_file():
            from eval.data import DataNotFoundError, DATA_HINT

            raise DataNotFoundError(f"data file not found: {path}; {DATA_HINT} (lm-eval: --metadata '{{\"data_dir\": \"DIR\"}}')")
        data = datasets.load_dataset("json", data_files=str(path), split="train")
        data = data.add_column("id", list(range(len(data))))
        if rows and split in rows:
            start, stop = rows[split]
            data = data.select(range(start, min(stop, len(data))))
        splits[split] = data
    return datasets.DatasetDict(splits)


def gsm8k_docs(dataset):
    return dataset.map(lambda r: {"gold": gsm8k_gold(r["answer"]), "target": gsm8k_cot(r["answer"])})


def nq_open_docs(dataset):
    return dataset.map(lambda r: {"gold": list(r["answer"]), "target": r["answer"][0]})


@functools.lru_cache(maxsize=None)
def _task(name: str):
    return get_task(name)


def _results(name: str, doc: dict, results: list[str]) -> dict[str, float]:
    task = _task(name)
    scores, _ = task.score(task.extract(results[0]), doc)
    return scores


def gsm8k_results(doc: dict, results: list[str]) -> dict[str, float]:
    return _results("gsm8k", doc, results)


def nq_open_results(doc: dict, results: list[str]) -> dict[str, float]:
    return _results("nq_open", doc, results)
