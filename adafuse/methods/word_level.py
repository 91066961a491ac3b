"""Word-level ensembling across tokenizers: `adafuse` (gated, adaptive span) and `word-fixed` (gate
off: every word is ensembled). See docs/algorithms.md §2.

Rows of a batch advance in *steps*; at each step every unfinished row sits at a word start (see
`adafuse.words`) and the lead member's next-token distribution there gives the gate margin
m = p1 - p2. A step advances the confident rows by one or more words each while the other rows
wait; when no row is confident, every row ensembles one word together (one set of member forwards
for the batch):
- confident (m >= threshold and fewer than `span` words committed since the last ensembled word):
  the lead decodes one word on its own (greedy at temperature 0) and the next word start is checked
  again; a row goes on with that word in the same step (same forwards) wherever it would be decoded
  confidently next, so confident rows of a batch do not wait at every word boundary. After `span`
  confident words in a row the next word is ensembled ("forced"), so at most `span` words are ever
  committed without the other members' say; span=0 ensembles every word.
- uncertain: each member proposes its top-`candidates` first tokens, each completed greedily to the
  word boundary (all of a member's branches of all rows in one tree forward per step; a branch walks
  on through draft nodes in that tree, the words members before it proposed and, for a member with
  a `specdec` drafter, the drafter's greedy continuation of the branch, as long as its greedy next
  token is there); the union of the candidate words (dedup
  by exact text) is scored by every member (all candidates of all rows in one tree forward per
  member; the lead completes last, with every other candidate in its tree, and is usually scored
  from that tree at no further forward; a non-lead needs no forward where every candidate it lacks
  is one token for it, as a token's log-prob needs only the logits before it), normalised
  (`normalise`), fused across members with the member weights (`calibration`), and the best is
  committed.

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

Temperature > 0: the lead's confident words are sampled token by token from its warped distribution
and the ensembled word is drawn from softmax(fused score / temperature); each row uses its own
generator seeded `seed + row`, so a batched run equals per-row runs. Candidate first tokens are the
deterministic top-B, their completions greedy; the gate always uses the untempered distribution.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Sequence

import torch

from runtime.errors import ConfigError
from adafuse.gate import top2_margin
from runtime.kv_state import KVState
from runtime.member import Member, make_generators
from runtime.outputs import Cost, GenerationOutput, split_batch_cost
from runtime.sampling import sample
from adafuse.scoring import CALIBRATIONS, NORMALISATIONS, choose, fuse_scores, normalised_score
from runtime.text_state import MemberText
from adafuse.words import word_end

EOS_KEY = "<eos>"
DRAFT_CANDIDATES = ("model-free", "all", "off")


@dataclass
class WordConfig:
    """Knobs of the word-level methods (paper values as defaults, except two measured choices).

    Defaults `normalise="byte"`, `calibration="softmax"` were picked with
    `benchmarks/adafuse_cost.py --normalisation` (smollm2-135m + gemma3-270m + qwen2.5-coder-0.5b,
    teacher-forced on GSM8K gold chains of thought, 4 questions x first 5 words = 20 positions):
    the gold word was picked at 0.50 (byte/softmax) vs 0.40 (token/none, the paper's setting),
    0.45 (token/softmax) and 0.40 (byte/none); at the 13 uncertain positions 0.38 vs 0.31. A small
    sample (differences of 1-2 positions); re-measure with more questions when time allows.

    `draft_candidates`: which members complete their candidate words through their `specdec`
    drafter (same words either way): "all", "off", or "model-free" (default: prompt lookup, which
    costs no forward; `docs/results/adafuse_cost/gsm8k_20_fp32_drafted_candidates.md`: fewer
    forwards, same time). A model drafter's forwards cost more than the member forwards they save
    on candidate words of one or two tokens (0.5B drafting for a 1.5B member, bfloat16:
    `gsm8k_6_lead15_drafted_candidates.md`)."""

    threshold: float = 0.7       # gate: confident iff p1 - p2 >= threshold
    span: int = 3                # max words committed without ensembling
    candidates: int = 3          # B: candidate words proposed per member
    normalise: str = "byte"      # "token" (paper) | "byte" | "char" | "sum"; byte: see below
    calibration: str = "softmax"  # "none" (paper: mean of scores) | "softmax" (see adafuse.scoring.fuse_scores)
    max_word_tokens: int = 8     # a word longer than this (tokens) is cut there
    gate: bool = True            # False = word-fixed: ensemble every word
    flush_guesses: int = 16      # guesses fed with a non-lead's flush, split over its rows (0: off)
    draft_candidates: str = "model-free"  # which members' drafters draft their candidate words: see below

    @classmethod
    def from_options(cls, method: str, options: dict[str, Any]) -> "WordConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"method '{method}' has no option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        cfg = cls(**options)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        def bad(name: str, want: str) -> ConfigError:
            return ConfigError(f"option {name}={getattr(self, name)!r} is invalid: {want}")

        if not isinstance(self.threshold, (int, float)) or not 0.0 <= float(self.threshold) <= 1.0:
            raise bad("threshold", "a margin in [0, 1]")
        for name, low in (("span", 0), ("candidates", 1), ("max_word_tokens", 1), ("flush_guesses", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(name, f"an integer >= {low}")
        if self.normalise not in NORMALISATIONS:
            raise bad("normalise", f"one of {', '.join(NORMALISATIONS)}")
        if self.calibration not in CALIBRATIONS:
            raise bad("calibration", f"one of {', '.join(CALIBRATIONS)}")
        if not isinstance(self.gate, bool):
            raise bad("gate", "True or False")
        if self.draft_candidates not in DRAFT_CANDIDATES:
            raise bad("draft_candidates", f"one of {', '.join(DRAFT_CANDIDATES)}")


@dataclass
class Candidate:
    text: str
    proposed_by: list[str] = field(default_factory=list)
    eos: bool = False
    scores: dict[str, float] = field(default_factory=dict)
    fused: float = float("nan")


@dataclass
class Round:
    """One round of one row: a confident span (1..span words by the lead) or one ensembled word."""

    kind: str                          # "confident" | "ensemble"
    units: list[str]                   # committed text units, in order
    gate: list[dict[str, Any]]         # per word start: {"margin": float, "decision": str}
    proposer: str                      # the member whose distribution drove the gate
    candidates: list[Candidate] = field(default_factory=list)
    chosen: str | None = None          # the committed candidate (ensemble rounds; "<eos>" = stop)

    @property
    def text(self) -> str:
        return "".join(self.units)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["text"] = self.text
        return d


class WordFusion:
    """The state of one batch: shared texts, each member's `MemberText`, traces. Drive with `step()`
    until `done`, or call `run()`."""

    def __init__(self, members: Sequence[Member], prompts: Sequence[str], config: WordConfig, *,
                 weights: Sequence[float], lead: int, chat: bool | None, max_new_tokens: int,
                 stop: Sequence[str], temperature: float, seed: int | None,
                 speculators: Sequence[Any | None] | None = None):
        self.members = list(members)
        self.config = config
        self.weights = [float(w) for w in weights]
        self.lead = lead
        self.max_new_tokens = max_new_tokens
        self.stop = [s for s in stop if s]
        self.temperature = float(temperature)
        self.speculators = list(speculators) if speculators else [None] * len(self.members)
        self.views = [MemberText(m, prompts, chat=chat) for m in self.members]
        n = len(prompts)
        self.texts = ["" for _ in range(n)]
        self.units: list[list[str]] = [[] for _ in range(n)]
        self.pending = [["" for _ in range(n)] for _ in self.members]
        self.finish: list[str | None] = [None] * n
        self.streak = [0] * n
        self.traces: list[list[Round]] = [[] for _ in range(n)]
        self.gens = make_generators(n, seed, self.members[lead].device)
        # the lead's candidate words of rows waiting for an ensembled word, advanced in the lead's
        # forwards for the confident rows (`_decode_word`); valid until the next ensembled word
        self._lead_branches: dict[int, Branches] = {}
        self._open_trees: dict[int, OpenTree | None] = {}  # per member, set by `propose`

    # ---- helpers ---------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return all(f is not None for f in self.finish)

    def active_rows(self) -> list[int]:
        return [b for b, f in enumerate(self.finish) if f is None]

    def flush(self, m: int, rows: Sequence[int] | None = None) -> None:
        """Feed member m the committed text it has not seen yet (one forward for all rows)."""
        rows = range(len(self.texts)) if rows is None else rows
        pieces = ["" for _ in self.texts]
        for b in rows:
            pieces[b], self.pending[m][b] = self.pending[m][b], ""
        if any(pieces):
            self.views[m].extend(pieces)

    def sync_all(self) -> None:
        for m in range(len(self.members)):
            self.flush(m)

    def _row_gen(self, b: int) -> torch.Generator | None:
        return self.gens[b] if self.gens is not None else None

    def _commit(self, b: int, unit: str, held_by: Sequence[int]) -> None:
        """Append `unit` to row b's shared text; members not in `held_by` (which already hold it in
        their cache) get it lazily. Then check stop strings."""
        if not unit:
            return
        start = len(self.texts[b])
        self.texts[b] += unit
        self.units[b].append(unit)
        for m in range(len(self.members)):
            if m not in held_by:
                self.pending[m][b] += unit
        for s in self.stop:
            cut = self.texts[b].find(s, max(0, start - len(s) + 1))
            if cut >= 0:
                self._truncate(b, cut)
                self.finish[b] = "stop"
                return

    def _truncate(self, b: int, cut: int) -> None:
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

    def _check_length(self, b: int) -> None:
        if self.finish[b] is None and len(self.views[self.lead].output_ids(b)) >= self.max_new_tokens:
            self.finish[b] = "length"

    def lead_tokens(self, b: int) -> int:
        return len(self.views[self.lead].output_ids(b))

    # ---- one step --------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        """Advance every unfinished row by one word (confident) or one ensembled word."""
        rows = self.active_rows()
        if not rows:
            return
        lead_state = self.views[self.lead].state
        margins = top2_margin(lead_state.next_probs(1.0)).tolist()
        cfg = self.config
        confident, ensemble, decisions = [], [], {}
        for b in rows:
            if not cfg.gate:
                decisions[b] = "off"
            elif margins[b] < cfg.threshold:
                decisions[b] = "uncertain"
            elif self.streak[b] >= cfg.span:
                decisions[b] = "forced"
            else:
                decisions[b] = "confident"
            (confident if decisions[b] == "confident" else ensemble).append(b)
        if confident:
            # rows at an ensembled word wait (their state does not change, so their gate reads the same
            # next step) until no row is confident: ensembled words of all rows then share one set of
            # member forwards instead of one set per step. Within `span` steps every row gets there.
            self._confident_words(confident, {b: margins[b] for b in confident}, waiting=ensemble)
            return
        if ensemble:
            self._ensemble_word(ensemble, {b: (margins[b], decisions[b]) for b in ensemble})

    # ---- confident path: the lead decodes one word -----------------------------------------
    def _confident_words(self, rows: list[int], margins: dict[int, float], waiting: Sequence[int] = ()) -> None:
        view = self.views[self.lead]
        member = view.member
        if self.speculators[self.lead] is None:
            words = self._decode_word(view, rows, margins, waiting)
        else:
            words = self._speculative_words(rows, margins)
        pieces = ["" for _ in self.texts]
        for b in rows:
            text = "".join(w for w, _ in words[b][0])
            view.texts[b] += text
            pieces[b] = text
        view.sync([b for b in rows if pieces[b]])
        for b in rows:
            spans, eos = words[b]
            for text, margin in spans:
                if self.finish[b] is not None:
                    break
                trace = self.traces[b]
                gate = {"margin": round(margin, 4), "decision": "confident"}
                if trace and trace[-1].kind == "confident" and self.streak[b] > 0:
                    trace[-1].units.append(text)
                    trace[-1].gate.append(gate)
                else:
                    trace.append(Round("confident", [text], [gate], member.name))
                if not text:
                    trace[-1].units.pop()
                    trace[-1].chosen = EOS_KEY if eos else None
                self.streak[b] += 1
                self._commit(b, text, held_by=(self.lead,))
            if eos and self.finish[b] is None:
                self.finish[b] = "eos"
            self._check_length(b)

    def _decode_word(self, view: MemberText, rows: list[int], margins: dict[int, float],
                     waiting: Sequence[int] = ()) -> dict[int, tuple[list[tuple[str, float]], bool]]:
        """The lead decodes confident words straight into its cache. A word ends *before* a token
        that starts the next word; where the one-word-per-step schedule would decode that next word
        confidently from this exact state (`_next_word`: gate, span, length, stop strings, canonical
        boundary), the row goes on with that token in the same forwards, so rows of a batch are not
        held at every word boundary by the row with the longest word. The state of a row that stops
        ends at the word boundary, ready for the next gate. Output equals one word per step (greedy;
        sampled rows keep the boundary token they drew instead of drawing it again).
        The same forwards advance the lead's candidate words of the `waiting` rows, and of rows that
        stop here for an ensembled word (`Branches`, as a tree beside the committed tokens), so their
        ensembled word needs fewer lead forwards.
        Returns row -> ([(word, gate margin at its start)], hit EOS)."""
        member, state = view.member, view.state
        if waiting:
            firsts, _ = self._firsts(view, [b for b in waiting if b not in self._lead_branches])
            for b, f in firsts.items():
                self._lead_branches[b] = Branches(member, f, self.config.max_word_tokens)
        have = {b: view.output_ids(b) for b in rows}  # + fed[b]: the row's output ids in the cache
        fed: dict[int, list[int]] = {b: [] for b in rows}
        words: dict[int, list[tuple[str, float]]] = {b: [] for b in rows}
        ids: dict[int, list[int]] = {b: [] for b in rows}   # of the word being decoded
        text: dict[int, str] = {b: "" for b in rows}
        margin = {b: margins[b] for b in rows}
        out: dict[int, tuple[list[tuple[str, float]], bool]] = {}
        riders: list[int] = []  # rows that just stopped for an ensembled word

        def at_word_start(b: int, gate: float) -> bool:
            """Row b's last word is complete and the next starts here with margin `gate`: True to
            go on with it in this step, else the row is done here."""
            nxt = self._next_word(b, words[b], have[b] + fed[b], gate)
            if nxt == "confident":
                ids[b], text[b], margin[b] = [], "", gate
                return True
            out[b] = (words[b], False)
            if nxt == "ensemble":
                riders.append(b)
            return False

        live = list(rows)
        while live:
            probs = state.next_probs(self.temperature if self.temperature > 0 else 0.0)
            if self.temperature > 0:
                toks = {b: int(sample(probs[b: b + 1], [self._row_gen(b)] if self.gens else None)) for b in live}
            else:
                toks = {b: int(probs[b].argmax()) for b in live}
            gates: list[float] | None = None
            feed: list[list[int]] = [[] for _ in self.texts]
            still, cut = [], []
            for b in live:
                tok = toks[b]
                if tok in member.eos_token_ids:
                    words[b].append((text[b], margin[b]))
                    out[b] = (words[b], True)
                    continue
                new = member.decode(ids[b] + [tok])
                end = word_end(new)
                if end is not None and end <= len(text[b]) and ids[b]:  # tok starts the next word
                    words[b].append((text[b], margin[b]))
                    if gates is None:
                        gates = top2_margin(state.next_probs(1.0)).tolist()
                    if not at_word_start(b, gates[b]):
                        continue  # tok is left out: the next step gates here
                    new = member.decode([tok])
                    end = word_end(new)
                ids[b].append(tok)
                fed[b].append(tok)
                feed[b] = [tok]
                if end is not None:  # tok straddles the boundary: keep the word's part of it
                    words[b].append((new[:end], margin[b]))
                    out[b] = (words[b], False)
                    continue
                text[b] = new
                if len(ids[b]) >= self.config.max_word_tokens:  # cut here; gated after this forward
                    words[b].append((new, margin[b]))
                    cut.append(b)
                    continue
                still.append(b)
            if riders:  # rows now waiting for an ensembled word ride the forwards left in this step
                firsts, _ = self._firsts(view, riders)
                for b, f in firsts.items():
                    self._lead_branches[b] = Branches(member, f, self.config.max_word_tokens)
                waiting = list(waiting) + riders
                riders.clear()
            ride = [b for b in waiting if not self._lead_branches[b].done]
            if ride and any(feed):
                self._ride(state, feed, ride)
            elif any(feed):
                state.append(feed, return_logits=False)
            if cut:
                gates = top2_margin(state.next_probs(1.0)).tolist()
                still += [b for b in cut if at_word_start(b, gates[b])]
            live = sorted(still)
        return out

    def _next_word(self, b: int, words: Sequence[tuple[str, float]], ids: list[int], margin: float) -> str:
        """What the one-word-per-step schedule would do next for row b, after the lead decoded
        `words` ((text, margin) pairs) in this step and its cache now holds output ids `ids`, with
        the next word start's gate `margin`: "stop" when the row finishes (length, stop string) or
        `ids` are not the canonical encoding of the text (the boundary is repaired first, which may
        change the state); else "confident" (gate passed, span not used up) or "ensemble"."""
        cfg = self.config
        if len(ids) >= self.max_new_tokens:
            return "stop"
        start = len(self.texts[b])
        full = self.texts[b] + "".join(w for w, _ in words)
        if any(full.find(s, max(0, start - len(s) + 1)) >= 0 for s in self.stop):
            return "stop"
        if self.members[self.lead].encode(full) != ids:
            return "stop"
        return "confident" if margin >= cfg.threshold and self.streak[b] + len(words) < cfg.span else "ensemble"

    def _ride(self, state: KVState, feed: list[list[int]], ride: Sequence[int]) -> None:
        """One lead forward that commits `feed` (one token per confident row) and advances the open
        candidate branches of the `ride` rows by one greedy token each (the branches are re-fed
        whole beside the committed tokens and discarded)."""
        built = TreeBuilder(state.batch_size)
        at: list[list[int]] = [[0] if f else [] for f in feed]
        for b, f in enumerate(feed):
            built.add(b, f)
        ends: dict[tuple[int, int], int] = {}
        for b in ride:
            bs = self._lead_branches[b]
            for i in bs.open():
                ends[(b, i)] = built.add(b, bs.tokens[i])
                at[b].append(ends[(b, i)])
        logits = state.forward_tree(built.tokens, built.parents, logits_at=at)
        state.accept([[0] if f else [] for f in feed])
        for (b, i), node in ends.items():
            self._lead_branches[b].step(i, int(logits[b, at[b].index(node)].argmax()))

    def _speculative_words(self, rows: list[int], margins: dict[int, float]
                           ) -> dict[int, tuple[list[tuple[str, float]], bool]]:
        """Confident words of a lead that has a `specdec.SpeculativeGenerator`: one speculative
        `decode` per step continues the lead's own KV state for up to the rest of the span, and stops
        a row as soon as a new word starts where the lead is not confident (the engine reports the
        target distribution every token was drawn from), so each word start is gated exactly as the
        plain path would gate it (margin, span, canonical boundary, length). Tokens past the last
        accepted word are rolled back; the row's last token is committed only when it is kept.
        Greedy output equals the plain path's. Returns row -> ([(word, gate margin at its start)],
        hit EOS)."""
        cfg = self.config
        view = self.views[self.lead]
        member, state = view.member, view.state
        spec = self.speculators[self.lead]
        budget = {b: cfg.span - self.streak[b] for b in rows}
        before = list(state.lengths)
        have = {b: view.output_ids(b) for b in rows}  # (`decode` commits into the state: read them first)

        def stop_fn(b: int, new: list[int]) -> bool:
            units = count_complete_units(member.decode(new))
            if units >= budget[b]:
                return True
            if units and len(new) > 1 and count_complete_units(member.decode(new[:-1])) < units:
                # new[-1] starts the next word: go on only where the lead is confident about it and
                # the row has room for it (`_next_word` stops it at max_new_tokens)
                if len(have[b]) + len(new) - 1 >= self.max_new_tokens:
                    return True
                return float(top2_margin(torch.softmax(spec.last_sources[b][-1].float(), -1)[None])[0]) < cfg.threshold
            return False

        def draft_depth(b: int, new: list[int]) -> int:
            # a confident run ends within the span budget (GSM8K: ~1.3 lead tokens per word), often
            # after one word: drafting deeper than one token per word left, plus one, costs drafter
            # forwards and verified tokens the run cannot use
            return 1 + budget[b] - count_complete_units(member.decode(new))

        # only `rows` are decoded: the other rows' state is left as it is
        new_ids = spec.decode(state, max(budget.values()) * cfg.max_word_tokens + 1, stop_fn=stop_fn,
                              temperature=self.temperature, generators=self.gens, commit_last=False,
                              record_sources=True, rows=rows, draft_depth=draft_depth)
        sources, uncommitted = spec.last_sources, spec.last_uncommitted
        out: dict[int, tuple[list[tuple[str, float]], bool]] = {}
        keep = list(before)
        last: dict[int, torch.Tensor] = {}
        missing: list[list[int]] = [[] for _ in range(state.batch_size)]
        for b in rows:
            words, n_keep, eos = self._walk_chunk(b, have[b], new_ids[b], sources[b][1:], margins[b])
            out[b] = (words, eos)
            committed = len(new_ids[b]) - int(uncommitted[b])
            keep[b] = before[b] + min(n_keep, committed)
            missing[b] = new_ids[b][committed:n_keep]
            if n_keep < len(new_ids[b]):  # the distribution at the kept boundary is already known
                last[b] = sources[b][n_keep]
        state.rollback(keep)
        for b, logits in last.items():
            state.last_logits[b] = logits
            state._stale.discard(b)
        if any(missing):  # a kept last token the engine left uncommitted (rare)
            state.append(missing, return_logits=False)
        return out

    def _walk_chunk(self, b: int, have: list[int], ids: list[int], after: list[torch.Tensor], first_margin: float
                    ) -> tuple[list[tuple[str, float]], int, bool]:
        """Split a speculatively decoded chunk `ids` (after the row's output ids `have`) into the words
        the plain path would have committed. Returns (words with their gate margins, tokens to keep,
        hit EOS)."""
        cfg = self.config
        member = self.views[self.lead].member
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

    # ---- uncertain path: ensemble one word -------------------------------------------------
    def _ensemble_word(self, rows: list[int], gates: dict[int, tuple[float, str]]) -> None:
        cfg = self.config
        names = [m.name for m in self.members]
        for m in range(len(self.members)):
            if not self._guesses_with_flush(m):  # (those flush in `propose`)
                self.flush(m, rows)
        cands = self.propose(rows)
        logprobs = self.candidate_logprobs(rows, cands)
        raw = {b: torch.zeros(len(self.members), len(cands[b])) for b in rows}
        for m in range(len(self.members)):
            for b in rows:
                for j, c in enumerate(cands[b]):
                    s = normalised_score(logprobs[m][b][j], c.text or "x", cfg.normalise)
                    raw[b][m, j] = s
                    c.scores[names[m]] = round(s, 4)
        picks: dict[int, int] = {}
        for b in rows:
            fused = fuse_scores(raw[b], self.weights, cfg.calibration)
            for c, f in zip(cands[b], fused.tolist()):
                c.fused = round(f, 4)
            picks[b] = choose(fused, self.temperature, self._row_gen(b))
        holders = self.commit_chosen(picks, cands)
        self._lead_branches = {}
        for b in rows:
            chosen = cands[b][picks[b]]
            margin, decision = gates[b]
            self.traces[b].append(Round("ensemble", [chosen.text] if chosen.text else [],
                                        [{"margin": round(margin, 4), "decision": decision}],
                                        names[self.lead], cands[b], EOS_KEY if chosen.eos else chosen.text))
            self.streak[b] = 0
            if chosen.eos:
                self.finish[b] = "eos"
                continue
            self._commit(b, chosen.text, held_by=holders[b])
            self._check_length(b)

    def _guesses_with_flush(self, m: int) -> bool:
        return m != self.lead and self.config.flush_guesses > 0

    def _flush_guessing(self, m: int, rows: Sequence[int], known: dict[int, list[str]]) -> "OpenTree | None":
        """`flush(m, rows)`, and in the same forward a tree of guesses below each flushed row's new
        text, every node with logits: the member's tokens of the lead's top-k first tokens (as text;
        k = `flush_guesses` // rows flushed) and of the words members before it proposed (`known`).
        `complete_words` walks the tree: where member m's first tokens are among the guesses, its
        first completion forward is saved (GSM8K, batch 1: ~20 % fewer non-lead forwards per word;
        the time saved was 9-19 % on 6 questions but 2 % on 20, see
        docs/results/adafuse_cost/gsm8k_20_flush_guesses.md). Guesses are cheap only while a forward
        stays memory bound, hence a budget per forward rather than per row (at batch 4, 8 guesses per
        row cost more time than the forwards they saved). Returns the open tree, or None when no
        guess was fed."""
        view, lead = self.views[m], self.views[self.lead]
        rows = [b for b in rows if self.pending[m][b]]
        k = self.config.flush_guesses // max(len(rows), 1)
        if not rows or k == 0:
            self.flush(m, rows)
            return None
        probs = lead.state.next_probs(1.0)
        top = torch.topk(probs, min(k, probs.shape[-1]), dim=-1).indices.tolist()
        built = TreeBuilder(len(self.texts))
        for b in rows:
            view.texts[b] += self.pending[m][b]
            self.pending[m][b] = ""
            have = view.canonical_ids(b)
            guesses = [lead.member.decode([t]) for t in top[b] if t not in lead.member.eos_token_ids]
            for text in guesses + known.get(b, []):
                if text:
                    built.add(b, continuation_ids(view, b, text, have))
        below = {b: (built.tokens[b], built.parents[b]) for b in rows if built.tokens[b]}
        view.sync(rows, below=below)
        if not below:
            return None
        state = view.state
        logits = {(b, n): state.node_logits(b, n) for b in below for n in range(len(built.tokens[b]))}
        return OpenTree(built, logits, state.open_tree_serial, [len(t) for t in built.tokens])

    def _candidate_drafter(self, m: int) -> Any | None:
        """Member m's `specdec` drafter, for its candidate words' completions, as `draft_candidates`
        allows (None: none)."""
        spec, which = self.speculators[m], self.config.draft_candidates
        if spec is None or spec.drafter is None or which == "off":
            return None
        return spec.drafter if which == "all" or spec.drafter_member is None else None

    def _firsts(self, view: MemberText, rows: Sequence[int]) -> tuple[dict[int, list[int]], dict[int, bool]]:
        """Per row, the member's top-B first tokens other than EOS, and whether an EOS was among
        the top-B (it takes one of the B slots)."""
        probs = view.state.next_probs(1.0)
        eos_ids = view.member.eos_token_ids
        k = min(self.config.candidates, probs.shape[-1])
        top = torch.topk(probs, k, dim=-1).indices.tolist()
        firsts = {b: [t for t in top[b] if t not in eos_ids] for b in rows}
        return firsts, {b: len(firsts[b]) < len(top[b]) for b in rows}

    def propose(self, rows: list[int]) -> dict[int, list[Candidate]]:
        """The union of every member's top-B candidate words per row (dedup by exact text, in member
        order; the lead's EOS, when among its top-B, is a candidate too). Members must be flushed for
        `rows`. The lead completes its words last, walking through a tree that already holds the
        other members' candidates: that tree also scores them (`candidate_logprobs`), so for the
        lead an ensembled word usually costs one forward. The open trees are kept in `_open_trees`."""
        cfg = self.config
        names = [m.name for m in self.members]
        eos_first: dict[int, bool] = {b: False for b in rows}
        words: dict[int, dict[int, list[str]]] = {}
        known: dict[int, list[str]] = {b: [] for b in rows}
        self._open_trees: dict[int, OpenTree | None] = {}
        order = [m for m in range(len(self.members)) if m != self.lead] + [self.lead]
        for m in order:
            view = self.views[m]
            guessed = self._flush_guessing(m, rows, known) if self._guesses_with_flush(m) else None
            firsts, eos = self._firsts(view, rows)
            started: dict[int, Branches] = {}
            if m == self.lead:
                eos_first = eos  # EOS takes one of the B slots; only the lead's counts
                started = {b: self._lead_branches[b] for b in rows
                           if b in self._lead_branches and self._lead_branches[b].firsts == firsts[b]}
            # every member walks through the candidates proposed before it; only the lead (last)
            # keeps its tree for scoring (the others score in a forward of their own: the lead
            # adds candidates after them)
            words[m], self._open_trees[m] = complete_words(view, rows, firsts, cfg.max_word_tokens, known,
                                                           keep_tree=m == self.lead, started=started, tree=guessed,
                                                           drafter=self._candidate_drafter(m))
            for b in rows:
                known[b] += [w for w in words[m][b] if w and w not in known[b]]
        union: dict[int, dict[str, Candidate]] = {b: {} for b in rows}
        for m in range(len(self.members)):
            for b in rows:
                if m == self.lead and eos_first[b]:
                    union[b].setdefault(EOS_KEY, Candidate("", [], eos=True)).proposed_by.append(names[m])
                for w in words[m][b]:
                    if not w:
                        continue
                    cand = union[b].setdefault(w, Candidate(w))
                    if names[m] not in cand.proposed_by:
                        cand.proposed_by.append(names[m])
        return {b: list(union[b].values()) for b in rows}

    def candidate_logprobs(self, rows: list[int], cands: dict[int, list[Candidate]]
                           ) -> list[dict[int, list[torch.Tensor]]]:
        """Per member, per row, per candidate: the member's log-probs of its own tokens of the
        candidate given the row's committed text (an EOS candidate: log p(any EOS of the member)).
        A token's log-prob needs the logits after its parent, so a candidate is scored from the
        member's last logits and its open completion tree (`propose`) wherever the tree already
        holds its tokens but the last (a word that is one token for the member needs no node at
        all). Where that is not so for some candidate, the tree is extended by every candidate it
        does not hold yet, in one forward for all rows (candidates sharing a token prefix share its
        nodes). The lead's tree is always extended (its next gate needs the logits after the chosen
        word); it usually holds every candidate already. The tree stays open so that `commit_chosen`
        can keep the chosen branch without another forward (any other state operation discards it)."""
        out = []
        self._tree_paths: list[dict[tuple[int, int], list[int]]] = []
        self._score_trees: list[OpenTree] = []
        open_trees = self._open_trees
        for m, view in enumerate(self.views):
            state = view.state
            ids = {(b, j): continuation_ids(view, b, c.text) for b in rows for j, c in enumerate(cands[b]) if not c.eos}
            tree = open_trees.get(m)
            if tree is None or not tree.is_open_in(state):
                tree = OpenTree(TreeBuilder(len(self.texts)), {}, None)
            fed = tree.fed
            for (b, _), t in ids.items():  # candidates sharing a prefix share its nodes
                tree.built.add(b, t)
            paths = {key: trie_path(tree.built.trie[key[0]], t) for key, t in ids.items()}
            if any(n < fed[key[0]] and (key[0], n) not in tree.logits for key, p in paths.items() for n in p):
                tree = OpenTree(tree.built, {}, None)  # re-feed all (not needed for `complete_words` trees)
            unfed = any(len(t) > f for t, f in zip(tree.built.tokens, tree.fed))
            scorable = all((key[0], n) in tree.logits for key, p in paths.items() for n in p[:-1])
            if unfed and (m == self.lead or not scorable):
                tree.grow(state)
            node_logits = tree.logits
            last_lp = torch.log_softmax(state.last_logits.float(), dim=-1)
            eos_ids = sorted(view.member.eos_token_ids)
            per_row: dict[int, list[torch.Tensor]] = {}
            for b in rows:
                row = []
                for j, c in enumerate(cands[b]):
                    if c.eos:
                        row.append(torch.logsumexp(last_lp[b, eos_ids], dim=0)[None].cpu() if eos_ids
                                   else torch.tensor([-1e4]))
                        continue
                    path = paths[(b, j)]
                    tok = torch.tensor(ids[(b, j)], device=last_lp.device)
                    inner = [node_logits[(b, n)] for n in path[:-1]]
                    prev = torch.cat([last_lp[b: b + 1]] + ([torch.log_softmax(torch.stack(inner), dim=-1)] if inner else []),
                                     dim=0)
                    row.append(prev.gather(-1, tok[:, None]).squeeze(-1).cpu())
                per_row[b] = row
            self._tree_paths.append(paths)
            self._score_trees.append(tree)
            out.append(per_row)
        self._open_trees = {}
        return out

    def commit_chosen(self, chosen: dict[int, int], cands: dict[int, list[Candidate]]) -> dict[int, list[int]]:
        """Every member keeps the chosen candidate's branch of its open scoring tree (no forward)
        where the tree holds all of it with the logits after its end, then its boundary is checked
        against the canonical encoding (`MemberText.sync`). A non-lead whose tree lacks the chosen
        word (it was scored without feeding its last token) gets it lazily with the next text it
        receives (`flush`). Returns row -> the members that now hold the chosen text."""
        holders: dict[int, list[int]] = {b: [] for b in chosen}
        for m, view in enumerate(self.views):
            paths: list[list[int]] = [[] for _ in self.texts]
            state, tree = view.state, self._score_trees[m]
            for b, j in chosen.items():
                if cands[b][j].eos:
                    continue
                path = self._tree_paths[m][(b, j)]
                if tree.is_open_in(state) and (b, path[-1]) in tree.logits:  # (fed in order: so is the path)
                    paths[b] = path
                elif m == self.lead:
                    raise RuntimeError("commit_chosen() needs the trees of candidate_logprobs()")
            if state.open_tree_serial is not None:
                state.accept(paths)
            for b, j in chosen.items():
                if paths[b] or not cands[b][j].text:
                    holders[b].append(m)
                    view.texts[b] += cands[b][j].text
            view.sync([b for b, j in chosen.items() if paths[b]])
        return holders

    # ---- whole run -------------------------------------------------------------------------
    def run(self, on_step: Callable[["WordFusion"], None] | None = None) -> list[GenerationOutput]:
        t0 = time.perf_counter()
        counted = list(self.members)  # members, then the models their drafters run
        for spec in self.speculators:
            dm = getattr(spec, "drafter_member", None)
            if dm is not None and all(dm is not m for m in counted):
                counted.append(dm)
        snaps = [m.counters.snapshot() for m in counted]
        while not self.done:
            self.step()
            if on_step is not None:
                on_step(self)
        wall = time.perf_counter() - t0
        total = Cost(wall_time_s=wall)
        for m, snap in zip(counted, snaps):
            total.merge(m.cost_since(snap))
        outs = []
        for b in range(len(self.texts)):
            outs.append(GenerationOutput(self.texts[b], self.lead_tokens(b), self.finish[b],
                                         total if b == 0 else Cost(), trace=self.traces[b],
                                         stats=round_stats(self.traces[b], self.texts[b])))
        return split_batch_cost(outs)


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


def continuation_ids(view: MemberText, row: int, text: str, have: Sequence[int] | None = None) -> list[int]:
    """The member's ids of `text` appended to the row's committed text: the tail of a fresh encoding
    of (committed + text) after the cached ids (or `have`); falls back to encoding `text` alone when
    the boundary would re-tokenise them (rare; the score is then of that tokenisation)."""
    have = view.output_ids(row) if have is None else list(have)
    full = view.member.encode(view.texts[row] + text)
    if len(full) > len(have) and full[: len(have)] == have:
        return full[len(have):]
    return view.member.encode(text)


@dataclass
class OpenTree:
    """A member's token tree still open in its state (`KVState.open_tree_serial` == `serial`; None: not
    fed yet): its nodes (`TreeBuilder`: per row, trie (parent node, token) -> node, in the order fed)
    and the logits after each node that has them, (row, node) -> [V]."""
    built: "TreeBuilder"
    logits: dict[tuple[int, int], torch.Tensor]
    serial: int | None
    fed_counts: list[int] | None = None  # per row, nodes of `built` fed so far

    def is_open_in(self, state: KVState) -> bool:
        return self.serial is not None and state.open_tree_serial == self.serial

    def grow(self, state: KVState, logits_at: list[list[int]] | None = None) -> None:
        """Feed the nodes added to `built` since the last call (one forward; a fresh tree in `state`
        unless this one is open there) and record their logits (all, or only `logits_at`)."""
        built, B = self.built, state.batch_size
        fed = self.fed
        tokens = [built.tokens[b][fed[b]:] for b in range(B)]
        parents = [built.parents[b][fed[b]:] for b in range(B)]
        logits = state.forward_tree(tokens, parents, logits_at=logits_at, extend=self.is_open_in(state))
        self.serial = state.open_tree_serial
        for b in range(B):
            for k, node in enumerate(range(fed[b], len(built.tokens[b])) if logits_at is None else logits_at[b]):
                self.logits[(b, node)] = logits[b, k]
        self.fed_counts = [len(t) for t in built.tokens]

    @property
    def fed(self) -> list[int]:
        """Per row, nodes of `built` already in the open tree."""
        return list(self.fed_counts) if self.fed_counts is not None else [0] * len(self.built.tokens)


def trie_path(trie: dict[tuple[int, int], int], ids: Sequence[int]) -> list[int] | None:
    """The nodes of `ids` hanging off the committed tokens in one row's trie, or None if not all are in."""
    node, out = -1, []
    for tok in ids:
        node = trie.get((node, tok))
        if node is None:
            return None
        out.append(node)
    return out


def below(parents: Sequence[int], roots: Sequence[int]) -> set[int]:
    """`roots` and every node under them, in a tree given by parent indices (parents[i] < i)."""
    out = set(roots)
    for i, p in enumerate(parents):
        if p in out:
            out.add(i)
    return out


class Branches:
    """One row's candidate words in the making: each first token is extended by its greedy next
    token until the word ends (a token that starts the next word is left out; one that straddles the
    boundary keeps the word's part), EOS, or `max_word_tokens`."""

    def __init__(self, member: Member, firsts: Sequence[int], max_word_tokens: int):
        self.member, self.max_word_tokens = member, max_word_tokens
        self.tokens = [[t] for t in firsts]
        self.texts = [member.decode([t]) for t in firsts]
        self.words: list[str | None] = [None] * len(firsts)
        for i, t in enumerate(self.texts):
            end = word_end(t)
            if end is not None:
                self.words[i] = t[:end]
            elif max_word_tokens <= 1:
                self.words[i] = t

    @property
    def firsts(self) -> list[int]:
        return [br[0] for br in self.tokens]

    @property
    def done(self) -> bool:
        return all(w is not None for w in self.words)

    def open(self) -> list[int]:
        return [i for i, w in enumerate(self.words) if w is None]

    def step(self, i: int, nxt: int) -> bool:
        """Extend open branch i by its greedy next token `nxt`; True if it is still open."""
        br, text = self.tokens[i], self.texts[i]
        if nxt in self.member.eos_token_ids:
            self.words[i] = text
            return False
        new = self.member.decode(br + [nxt])
        end = word_end(new)
        if end is not None:
            self.words[i] = new[:end] if end > len(text) else text
            return False
        br.append(nxt)
        self.texts[i] = new
        if len(br) >= self.max_word_tokens:
            self.words[i] = new
            return False
        return True

    def result(self) -> list[str]:
        return [w or "" for w in self.words]


class TreeBuilder:
    """Per-row token tries for one `forward_tree`: shared prefixes become one node."""

    def __init__(self, batch_size: int):
        self.trie: list[dict[tuple[int, int], int]] = [{} for _ in range(batch_size)]
        self.tokens: list[list[int]] = [[] for _ in range(batch_size)]
        self.parents: list[list[int]] = [[] for _ in range(batch_size)]

    def add(self, b: int, ids: Sequence[int]) -> int:
        """Add a root-to-node path; returns its last node (-1 for an empty path)."""
        node = -1
        for tok in ids:
            if (node, tok) not in self.trie[b]:
                self.trie[b][(node, tok)] = len(self.tokens[b])
                self.tokens[b].append(tok)
                self.parents[b].append(node)
            node = self.trie[b][(node, tok)]
        return node


def complete_words(view: MemberText, rows: Sequence[int], firsts: dict[int, list[int]],
                   max_word_tokens: int, known: dict[int, list[str]] | None = None, keep_tree: bool = False,
                   started: dict[int, Branches] | None = None, tree: OpenTree | None = None,
                   drafter: Any | None = None) -> tuple[dict[int, list[str]], OpenTree | None]:
    """Complete each first token greedily to the word boundary (`Branches`) without committing
    anything; all unfinished branches of all rows advance in one forward per step. The steps grow
    one token tree in the member's state (`KVState.forward_tree(extend=True)`): the first holds the
    branches' tokens and the `known` words as drafts (per row, words other members proposed, by this
    member's continuation ids), each later step feeds only each open branch's next token. A branch
    walks on through the tree while its greedy next token is a node there, so completing a word some
    member already proposed costs no further forward. Logits are computed at the branch ends
    and the drafts below them only (only drafts a branch can walk into are fed); with `keep_tree`
    the tree also holds every known word and the words completed so far, and every node gets logits
    (the lead: its tree usually holds every candidate). The tree stays open in the state (returned as
    an `OpenTree`) for `candidate_logprobs` to score from or extend and `commit_chosen` to keep the
    chosen word. `started`: rows
    whose branches (of the same firsts, at the same state) were already advanced elsewhere. `tree`: a
    tree already open in the state (guesses fed with a flush, `WordFusion._flush_guessing`), every
    node with logits, that the branches walk first and the steps grow. `drafter`: the member's
    `specdec` drafter; its greedy drafts of each open branch, up to the word's end
    (`draft_branches`), go into the first forward below the branch, so the member verifies them as
    its speculative generator would at temperature 0 (the walk takes the member's argmax at every
    node, so the words are the same with or without drafts; see `WordConfig.draft_candidates` for
    what they save).
    Returns (row -> words aligned with firsts, the open tree or None)."""
    member, state = view.member, view.state
    B = state.batch_size
    started = started or {}
    branches = {b: started[b] if b in started else Branches(member, firsts[b], max_word_tokens) for b in rows}
    drafts = {b: [continuation_ids(view, b, w) for w in (known or {}).get(b, []) if w] for b in rows}
    if tree is None or not tree.is_open_in(state):
        tree = OpenTree(TreeBuilder(B), {}, None)  # grown by each step's forward
    built = tree.built
    first = True
    drafted: dict[int, list[list[int]]] = {}
    while True:
        for b in rows:
            bs = branches[b]
            for i in bs.open():
                node = (trie_path(built.trie[b], bs.tokens[i]) or [None])[-1]
                # walk on while the greedy next token is a node with logits
                while node is not None and (b, node) in tree.logits:
                    nxt = int(tree.logits[(b, node)].argmax())
                    if not bs.step(i, nxt):
                        break
                    node = built.trie[b].get((node, nxt))
        if all(branches[b].done for b in rows):
            break
        if first and drafter is not None:
            drafted = draft_branches(view, rows, branches, drafter, max_word_tokens)
        fed = tree.fed
        ends: list[list[int]] = [[] for _ in range(B)]
        for b in rows:
            bs = branches[b]
            if first:  # drafts go into the first forward; without keep_tree only those a branch can walk into
                open_branches = [bs.tokens[i] for i in bs.open()]
                for ids in drafts[b]:
                    if keep_tree or any(ids[: len(br)] == br for br in open_branches):
                        built.add(b, ids)
                for ids in drafted.get(b, []):
                    built.add(b, ids)
            for i, word in enumerate(bs.words):
                if word is None:
                    ends[b].append(built.add(b, bs.tokens[i]))
                elif keep_tree and word:
                    built.add(b, continuation_ids(view, b, word))
        if all(len(t) == f for t, f in zip(built.tokens, fed)):
            raise RuntimeError("complete_words: an open branch ends at a node without logits")
        # LM head: every node with keep_tree, else only where a walk can go (branch ends and below)
        tree.grow(state, None if keep_tree else
                  [[n for n in sorted(below(built.parents[b], ends[b])) if n >= fed[b]] for b in range(B)])
        first = False
    return {b: branches[b].result() for b in rows}, (tree if tree.serial is not None else None)


def draft_branches(view: MemberText, rows: Sequence[int], branches: dict[int, "Branches"], drafter: Any,
                   max_word_tokens: int) -> dict[int, list[list[int]]]:
    """Per row, each open branch's tokens followed by the drafter's greedy continuation of it, cut
    where the word would end (a drafted token is kept only while the branch stays open after it: a
    token that ends the word needs no logits). Branches the drafter has nothing for are left out."""
    member, B = view.member, view.state.batch_size
    opened = {b: branches[b].open() for b in rows}
    tokens = [[list(branches[b].tokens[i]) for i in opened.get(b, [])] for b in range(B)]
    contexts = [list(view.state.ids[b]) if tokens[b] else None for b in range(B)]
    depth = [[max_word_tokens - 1 - len(t) for t in row] for row in tokens]

    def keep(b: int, i: int, draft: list[int]) -> bool:
        ids = tokens[b][i] + draft
        return (draft[-1] not in member.eos_token_ids and len(ids) < max_word_tokens
                and word_end(member.decode(ids)) is None)

    drafts = drafter.draft_continuations(contexts, tokens, depth, keep)
    return {b: [t + d for t, d in zip(tokens[b], drafts[b]) if d] for b in rows}


def round_stats(trace: Sequence[Round], text: str) -> dict[str, Any]:
    """Counts for reports: rounds, ensembled rounds, words committed confidently / by ensembling."""
    ens = sum(1 for r in trace if r.kind == "ensemble")
    conf_words = sum(len(r.units) for r in trace if r.kind == "confident")
    ens_words = sum(len(r.units) for r in trace if r.kind == "ensemble")
    return {"rounds": len(trace), "ensemble_rounds": ens, "confident_words": conf_words,
            "ensembled_words": ens_words, "units": conf_words + ens_words}


def generate(members: Sequence[Member], prompts: Sequence[str], *, max_new_tokens: int, stop: Sequence[str],
             temperature: float, seed: int | None, weights: Sequence[float], lead: int, chat: bool | None,
             method: str = "adafuse", speculators: Sequence[Any | None] | None = None,
             **options: Any) -> list[GenerationOutput]:
    """Word-level ensemble generation (`method` "adafuse" or "word-fixed"); options are `WordConfig`
    knobs. Rows of `prompts` are processed together and finish independently."""
    if method == "word-fixed":
        options = {**options, "gate": False}
    cfg = WordConfig.from_options(method, options)
    fusion = WordFusion(members, prompts, cfg, weights=weights, lead=lead, chat=chat,
                        max_new_tokens=max_new_tokens, stop=stop, temperature=temperature, seed=seed,
                        speculators=speculators)
    return fusion.run()
