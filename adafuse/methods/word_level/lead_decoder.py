"""The lead's confident words: `LeadDecoder`, plain or through a `specdec.SpeculativeGenerator`.

Confident (m >= threshold and fewer than `span` words committed since the last ensembled word):
the lead decodes one word on its own (greedy at temperature 0) and the next word start is checked
again; a row goes on with that word in the same step (same forwards) wherever it would be decoded
confidently next, so confident rows of a batch do not wait at every word boundary. After `span`
confident words in a row the next word is ensembled ("forced"), so at most `span` words are ever
committed without the other members' say; span=0 ensembles every word.

At temperature > 0 the confident words are sampled token by token from the lead's warped
distribution (each row from its own generator); the gate always uses the untempered distribution.
A speculative lead decodes the same words in speculative chunks (`_speculative_words`); the single
call into `specdec` is `LeadDecoder._speculate`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from adafuse.gate import gate_decision, top2_margin
from adafuse.methods.word_level.batch import Batch
from adafuse.methods.word_level.options import WordConfig
from adafuse.methods.word_level.records import EOS_KEY, Round
from adafuse.methods.word_level.trees import Branches, top_firsts
from adafuse.words import word_end
from runtime.forward_group import run_together, same_model
from runtime.kv_state import KVState
from runtime.sampling import SamplingParams, sample
from specdec.config import DecodeControl


FOLLOW_MAX_ROWS = 4  # views follow the lead's confident tokens while rows x views stay within this


@dataclass
class ConfidentRun:
    """What the lead decoded for one row in one step: its words, each with the gate margin at its
    start (an EOS at a word start is an empty word), and whether the row ended at EOS."""

    words: list[tuple[str, float]]
    eos: bool = False


@dataclass
class _Walk:
    """Per-row progress of one plain decoding call (`LeadDecoder._decode_word`)."""

    have: dict[int, list[int]]                # the row's output ids in the cache before the call
    margin: dict[int, float]                  # gate margin at the start of the word being decoded
    fed: dict[int, list[int]]                 # tokens fed since (have + fed: the row's output ids)
    words: dict[int, list[tuple[str, float]]]  # words decoded so far
    ids: dict[int, list[int]]                 # of the word being decoded
    text: dict[int, str]                      # of the word being decoded
    out: dict[int, ConfidentRun]              # rows that are done, with their run
    riders: list[int]                         # rows that just stopped for an ensembled word


def count_complete_units(text: str) -> int:
    """How many units of `text` are complete (the next unit has started)."""
    n, rest = 0, text
    while rest:
        end = word_end(rest)
        if end is None:
            break
        n += 1
        rest = rest[end:]
    return n


class LeadDecoder:
    """The lead member's confident words for the rows the gate passed: `advance` decodes them into
    the lead's cache and commits them to the batch (trace, streak, stop, length). It also keeps the
    lead's candidate words of rows waiting for an ensembled word (`Branches`), advanced in its own
    forwards; `take_branches` hands them to that ensembled word."""

    def __init__(self, batch: Batch, config: WordConfig, temperature: float, speculator: Any | None):
        self.batch = batch
        self.config = config
        self.temperature = temperature
        self.speculator = speculator
        self.view = batch.lead_view
        self.member = self.view.member
        # the lead's candidate words of rows waiting for an ensembled word, advanced in the lead's
        # forwards for the confident rows (`_decode_word`); valid until the next ensembled word
        self.branches: dict[int, Branches] = {}
        # views of the lead's model follow its confident tokens as rows of the lead's own forwards, so
        # they need no catch-up forward at the next ensembled word (plain lead only). Only while those
        # forwards stay memory-bound (few rows): wider, following costs more than the lazy catch-up
        # it saves (the outputs are the same either way)
        views = [m for m, v in enumerate(batch.views) if m != batch.lead and same_model(v.member, self.member)]
        small = len(batch.texts) * (1 + len(views)) <= FOLLOW_MAX_ROWS
        self.followers = views if speculator is None and small else []
        self._followed = False  # the followers' pending text went into a forward of this `_decode_word`

    def take_branches(self) -> dict[int, Branches]:
        """The lead's candidate branches advanced so far (row -> `Branches`, at the row's current
        state); they are forgotten here, as the ensembled word that takes them changes the state."""
        branches, self.branches = self.branches, {}
        return branches

    def advance(self, rows: list[int], margins: dict[int, float], waiting: Sequence[int] = ()) -> None:
        """Decode and commit the confident words of `rows` (gate margins `margins` at their word
        starts); the `waiting` rows' lead branches ride the same forwards (plain lead only)."""
        self.commit(rows, self.decode(rows, margins, waiting))

    def decode(self, rows: list[int], margins: dict[int, float], waiting: Sequence[int] = ()
               ) -> dict[int, ConfidentRun]:
        """The lead's confident words of `rows`, decoded into its cache (not yet committed to the
        batch): plain, or speculative when the lead has a speculator."""
        if self.speculator is None:
            return self._decode_word(rows, margins, waiting)
        return self._speculative_words(rows, margins)

    def commit(self, rows: list[int], runs: dict[int, ConfidentRun]) -> None:
        """Commit each row's run: the lead's view adopts the words (boundary repair), each word is
        recorded in the row's confident round (a new one after an ensembled word) and committed to
        the batch until the row finishes (EOS, stop string, length)."""
        batch, view = self.batch, self.view
        pieces = ["" for _ in batch.texts]
        for b in rows:
            text = "".join(w for w, _ in runs[b].words)
            view.texts[b] += text
            pieces[b] = text
        view.sync([b for b in rows if pieces[b]])
        holders = {b: (batch.lead, *self._follow_commit(b, pieces[b])) for b in rows}
        for f in self.followers:  # their caches hold the lead's tokens: repaired to canonical as the lead's
            batch.views[f].sync([b for b in rows if f in holders[b] and pieces[b]])
        for b in rows:
            run = runs[b]
            for text, margin in run.words:
                if batch.finish[b] is not None:
                    break
                trace = batch.traces[b]
                gate = {"margin": round(margin, 4), "decision": "confident"}
                if trace and trace[-1].kind == "confident" and batch.streak[b] > 0:
                    trace[-1].units.append(text)
                    trace[-1].gate.append(gate)
                else:
                    trace.append(Round("confident", [text], [gate], self.member.name))
                if not text:
                    trace[-1].units.pop()
                    trace[-1].chosen = EOS_KEY if run.eos else None
                batch.streak[b] += 1
                batch.commit(b, text, held_by=holders[b])
            if run.eos:
                batch.end_at_eos(b)
            batch.check_length(b)

    # ---- plain lead ------------------------------------------------------------------------
    def _decode_word(self, rows: list[int], margins: dict[int, float], waiting: Sequence[int] = ()
                     ) -> dict[int, ConfidentRun]:
        """The lead decodes confident words straight into its cache. A word ends *before* a token
        that starts the next word; where the one-word-per-step schedule would decode that next word
        confidently from this exact state (`_next_word`: gate, span, length, stop strings, canonical
        boundary), the row goes on with that token in the same forwards, so rows of a batch are not
        held at every word boundary by the row with the longest word. The state of a row that stops
        ends at the word boundary, ready for the next gate. Output equals one word per step (greedy;
        sampled rows keep the boundary token they drew instead of drawing it again).
        The same forwards advance the lead's candidate words of the `waiting` rows, and of rows that
        stop here for an ensembled word (`Branches`, as a tree beside the committed tokens), so their
        ensembled word needs fewer lead forwards. Returns row -> its `ConfidentRun`."""
        batch, state = self.batch, self.view.state
        if waiting:
            self._start_branches([b for b in waiting if b not in self.branches])
        self._followed = False
        w = _Walk(have={b: self.view.output_ids(b) for b in rows}, margin={b: margins[b] for b in rows},
                  fed={b: [] for b in rows}, words={b: [] for b in rows}, ids={b: [] for b in rows},
                  text={b: "" for b in rows}, out={}, riders=[])
        live = list(rows)
        while live:
            probs = state.next_probs(self.temperature if self.temperature > 0 else 0.0)
            if self.temperature > 0:
                toks = {b: int(sample(probs[b: b + 1], [batch.row_gen(b)] if batch.gens else None)) for b in live}
            else:
                toks = {b: int(probs[b].argmax()) for b in live}
            gates: list[list[float]] = []  # the gates at this state, computed when first needed

            def gate(b: int) -> float:
                """Row b's gate margin at the state before this step's forward."""
                if not gates:
                    gates.append(top2_margin(state.next_probs(1.0)).tolist())
                return gates[0][b]

            feed: list[list[int]] = [[] for _ in batch.texts]
            still, cut = [], []
            for b in live:
                status = self._token(w, b, toks[b], gate)
                if status is not None:
                    feed[b] = [toks[b]]
                if status == "live":
                    still.append(b)
                elif status == "cut":
                    cut.append(b)
            if w.riders:  # rows now waiting for an ensembled word ride the forwards left in this step
                self._start_branches(w.riders)
                waiting = list(waiting) + w.riders
                w.riders = []
            ride = [b for b in waiting if not self.branches[b].done]
            if any(feed):
                self._forward(state, feed, ride)
            if cut:
                after = top2_margin(state.next_probs(1.0)).tolist()
                still += [b for b in cut if self._at_word_start(w, b, after[b])]
            live = sorted(still)
        return w.out

    def _token(self, w: _Walk, b: int, tok: int, gate: Callable[[int], float]) -> str | None:
        """Take row b's next token `tok` (`gate(b)`: the margin at the current state). Returns
        "live" (fed; the word goes on), "cut" (fed; the word is cut at `max_word_tokens` and gated
        after this forward), "done" (fed; the row stops after it) or None (not fed: the row stops
        before it, at EOS or at a word start it does not go on from)."""
        member = self.member
        if tok in member.eos_token_ids:
            w.words[b].append((w.text[b], w.margin[b]))
            w.out[b] = ConfidentRun(w.words[b], True)
            return None
        new = member.decode(w.ids[b] + [tok])
        end = word_end(new)
        if end is not None and end <= len(w.text[b]) and w.ids[b]:  # tok starts the next word
            w.words[b].append((w.text[b], w.margin[b]))
            if not self._at_word_start(w, b, gate(b)):
                return None  # tok is left out: the next step gates here
            new = member.decode([tok])
            end = word_end(new)
        w.ids[b].append(tok)
        w.fed[b].append(tok)
        if end is not None:  # tok straddles the boundary: keep the word's part of it
            w.words[b].append((new[:end], w.margin[b]))
            w.out[b] = ConfidentRun(w.words[b], False)
            return "done"
        w.text[b] = new
        if len(w.ids[b]) >= self.config.max_word_tokens:  # cut here; gated after this forward
            w.words[b].append((new, w.margin[b]))
            return "cut"
        return "live"

    def _at_word_start(self, w: _Walk, b: int, gate: float) -> bool:
        """Row b's last word is complete and the next starts here with margin `gate`: True to go on
        with it in this step, else the row is done here (a rider when its next word is ensembled)."""
        nxt = self._next_word(b, w.words[b], w.have[b] + w.fed[b], gate)
        if nxt == "confident":
            w.ids[b], w.text[b], w.margin[b] = [], "", gate
            return True
        w.out[b] = ConfidentRun(w.words[b], False)
        if nxt == "ensemble":
            w.riders.append(b)
        return False

    def _start_branches(self, rows: Sequence[int]) -> None:
        """Start the lead's candidate branches of `rows` (its top-B first tokens at their state)."""
        firsts, _ = top_firsts(self.view, rows, self.config.candidates)
        for b, f in firsts.items():
            self.branches[b] = Branches(self.member, f, self.config.max_word_tokens)

    def _next_word(self, b: int, words: Sequence[tuple[str, float]], ids: list[int], margin: float) -> str:
        """What the one-word-per-step schedule would do next for row b, after the lead decoded
        `words` ((text, margin) pairs) in this step and its cache now holds output ids `ids`, with
        the next word start's gate `margin`: "stop" when the row finishes (length, stop string) or
        `ids` are not the canonical encoding of the text (the boundary is repaired first, which may
        change the state); else "confident" (gate passed, span not used up) or "ensemble"."""
        cfg, batch = self.config, self.batch
        if len(ids) >= batch.max_new_tokens:
            return "stop"
        start = len(batch.texts[b])
        full = batch.texts[b] + "".join(w for w, _ in words)
        if batch.stop.cut(full, start) is not None:
            return "stop"
        if self.member.encode(full) != ids:
            return "stop"
        decision = gate_decision(margin, batch.streak[b] + len(words), cfg.threshold, cfg.span, cfg.gate)
        return "confident" if decision == "confident" else "ensemble"

    def _forward(self, state: KVState, feed: list[list[int]], ride: Sequence[int]) -> None:
        """One lead forward committing `feed` (and riding the `ride` rows' branches, `_ride`) and, as
        rows of the same forward (`runtime.forward_group`), the followers' appends of the same tokens,
        the first time behind the text they have not been fed yet (`_follow`)."""
        lead_op = (lambda: self._ride(state, feed, ride)) if ride else (lambda: state.append(feed, return_logits=False))
        run_together([lead_op] + [lambda f=f: self._follow(f, feed) for f in self.followers], lambda op: op())
        self._followed = True

    def _follow(self, f: int, feed: list[list[int]]) -> None:
        """Follower f appends the lead's fed tokens; in the call's first forward, behind its pending
        text (synced to canonical ids in the same forward)."""
        batch, view = self.batch, self.batch.views[f]
        rows = []
        if not self._followed:
            for b, piece in enumerate(batch.pending[f]):
                if piece:
                    view.texts[b] += piece
                    batch.pending[f][b] = ""
                    rows.append(b)
        view.sync(rows, then={b: ids for b, ids in enumerate(feed) if ids})

    def _follow_commit(self, b: int, text: str) -> list[int]:
        """The followers that hold row b's confident `text` (fed in step with the lead: their pending
        text went first), with the text added to their views; the others get it lazily."""
        held = [f for f in self.followers if not self.batch.pending[f][b]]
        for f in held:
            self.batch.views[f].texts[b] += text
        return held

    def _ride(self, state: KVState, feed: list[list[int]], ride: Sequence[int]) -> None:
        """One lead forward that commits `feed` (one token per confident row) and advances the open
        candidate branches of the `ride` rows by one greedy token each (the branches are re-fed
        whole beside the committed tokens and discarded)."""
        tree = state.new_tree()
        at: list[list[int]] = [[0] if f else [] for f in feed]
        for b, f in enumerate(feed):
            tree.add(b, f)
        ends: dict[tuple[int, int], int] = {}
        for b in ride:
            bs = self.branches[b]
            for i in bs.open():
                ends[(b, i)] = tree.add(b, bs.tokens[i])
                at[b].append(ends[(b, i)])
        logits = tree.grow(at)
        tree.accept([[0] if f else [] for f in feed])
        for (b, i), node in ends.items():
            self.branches[b].step(i, int(logits[b, at[b].index(node)].argmax()))

    # ---- speculative lead ------------------------------------------------------------------
    def _speculative_words(self, rows: list[int], margins: dict[int, float]) -> dict[int, ConfidentRun]:
        """Confident words of a lead that has a `specdec.SpeculativeGenerator`: one speculative
        `decode` per step continues the lead's own KV state for up to the rest of the span, and stops
        a row as soon as a new word starts where the lead is not confident (the engine reports the
        target distribution every token was drawn from), so each word start is gated exactly as the
        plain path would gate it (margin, span, canonical boundary, length). Tokens past the last
        accepted word are rolled back; the row's last token is committed only when it is kept.
        Greedy output equals the plain path's. Returns row -> its `ConfidentRun`."""
        cfg, batch = self.config, self.batch
        member, state = self.member, self.view.state
        budget = {b: cfg.span - batch.streak[b] for b in rows}
        before = list(state.lengths)
        have = {b: self.view.output_ids(b) for b in rows}  # (`decode` commits into the state: read them first)

        def stop_fn(b: int, new: list[int], source: torch.Tensor) -> bool:
            """Stop row b after its new tokens `new` (`source`: the logits new[-1] was drawn from)?"""
            units = count_complete_units(member.decode(new))
            if units >= budget[b]:
                return True
            if units and len(new) > 1 and count_complete_units(member.decode(new[:-1])) < units:
                # new[-1] starts the next word: go on only where the lead is confident about it and
                # the row has room for it (`_next_word` stops it at max_new_tokens)
                if len(have[b]) + len(new) - 1 >= batch.max_new_tokens:
                    return True
                margin = float(top2_margin(torch.softmax(source.float(), -1)[None])[0])
                return gate_decision(margin, batch.streak[b] + units, cfg.threshold, cfg.span, cfg.gate) != "confident"
            return False

        def draft_depth(b: int, new: list[int]) -> int:
            """Row b's next draft depth: one token per word left in the span, plus one."""
            # a confident run ends within the span budget (GSM8K: ~1.3 lead tokens per word), often
            # after one word: drafting deeper than one token per word left, plus one, costs drafter
            # forwards and verified tokens the run cannot use
            return 1 + budget[b] - count_complete_units(member.decode(new))

        # only `rows` are decoded: the other rows' state is left as it is
        new_ids, sources, uncommitted = self._speculate(state, max(budget.values()) * cfg.max_word_tokens + 1,
                                                        rows, stop_fn, draft_depth)
        out: dict[int, ConfidentRun] = {}
        keep = list(before)
        last: dict[int, torch.Tensor] = {}
        missing: list[list[int]] = [[] for _ in range(state.batch_size)]
        for b in rows:
            words, n_keep, eos = self._walk_chunk(b, have[b], new_ids[b], sources[b][1:], margins[b])
            out[b] = ConfidentRun(words, eos)
            committed = len(new_ids[b]) - int(uncommitted[b])
            keep[b] = before[b] + min(n_keep, committed)
            missing[b] = new_ids[b][committed:n_keep]
            if n_keep < len(new_ids[b]):  # the distribution at the kept boundary is already known
                last[b] = sources[b][n_keep]
        state.rollback(keep)
        for b, logits in last.items():
            state.set_next_logits(b, logits)
        if any(missing):  # a kept last token the engine left uncommitted (rare)
            state.append(missing, return_logits=False)
        return out

    def _speculate(self, state: KVState, max_new_tokens: int, rows: list[int],
                   stop_fn: Callable[[int, list[int], torch.Tensor], bool],
                   draft_depth: Callable[[int, list[int]], int]
                   ) -> tuple[list[list[int]], list[list[torch.Tensor]], list[bool]]:
        """The one call into `specdec`: the lead's speculator continues `rows` of `state` (committing
        into it, the last token of a row possibly not), until `stop_fn(row, new_ids, logits the
        last new token was drawn from)` holds, EOS, or `max_new_tokens`. Returns (per row the new
        ids, per row the target logits each new token was drawn from, per row whether the state
        lacks the row's last new token)."""
        control = DecodeControl(stop=lambda b, row: stop_fn(b, row.ids, row.sources[-1]), rows=rows,
                                draft_depth=lambda b, row: draft_depth(b, row.ids), commit_last=False,
                                record_sources=True)
        result = self.speculator.decode(state, max_new_tokens, SamplingParams(self.temperature), self.batch.gens,
                                        control)
        return result.ids, result.sources, result.uncommitted

    def _walk_chunk(self, b: int, have: list[int], ids: list[int], after: list[torch.Tensor], first_margin: float
                    ) -> tuple[list[tuple[str, float]], int, bool]:
        """Split a speculatively decoded chunk `ids` (after the row's output ids `have`) into the words
        the plain path would have committed. Returns (words with their gate margins, tokens to keep,
        hit EOS)."""
        cfg, member = self.config, self.member
        words: list[tuple[str, float]] = []
        cur: list[int] = []
        text, margin, j = "", first_margin, 0

        def accept_boundary(n_tokens: int) -> float | None:
            """After a word that ends at token n_tokens: the next word's margin if the plain path
            would continue confidently from this exact state, else None."""
            if n_tokens > len(after):
                return None
            m = float(top2_margin(torch.softmax(after[n_tokens - 1].float(), -1)[None])[0])
            return m if self._next_word(b, words, have + ids[:n_tokens], m) == "confident" else None

        while j < len(ids):
            tok = ids[j]
            if tok in member.eos_token_ids:  # (at a word start: an empty word, as the plain path records it)
                words.append((text, margin))
                return words, j, True
            new = member.decode(cur + [tok])
            end = word_end(new)
            if end is not None and end <= len(text) and cur:  # tok starts the next word
                words.append((text, margin))
                nxt = accept_boundary(j)
                if nxt is None:
                    return words, j, False
                cur, text, margin = [], "", nxt
                continue
            cur.append(tok)
            if end is not None:  # tok straddles the boundary: the plain path stops and repairs
                words.append((new[:end], margin))
                return words, j + 1, False
            text = new
            j += 1
            if len(cur) >= cfg.max_word_tokens:
                words.append((text, margin))
                nxt = accept_boundary(j)
                if nxt is None:
                    return words, j, False
                cur, text, margin = [], "", nxt
        if text:  # the chunk ended inside a word (length cap): keep the words before it
            return words, j - len(cur), False
        return words, j, False
