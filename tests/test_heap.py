"""`runtime.heap`: freed heap handed back to the OS, at most once per interval (long runs)."""
import sys

import pytest
import torch

from runtime import heap


def _anon_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux-only")
def test_release_gives_fragmented_heap_back():
    keep = [torch.ones(30_000 + 997 * (i % 13)) for i in range(4000)]   # ~0.5 GiB in varied sizes
    del keep[::2]                                                       # every other one freed: holes
    before = _anon_kib()
    assert heap.release_free_heap() is True
    assert _anon_kib() <= before


def test_trimmer_releases_at_most_once_per_interval(monkeypatch):
    calls, now = [], [0.0]
    monkeypatch.setattr(heap, "release_free_heap", lambda: calls.append(now[0]) or True)
    trimmer = heap.HeapTrimmer(every_s=60, clock=lambda: now[0])
    for t in (1, 30, 59, 61, 90, 120, 200):
        now[0] = float(t)
        trimmer.maybe()
    assert calls == [61.0, 200.0] and trimmer.releases == 2   # 90 and 120 are within 60 s of 61
