"""When a row of a batch is finished: the one rule every generation path applies.

`FinishRule(member, rows, stop, max_new_tokens)` knows, per row, the member's EOS ids, the stop
strings and the length budget:

- token paths (plain and speculative decoding) call `after_tokens(b, ids)` with row b's new ids so
  far: "eos" (the text excludes the EOS), "stop" (the text is cut before the earliest stop string;
  `stop_string[b]` says which), "length" (`max_new_tokens` ids), or None. The text is decoded
  incrementally (`runtime.retokenize.TextOfIds`: only the new ids, with a few of look-behind) and
  scanned for stop strings only where it changed (`StopStrings.cut(text, start)`): never rescanned
  from the beginning;
- text paths (word-level and token-union ensembles, whose rows grow by committed text) call
  `after_text(b, text, start)` once row b's text grew past `start` characters: the stop cut, or None.

`reasons[b]` / `texts[b]` hold the outcome; `done` says whether every row has one. (A row's seeded
token draw is `runtime.sampling.draw`.)
"""
from __future__ import annotations

from typing import Any, Sequence

from runtime.retokenize import TextOfIds
from runtime.stopping import StopStrings


class FinishRule:
    """Per row of a batch: finished or not, why, and its text (see the module docstring)."""

    def __init__(self, member: Any, rows: int, stop: Sequence[str] | StopStrings | None, max_new_tokens: int):
        self.member = member
        self.stops = stop if isinstance(stop, StopStrings) else StopStrings(stop)
        self.max_new_tokens = max_new_tokens
        self.reasons: list[str | None] = [None] * rows
        self.texts = [""] * rows
        self.stop_string = [""] * rows
        self._decoded = [TextOfIds(member, prefix=[]) for _ in range(rows)]

    @property
    def done(self) -> bool:
        return all(r is not None for r in self.reasons)

    def after_tokens(self, b: int, ids: Sequence[int]) -> str | None:
        """Row b after its new `ids` (all of them so far): its finish reason, or None (go on)."""
        eos = bool(ids) and ids[-1] in self.member.eos_token_ids
        before = self._decoded[b].text
        text = self._decoded[b].update(ids[:-1] if eos else ids)
        if eos:
            return self._finish(b, "eos", text)
        start = _common_prefix(before, text)
        cut = self.stops.cut(text, start)
        if cut is not None:
            self.stop_string[b] = self.stops.matched(text, cut)
            return self._finish(b, "stop", text[:cut])
        if len(ids) >= self.max_new_tokens:
            return self._finish(b, "length", text)
        self.texts[b] = text
        return None

    def after_text(self, b: int, text: str, start: int = 0) -> int | None:
        """Row b's committed text grew past `start` characters: where a stop string cuts it (the row
        is then finished, "stop", with the text cut there), or None."""
        cut = self.stops.cut(text, start)
        if cut is None:
            self.texts[b] = text
            return None
        self.stop_string[b] = self.stops.matched(text, cut)
        self._finish(b, "stop", text[:cut])
        return cut

    def finish(self, b: int, reason: str, text: str | None = None) -> None:
        """Finish row b for `reason` (e.g. "eos" or "length" decided by the caller's own count)."""
        self._finish(b, reason, self.texts[b] if text is None else text)

    def _finish(self, b: int, reason: str, text: str) -> str:
        self.reasons[b], self.texts[b] = reason, text
        return reason


def _common_prefix(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share (a decoded text can change in its last
    characters, e.g. bytes of a character that the next id completes)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
