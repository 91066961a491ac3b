"""Cross-tokenizer bookkeeping in one place: shared *text* <-> one member's token ids and KV cache.

Members of an ensemble share text, not ids. `MemberText` keeps, for a batch of rows, each row's
prompt ids (the member's own prompt formatting) and the member's encoding of the committed output
text, with the member's `KVState` holding exactly `prompt_ids + encode(output_text)`.

`extend(pieces)` appends text to each row: it re-tokenises the row's output text, keeps the longest
common prefix with the cached ids, rolls the cache back to it and feeds only the tail — the prefix is
never re-encoded by the model. `adopt(row, ids)` takes tokens the member generated itself (already in
the cache) and then repairs them to the canonical encoding the same way.
"""
from __future__ import annotations

from typing import Sequence

from runtime.kv_state import KVState
from runtime.member import Member


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class MemberText:
    """One member's view of a batch of (prompt, committed output text) rows."""

    def __init__(self, member: Member, prompts: Sequence[str], chat: bool | None = None):
        self.member = member
        self.prompt_ids = [member.encode_prompt(p, chat) for p in prompts]
        self.texts = ["" for _ in prompts]
        self.state: KVState = member.start(self.prompt_ids)
        self.tokens_refed = 0  # tokens re-fed because a boundary re-tokenised differently

    def __repr__(self) -> str:
        return f"MemberText({self.member.name!r}, rows={len(self.texts)}, lengths={self.state.lengths})"

    @property
    def batch_size(self) -> int:
        return len(self.texts)

    def output_ids(self, row: int) -> list[int]:
        """The cached ids after the prompt (the member's tokens of the committed text)."""
        return self.state.ids[row][len(self.prompt_ids[row]):]

    def canonical_ids(self, row: int) -> list[int]:
        """A fresh encoding of row's committed output text (what the cache must equal)."""
        return self.member.encode(self.texts[row]) if self.texts[row] else []

    def extend(self, pieces: Sequence[str]) -> None:
        """Append `pieces[b]` (possibly "") to row b's text and bring the cache to its canonical ids."""
        for b, piece in enumerate(pieces):
            self.texts[b] += piece
        self.sync([b for b, piece in enumerate(pieces) if piece])

    def sync(self, rows: Sequence[int] | None = None, append_as_is: dict[int, list[int]] | None = None,
             below: dict[int, tuple[list[int], list[int]]] | None = None,
             then: dict[int, list[int]] | None = None) -> None:
        """Roll each given row back to the longest common prefix of cached and canonical ids and
        feed the tail, all rows in one forward. Rows in `append_as_is` instead just get those ids
        appended (a member keeping its own token for text it chose), in the same forward. `below`:
        row -> (tokens, parents) of a token tree that the same forward opens below the row's synced
        ids (`KVState.append_open`; parent -1 = the row's last token). `then`: row -> ids fed after
        the row's synced ids in the same forward, for text not committed yet (a view following its
        lead's tokens: the next sync brings the row back to its canonical ids)."""
        rows = range(self.batch_size) if rows is None else rows
        append_as_is = append_as_is or {}
        tails: list[list[int]] = [list(append_as_is.get(b, [])) for b in range(self.batch_size)]
        keep = list(self.state.lengths)
        for b in rows:
            if b in append_as_is:
                continue
            want = self.canonical_ids(b)
            have = self.output_ids(b)
            lcp = common_prefix_len(have, want)
            n_prompt = len(self.prompt_ids[b])
            keep[b] = max(n_prompt + lcp, 1)
            tails[b] = want[lcp:]
            if lcp < len(have):
                self.tokens_refed += len(want) - lcp
        for b, ids in (then or {}).items():
            tails[b] = tails[b] + list(ids)
        if keep != self.state.lengths:
            self.state.rollback(keep)
        if below:
            empty: tuple[list[int], list[int]] = ([], [])
            trees = [below.get(b, empty) for b in range(self.batch_size)]
            self.state.append_open(tails, [t for t, _ in trees], [p for _, p in trees])
        elif any(tails):
            self.state.append(tails, return_logits=False)

    def adopt(self, row: int, new_text: str) -> None:
        """Record that the member itself generated `new_text` on `row` (tokens already appended to
        the cache by its own decoding); repair the boundary to the canonical encoding."""
        self.texts[row] += new_text
        self.sync([row])
