"""The rows of one batch, shared by every piece of word-level fusion: `Batch`.

Text discipline: the shared committed text of a row is exactly the concatenation of its committed
units. Each member's `MemberText` holds its own ids + KV cache of that text; members that were not
needed in a step, and non-leads that scored the chosen word without feeding it, receive the
committed text lazily (one forward at their next ensembled word), with longest-common-prefix
boundary repair, so the prefix is never re-encoded. That forward also carries guesses of the
non-lead's candidate tokens (the lead's top first tokens and the words proposed before it, as a tree
below the new text; `flush_guesses`), so that its first completion forward is often not needed.

Stopping: EOS of the lead (an EOS chosen confidently, or the lead's EOS candidate winning an
ensembled word), a stop string (the text is cut before it), or `max_new_tokens` counted in *lead
member tokens* of the committed text (checked after each word, so the last word is kept whole).
"""
from __future__ import annotations

from typing import Sequence

import torch

from adafuse.methods.word_level.records import EOS_KEY, Round
from runtime.finish import FinishRule
from runtime.forward_group import run_members
from runtime.member import Member, make_generators
from runtime.stopping import StopStrings
from runtime.text_state import MemberText


class Batch:
    """Per row: the shared committed text and its units, what each member has not been fed yet
    (`pending[m][b]`), why it finished (None: still running), confident words since the last
    ensembled word (`streak`), the trace, and its sampling generator; per member its `MemberText`
    view of every row. The lead decoder and the ensembled word both read and commit through it."""

    def __init__(self, members: Sequence[Member], prompts: Sequence[str], *, lead: int, chat: bool | None,
                 max_new_tokens: int, stop: StopStrings, seed: int | None):
        self.lead = lead
        self.max_new_tokens = max_new_tokens
        self.stop = stop
        # views of one model prefill together (`runtime.forward_group`)
        self.views = run_members(list(members), lambda m: m, lambda m: MemberText(m, prompts, chat=chat))
        n = len(prompts)
        self.texts = ["" for _ in range(n)]
        self.units: list[list[str]] = [[] for _ in range(n)]
        self.pending = [["" for _ in range(n)] for _ in members]
        self.rule = FinishRule(members[lead], n, stop, max_new_tokens)  # the one finish rule (`runtime.finish`)
        self.finish: list[str | None] = self.rule.reasons  # why each row finished (None: running)
        self.streak = [0] * n
        self.traces: list[list[Round]] = [[] for _ in range(n)]
        self.gens = make_generators(n, seed, members[lead].device)

    @property
    def done(self) -> bool:
        """Whether every row has finished."""
        return all(f is not None for f in self.finish)

    @property
    def lead_view(self) -> MemberText:
        """The lead member's view."""
        return self.views[self.lead]

    def active(self) -> list[int]:
        """The rows still running, in order."""
        return [b for b, f in enumerate(self.finish) if f is None]

    def row_gen(self, b: int) -> torch.Generator | None:
        """Row b's sampling generator (None without a seed)."""
        return self.gens[b] if self.gens is not None else None

    def lead_tokens(self, b: int) -> int:
        """Row b's committed text in lead member tokens (what `max_new_tokens` counts)."""
        return len(self.views[self.lead].output_ids(b))

    def flush(self, m: int, rows: Sequence[int] | None = None) -> None:
        """Feed member m the committed text it has not seen yet (one forward for all rows)."""
        rows = range(len(self.texts)) if rows is None else rows
        pieces = ["" for _ in self.texts]
        for b in rows:
            pieces[b], self.pending[m][b] = self.pending[m][b], ""
        if any(pieces):
            self.views[m].extend(pieces)

    def sync_all(self) -> None:
        """Feed every member everything pending (all rows)."""
        for m in range(len(self.views)):
            self.flush(m)

    def commit(self, b: int, unit: str, held_by: Sequence[int]) -> None:
        """Append `unit` to row b's shared text; members not in `held_by` (which already hold it in
        their cache) get it lazily. Then check stop strings (the earliest one that ends in `unit`
        cuts the text and finishes the row)."""
        if not unit:
            return
        start = len(self.texts[b])
        self.texts[b] += unit
        self.units[b].append(unit)
        for m in range(len(self.views)):
            if m not in held_by:
                self.pending[m][b] += unit
        cut = self.rule.after_text(b, self.texts[b], start)
        if cut is not None:  # (the rule has finished the row: "stop")
            self.truncate(b, cut)

    def truncate(self, b: int, cut: int) -> None:
        """Cut row b's text (and its units and trace) at character `cut`."""
        self.texts[b] = self.texts[b][:cut]
        kept, total = [], 0
        for u in self.units[b]:
            if total >= cut:
                break
            kept.append(u[: cut - total])
            total += len(kept[-1])
        self.units[b] = kept
        remaining = cut
        for r in self.traces[b]:
            new_units = []
            for u in r.units:
                piece = u[:max(remaining, 0)]
                remaining -= len(piece)
                if piece:
                    new_units.append(piece)
            r.units = new_units
        self.traces[b] = [r for r in self.traces[b] if r.units or r.chosen == EOS_KEY]

    def check_length(self, b: int) -> None:
        """Finish row b with "length" once its text has `max_new_tokens` lead tokens."""
        if self.finish[b] is None and self.lead_tokens(b) >= self.max_new_tokens:
            self.rule.finish(b, "length")

    def end_at_eos(self, b: int) -> None:
        """Finish row b: the lead's EOS (chosen confidently, or won an ensembled word)."""
        if self.finish[b] is None:
            self.rule.finish(b, "eos")
