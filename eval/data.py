"""Benchmark data: where it lives and how each dataset is read into docs.

A doc is a dict with at least `id` (the row index in its source file), `gold` (what the metrics
compare against) and `target` (the answer text used when the doc is a few-shot exemplar).
Loaders return `(eval_docs, fewshot_docs)`; the two never overlap:

- gsm8k: eval = test.jsonl, exemplars = the first rows of train.jsonl.
- nq_open: the first `fewshot_reserved` rows of dev.jsonl (default 8) are the exemplar pool and are
  never evaluated; evaluation starts at row `fewshot_reserved` (ids are file row indices).
- wmt22: same split of `{pair}.src/.ref` lines: rows [0, fewshot_reserved) are exemplars.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable

from runtime.errors import ConfigError

Doc = dict[str, Any]
DATA_HINT = "pass --data_dir DIR (or set ADAFUSE_DATA) to the folder holding gsm8k/, nq_open/ and wmt22/"


class DataNotFoundError(ConfigError, FileNotFoundError):
    """A benchmark file or the data folder is missing."""


def default_data_dir() -> Path:
    """`$ADAFUSE_DATA`, else `../shared/data` from the repo root, else `../shared/data` or `shared/data` from cwd."""
    env = os.environ.get("ADAFUSE_DATA")
    if env:
        return Path(env).expanduser()
    candidates = [Path(__file__).resolve().parents[2] / "shared" / "data",
                  Path.cwd().parent / "shared" / "data", Path.cwd() / "shared" / "data"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return candidates[0]


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """The data folder to use; raises `DataNotFoundError` naming the path and the fix if it is absent."""
    path = Path(data_dir).expanduser() if data_dir else default_data_dir()
    if not path.is_dir():
        raise DataNotFoundError(f"data folder not found: {path}; {DATA_HINT}")
    return path.resolve()


def _require(path: Path) -> Path:
    if not path.is_file():
        raise DataNotFoundError(f"data file not found: {path}; {DATA_HINT}")
    return path


def _read_jsonl(path: Path) -> list[dict]:
    with open(_require(path), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _read_lines(path: Path) -> list[str]:
    with open(_require(path), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


_CALC = re.compile(r"<<[^>]*>>")


def gsm8k_gold(answer: str) -> str:
    """The gold number: what follows `#### ` in a GSM8K answer, commas stripped."""
    return answer.split("####")[-1].strip().replace(",", "")


def gsm8k_cot(answer: str) -> str:
    """A train answer as a one-paragraph chain of thought ending "The answer is N."
    (calculator annotations `<<...>>` removed)."""
    reasoning, _, _ = answer.partition("####")
    lines = [line.strip() for line in _CALC.sub("", reasoning).splitlines() if line.strip()]
    return " ".join(lines + [f"The answer is {gsm8k_gold(answer)}."])


def load_gsm8k(data_dir: Path, num_fewshot: int, fewshot_reserved: int | None = None) -> tuple[list[Doc], list[Doc]]:
    test = _read_jsonl(data_dir / "gsm8k" / "test.jsonl")
    docs = [{"id": i, "question": r["question"], "gold": gsm8k_gold(r["answer"]), "target": gsm8k_cot(r["answer"])}
            for i, r in enumerate(test)]
    shots: list[Doc] = []
    if num_fewshot:
        train = _read_jsonl(data_dir / "gsm8k" / "train.jsonl")[: max(num_fewshot, fewshot_reserved or 0)]
        shots = [{"id": i, "question": r["question"], "gold": gsm8k_gold(r["answer"]), "target": gsm8k_cot(r["answer"])}
                 for i, r in enumerate(train)]
    return docs, shots


def load_nq_open(data_dir: Path, num_fewshot: int, fewshot_reserved: int | None = None) -> tuple[list[Doc], list[Doc]]:
    rows = _read_jsonl(data_dir / "nq_open" / "dev.jsonl")
    reserved = 8 if fewshot_reserved is None else fewshot_reserved
    docs = [{"id": i, "question": r["question"], "gold": list(r["answer"]), "target": r["answer"][0]}
            for i, r in enumerate(rows)]
    return docs[reserved:], docs[:reserved]


_LANGS = {"de": "German", "en": "English", "zh": "Chinese", "cs": "Czech", "ru": "Russian", "ja": "Japanese"}


def load_wmt22(data_dir: Path, num_fewshot: int, fewshot_reserved: int | None = None, pair: str = "de-en") -> tuple[list[Doc], list[Doc]]:
    src = _read_lines(data_dir / "wmt22" / f"{pair}.src")
    ref = _read_lines(data_dir / "wmt22" / f"{pair}.ref")
    if len(src) != len(ref):
        raise ConfigError(f"{data_dir / 'wmt22' / pair}.src/.ref have {len(src)} and {len(ref)} lines; they must align")
    s, t = pair.split("-")
    names = {"src_lang": _LANGS.get(s, s), "tgt_lang": _LANGS.get(t, t)}
    reserved = 8 if fewshot_reserved is None else fewshot_reserved
    docs = [{"id": i, "src": a, "gold": b, "target": b, **names} for i, (a, b) in enumerate(zip(src, ref))]
    return docs[reserved:], docs[:reserved]


DATASETS: dict[str, Callable[..., tuple[list[Doc], list[Doc]]]] = {
    "gsm8k": load_gsm8k,
    "nq_open": load_nq_open,
    "wmt22": load_wmt22,
}
