"""What flows between the stages of `adafuse tune` (`eval.tune`) and its report (`eval.tune_report`):
the candidates, the halving rounds, each candidate's dev result and each task's outcome."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eval.config import RunSpec, TaskSpec


@dataclass
class Candidate:
    """One system scored on dev: a member alone (`single`) or an ensemble; `name` is its folder."""

    name: str
    method: str
    members: list[str]
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    prior: float = 0.0

    @property
    def is_single(self) -> bool:
        """A member alone (the baselines every tune keeps)."""
        return self.method == "single"

    def run(self) -> RunSpec:
        """The eval run of this candidate (its name is its folder under OUT/candidates)."""
        return RunSpec(name=self.name, method=self.method, members=list(self.members), options=dict(self.options))


@dataclass
class Round:
    """One halving round: the rows scored, the ranking (best first), and who went on."""

    index: int
    rows: int
    ranked: list[str]
    kept: list[str]
    scores: dict[str, float]


@dataclass
class Scored:
    """A candidate's latest dev result."""

    cand: Candidate
    rows: int
    metrics: dict[str, Any]
    outcome: str = ""

    @property
    def score(self) -> float:
        return self.metrics["score"]

    def cost_key(self) -> tuple:
        """Cheaper first: fewer members, fewer forward passes per example, then the name."""
        return (len(self.cand.members), self.metrics.get("forward_passes_per_example") or 0.0, self.cand.name)


@dataclass
class TaskResult:
    """What one task's tune found: every candidate's latest result, the rounds, the choice."""

    task: TaskSpec
    dev_ids: list[Any]
    singles: list[Scored]
    kept: list[str]
    scored: dict[str, Scored]
    rounds: list[Round]
    chosen: Scored
    best_single: Scored
    paired: dict[str, Any] = field(default_factory=dict)
