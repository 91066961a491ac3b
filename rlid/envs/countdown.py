"""Countdown, step by step: combine two of the numbers at a time until the target is among them.

Puzzles come from `reasoning_gym`'s "countdown" generator (numbers and target from its metadata),
small by default (3-4 numbers in 1..20, targets 10..99). The state is the sorted multiset of the
remaining numbers; a move "a op b = c" replaces a and b by c. Legal moves: +, * (written small
number first), - and exact / (large number first), results positive integers only (no zero, no
negative, no fraction). Two moves that leave the same multiset are the same move (e.g. "2 + 2 = 4"
and "2 * 2 = 4", or "x * 1" and "x / 1"); the menu keeps the first in pair-then-operator order.
So n numbers give at most C(n, 2) * 5 entries: 15 for 3 numbers, 30 for 4, 75 for 6.

The episode succeeds (reward 1) as soon as the target is one of the numbers (it need not use them
all); it ends then, or when one number is left, or after `max_steps` moves, with reward 0, or with
`shaping * max(0, 1 - distance / target)` where distance is the closest number's distance to the
target, if `shaping` > 0 (off by default). `reach_shaping` > 0 instead pays a failed episode for the
moves that kept the target reachable (`MenuEnvironment`), and `end_on_dead_end` ends the episode at
the first move after which the target cannot be reached in the moves left (exact search)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import reasoning_gym

from runtime.errors import ConfigError
from rlid.envs.base import (PUZZLE_STRIDE, MenuEnvironment, check_bool, check_fraction, check_int, check_range,
                            first_usable, puzzle_index)

OPERATORS = ("+", "-", "*", "/")

INSTRUCTION = ("Countdown: reach the target number. Each move combines two of the numbers with +, -, * or / "
               "(whole positive results only) and replaces them by the result.")


@dataclass(frozen=True)
class CountdownOptions:
    """Puzzle difficulty (passed to reasoning_gym's CountdownConfig) and episode rules.
    `max_steps` None: max_numbers - 1 (enough to combine all numbers). `only_solvable`: skip
    generated puzzles whose target cannot be reached under this env's rules (deterministic)."""

    min_numbers: int = 3
    max_numbers: int = 4
    min_value: int = 1
    max_value: int = 20
    min_target: int = 10
    max_target: int = 99
    operators: tuple[str, ...] = OPERATORS
    max_steps: int | None = None
    only_solvable: bool = True
    shaping: float = 0.0
    reach_shaping: float = 0.0
    end_on_dead_end: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.operators, list):  # from YAML
            object.__setattr__(self, "operators", tuple(self.operators))

    def validate(self) -> None:
        check_int("min_numbers", self.min_numbers, 2, 8)
        check_int("max_numbers", self.max_numbers, 2, 8)
        check_range("min_numbers", self.min_numbers, "max_numbers", self.max_numbers)
        check_int("min_value", self.min_value, 1)
        check_int("max_value", self.max_value, 1)
        check_range("min_value", self.min_value, "max_value", self.max_value)
        check_int("min_target", self.min_target, 1)
        check_int("max_target", self.max_target, 1)
        check_range("min_target", self.min_target, "max_target", self.max_target)
        ops = self.operators
        if not isinstance(ops, tuple) or not ops or any(op not in OPERATORS for op in ops) or len(set(ops)) != len(ops):
            raise ConfigError(f"option operators must be distinct ones of {' '.join(OPERATORS)}, got {self.operators!r}")
        if self.max_steps is not None:
            check_int("max_steps", self.max_steps, 1)
        check_bool("only_solvable", self.only_solvable)
        check_fraction("shaping", self.shaping)
        check_fraction("reach_shaping", self.reach_shaping)
        if self.shaping > 0 and self.reach_shaping > 0:
            raise ConfigError("options shaping and reach_shaping are two rewards for a failed episode; set one of them to 0")
        check_bool("end_on_dead_end", self.end_on_dead_end)


def _combine(a: int, b: int, op: str) -> tuple[str, int] | None:
    """The move text and result of combining a <= b with `op`, or None if it is not legal."""
    if op == "+":
        return f"{a} + {b} = {a + b}", a + b
    if op == "*":
        return f"{a} * {b} = {a * b}", a * b
    if op == "-":
        return (f"{b} - {a} = {b - a}", b - a) if b > a else None
    return (f"{b} / {a} = {b // a}", b // a) if b % a == 0 else None


def legal_moves(numbers: tuple[int, ...], operators: tuple[str, ...] = OPERATORS) -> list[tuple[str, tuple[int, ...]]]:
    """(move text, resulting sorted numbers) for every distinct legal move from `numbers` (sorted)."""
    seen: set[tuple[int, ...]] = set()
    moves = []
    for i in range(len(numbers)):
        for j in range(i + 1, len(numbers)):
            rest = numbers[:i] + numbers[i + 1:j] + numbers[j + 1:]
            for op in OPERATORS:
                if op not in operators or (made := _combine(numbers[i], numbers[j], op)) is None:
                    continue
                after = tuple(sorted(rest + (made[1],)))
                if after not in seen:
                    seen.add(after)
                    moves.append((made[0], after))
    return moves


@functools.lru_cache(maxsize=1 << 16)
def reachable(numbers: tuple[int, ...], target: int, steps_left: int,
              operators: tuple[str, ...] = OPERATORS) -> bool:
    """Exact search: can a sequence of at most `steps_left` legal moves put `target` among `numbers`?"""
    if target in numbers:
        return True
    if steps_left <= 0 or len(numbers) < 2:
        return False
    return any(reachable(after, target, steps_left - 1, operators) for _, after in legal_moves(numbers, operators))


class CountdownEnv(MenuEnvironment):
    """Seeded step-wise Countdown (`rlid.types.Environment`); see the module docstring for the rules."""

    name = "countdown"
    instruction = INSTRUCTION

    def __init__(self, options: CountdownOptions | None = None) -> None:
        super().__init__()
        self.options = options or CountdownOptions()
        self.options.validate()
        o = self.options
        self.max_steps = o.max_steps if o.max_steps is not None else o.max_numbers - 1
        self.operators = tuple(o.operators)
        self.reach_shaping = float(o.reach_shaping)
        self._dataset = reasoning_gym.create_dataset(
            "countdown", size=PUZZLE_STRIDE, seed=0, min_numbers=o.min_numbers, max_numbers=o.max_numbers,
            min_value=o.min_value, max_value=o.max_value, min_target=o.min_target, max_target=o.max_target,
            operators=self.operators)
        self.numbers: tuple[int, ...] = ()
        self.target = 0
        self._history: list[tuple[int, ...]] = []

    def reset_to(self, numbers: list[int] | tuple[int, ...], target: int) -> None:
        """Start an episode from a hand-made puzzle (seed None)."""
        if len(numbers) < 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in numbers):
            raise ValueError(f"numbers must be two or more positive ints, got {numbers!r}")
        self.seed = None
        self.numbers, self.target = tuple(sorted(numbers)), int(target)
        self._start()

    def puzzle(self, seed: int, attempt: int = 0) -> tuple[tuple[int, ...], int]:
        """The generator's puzzle (sorted numbers, target) for a seed's attempt."""
        meta = self._dataset[puzzle_index(seed, attempt)]["metadata"]
        return tuple(sorted(int(n) for n in meta["numbers"])), int(meta["target"])

    def _load(self, seed: int) -> None:
        self.numbers, self.target = first_usable(self.name, seed, self._draw, self._usable, "widen the target range")

    def _draw(self, seed: int, attempt: int) -> tuple[tuple[int, ...], int] | None:
        try:
            return self.puzzle(seed, attempt)
        except ValueError:  # the generator found no expression in range
            return None

    def _usable(self, puzzle: tuple[tuple[int, ...], int]) -> bool:
        numbers, target = puzzle
        if target in numbers:
            return False
        return not self.options.only_solvable or reachable(numbers, target, self.max_steps, self.operators)

    def _start(self) -> None:
        self._history = [self.numbers]
        super()._start()

    def observation(self) -> str:
        return f"Target: {self.target}\nNumbers: {', '.join(map(str, self.numbers))}"

    def _legal(self) -> list[str]:
        return [text for text, _ in legal_moves(self.numbers, self.operators)]

    def _apply(self, index: int, text: str) -> dict[str, Any]:
        moved, after = legal_moves(self.numbers, self.operators)[index]
        assert moved == text
        self.numbers = after
        self._history.append(after)
        return {"numbers": list(after)}

    def _solved(self) -> bool:
        return self.target in self.numbers

    def _stuck(self) -> bool:
        return len(self.numbers) < 2 or (self.options.end_on_dead_end and not self.alive())

    def _final_reward(self, success: bool) -> float:
        if success or self.options.shaping <= 0:
            return super()._final_reward(success)
        distance = min(abs(n - self.target) for n in self.numbers)
        return float(self.options.shaping * max(0.0, 1.0 - distance / self.target))

    def _memory_line(self, n: int) -> str:
        return f"Move {n + 1}: {self._moves[n]}, leaving {', '.join(map(str, self._history[n + 1]))}"

    def solvable(self) -> bool:
        """Whether the target can still be reached within the moves left (exact search)."""
        return reachable(self.numbers, self.target, self.steps_left, self.operators)

    def solution_length(self) -> int | None:
        """Fewest moves that put the target among the numbers, within the moves left (None: not
        possible; 0 when it is there already)."""
        return next((k for k in range(self.steps_left + 1)
                     if reachable(self.numbers, self.target, k, self.operators)), None)
