"""Word segmentation: the fusion unit of word-level ensembling. Pure string functions.

A *unit* (word) is one of:
- horizontal whitespace (spaces, tabs) followed by a run of non-space characters: the leading space
  and any attached punctuation belong to the word (" apples.", " 16*16", " =");
- horizontal whitespace followed by a run of newlines ("\\n", "\\n\\n", "  \\r\\n"): newlines are units
  of their own, so they are never lost or merged into a word;
- horizontal whitespace followed by one CJK character (Chinese, Japanese kana, CJK punctuation):
  scripts without spaces are fused character by character.

Contract: `"".join(split_words(text)) == text` for every string, byte for byte.
"""
from __future__ import annotations

_CJK_RANGES = (
    (0x3000, 0x303F),   # CJK symbols and punctuation
    (0x3040, 0x30FF),   # hiragana, katakana
    (0x3400, 0x4DBF),   # CJK extension A
    (0x4E00, 0x9FFF),   # CJK unified ideographs
    (0xF900, 0xFAFF),   # CJK compatibility ideographs
    (0xFF00, 0xFFEF),   # half/full-width forms
    (0x20000, 0x2FA1F),  # CJK extensions B..F, compatibility supplement
)
_NEWLINES = "\r\n"


def is_cjk(ch: str) -> bool:
    """True for a character of a script written without spaces (one fusion unit per character)."""
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _horizontal_space(ch: str) -> bool:
    return ch.isspace() and ch not in _NEWLINES


def word_end(text: str, final: bool = False) -> int | None:
    """End index of the first unit of `text` when that unit is known to be complete, else None.

    A unit is complete once the character after it is visible (the next unit has started). With
    `final=True` (no more text will come) a non-empty unfinished unit ends at `len(text)`.
    Leading horizontal whitespace alone is never complete unless `final`.
    """
    n = len(text)
    i = 0
    while i < n and _horizontal_space(text[i]):
        i += 1
    if i == n:
        return n if final and n else None
    ch = text[i]
    if ch in _NEWLINES:
        j = i
        while j < n and text[j] in _NEWLINES:
            j += 1
    elif is_cjk(ch):
        return i + 1
    else:
        j = i
        while j < n and not text[j].isspace() and not is_cjk(text[j]):
            j += 1
    if j < n:
        return j
    return n if final else None


def split_words(text: str) -> list[str]:
    """All units of `text`, in order; their concatenation is `text`."""
    units = []
    rest = text
    while rest:
        end = word_end(rest, final=True)
        assert end is not None and end > 0
        units.append(rest[:end])
        rest = rest[end:]
    return units


def count_words(text: str) -> int:
    """Number of units that are not pure whitespace (newline units are not counted as words)."""
    return sum(1 for u in split_words(text) if u.strip())
