"""Handing freed heap memory back to the OS during long runs.

Decoding allocates and frees tensors of ever-changing sizes (KV caches grow per row, trees differ
per step), and glibc's allocator keeps much of what is freed resident: in a 65-minute soak of the
speculative ensemble (docs/results/soak) the resident memory crept up by ~8 MiB a minute after every
cache had reached its bound, and one `malloc_trim(0)` handed back 417 MiB. `release_free_heap()`
calls it (glibc only; a no-op elsewhere); `HeapTrimmer` does so at most once per `every_s` seconds,
so a runner can call it after every batch at no measurable cost.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
import time

_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _LIBC = lib if hasattr(lib, "malloc_trim") else False
            except OSError:
                pass
    return _LIBC


def release_free_heap() -> bool:
    """`malloc_trim(0)`: return freed heap pages to the OS. False where there is no glibc."""
    lib = _libc()
    if not lib:
        return False
    lib.malloc_trim(0)
    return True


class HeapTrimmer:
    """`maybe()` releases the free heap when `every_s` seconds have passed since the last release."""

    def __init__(self, every_s: float = 60.0, clock=time.monotonic):
        self.every_s, self.clock = every_s, clock
        self.last = clock()
        self.releases = 0

    def maybe(self) -> bool:
        now = self.clock()
        if now - self.last < self.every_s:
            return False
        self.last = now
        self.releases += release_free_heap()
        return True
