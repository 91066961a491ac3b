"""ARC 1-D as a one-decision episode: pick the test output from a small menu of candidate rows.

Tasks come from `reasoning_gym`'s "arc_1d" generator (rows of 8-12 cells by default, 3 train
examples). The observation shows the train examples and the test input; the menu holds the correct
test output once plus `options - 1` distractors, shuffled, all distinct. Distractors are drawn, with
a Random seeded by the episode seed, from other 1-D transformations of the test row: the input
itself, the correct output shifted or rotated by one cell, mirrored, the input shifted by one or two
cells, the input's cells pushed left or right (gravity); if those give too few distinct rows, the
correct output with one cell recoloured. Reward 1 (success) if the correct row is picked; the
episode ends after that one step. `solvable()` is True while the episode is not over."""
from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import Any, Sequence

import reasoning_gym
from reasoning_gym.arc.arc_1d_tasks import ARC_1D_TASKS

from runtime.errors import ConfigError
from rlid.envs.base import PUZZLE_STRIDE, MenuEnvironment, check_int, check_range, puzzle_index

Row = tuple[int, ...]
INSTRUCTION = ("ARC 1-D: find the rule that turns each example input row into its output row, "
               "then pick the output row of the test input.")


@dataclass(frozen=True)
class Arc1DOptions:
    """Row length range, train examples, menu size (`options`), and optionally a subset of
    reasoning_gym's ARC-1D task names (`tasks`, None = all)."""

    min_size: int = 8
    max_size: int = 12
    num_train: int = 3
    options: int = 4
    tasks: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tasks, list):  # from YAML
            object.__setattr__(self, "tasks", tuple(self.tasks))

    def validate(self) -> None:
        check_int("min_size", self.min_size, 8, 100)
        check_int("max_size", self.max_size, 8, 100)
        check_range("min_size", self.min_size, "max_size", self.max_size)
        check_int("num_train", self.num_train, 1, 10)
        check_int("options", self.options, 2, 26)
        if self.tasks is not None:
            if not isinstance(self.tasks, tuple):
                raise ConfigError(f"option tasks must be a list of ARC-1D task names, got {self.tasks!r}")
            unknown = [t for t in self.tasks if t not in ARC_1D_TASKS]
            if unknown or not self.tasks:
                raise ConfigError(f"option tasks: unknown ARC-1D task {unknown[0] if unknown else '(none given)'!r}; "
                                  f"valid tasks: {', '.join(ARC_1D_TASKS)}")


def _shift(row: Row, k: int) -> Row:
    """Cells moved k to the right (k < 0: left), zeros coming in."""
    n = len(row)
    return tuple(row[i - k] if 0 <= i - k < n else 0 for i in range(n))


def _rotate(row: Row, k: int) -> Row:
    return tuple(row[(i - k) % len(row)] for i in range(len(row)))


def _gravity(row: Row, right: bool) -> Row:
    cells = [v for v in row if v]
    pad = (0,) * (len(row) - len(cells))
    return pad + tuple(cells) if right else tuple(cells) + pad


def transformations(test_input: Row, answer: Row) -> list[Row]:
    """Rows made from the test pair by other 1-D transformations, in a fixed order (may repeat or
    equal the answer; `distractors` filters)."""
    return [test_input, _shift(answer, 1), _shift(answer, -1), _rotate(answer, 1), _rotate(answer, -1),
            tuple(reversed(answer)), _shift(test_input, 1), _shift(test_input, -1), _shift(test_input, 2),
            _shift(test_input, -2), _gravity(test_input, False), _gravity(test_input, True)]


def distractors(test_input: Row, answer: Row, count: int, rng: Random) -> list[Row]:
    """`count` distinct rows, none equal to `answer`, drawn with `rng` (see the module docstring)."""
    pool = list(dict.fromkeys(r for r in transformations(test_input, answer) if r != answer))
    chosen = rng.sample(pool, min(count, len(pool)))
    while len(chosen) < count:
        i = rng.randrange(len(answer))
        colour = rng.choice([v for v in range(10) if v != answer[i]])
        row = answer[:i] + (colour,) + answer[i + 1:]
        if row not in chosen:
            chosen.append(row)
    return chosen


def row_text(row: Sequence[int]) -> str:
    return " ".join(map(str, row))


class Arc1DEnv(MenuEnvironment):
    """Seeded one-step ARC-1D choice (`rlid.types.Environment`); see the module docstring."""

    name = "arc_1d"
    instruction = INSTRUCTION
    max_steps = 1

    def __init__(self, options: Arc1DOptions | None = None) -> None:
        super().__init__()
        self.options = options or Arc1DOptions()
        self.options.validate()
        o = self.options
        self._dataset = reasoning_gym.create_dataset(
            "arc_1d", size=PUZZLE_STRIDE, seed=0, min_size=o.min_size, max_size=o.max_size, num_train=o.num_train)
        if o.tasks is not None:
            self._dataset.task_names = list(o.tasks)  # the generator draws the task from this list
        self.task_name = ""
        self.train: list[tuple[Row, Row]] = []
        self.test_input: Row = ()
        self.answer: Row = ()
        self.candidates: list[Row] = []
        self._picked: Row | None = None

    def _load(self, seed: int) -> None:
        meta = self._dataset[puzzle_index(seed)]["metadata"]
        train = [(tuple(ex["input"]), tuple(ex["output"])) for ex in meta["train_examples"]]
        test = meta["test_example"]
        self._set(meta["task_name"], train, tuple(test["input"]), tuple(test["output"]), Random(f"arc_1d/{seed}"))

    def reset_to(self, train: list[tuple[Row, Row]], test_input: Row, answer: Row, rng_seed: int = 0) -> None:
        """Start an episode from a hand-made task (seed None)."""
        self.seed = None
        self._set("hand-made", [(tuple(a), tuple(b)) for a, b in train], tuple(test_input), tuple(answer),
                  Random(f"arc_1d/hand-made/{rng_seed}"))
        self._start()

    def _set(self, task: str, train: list[tuple[Row, Row]], test_input: Row, answer: Row, rng: Random) -> None:
        self.task_name, self.train, self.test_input, self.answer = task, train, test_input, answer
        self.candidates = [answer] + distractors(test_input, answer, self.options.options - 1, rng)
        rng.shuffle(self.candidates)
        self._picked = None

    @property
    def answer_index(self) -> int:
        return self.candidates.index(self.answer)

    def observation(self) -> str:
        parts = [f"Example {n}:\nInput:  {row_text(x)}\nOutput: {row_text(y)}" for n, (x, y) in enumerate(self.train, 1)]
        parts.append(f"Test input: {row_text(self.test_input)}")
        return "\n\n".join(parts)

    def _legal(self) -> list[str]:
        return [row_text(r) for r in self.candidates]

    def _apply(self, index: int, text: str) -> dict[str, Any]:
        self._picked = self.candidates[index]
        return {"task": self.task_name, "answer": row_text(self.answer)}

    def _solved(self) -> bool:
        return self._picked == self.answer

    def _stuck(self) -> bool:
        return self._picked is not None

    def solvable(self) -> bool:
        """True before the pick (the answer is on the menu); after it, whether the pick was right."""
        return not self.done or self.success
