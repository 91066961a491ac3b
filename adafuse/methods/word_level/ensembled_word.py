"""One ensembled word for a set of rows: `EnsembledWord`, propose -> score -> fuse -> commit.

Uncertain: each member proposes its top-`candidates` first tokens, each completed greedily to the
word boundary (members on one device one after another, device groups at once, the lead last; all of a member's branches of all rows in one tree forward per step; a branch walks
on through draft nodes in that tree, the words members before it proposed and, for a member with
a `specdec` drafter, the drafter's greedy continuation of the branch, as long as its greedy next
token is there); the union of the candidate words (dedup by exact text) is scored by every member
(all candidates of all rows in one tree forward per member; the lead completes last, with every
other candidate in its tree, and is usually scored from that tree at no further forward; a non-lead
needs no forward where every candidate it lacks is one token for it, as a token's log-prob needs
only the logits before it), normalised (`normalise`), fused across members with the member weights
(`calibration`), and the best is committed.

Temperature > 0: the ensembled word is drawn from softmax(fused score / temperature) with the row's
own generator. Candidate first tokens are the deterministic top-B, their completions greedy.

The steps hand each other `Proposal` (`propose`) and `Scored` (`score`); `commit` keeps the chosen
word in every member's open tree that holds it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from adafuse.methods.word_level.batch import Batch
from adafuse.methods.word_level.options import WordConfig
from adafuse.methods.word_level.records import EOS_KEY, Candidate, Round
from adafuse.methods.word_level.trees import Branches, complete_words, continuation_ids, top_firsts
from adafuse.gate import top2_margin
from adafuse.scoring import choose, fuse_scores, normalised_score
from runtime.devices import device_key, run_by_device
from runtime.forward_group import model_groups, run_members, run_together, same_model
from runtime.member import Member
from runtime.open_tree import OpenTree, TokenTrie


@dataclass
class Proposal:
    """The candidates of one ensembled word: the rows, per row the union of the members' candidate
    words (`Candidate`s, dedup by text, in member order), and per member the completion tree left
    open in its state (None: none; `score` extends these trees in place)."""

    rows: list[int]
    cands: dict[int, list[Candidate]]
    open_trees: dict[int, OpenTree | None]
    lead_word: dict[int, str | None] = field(default_factory=dict)  # row -> the lead's own word (or EOS_KEY)
    margins: dict[int, list[float]] = field(default_factory=dict)   # member -> per row p1 - p2 ("confidence")


@dataclass
class Scored:
    """A scored proposal: per member, per row, per candidate the log-probs of the member's tokens of
    the candidate; per member the node path of each (row, candidate index) in its scoring tree, and
    that tree (still open in the member's state, for `commit`)."""

    proposal: Proposal
    logprobs: list[dict[int, list[torch.Tensor]]]
    paths: list[dict[tuple[int, int], list[int]]]
    trees: list[OpenTree]


@dataclass
class _MemberProposal:
    """One member's part of a `Proposal`: per row its candidate words, its open completion tree (the
    lead's; None for the others), per row its p1 - p2 (fusion "confidence" only), and for the lead per
    row whether EOS is among its top-B first tokens and whether it is its top-1."""

    words: dict[int, list[str]]
    tree: OpenTree | None
    margins: list[float] | None
    eos_first: dict[int, bool]
    top_eos: dict[int, bool]


def _add_known(known: dict[int, list[str]], words: dict[int, list[str]]) -> None:
    """Append each row's new, non-empty `words` to `known[row]` (in order, no repeats)."""
    for b, row in known.items():
        row += [w for w in words[b] if w and w not in row]


class EnsembledWord:
    """Ensembles one word for rows of the batch: `run(rows, gates, lead_branches)` proposes, scores,
    fuses, commits the chosen word into every member that holds it and records the round."""

    def __init__(self, batch: Batch, members: Sequence[Member], config: WordConfig, *, weights: Sequence[float],
                 temperature: float, speculators: Sequence[Any | None]):
        self.batch = batch
        self.members = list(members)
        self.lead = batch.lead
        self.config = config
        self.weights = list(weights)
        self.temperature = temperature
        self.speculators = list(speculators)

    def run(self, rows: list[int], gates: dict[int, tuple[float, str]],
            lead_branches: dict[int, Branches] | None = None) -> None:
        """Ensemble one word for `rows` (`gates`: row -> (gate margin, decision) for the trace);
        `lead_branches`: the lead's candidate branches already advanced (`LeadDecoder.take_branches`)."""
        # (members that flush with guesses do so in `propose`); members on different devices at once,
        # views of one model in one forward
        run_members([m for m in range(len(self.members)) if not self._guesses_with_flush(m)], self._member,
                    lambda m: self.batch.flush(m, rows))
        proposal = self.propose(rows, lead_branches)
        scored = self.score(proposal)
        picks = self.fuse(scored)
        holders = self.commit(scored, picks)
        self._record(proposal, picks, holders, gates)

    # ---- propose ---------------------------------------------------------------------------
    def propose(self, rows: list[int], lead_branches: dict[int, Branches] | None = None) -> Proposal:
        """The union of every member's top-B candidate words per row (dedup by exact text, in member
        order; the lead's EOS, when among its top-B, is a candidate too). Members must be flushed for
        `rows` (but those that flush with guesses, `_flush_guessing`). The lead completes its words
        last, walking through a tree that already holds the other members' candidates: that tree also
        scores them (`score`), so for the lead an ensembled word usually costs one forward. The lead's
        `lead_branches` of the same first tokens are taken up where they are."""
        names = [m.name for m in self.members]
        lead_branches = lead_branches or {}
        others = [m for m in range(len(self.members)) if m != self.lead]
        by_device: dict[str, list[int]] = {}
        for m in others:
            by_device.setdefault(self._device(m), []).append(m)
        lead_views = any(same_model(self.members[m], self.members[self.lead]) for m in others)
        if lead_views:  # views of the lead's model: the lead proposes with them, in the same forwards
            by_device.setdefault(self._device(self.lead), []).append(self.lead)
        # members on one device propose one after another, each walking through the words proposed
        # before it (views of one model at once, each knowing the words proposed before them); device
        # groups propose at once (each knowing only its own group's words: the same words, maybe more
        # forwards); the lead last, knowing them all, unless it proposed with its views
        chains = run_by_device(list(by_device.values()), lambda group: self._device(group[0]),
                               lambda group: self._propose_chain(group, rows, lead_branches))
        proposed: dict[int, _MemberProposal] = {m: p for chain in chains for m, p in chain.items()}
        known: dict[int, list[str]] = {b: [] for b in rows}
        for m in others:
            _add_known(known, proposed[m].words)
        if not lead_views:
            proposed.update(self._propose_chain([self.lead], rows, lead_branches, known))
        words = {m: p.words for m, p in proposed.items()}
        open_trees = {m: p.tree for m, p in proposed.items()}
        margins = {m: p.margins for m, p in proposed.items() if p.margins is not None}
        eos_first, lead_top_eos = proposed[self.lead].eos_first, proposed[self.lead].top_eos
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
        lead_word = {b: EOS_KEY if lead_top_eos[b] else (words[self.lead][b][0] or None) if words[self.lead][b] else None
                     for b in rows}
        return Proposal(list(rows), {b: list(union[b].values()) for b in rows}, open_trees, lead_word, margins)

    def _propose_chain(self, chain: Sequence[int], rows: list[int], lead_branches: dict[int, Branches],
                       known: dict[int, list[str]] | None = None) -> dict[int, "_MemberProposal"]:
        """Members `chain` propose one after another (their top-B first tokens, each completed
        greedily to the word boundary), each walking through the words `known` and proposed before it
        in the chain; only the lead keeps its completion tree open (for `score`: the lead proposes
        after every other member, so its tree already holds their candidates)."""
        known = {b: list((known or {}).get(b, [])) for b in rows}
        out: dict[int, _MemberProposal] = {}
        for group in model_groups(chain, self._member):  # views of one model: together, in one forward each
            snapshot = {b: list(w) for b, w in known.items()}
            proposals = run_together(group, lambda m: self._propose_one(m, rows, lead_branches, snapshot))
            for m, proposal in zip(group, proposals):
                _add_known(known, proposal.words)
                out[m] = proposal
        return out

    def _propose_one(self, m: int, rows: list[int], lead_branches: dict[int, Branches],
                     known: dict[int, list[str]]) -> "_MemberProposal":
        """Member m's proposal: its top-B first tokens, each completed greedily to the word boundary,
        walking through the `known` words (see `_propose_chain`)."""
        cfg = self.config
        view = self.batch.views[m]
        guessed = self._flush_guessing(m, rows, known) if self._guesses_with_flush(m) else None
        firsts, eos = top_firsts(view, rows, cfg.candidates)
        margins = top2_margin(view.state.next_probs(1.0)).tolist() if cfg.fusion == "confidence" else None
        started: dict[int, Branches] = {}
        top_eos: dict[int, bool] = {}
        if m == self.lead:
            top1 = view.state.next_probs(1.0).argmax(-1).tolist()
            top_eos = {b: top1[b] in view.member.eos_token_ids for b in rows}
            started = {b: lead_branches[b] for b in rows
                       if b in lead_branches and lead_branches[b].firsts == firsts[b]}
        words, tree = complete_words(view, rows, firsts, cfg.max_word_tokens, known,
                                     keep_tree=m == self.lead, started=started, tree=guessed,
                                     drafter=self._candidate_drafter(m))
        # EOS takes one of the B slots; only the lead's counts
        return _MemberProposal(words, tree, margins, eos if m == self.lead else {}, top_eos)

    def _guesses_with_flush(self, m: int) -> bool:
        """Whether member m receives its pending text with guesses (`_flush_guessing`, in `propose`)."""
        return m != self.lead and self.config.flush_guesses > 0

    def _flush_guessing(self, m: int, rows: Sequence[int], known: dict[int, list[str]]) -> OpenTree | None:
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
        batch = self.batch
        view, lead = batch.views[m], batch.lead_view
        rows = [b for b in rows if batch.pending[m][b]]
        k = self.config.flush_guesses // max(len(rows), 1)
        if not rows or k == 0:
            batch.flush(m, rows)
            return None
        probs = lead.state.next_probs(1.0)
        top = torch.topk(probs, min(k, probs.shape[-1]), dim=-1).indices.tolist()
        built = TokenTrie(len(batch.texts))
        for b in rows:
            view.texts[b] += batch.pending[m][b]
            batch.pending[m][b] = ""
            have = view.canonical_ids(b)
            guesses = [lead.member.decode([t]) for t in top[b] if t not in lead.member.eos_token_ids]
            for text in guesses + known.get(b, []):
                if text:
                    built.add(b, continuation_ids(view, b, text, have))
        below = {b: (built.tokens[b], built.parents[b]) for b in rows if built.tokens[b]}
        view.sync(rows, below=below)
        tree = view.state.tree
        return tree if below and tree is not None else None

    def _candidate_drafter(self, m: int) -> Any | None:
        """Member m's `specdec` drafter, for its candidate words' completions, as `draft_candidates`
        allows (None: none)."""
        spec, which = self.speculators[m], self.config.draft_candidates
        if spec is None or spec.drafter is None or which == "off":
            return None
        return spec.drafter if which == "all" or spec.drafter_member is None else None

    # ---- score -----------------------------------------------------------------------------
    def score(self, proposal: Proposal) -> Scored:
        """Per member, per row, per candidate: the member's log-probs of its own tokens of the
        candidate given the row's committed text (an EOS candidate: log p(any EOS of the member)).
        A token's log-prob needs the logits after its parent, so a candidate is scored from the
        member's last logits and its open completion tree (`propose`) wherever the tree already
        holds its tokens but the last (a word that is one token for the member needs no node at
        all). Where that is not so for some candidate, the tree is extended by every candidate it
        does not hold yet, in one forward for all rows (candidates sharing a token prefix share its
        nodes). The lead's tree is always extended (its next gate needs the logits after the chosen
        word); it usually holds every candidate already. The tree stays open so that `commit` can
        keep the chosen branch without another forward (any other state operation discards it)."""
        per_member = run_members(list(range(len(self.members))), self._member,
                                 lambda m: self._score_member(m, proposal))
        logprobs, all_paths, trees = (list(x) for x in zip(*per_member))
        return Scored(proposal, logprobs, all_paths, trees)

    def _member(self, m: int) -> Member:
        """Member m (`runtime.forward_group.run_members` groups members by device and model)."""
        return self.members[m]

    def _device(self, m: int) -> str:
        """Member m's device (`runtime.devices.run_by_device` runs members on different devices at once)."""
        return device_key(self.members[m])

    def _score_member(self, m: int, proposal: Proposal) -> tuple[dict[int, list[torch.Tensor]], dict, OpenTree]:
        """Member m's part of `score`: (per row its candidates' token log-probs, the candidates' tree
        paths, its open tree)."""
        rows, cands = proposal.rows, proposal.cands
        view = self.batch.views[m]
        state = view.state
        ids = {(b, j): continuation_ids(view, b, c.text) for b in rows for j, c in enumerate(cands[b]) if not c.eos}
        tree = proposal.open_trees.get(m)
        if tree is None or not tree.is_open:
            tree = state.new_tree()
        fed = tree.fed
        for (b, _), t in ids.items():  # candidates sharing a prefix share its nodes
            tree.add(b, t)
        paths = {key: tree.path(key[0], t) for key, t in ids.items()}
        if any(n < fed[key[0]] and tree.logits(key[0], n) is None for key, p in paths.items() for n in p):
            fresh = state.new_tree()  # re-feed all (not needed for `complete_words` trees)
            fresh.add_nodes(tree.tokens, tree.parents)
            tree = fresh
        unfed = any(len(t) > f for t, f in zip(tree.tokens, tree.fed))
        scorable = all(tree.logits(key[0], n) is not None for key, p in paths.items() for n in p[:-1])
        if unfed and (m == self.lead or not scorable):
            tree.grow()
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
                inner = [tree.logits(b, n) for n in path[:-1]]
                prev = torch.cat([last_lp[b: b + 1]] + ([torch.log_softmax(torch.stack(inner), dim=-1)] if inner else []),
                                 dim=0)
                row.append(prev.gather(-1, tok[:, None]).squeeze(-1).cpu())
            per_row[b] = row
        return per_row, paths, tree

    # ---- fuse and commit -------------------------------------------------------------------
    def fuse(self, scored: Scored) -> dict[int, int]:
        """Normalise every member's log-probs (`normalise`; recorded in `Candidate.scores`), fuse
        them across members with the weights (`calibration`; `Candidate.fused`) and choose per row
        (argmax, or sampled at temperature > 0). Returns row -> the chosen candidate's index."""
        cfg, names = self.config, [m.name for m in self.members]
        rows, cands = scored.proposal.rows, scored.proposal.cands
        raw = {b: torch.zeros(len(self.members), len(cands[b])) for b in rows}
        for m in range(len(self.members)):
            for b in rows:
                for j, c in enumerate(cands[b]):
                    s = normalised_score(scored.logprobs[m][b][j], c.text or "x", cfg.normalise)
                    raw[b][m, j] = s
                    c.scores[names[m]] = round(s, 4)
        picks: dict[int, int] = {}
        for b in rows:
            fused = fuse_scores(raw[b], self._weights(scored.proposal, b), cfg.calibration)
            if cfg.fusion == "lead-keeps":
                own = scored.proposal.lead_word.get(b)
                keys = [EOS_KEY if c.eos else c.text for c in cands[b]]
                if own in keys:
                    fused[keys.index(own)] += float(cfg.keep_margin)
            for c, f in zip(cands[b], fused.tolist()):
                c.fused = round(f, 4)
            picks[b] = choose(fused, self.temperature, self.batch.row_gen(b))
        return picks

    def _weights(self, proposal: Proposal, b: int) -> list[float]:
        """The member weights at row b's word: the weights, scaled by each member's own margin under
        `fusion="confidence"` (the weights alone where every margin is 0)."""
        if self.config.fusion != "confidence":
            return self.weights
        scaled = [w * proposal.margins[m][b] for m, w in enumerate(self.weights)]
        return scaled if sum(scaled) > 0 else self.weights

    def commit(self, scored: Scored, picks: dict[int, int]) -> dict[int, list[int]]:
        """Every member keeps the chosen candidate's branch of its open scoring tree (no forward)
        where the tree holds all of it with the logits after its end, then its boundary is checked
        against the canonical encoding (`MemberText.sync`). A non-lead whose tree lacks the chosen
        word (it was scored without feeding its last token) gets it lazily with the next text it
        receives (`Batch.flush`). Returns row -> the members that now hold the chosen text."""
        cands = scored.proposal.cands
        holders: dict[int, list[int]] = {b: [] for b in picks}
        for m, view in enumerate(self.batch.views):
            paths: list[list[int]] = [[] for _ in self.batch.texts]
            state, tree = view.state, scored.trees[m]
            for b, j in picks.items():
                if cands[b][j].eos:
                    continue
                path = scored.paths[m][(b, j)]
                if tree.is_open and tree.logits(b, path[-1]) is not None:  # (fed in order: so is the path)
                    paths[b] = path
                elif m == self.lead:
                    raise RuntimeError("EnsembledWord.commit() needs the open trees of score()")
            if state.tree is not None:
                state.accept(paths)
            for b, j in picks.items():
                if paths[b] or not cands[b][j].text:
                    holders[b].append(m)
                    view.texts[b] += cands[b][j].text
            view.sync([b for b, j in picks.items() if paths[b]])
        return holders

    def _record(self, proposal: Proposal, picks: dict[int, int], holders: dict[int, list[int]],
                gates: dict[int, tuple[float, str]]) -> None:
        """Record each row's ensembled round and commit its chosen word to the batch (`holders`
        already hold it): EOS finishes the row, else stop strings and length are checked."""
        batch, lead_name = self.batch, self.members[self.lead].name
        for b in proposal.rows:
            chosen = proposal.cands[b][picks[b]]
            margin, decision = gates[b]
            batch.traces[b].append(Round("ensemble", [chosen.text] if chosen.text else [],
                                         [{"margin": round(margin, 4), "decision": decision}],
                                         lead_name, proposal.cands[b], EOS_KEY if chosen.eos else chosen.text,
                                         proposal.lead_word.get(b)))
            batch.streak[b] = 0
            if chosen.eos:
                batch.end_at_eos(b)
                continue
            batch.commit(b, chosen.text, held_by=holders[b])
            batch.check_length(b)
