"""The typed trace of the word-level methods: one `Round` per confident span or ensembled word, with
its `Candidate`s; `round_stats` counts them for reports."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

EOS_KEY = "<eos>"  # `Round.chosen` of a round that stopped at the lead's EOS


@dataclass
class Candidate:
    """One candidate word of an ensembled word: its text, the members that proposed it (in member
    order), whether it is the lead's EOS, each member's normalised score and the fused score."""

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
    lead_word: str | None = None       # ensemble rounds: the lead's own word (its greedy candidate or "<eos>")

    @property
    def text(self) -> str:
        """The round's committed text: its units joined."""
        return "".join(self.units)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field (candidates as dicts) plus `text`."""
        d = asdict(self)
        d["text"] = self.text
        return d


def round_stats(trace: Sequence[Round], text: str) -> dict[str, Any]:
    """Counts for reports: rounds, ensembled rounds, words committed confidently / by ensembling,
    ensembled words where the lead's own word lost (`overruled`), and per member how many ensembled
    words it proposed the winner of (`won_by`; a word several members proposed counts for each)."""
    ensembled = [r for r in trace if r.kind == "ensemble"]
    conf_words = sum(len(r.units) for r in trace if r.kind == "confident")
    ens_words = sum(len(r.units) for r in ensembled)
    won_by: dict[str, int] = {}
    for r in ensembled:
        key = r.chosen
        for c in r.candidates:
            if (EOS_KEY if c.eos else c.text) == key:
                for name in c.proposed_by:
                    won_by[name] = won_by.get(name, 0) + 1
                break
    overruled = sum(1 for r in ensembled if r.lead_word is not None and r.chosen != r.lead_word)
    return {"rounds": len(trace), "ensemble_rounds": len(ensembled), "confident_words": conf_words,
            "ensembled_words": ens_words, "units": conf_words + ens_words, "overruled": overruled,
            "won_by": won_by}
