"""Text <-> ids of a growing text under two tokenizers, touching only the changed tail.

A model with another tokenizer follows a member through their shared text:

- `TextOfIds`: one row's text of a member's growing ids; only the new ids are decoded (with a few
  ids of look-behind, so byte pieces and leading-space markers come out as in a full decode);
- `IdsOfText`: one row's ids of a growing text under a member's tokenizer; only the text after the
  last stable token boundary is re-encoded (the prefix never is), so a cache keyed by these ids keeps
  its prefix and re-feeds just the tail whose tokenisation changed;
- `appended_text(member, ids, new)`: the text `new` ids add after `ids` (complete characters only);
- `continuation_ids(member, ids, text, addition)`: ids that continue the committed `ids` (text
  `text`) by `addition` without changing them: the canonical encoding of the last few committed
  tokens' text + `addition`, after those tokens; where that encoding merges the last committed
  token with the addition, only the part after its first boundary past the committed text is kept,
  the piece before that boundary encoded on its own (the boundary repaired once).

Every step checks its text against what it decoded and falls back to a longer look-behind, or says
it has nothing (None), rather than guess.
"""
from __future__ import annotations

from typing import Protocol, Sequence


class Member(Protocol):
    """What this module needs of a member: its name and its text <-> ids (`runtime.member.Member`)."""

    name: str

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


REPLACEMENT = "\ufffd"  # what a decoder gives for bytes that do not (yet) form a character
WINDOWS = (4, 16)       # look-behind ids tried in turn


def special_prefix(member: Member) -> list[int]:
    """The ids the member's tokenizer puts before any text it encodes with special tokens (BOS or
    nothing)."""
    full, plain = member.encode("a", add_special_tokens=True), member.encode("a")
    return full[: len(full) - len(plain)] if plain and full[len(full) - len(plain):] == plain else []


def _cut_at_partial(text: str) -> str:
    """`text` up to its first replacement character (bytes of a character not complete yet)."""
    i = text.find(REPLACEMENT)
    return text if i < 0 else text[:i]


def decode_extension(member: Member, text: str, ids: Sequence[int], n_old: int, start: int = 0) -> str:
    """`member.decode(ids[start:])`, given `text == member.decode(ids[start:n_old])`: decodes only a
    window of ids before `n_old` and the new ids (a window must start on a character boundary and its
    text end `text`; else a longer one, else a full decode)."""
    if n_old <= start:
        return member.decode(ids[start:])
    for w in WINDOWS:
        s = max(start, n_old - w)
        head = member.decode(ids[s:n_old])
        if (s > start and head.startswith(REPLACEMENT)) or not text.endswith(head):
            continue
        return text[: len(text) - len(head)] + member.decode(ids[s:])
    return member.decode(ids[start:])


def appended_text(member: Member, ids: Sequence[int], new: Sequence[int], start: int = 0) -> str | None:
    """The text the ids `new` add after `ids` (decoded from a window of `ids` on), cut before any
    character whose bytes are not complete; None where no window decodes consistently."""
    if not new:
        return ""
    for w in WINDOWS:
        s = max(start, len(ids) - w)
        head = member.decode(ids[s:])
        if s > start and head.startswith(REPLACEMENT):
            continue
        full = member.decode(list(ids[s:]) + list(new))
        if full.startswith(head) and not head.endswith(REPLACEMENT):
            return _cut_at_partial(full[len(head):])
    return None


def continuation_ids(member: Member, ids: Sequence[int], text: str, addition: str, start: int = 0
                     ) -> list[int] | None:
    """Ids that continue `ids` (whose text from `start` on is `text`) so that the text becomes
    `text + addition`; [] for no addition, None where the committed text ends inside a character or
    no look-behind window decodes to the end of `text` (see the module docstring)."""
    if not addition:
        return []
    if not text or text.endswith(REPLACEMENT):
        return member.encode(addition) if not text and start == len(ids) else None
    for w in (3, 8):
        s = max(start, len(ids) - w)
        head_ids = list(ids[s:])
        head = member.decode(head_ids)
        if (s > start and head.startswith(REPLACEMENT)) or not head or not text.endswith(head):
            continue
        enc = member.encode(head + addition)
        if enc[: len(head_ids)] == head_ids:
            return enc[len(head_ids):]
        return _repair_boundary(member, enc, head, addition)
    return None


def _repair_boundary(member: Member, enc: list[int], head: str, addition: str) -> list[int] | None:
    """The boundary of `enc` (= encode(head + addition)) merged committed text with the addition:
    from its first token boundary at or past the end of `head`, those tokens; the piece of the
    addition before that boundary encoded on its own."""
    for i in range(1, len(enc) + 1):
        t = member.decode(enc[:i])
        if len(t) >= len(head) and t.startswith(head) and not t.endswith(REPLACEMENT):
            piece = t[len(head):]
            if not addition.startswith(piece):
                return None
            return (member.encode(piece) if piece else []) + enc[i:]
    return None


class TextOfIds:
    """One row's text of a member's growing ids, after the member's special prefix (its BOS), which
    has no text. `update(ids)` decodes only what changed (ids that extend the last ones: the new ids;
    other ids: all of them)."""

    def __init__(self, member: Member, prefix: Sequence[int] | None = None):
        self.member = member
        self.prefix = list(special_prefix(member) if prefix is None else prefix)
        self.ids: list[int] = []
        self.text = ""
        self.start = 0  # ids[:start] is the special prefix (no text)

    def __repr__(self) -> str:
        return f"TextOfIds({self.member.name!r}, ids={len(self.ids)}, chars={len(self.text)})"

    def update(self, ids: Sequence[int]) -> str:
        """The text of `ids` (from `start` on)."""
        ids = list(ids)
        n = len(self.ids)
        if ids == self.ids:
            return self.text
        if n and len(ids) >= n and ids[:n] == self.ids:
            self.text = decode_extension(self.member, self.text, ids, n, self.start)
        else:
            p = len(self.prefix)
            self.start = p if p and ids[:p] == self.prefix else 0
            self.text = self.member.decode(ids[self.start:])
        self.ids = ids
        return self.text


class IdsOfText:
    """One row's ids of a growing text under a member's tokenizer (its special prefix first).

    `update(text)` re-encodes only the text after the last stable boundary at or before the first
    changed character: boundaries are placed `back` tokens before the end of each encoding, where
    encoding the rest of the text on its own gives the same tokens (checked), so a re-encode from
    there agrees with the encoding of the whole text as long as the tokens before it do."""

    def __init__(self, member: Member, back: int = 2, keep_anchors: int = 8):
        self.member = member
        self.prefix = special_prefix(member)
        self.ids: list[int] = []
        self.text = ""
        self.back, self.keep_anchors = back, keep_anchors
        self.anchors: list[tuple[int, int]] = [(0, 0)]  # (tokens, characters) where encoding may restart
        self.reencoded = 0  # tokens encoded again (the tails), for the record

    def __repr__(self) -> str:
        return f"IdsOfText({self.member.name!r}, ids={len(self.ids)}, anchors={len(self.anchors)})"

    @property
    def full_ids(self) -> list[int]:
        """The special prefix + the ids of the text."""
        return self.prefix + self.ids

    def update(self, text: str) -> list[int]:
        """The special prefix + ids of `text` (only the tail after the last stable boundary encoded)."""
        same = len(self.text) if text.startswith(self.text) else _common_chars(self.text, text)
        while self.anchors[-1][1] > same:
            self.anchors.pop()
        m, off = self.anchors[-1]
        tail = self.member.encode(text[off:]) if off < len(text) else []
        self.reencoded += len(tail)
        self.ids = self.ids[:m] + tail
        self.text = text
        self._place_anchor(m, off, tail)
        return self.full_ids

    def _place_anchor(self, m: int, off: int, tail: list[int], tries: int = 8) -> None:
        """A boundary `back` (or up to `tries` more) tokens before the end of `tail` whose text is a
        prefix of the text's tail and where encoding the rest on its own gives the same tokens."""
        for j in range(len(tail) - self.back, max(0, len(tail) - self.back - tries), -1):
            piece = self.member.decode(tail[:j])
            if not piece or not self.text.startswith(piece, off):
                continue
            if self.member.encode(self.text[off + len(piece):]) == tail[j:]:
                self.anchors.append((m + j, off + len(piece)))
                if len(self.anchors) > self.keep_anchors + 1:
                    del self.anchors[1]
                return


def _common_chars(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search on prefix equality (C-speed comparisons)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
