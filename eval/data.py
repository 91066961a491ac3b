"""Benchmark data: where it lives and how each dataset is read into docs.

A doc is a dict with at least `id` (the row index in its source file), `gold` (what the metrics
compare against) and `target` (the answer text used when the doc is a few-shot exemplar).
Loaders return `(eval_docs, fewshot_docs)` of a `split` ("test", the default, or "dev"); the
exemplars, the test rows and the dev rows never overlap. Dev rows start at a fixed, documented row
(`DEV_START`) and are what `adafuse tune` chooses settings on; the test split stops before it:

- gsm8k: test = test.jsonl; exemplars = the first rows of train.jsonl; dev = train.jsonl rows
  1000-2999; heldout = train.jsonl rows 3000-3399, a GSM8K-style test set that no run read before
  it was declared (every test.jsonl row had been evaluated); ids are train.jsonl row indices.
- nq_open: the first `fewshot_reserved` rows of dev.jsonl (default 8) are the exemplar pool and are
  never evaluated; test = rows [fewshot_reserved, 2000); dev = rows from 2000 on (ids are file row
  indices).
- wmt22: the same split of `{pair}.src/.ref` lines: exemplars [0, fewshot_reserved), test
  [fewshot_reserved, 1000), dev from line 1000 on.

`check_range` refuses (one-line `ConfigError`) a test range that would reach the dev rows.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable

from runtime.errors import ConfigError
from runtime.files import read_text

Doc = dict[str, Any]
SPLITS = ("test", "dev", "heldout")
# first dev row of each dataset (a row index of gsm8k/train.jsonl, nq_open/dev.jsonl, wmt22/{pair}.src)
DEV_START: dict[str, int] = {"gsm8k": 1000, "nq_open": 2000, "wmt22": 1000}
# rows of a dataset kept out of its dev rows as a second test set: [start, end) (GSM8K's train rows)
HELDOUT: dict[str, tuple[int, int]] = {"gsm8k": (3000, 3400)}
DATA_HINT = "pass --data_dir DIR (or set ADAFUSE_DATA) to the folder holding gsm8k/, nq_open/ and wmt22/"


class DataError(ConfigError):
    """A benchmark file is missing or unreadable (binary, not UTF-8, not JSON, rows without fields)."""


class DataNotFoundError(DataError, FileNotFoundError):
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


def _text_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (no newlines); a binary or non-UTF-8 file, or one without any
    text, is a one-line DataError naming the file (and the line)."""
    text = read_text(_require(path), "benchmark text", "fix or restore the file", DataError)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # universal newlines, as open() reads
    return lines[:-1] if lines[-1] == "" else lines


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(_text_lines(path), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{path}: line {n} is not JSON ({exc.msg}); fix or restore the file") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}: line {n} is not a JSON object; fix or restore the file")
        rows.append(row)
    return rows


def _read_lines(path: Path) -> list[str]:
    return _text_lines(path)


def _docs(path: Path, rows: list, make: Callable[[int, Any], Doc]) -> list[Doc]:
    """`make(i, row)` for every row; a row without the fields a doc needs is a one-line DataError."""
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(make(i, row))
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            what = f"field {exc}" if isinstance(exc, KeyError) else f"a well-formed field ({exc})"
            raise DataError(f"{path}: row {i + 1} lacks {what}; fix or restore the file") from None
    return out


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


def _check_split(split: str, dataset: str | None = None) -> None:
    if split not in SPLITS:
        raise ConfigError(f"split {split!r} is invalid: one of {', '.join(SPLITS)}")
    if split == "heldout" and dataset is not None and dataset not in HELDOUT:
        raise ConfigError(f"{dataset} has no heldout split (only {', '.join(HELDOUT)}); use split test or dev")


def check_range(dataset: str, split: str, limit: int | None, num_fewshot: int, fewshot_reserved: int | None) -> None:
    """Raise a one-line `ConfigError` (without a file prefix) if the exemplars, or the first `limit`
    test rows, would reach the dev rows of `dataset`; dev ranges end where the file (or the heldout rows)
    begin, so any limit is fine."""
    _check_split(split, dataset)
    start = DEV_START.get(dataset)
    if start is None:
        return
    reserved = _reserved(dataset, fewshot_reserved)
    pool = max(num_fewshot, reserved)
    if pool > start:
        raise ConfigError(f"{dataset}: {pool} exemplar rows would reach the dev rows (row {start} on); use at most {start}")
    if split == "test" and limit is not None and dataset != "gsm8k" and reserved + limit > start:
        raise ConfigError(f"{dataset}: limit {limit} would reach the dev rows (row {start} on): test rows are "
                          f"{reserved}..{start - 1}, so limit <= {start - reserved}")


def _reserved(dataset: str, fewshot_reserved: int | None) -> int:
    if fewshot_reserved is not None:
        return fewshot_reserved
    return 0 if dataset == "gsm8k" else 8


def _gsm8k_doc(i: int, r: dict) -> Doc:
    return {"id": i, "question": r["question"], "gold": gsm8k_gold(r["answer"]), "target": gsm8k_cot(r["answer"])}


def load_gsm8k(data_dir: Path, num_fewshot: int, fewshot_reserved: int | None = None,
               split: str = "test") -> tuple[list[Doc], list[Doc]]:
    check_range("gsm8k", split, None, num_fewshot, fewshot_reserved)
    test_path, train_path = data_dir / "gsm8k" / "test.jsonl", data_dir / "gsm8k" / "train.jsonl"
    test = _read_jsonl(test_path) if split == "test" else []
    train = _read_jsonl(train_path) if num_fewshot or split != "test" else []
    rows, path = (test, test_path) if split == "test" else (train, train_path)
    held = HELDOUT["gsm8k"]
    first, end = {"test": (0, None), "dev": (DEV_START["gsm8k"], held[0]), "heldout": held}[split]
    docs = _docs(path, rows, _gsm8k_doc)[first:end]
    shots = _docs(train_path, train[: max(num_fewshot, fewshot_reserved or 0)], _gsm8k_doc) if num_fewshot else []
    return docs, shots


def _split_rows(dataset: str, docs: list[Doc], split: str, fewshot_reserved: int | None,
                num_fewshot: int) -> tuple[list[Doc], list[Doc]]:
    """(the split's rows, the exemplar pool) of one file's docs: pool [0, reserved), test
    [reserved, DEV_START), dev [DEV_START, end)."""
    check_range(dataset, split, None, num_fewshot, fewshot_reserved)
    reserved, start = _reserved(dataset, fewshot_reserved), DEV_START[dataset]
    rows = docs[start:] if split == "dev" else docs[reserved:start]
    return rows, docs[:reserved]


def load_nq_open(data_dir: Path, num_fewshot: int, fewshot_reserved: int | None = None,
                 split: str = "test") -> tuple[list[Doc], list[Doc]]:
    path = data_dir / "nq_open" / "dev.jsonl"
    docs = _docs(path, _read_jsonl(path),
                 lambda i, r: {"id": i, "question": r["question"], "gold": list(r["answer"]), "target": r["answer"][0]})
    return _split_rows("nq_open", docs, split, fewshot_reserved, num_fewshot)


_LANGS = {"de": "German", "en": "English", "zh": "Chinese", "cs": "Czech", "ru": "Russian", "ja": "Japanese"}


def load_wmt22(data_dir: Path, num_fewshot: int, fewshot_reserved: int | None = None, pair: str = "de-en",
               split: str = "test") -> tuple[list[Doc], list[Doc]]:
    src = _read_lines(data_dir / "wmt22" / f"{pair}.src")
    ref = _read_lines(data_dir / "wmt22" / f"{pair}.ref")
    if len(src) != len(ref):
        raise ConfigError(f"{data_dir / 'wmt22' / pair}.src/.ref have {len(src)} and {len(ref)} lines; they must align")
    s, t = pair.split("-")
    names = {"src_lang": _LANGS.get(s, s), "tgt_lang": _LANGS.get(t, t)}
    docs = [{"id": i, "src": a, "gold": b, "target": b, **names} for i, (a, b) in enumerate(zip(src, ref))]
    return _split_rows("wmt22", docs, split, fewshot_reserved, num_fewshot)


DATASETS: dict[str, Callable[..., tuple[list[Doc], list[Doc]]]] = {
    "gsm8k": load_gsm8k,
    "nq_open": load_nq_open,
    "wmt22": load_wmt22,
}
