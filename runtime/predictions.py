"""Reading `predictions.jsonl` (one JSON record per line, appended by `eval.runner`), for resuming
and for reports.

A record is a JSON object with at least `RECORD_KEYS`. A last line cut short (no final newline, or
not JSON) is a write a kill or a full disk stopped: `read_predictions` cuts it off with a warning;
any other line that is not a record is a one-line `ConfigError` naming the file and the line.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from runtime.errors import ConfigError
from runtime.files import exclusive

PREDICTIONS = "predictions.jsonl"
RECORD_KEYS = ("id", "score", "scores", "cost", "num_tokens", "finish_reason", "wall_s")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def _parse_line(chunk: bytes, required: tuple[str, ...] = RECORD_KEYS) -> tuple[dict | None, str | None]:
    """(record, None) for a prediction record (a JSON object with the `required` keys), else (None, why not)."""
    try:
        rec = json.loads(chunk.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except ValueError:
        return None, "not JSON"
    if not isinstance(rec, dict) or any(k not in rec for k in required):
        missing = [k for k in required if not isinstance(rec, dict) or k not in rec]
        return None, f"JSON without {', '.join(repr(k) for k in missing[:3])}"
    return rec, None


def parse_predictions(path: Path, required: tuple[str, ...] = RECORD_KEYS
                      ) -> tuple[list[dict], tuple[int, int] | None]:
    """(records, first occurrence of each id; (byte offset, line number) of a torn last line or None).
    A torn last line has no final newline or is not JSON; any other bad line raises ConfigError."""
    lines = path.read_bytes().split(b"\n")
    last = max((i for i, chunk in enumerate(lines) if chunk.strip()), default=-1)
    records: dict[Any, dict] = {}
    offset = 0
    for i, chunk in enumerate(lines):
        if chunk.strip():
            rec, why = _parse_line(chunk, required)
            if i == last and (i == len(lines) - 1 or why == "not JSON"):
                return list(records.values()), (offset, i + 1)
            if why is not None:
                raise ConfigError(f"{path}: line {i + 1} is not a prediction record ({why}); delete that line "
                                  f"(or the whole folder) and rerun")
            records.setdefault(rec["id"], rec)
        offset += len(chunk) + 1
    return list(records.values()), None


def read_predictions(path: Path, warn: Callable[[str], None] | None = None,
                     required: tuple[str, ...] = RECORD_KEYS) -> list[dict]:
    """Complete records of a predictions file, the first occurrence of each id (shards of different N
    may both write one). A last line cut short (no final newline, or not JSON: a write stopped by a
    kill or a full disk) is cut off the file with a warning (`warn`, default stderr), so the example
    is computed again; any other line that is not a record (a JSON object with the `required` keys)
    is a one-line ConfigError naming it."""
    if not path.exists():
        return []
    records, torn = parse_predictions(path, required)
    if torn is not None:
        with exclusive(path):  # no append in flight (appends hold a shared lock): look again
            records, torn = parse_predictions(path, required)
            if torn is not None:
                os.truncate(path, torn[0])
                (warn or _stderr)(f"warning: {path}: line {torn[1]} was cut short by an interrupted write; "
                                  f"dropped it, that example is computed again")
    return records
