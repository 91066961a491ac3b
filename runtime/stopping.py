"""Stop strings: the one checker every generation path uses (plain, speculative, every method).

A row stops at the earliest occurrence of any stop string in its text; the text is cut before it.
Checks are incremental: `cut(text, start)` looks only at matches that end after `start` (the
length of the text already checked), so a growing text is never rescanned from the beginning.
"""
from __future__ import annotations

from typing import Sequence


class StopStrings:
    """The non-empty stop strings of a request."""

    def __init__(self, stops: Sequence[str] | None = None):
        self.stops = [s for s in (stops or []) if s]
        self._longest = max((len(s) for s in self.stops), default=0)

    def __bool__(self) -> bool:
        return bool(self.stops)

    def __repr__(self) -> str:
        return f"StopStrings({self.stops!r})"

    def cut(self, text: str, start: int = 0) -> int | None:
        """Where `text` is to be cut (the earliest stop string that ends after `start`), or None."""
        if not self.stops:
            return None
        lo = max(0, start - self._longest + 1)
        cuts = [c for c in (text.find(s, lo) for s in self.stops) if c >= 0]
        return min(cuts) if cuts else None

    def matched(self, text: str, cut: int) -> str:
        """The stop string found at `cut` (the longest one, where several start there)."""
        return max((s for s in self.stops if text.startswith(s, cut)), key=len, default="")
