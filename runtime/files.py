"""Writes that survive a kill or a full disk.

- `write_text_atomic(path, text)` / `write_json_atomic(path, data)` / `write_bytes_atomic`: the new content goes to a temp
  file in the same folder, is flushed and fsynced, then `os.replace`d over `path`: a reader (or a
  process resuming after a kill) sees the old file or the new one, never half of one.
- `read_text(path, what, fix, error)`: a UTF-8 file's text, or one line naming the file when it is
  binary, not UTF-8 (the line named) or empty.
- `append_line(fd, line, path)`: one `os.write` per record on an `O_APPEND` descriptor, so records
  of processes sharing a file never interleave; a short write (the disk filled mid-record) is cut
  back off, so the file keeps ending on a whole line. Each append holds a shared `flock` on the
  file, so a reader that takes it exclusively (`exclusive(path)`) sees no write in flight: a line
  that looks cut short then really is.

A full disk (ENOSPC, EDQUOT, or EFBIG from a size limit) raises `DiskFullError`, one line naming the
file; whatever was already on disk is left valid.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from runtime.errors import AdafuseError

FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class DiskFullError(AdafuseError, OSError):
    """A write ran out of space (or hit a file size limit)."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` is an OSError meaning "no room left" (a full disk, a quota, a size limit)."""
    return isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS


def disk_full(path: str | os.PathLike, exc: OSError) -> DiskFullError:
    """The one-line error for a write to `path` that found no room."""
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    return DiskFullError(f"cannot write {path}: {why}; free some space (or raise the limit) and rerun the same "
                         f"command: what is already written is kept and resumed from")


def read_text(path: str | os.PathLike, what: str, fix: str, error: type[Exception]) -> str:
    """The text of the UTF-8 file `path`; `error` (one line naming the file, ending with `fix`) if it
    is binary (NUL bytes), not UTF-8 (the line named) or holds no text."""
    raw = Path(path).read_bytes()
    if b"\0" in raw:
        raise error(f"{path} is a binary file, not {what}; {fix}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(f"{path}: line {line} is not UTF-8 text (byte 0x{raw[exc.start]:02x}); {fix}") from None
    if not text.strip():
        raise error(f"{path} is empty; {fix}")
    return text


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace `path` by `text` (UTF-8) atomically: temp file in the same folder, fsync, os.replace."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` by `data` atomically: temp file in the same folder, fsync, os.replace."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full(path, exc) from None
        raise


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """`write_text_atomic` of `data` as indented JSON (non-ASCII kept) with a final newline."""
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def append_line(fd: int, line: str, path: str | os.PathLike) -> None:
    """Append `line` (which ends with a newline) to the `O_APPEND` descriptor `fd` of `path` in one
    write. A write that stops short is continued (to learn why); if the rest fails, the half record
    is cut back off the file and a full disk raises `DiskFullError`."""
    data = line.encode("utf-8")
    done = 0
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        while done < len(data):
            done += os.write(fd, data[done:])
    except OSError as exc:
        if done:
            _cut_tail(fd, path, data[:done])
        if is_disk_full(exc):
            raise disk_full(path, exc) from None
        raise
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _cut_tail(fd: int, path: str | os.PathLike, partial: bytes) -> None:
    """Truncate the half record `partial` off the end of the file, if it is still the file's end."""
    start = os.fstat(fd).st_size - len(partial)
    if start < 0:
        return
    with open(path, "rb") as f:
        f.seek(start)
        if f.read() == partial:
            os.ftruncate(fd, start)


@contextlib.contextmanager
def exclusive(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive `flock` on the existing file `path`: no `append_line` is in flight meanwhile."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
