"""Decision-plane ensembles: members with different tokenizers need no alignment here — each gives
π over the same labelled menu, and the fused law is a weighted mixture (or a normalised weighted
product) of theirs. As in AdaFuse, the lead's top-1 − top-2 margin gates the ensemble: a confident
lead decides alone; below `threshold` the other members are consulted (one batched forward each,
over the uncertain states only)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from rlid.types import DecisionState, OptionLaw, Policy

RULES = ("mixture", "product")


def fuse_log_probs(log_probs: Sequence[torch.Tensor], weights: Sequence[float], rule: str = "mixture") -> torch.Tensor:
    """Fuse members' log π over one menu (each a [n] tensor of normalised log-probs).

    mixture: log Σ_m w_m π_m(a) (weights normalised to sum 1); product: log of Π_m π_m(a)^{w_m},
    renormalised over the menu. Returns normalised log-probs [n]."""
    if rule not in RULES:
        raise ValueError(f"unknown fusion rule {rule!r}; choose one of {', '.join(RULES)}")
    if len(log_probs) != len(weights) or not log_probs:
        raise ValueError("fuse_log_probs needs one weight per member's law")
    w = torch.tensor([float(x) for x in weights], dtype=log_probs[0].dtype)
    if (w < 0).any() or float(w.sum()) <= 0:
        raise ValueError(f"ensemble weights must be >= 0 with a positive sum, got {list(weights)}")
    w = w / w.sum()
    stacked = torch.stack(list(log_probs))                       # [M, n]
    if rule == "mixture":
        live = w > 0
        return torch.logsumexp(stacked[live] + w[live].log()[:, None], dim=0)
    scores = (w[:, None] * stacked).sum(0)
    return scores - torch.logsumexp(scores, dim=0)


@dataclass
class GateCounts:
    """How often the gate let the lead decide alone and how often it consulted the others."""

    decisions: int = 0
    consulted: int = 0

    @property
    def consult_rate(self) -> float:
        return self.consulted / self.decisions if self.decisions else 0.0


@dataclass
class DecisionEnsemble:
    """A `Policy` over several member policies. `lead` indexes the member whose margin gates;
    `threshold` = 1.0 always consults (plain mixture), 0.0 never (the lead alone)."""

    members: Sequence[Policy]
    weights: Sequence[float] | None = None
    lead: int = 0
    threshold: float = 0.5
    rule: str = "mixture"
    counts: GateCounts = field(default_factory=GateCounts)

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError("a DecisionEnsemble needs at least one member")
        if not 0 <= self.lead < len(self.members):
            raise ValueError(f"lead {self.lead} is not a member index (0..{len(self.members) - 1})")
        self.weights = list(self.weights) if self.weights is not None else [1.0] * len(self.members)
        fuse_log_probs([torch.zeros(1)] * len(self.members), self.weights, self.rule)   # validates early

    def laws(self, states: Sequence[DecisionState]) -> list[OptionLaw]:
        lead_laws = self.members[self.lead].laws(states)
        uncertain = [i for i, law in enumerate(lead_laws) if law.margin < self.threshold]
        self.counts.decisions += len(states)
        self.counts.consulted += len(uncertain)
        if not uncertain:
            return lead_laws
        picked = [states[i] for i in uncertain]
        others = {m: member.laws(picked) for m, member in enumerate(self.members) if m != self.lead}
        out = list(lead_laws)
        for j, i in enumerate(uncertain):
            per_member = [lead_laws[i].log_probs if m == self.lead else others[m][j].log_probs
                          for m in range(len(self.members))]
            out[i] = OptionLaw(fuse_log_probs(per_member, self.weights, self.rule), lead_laws[i].labels)
        return out


def pick_on_dev(scores: Sequence[tuple[str, float]]) -> str:
    """The name with the highest dev score; a tie goes to the one listed first (callers list each
    member alone first, so an ensemble must beat every single member on dev to be chosen)."""
    if not scores:
        raise ValueError("pick_on_dev needs at least one (name, score)")
    best = max(score for _, score in scores)
    return next(name for name, score in scores if score == best)
