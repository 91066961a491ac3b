"""What every menu environment shares: episode bookkeeping (steps, done, the executed moves), index
checks, option validation and the seed -> puzzle-index rule. Subclasses say what a state is."""
from __future__ import annotations

import copy
import operator
from typing import Any, Callable, TypeVar

from runtime.errors import ConfigError
from runtime.options import parse_options
from rlid.types import StepResult

# Puzzle `attempt` of episode seed s is generator index s * PUZZLE_STRIDE + attempt, so resampling
# (e.g. to skip unsolvable puzzles) never lands on another seed's first puzzle.
PUZZLE_STRIDE = 1000
T = TypeVar("T")


def puzzle_index(seed: int, attempt: int = 0) -> int:
    """The generator index of a seed's `attempt`-th puzzle; seeds are non-negative integers."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if not 0 <= attempt < PUZZLE_STRIDE:
        raise ValueError(f"attempt {attempt} outside 0..{PUZZLE_STRIDE - 1}")
    return seed * PUZZLE_STRIDE + attempt


def check_int(option: str, value: Any, low: int, high: int | None = None) -> None:
    """ConfigError unless `value` is an int in [low, high] (high None: no upper bound)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"option {option} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise ConfigError(f"option {option} must be {bound}, got {value}")


def check_bool(option: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"option {option} must be true or false, got {value!r}")


def first_usable(env_name: str, seed: int, draw: Callable[[int, int], T | None], usable: Callable[[T], bool],
                 fix: str) -> T:
    """The first of a seed's generator draws `draw(seed, attempt)` (None: a failed draw) that is
    `usable`; a ConfigError saying `fix` if none of PUZZLE_STRIDE draws is."""
    for attempt in range(PUZZLE_STRIDE):
        puzzle = draw(seed, attempt)
        if puzzle is not None and usable(puzzle):
            return puzzle
    raise ConfigError(f"{env_name}: no usable puzzle for seed {seed} in {PUZZLE_STRIDE} draws; {fix}")


def check_fraction(option: str, value: Any) -> None:
    """ConfigError unless `value` is a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigError(f"option {option} must be a number in [0, 1], got {value!r}")


def check_range(low_name: str, low: int, high_name: str, high: int) -> None:
    if low > high:
        raise ConfigError(f"option {low_name} ({low}) must be <= {high_name} ({high})")


def options_from(cls: type, env_name: str, options: dict[str, Any]):
    """Build the options dataclass `cls` from keyword options; an unknown key is a ConfigError
    naming it and the valid ones. The dataclass's own `validate()` checks the values."""
    return parse_options(cls, options, f"environment {env_name!r}")


class MenuEnvironment:
    """Base of the `rlid.types.Environment`s here. A subclass implements `_load(seed)` (set up the
    seed's puzzle), `_legal()` (the menu of the current state), `_apply(index, text)` (execute a menu
    entry), `_solved()`, and optionally `_stuck()` (no progress possible: episode over) and
    `_final_reward(success)`. The base counts steps, ends episodes at `max_steps`, caches the menu
    so that `step(i)` executes exactly the `menu()[i]` a policy saw, and records moves for `memory`.

    Reachability shaping (for subclasses with `solvable()`, set `reach_shaping` > 0): a failed
    episode returns `reach_shaping * kept / max_steps`, where `kept` counts the moves after which the
    puzzle could still be solved in the moves left (a prefix: once unsolvable, always unsolvable).
    A success returns 1 as always, and `kept < max_steps` for every failure, so a success is always
    worth more. `alive()` is `solvable()` computed once per step (what `_stuck` may also ask)."""

    name: str = ""
    instruction: str = ""
    max_steps: int = 1
    reach_shaping: float = 0.0

    def __init__(self) -> None:
        self._moves: list[str] = []
        self._done = True
        self._success = False
        self._menu: list[str] | None = None
        self._kept = 0
        self._alive: tuple[int, bool] | None = None
        self.seed: int | None = None

    # -- the protocol -------------------------------------------------------------------------
    def reset(self, seed: int) -> None:
        puzzle_index(seed)  # validates the seed
        self.seed = seed
        self._load(seed)
        self._start()

    def menu(self) -> list[str]:
        if self._done:
            return []
        if self._menu is None:
            self._menu = self._legal()
        return list(self._menu)

    def menu_notes(self) -> list[str]:
        """One note per menu entry that prompts show beside it ([]: none; subclasses may say more)."""
        return []

    def step(self, index: int) -> StepResult:
        if self._done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset(seed) first")
        menu = self.menu()
        try:
            i = operator.index(index)
        except TypeError:
            raise ValueError(f"{self.name}: action index must be an int, got {index!r}") from None
        if not 0 <= i < len(menu):
            raise ValueError(f"{self.name}: action index {i} outside the menu of {len(menu)} actions")
        info = self._apply(i, menu[i]) or {}
        self._moves.append(menu[i])
        self._menu = None
        success = self._solved()
        if self.reach_shaping > 0 and self._kept == len(self._moves) - 1 and (success or self.alive()):
            self._kept += 1
        done = success or len(self._moves) >= self.max_steps or self._stuck()
        self._done, self._success = done, success
        reward = self._final_reward(success) if done else 0.0
        return StepResult(reward=reward, done=done, success=success, info=info)

    def memory(self, k: int) -> str:
        """The last k executed moves, one a line ("" when k == 0 or nothing has been done yet)."""
        if k < 0:
            raise ValueError(f"memory k must be >= 0, got {k}")
        if k == 0 or not self._moves:
            return ""
        start = max(0, len(self._moves) - k)
        return "\n".join(self._memory_line(n) for n in range(start, len(self._moves)))

    def last_move_rewards(self) -> list[float] | None:
        """The reward of every menu option when this is the episode's last move (one move left, so
        every option ends it), each executed on a copy of this state; None otherwise."""
        return self.option_values() if not self._done and self.steps_left == 1 else None   # every option ends it

    def option_values(self, discount: float = 1.0) -> list[float] | None:
        """Q*(s, a) of every menu option under this environment's return, each option executed on a
        copy: its reward where it ends the episode, else 1.0 if the puzzle can still be solved in the
        moves left (an optimal continuation then succeeds) and the failure reward if it cannot (a
        dead end earns no more moves kept). At a last move this is `last_move_rewards()`. Needs
        `solvable()`; None once the episode is over. `discount` γ < 1: a live option is worth γ^d,
        d = `solution_length()` after it (the fewest moves still needed; needs that method)."""
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount must be in (0, 1], got {discount}")
        if self._done:
            return None
        values = []
        for i in range(len(self.menu())):
            twin = self._twin()
            result = twin.step(i)
            if result.done:
                values.append(result.reward)
            elif not twin.alive():
                values.append(twin.failure_reward())
            else:
                values.append(1.0 if discount == 1.0 else discount ** twin.solution_length())
        return values

    def option_rewards(self) -> list[float] | None:
        """The immediate reward of every menu option, each executed on a copy of this state (what the
        move itself earns, not what follows it); None once the episode is over."""
        if self._done:
            return None
        return [self._twin().step(i).reward for i in range(len(self.menu()))]

    def option_wins(self) -> list[bool] | None:
        """Which menu options solve the puzzle at once, each executed on a copy; None once the
        episode is over."""
        if self._done:
            return None
        return [self._twin().step(i).success for i in range(len(self.menu()))]

    def solution_length(self) -> int | None:
        """Fewest moves from here to a solved state within the moves left (None: not possible)."""
        raise NotImplementedError(f"{self.name}: no solution_length(); option values with a discount need it")

    def _twin(self) -> "MenuEnvironment":
        """A copy that can be stepped without touching this one (containers copied, values shared:
        states are tuples and frozen dataclasses)."""
        twin = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, (list, dict, set)):
                setattr(twin, name, copy.copy(value))
        return twin

    def failure_reward(self) -> float:
        """What a failed episode earns if it ends now (for a rollout cut short by steps that did not
        move the environment, e.g. a token policy's unparsable actions)."""
        return self._final_reward(False)

    def alive(self) -> bool:
        """`solvable()` of the current state, computed at most once per step."""
        if self._alive is None or self._alive[0] != len(self._moves):
            self._alive = (len(self._moves), bool(self.solvable()))
        return self._alive[1]

    def solvable(self) -> bool:
        raise NotImplementedError(f"{self.name}: no solvability check")

    @property
    def kept(self) -> int:
        """Moves so far after which the puzzle could still be solved (counted when reach_shaping > 0)."""
        return self._kept

    @property
    def done(self) -> bool:
        return self._done

    @property
    def success(self) -> bool:
        return self._success

    @property
    def steps(self) -> int:
        """Moves executed since the last reset."""
        return len(self._moves)

    @property
    def steps_left(self) -> int:
        return max(0, self.max_steps - len(self._moves))

    @property
    def moves(self) -> list[str]:
        return list(self._moves)

    # -- for subclasses -----------------------------------------------------------------------
    def _start(self) -> None:
        """Begin an episode from the state `_load` (or a hand-made setter) put in place."""
        self._moves, self._menu, self._success = [], None, False
        self._kept, self._alive = 0, None
        self._done = False
        if self._solved():
            raise ValueError(f"{self.name}: the start state is already solved")

    def _memory_line(self, n: int) -> str:
        return f"Move {n + 1}: {self._moves[n]}"

    def _stuck(self) -> bool:
        return not self._legal()

    def _final_reward(self, success: bool) -> float:
        if success:
            return 1.0
        return self.reach_shaping * self._kept / self.max_steps if self.reach_shaping > 0 else 0.0

    def _load(self, seed: int) -> None:
        raise NotImplementedError

    def _legal(self) -> list[str]:
        raise NotImplementedError

    def _apply(self, index: int, text: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def _solved(self) -> bool:
        raise NotImplementedError
