"""What `adafuse bound` has finished, on disk, so a killed run resumes where it stopped.

- `save_record` / `load_record`: one prompt's cached logits (`torch.save`), written atomically (temp
  file, fsync, `os.replace`); a cache file that does not load or lacks its fields is reported and
  removed (`load_record` returns None: the caller computes it again), never used.
- `MeasureJournal`: one JSON line per measured (temperature, position) — α* per (n, scheme), each
  verifier's estimate and variance per n — appended as each position finishes. A rerun with the
  same settings (`settings_key`) reads it back and measures only the positions that are missing; a
  journal of other settings is set aside, a torn last line (a kill mid-write) dropped. Values
  round-trip through JSON exactly (floats as repr), so a resumed report equals an uninterrupted one.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from runtime.files import append_line, write_bytes_atomic

RECORD_KEYS = ("dataset", "text", "prompt_ids", "continuation", "target_logits")


def save_record(path: Path, record: dict[str, Any]) -> None:
    """`torch.save(record)` to `path`, atomically."""
    buf = io.BytesIO()
    torch.save(record, buf)
    write_bytes_atomic(path, buf.getvalue())


def load_record(path: Path, needs_draft: bool = True) -> dict[str, Any] | None:
    """The record at `path`, or None (the file is removed, with a warning) when it does not load or
    lacks a field (`draft_logits` too when `needs_draft`)."""
    try:
        rec = torch.load(path, weights_only=False)
        keys = RECORD_KEYS + (("draft_logits",) if needs_draft else ())
        if not isinstance(rec, dict) or any(k not in rec for k in keys):
            raise ValueError("fields missing")
        if needs_draft and rec["draft_logits"].shape != rec["target_logits"].shape:
            raise ValueError("target and draft logits differ in shape")
        return rec
    except Exception as exc:  # noqa: BLE001 - any unreadable cache file is recomputed, never used
        print(f"warning: cache file {path} is unusable ({type(exc).__name__}: {str(exc)[:80]}); computing it again",
              file=sys.stderr)
        path.unlink(missing_ok=True)
        return None


def settings_key(settings: dict[str, Any]) -> str:
    """A short hash of everything a measurement depends on."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


class MeasureJournal:
    """Append-only record of measured positions (see the module docstring). `done` maps
    (temperature index, position index) -> the entry written for it."""

    def __init__(self, path: Path, key: str):
        self.path, self.key = Path(path), key
        self.done: dict[tuple[int, int], dict[str, Any]] = {}
        if self.path.exists():
            self._read()
        if not self.done:
            self.path.write_text(json.dumps({"settings": key}) + "\n")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    def _read(self) -> None:
        lines = self.path.read_bytes().split(b"\n")
        try:
            header = json.loads(lines[0])
        except ValueError:
            header = {}
        if header.get("settings") != self.key:
            aside = self.path.with_name(self.path.name + ".other")
            os.replace(self.path, aside)
            print(f"warning: {self.path} was measured with other settings; moved to {aside}, starting over",
                  file=sys.stderr)
            return
        parsed = 0
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except ValueError:  # a torn last line (or the empty rest): measured again
                break
            self.done[(entry["t"], entry["j"])] = entry
            parsed += 1
        whole = b"\n".join(lines[: 1 + parsed]) + b"\n"
        if len(whole) != self.path.stat().st_size:  # drop what follows the last whole entry
            with open(self.path, "r+b") as fh:
                fh.truncate(len(whole))

    def add(self, t: int, j: int, alpha: dict[str, float], est: dict[str, list[float]]) -> dict[str, Any]:
        entry = {"t": t, "j": j, "alpha": alpha, "est": est}
        append_line(self._fd, json.dumps(entry) + "\n", self.path)
        self.done[(t, j)] = entry
        return entry

    def close(self) -> None:
        os.close(self._fd)
