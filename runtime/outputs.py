"""Small dataclasses that flow out of every generation path (single member, speculative, ensemble)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Cost:
    """What one generation cost.

    forward_passes / tokens_processed: per member name, counting every model forward call and every
    token position fed through a model (prefill, decode, tree nodes, candidate scoring).
    """

    forward_passes: dict[str, int] = field(default_factory=dict)
    tokens_processed: dict[str, int] = field(default_factory=dict)
    wall_time_s: float = 0.0

    def add(self, member: str, forwards: int, tokens: int) -> None:
        self.forward_passes[member] = self.forward_passes.get(member, 0) + forwards
        self.tokens_processed[member] = self.tokens_processed.get(member, 0) + tokens

    def merge(self, other: "Cost") -> "Cost":
        for name, n in other.forward_passes.items():
            self.forward_passes[name] = self.forward_passes.get(name, 0) + n
        for name, n in other.tokens_processed.items():
            self.tokens_processed[name] = self.tokens_processed.get(name, 0) + n
        self.wall_time_s += other.wall_time_s
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "forward_passes": dict(self.forward_passes),
            "tokens_processed": dict(self.tokens_processed),
            "wall_time_s": round(self.wall_time_s, 4),
        }


@dataclass
class GenerationOutput:
    """One prompt's result: the generated text (stop string excluded), the number of new tokens of
    the lead member, why it stopped ("eos" | "stop" | "length"), its cost and an optional trace."""

    text: str
    num_tokens: int
    finish_reason: str
    cost: Cost
    trace: Any = None
    stats: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "num_tokens": self.num_tokens,
            "finish_reason": self.finish_reason,
            "cost": self.cost.to_dict(),
            "stats": self.stats,
        }
