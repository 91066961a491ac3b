"""An advisory lock on an output folder (`OUT/<run>/<task>`), so two processes never write one
folder's predictions at once.

`hold(folder, shard)` takes `folder/.lock` with `fcntl.flock`: exclusively without a shard, shared
with `--shard K/N` (plus `folder/.lock.shard-K-of-N` exclusively), so the shards of one run share a
folder while a second unsharded process, or a second copy of a shard, is refused at once with one
line (`FolderBusyError`). The kernel drops the locks of a killed process; lock files are removed on
release (a process that opened one just before is told by the inode check and retries). Holding is
re-entrant within a process (`evaluate` takes every folder of its runs up front, `run_task` again).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Iterator

from runtime.errors import AdafuseError

LOCK = ".lock"

_held: dict[tuple[str, tuple[int, int] | None], list] = {}  # key -> [lock fds, count]


class FolderBusyError(AdafuseError):
    """Another process is writing the same output folder (or the same shard of it)."""


def _holder(path: Path) -> str:
    """' (pid N)' when the lock file names a live process, else ''."""
    try:
        pid = int(path.read_text().strip() or 0)
        if pid > 0:
            os.kill(pid, 0)
            return f" (pid {pid})"
    except (OSError, ValueError):
        pass
    return ""


def _acquire(path: Path, shared: bool, what: str, hint: str) -> int:
    """An fd of `path` holding a flock (shared or exclusive); FolderBusyError if another process
    holds a conflicting one."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            raise FolderBusyError(f"{what} is being written by another adafuse process{_holder(path)}; wait for "
                                  f"it to finish, or {hint}") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file its last holder removed after we opened it
            os.ftruncate(fd, 0)
            if not shared:
                os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)


def _release(fd: int, path: Path) -> None:
    """Drop the lock; remove the file when nobody else holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink(missing_ok=True)
    except OSError:
        pass  # other holders (shards) keep it
    os.close(fd)


@contextlib.contextmanager
def hold(folder: str | os.PathLike, shard: tuple[int, int] | None = None) -> Iterator[None]:
    """Hold `folder`'s lock (created with the folder if needed) for the block; see the module docstring."""
    folder = Path(folder)
    key = (str(folder.resolve()), shard)
    if key in _held:
        _held[key][1] += 1
    else:
        folder.mkdir(parents=True, exist_ok=True)
        hint = "use another --output_path (to split one run over processes, give each --shard K/N)"
        paths = [folder / LOCK]
        fds = [_acquire(paths[0], shared=shard is not None, what=str(folder), hint=hint)]
        if shard is not None:
            paths.append(folder / f"{LOCK}.shard-{shard[0]}-of-{shard[1]}")
            try:
                fds.append(_acquire(paths[1], False, f"shard {shard[0]}/{shard[1]} of {folder}",
                                    "give this process another --shard K/N"))
            except BaseException:
                _release(fds[0], paths[0])
                raise
        _held[key] = [list(zip(fds, paths)), 1]
    try:
        yield
    finally:
        _held[key][1] -= 1
        if _held[key][1] == 0:
            for fd, path in reversed(_held.pop(key)[0]):
                _release(fd, path)


@contextlib.contextmanager
def hold_all(folders: list[Path], shard: tuple[int, int] | None = None) -> Iterator[None]:
    """`hold` every folder for the block (all or none: a busy one releases those taken before it)."""
    with contextlib.ExitStack() as stack:
        for folder in folders:
            stack.enter_context(hold(folder, shard))
        yield
