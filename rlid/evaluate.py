"""Success on held-out seeds, with intervals, and the rollout cost: decisions per second.

`evaluate_policy` runs a decision-plane `Policy` (a `DecisionModel` or a `DecisionEnsemble`) greedily
or sampled over seeds in lockstep (`rlid.rollout.run_episodes`); `wilson_interval` and
`paired_difference` are the intervals the reports print; `live_moves` replays episodes to tell how often
the chosen move kept the puzzle solvable, against the share of such moves in the menus (chance)."""
from __future__ import annotations

import math
import random
import time
from dataclasses import astuple, dataclass, field
from typing import Callable, Sequence

import torch

from rlid.option_law import pick
from rlid.types import DecisionState, Environment, Episode, Policy


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score 95 % interval of a success rate (sensible at 0 and n, unlike the normal one)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_difference(a: Sequence[float], b: Sequence[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of a − b over the same seeds and its paired bootstrap 95 % interval (seeds resampled)."""
    if len(a) != len(b) or not a:
        raise ValueError("paired_difference needs two equally long, non-empty score lists (same seeds)")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    rng = random.Random(seed)
    n = len(diffs)
    boots = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    return (sum(diffs) / n, boots[int(0.025 * n_boot)], boots[min(n_boot - 1, int(0.975 * n_boot))])


@dataclass
class EvalResult:
    """Held-out success with its interval, the rollout cost, and the episodes themselves."""

    episodes: list[Episode]
    wall_s: float
    decisions: int
    invalid: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def successes(self) -> list[float]:
        return [1.0 if e.success else 0.0 for e in self.episodes]

    @property
    def success_rate(self) -> float:
        return sum(self.successes) / len(self.episodes) if self.episodes else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(int(sum(self.successes)), len(self.episodes))

    @property
    def steps_to_success(self) -> float | None:
        """Mean decisions of the solved episodes (invalid token-level steps count: they cost a move), or None."""
        solved = [len(e.transitions) for e in self.episodes if e.success]
        return sum(solved) / len(solved) if solved else None

    @property
    def decisions_per_s(self) -> float:
        return self.decisions / self.wall_s if self.wall_s > 0 else float("inf")

    def summary(self) -> dict:
        lo, hi = self.interval
        return {"episodes": len(self.episodes), "success": self.success_rate, "success_lo": lo, "success_hi": hi,
                "mean_reward": sum(e.total_reward for e in self.episodes) / max(1, len(self.episodes)),
                "steps_to_success": self.steps_to_success,
                "decisions": self.decisions, "invalid": self.invalid, "wall_s": self.wall_s,
                "decisions_per_s": self.decisions_per_s, **self.extra}


def evaluate_policy(policy: Policy, make_env: Callable[[], Environment], seeds: Sequence[int], *,
                    greedy: bool = True, memory_k: int = 0, seed: int = 0) -> EvalResult:
    """Roll `policy` out from every seed (lockstep batches) under no_grad; time and count decisions."""
    from rlid.rollout import run_episodes

    generator = torch.Generator().manual_seed(seed)
    decisions = 0

    def policy_fn(states: list[DecisionState]) -> list[int]:
        nonlocal decisions
        decisions += len(states)
        return pick(policy.laws(states), greedy, generator)

    start = time.perf_counter()
    with torch.no_grad():
        episodes = run_episodes(make_env, policy_fn, list(seeds), memory_k=memory_k)
    return EvalResult(episodes, time.perf_counter() - start, decisions)


@dataclass
class LiveCounts:
    """Counts behind `live_moves` (sums over decisions, so episodes and blocks of them add up):
    `chosen`/`chance` sum the chosen option's liveness and the live share of each menu over `n`
    decisions; `won`/`win_chance` the same for immediately winning options over `n_win` decisions."""

    chosen: float = 0.0
    chance: float = 0.0
    n: int = 0
    won: float = 0.0
    win_chance: float = 0.0
    n_win: int = 0

    def __add__(self, other: "LiveCounts") -> "LiveCounts":
        return LiveCounts(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def summary(self) -> dict[str, float] | None:
        """The `live_moves` fields, or None where no decision was counted."""
        if not self.n:
            return None
        out = {"live_moves": self.chosen / self.n, "live_chance": self.chance / self.n, "live_decisions": self.n,
               "win_decisions": self.n_win}
        if self.n_win:
            out.update(wins_taken=self.won / self.n_win, win_chance=self.win_chance / self.n_win)
        return out


def live_counts(env: Environment, ep: Episode) -> LiveCounts | None:
    """`LiveCounts` of one episode, replayed from its seed on `env` (see `live_moves`); None for an
    environment without a solvability check."""
    if not hasattr(env, "option_values"):
        return None
    c = LiveCounts()
    env.reset(ep.seed)
    for t in ep.transitions:
        if t.action is None or t.action < 0:
            continue
        if tuple(env.menu()) != tuple(t.state.actions):
            raise RuntimeError(f"{env.name} seed {ep.seed}: the replayed menu differs from the episode's "
                               "(the environment is not deterministic)")
        try:
            values = env.option_values()
        except NotImplementedError:                        # no solvable(): a multi-move env without a check
            return None
        live = [v == 1.0 for v in values]
        c.chosen += live[t.action]
        c.chance += sum(live) / len(live)
        c.n += 1
        wins = env.option_wins()
        if any(wins):
            c.won += wins[t.action]
            c.win_chance += sum(wins) / len(wins)
            c.n_win += 1
        env.step(t.action)
    return c


def live_moves(make_env: Callable[[], Environment], episodes: Sequence[Episode]) -> dict[str, float] | None:
    """How often a policy's move kept the puzzle solvable or solved it: `live_moves`, the share of its
    executed decisions whose option has Q* = 1 (`env.option_values()`), beside `live_chance`, the mean
    share of such options in the same menus (what a uniformly random choice gets at those states), and
    `live_decisions`, how many were counted. Each episode is replayed from its seed on a fresh env
    (invalid token-level steps, which do not move the env, are skipped; moves left are the env's own
    count). Also `wins_taken`: at the decisions where some option solves the puzzle at once
    (`env.option_wins()`; `win_decisions` of them), the share where the policy took one, beside
    `win_chance`, the mean share of winning options there. None for an environment without a
    solvability check."""
    env = make_env()
    total = LiveCounts()
    for ep in episodes:
        counts = live_counts(env, ep)
        if counts is None:
            return None
        total = total + counts
    return total.summary()
