"""What every generation path (single member, speculative, ensemble) returns, and what it cost.

`GenerationOutput` per prompt with its `Cost` (forwards and tokens fed per member name, wall time);
`CostMeter` measures a generation from the members' counters; `split_batch_cost` spreads a batch's
cost evenly over its rows."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence


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

    def share(self, n: int) -> "Cost":
        """One of `n` equal shares of this cost (a batch's cost per row)."""
        out = Cost(wall_time_s=self.wall_time_s / n)
        for name in self.forward_passes:
            out.forward_passes[name] = self.forward_passes[name] / n
            out.tokens_processed[name] = self.tokens_processed[name] / n
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "forward_passes": dict(self.forward_passes),
            "tokens_processed": dict(self.tokens_processed),
            "wall_time_s": round(self.wall_time_s, 4),
        }


@dataclass
class GenerationOutput:
    """One prompt's result: the generated text (stop string excluded), the number of new tokens of
    the lead member, why it stopped ("eos" | "stop" | "length"), its cost and an optional trace.
    `program`: where the text is a program a program view wrote, the sandbox's result of running it
    (`runtime.program_answers`: stdout, error, ...); its answer is then what it printed."""

    text: str
    num_tokens: int
    finish_reason: str
    cost: Cost
    trace: Any = None
    stats: dict[str, Any] = field(default_factory=dict)
    program: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "num_tokens": self.num_tokens,
            "finish_reason": self.finish_reason,
            "cost": self.cost.to_dict(),
            "stats": self.stats,
            **({"program": self.program} if self.program is not None else {}),
        }


class CostMeter:
    """Counts what a generation costs: snapshots the counters of the models it runs (members and
    their drafters' models, each once; views of a model count as their model) when created; `cost()` is what they did since, with the wall
    time. Every generation path measures through this."""

    def __init__(self, models: Sequence[Any]):
        self.models: list[Any] = []
        for m in models:  # views of one model share its counters: counted once, under the model's name
            if m is not None and all(m.counters is not x.counters for x in self.models):
                self.models.append(m)
        self._snaps = [m.counters.snapshot() for m in self.models]
        self._t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def cost(self) -> Cost:
        total = Cost(wall_time_s=self.elapsed())
        for m, snap in zip(self.models, self._snaps):
            total.add(getattr(m, "model_name", m.name), m.counters.forward_passes - snap[0],
                      m.counters.tokens_processed - snap[1])
        return total


def batch_outputs(cost: Cost, texts: Sequence[str], num_tokens: Sequence[int], reasons: Sequence[str],
                  traces: Sequence[Any] | None = None, stats: Sequence[dict[str, Any]] | None = None
                  ) -> list[GenerationOutput]:
    """One `GenerationOutput` per row of a batch (its text, lead tokens, finish reason, and optional
    trace / stats), the batch's `cost` split evenly over the rows: what every generation path returns."""
    outs = [GenerationOutput(t, n, r, cost if b == 0 else Cost()) for b, (t, n, r) in
            enumerate(zip(texts, num_tokens, reasons))]
    for b, out in enumerate(outs):
        if traces is not None:
            out.trace = traces[b]
        if stats is not None:
            out.stats = stats[b]
    return split_batch_cost(outs) if outs else outs


def split_batch_cost(outs: list[GenerationOutput]) -> list[GenerationOutput]:
    """Spread the cost recorded on outs[0] (a whole batch's) evenly over the rows."""
    total = outs[0].cost
    for o in outs:
        o.cost = total.share(len(outs))
    return outs
