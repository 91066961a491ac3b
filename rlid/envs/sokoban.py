"""Small Sokoban boards: push every box onto a goal.

Boards come from `reasoning_gym`'s Sokoban generator (a reverse-play generator whose boards its A*
solves within `max_depth` moves), run small: 5x5 to 6x6 including the border walls, one box by
default. Boards already solved at the start are skipped, and with `only_solvable` (default) so
are boards whose shortest solution (our BFS) is longer than `max_steps`, deterministically.

Menu: the legal moves among "up", "down", "left", "right" (in that order): not into a wall, and not
pushing a box into a wall or another box. Reward 1 and success when every box is on a goal; the
episode also ends (reward 0) after `max_steps` moves, with `end_on_deadlock` as soon as the board
can no longer be solved in the moves left, and if no move is legal. `solvable()`: a breadth-first
search over (player, boxes) states, at most the moves left deep, pruning boxes stuck in a corner off
a goal; it gives up after SEARCH_LIMIT states and then says True (not proven unsolvable).

`describe_moves` (compiled memory, off by default): what each legal move does, as facts of the board
after it, stated in the observation (true or "observation") or as each menu entry's note ("menu",
`rlid.types.DecisionState.notes`: the facts sit beside the option's label): where you stand and how
far (Manhattan) you then are from the nearest box off a goal, or where you push the box, how far it
then is from the nearest free goal, and whether it lands on a goal or is stuck in a corner for good. No search, no advice: the same facts
a player reads off the board by counting squares."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import reasoning_gym

from runtime.errors import ConfigError

from rlid.envs.base import (PUZZLE_STRIDE, MenuEnvironment, check_bool, check_fraction, check_int, check_range,
                            first_usable, puzzle_index)

Cell = tuple[int, int]  # (row, column), 0-based from the top left
DIRECTIONS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
SEARCH_LIMIT = 200_000
LEGEND = "# wall, . floor, P you, B box, G goal, * box on a goal, + you on a goal"
INSTRUCTION = ("Sokoban: push every box (B) onto a goal (G). You move one square at a time "
               "and can only push a box, never pull it.")
# reasoning_gym's gamestr symbols -> ours
_RG_SYMBOLS = {"+": "#", "-": ".", "*": "P", "%": "+", "@": "B", "X": "G", "$": "*"}


@dataclass(frozen=True)
class Board:
    """A Sokoban state: fixed walls and goals, the movable boxes and the player."""

    height: int
    width: int
    walls: frozenset[Cell]
    goals: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    def blocked(self, cell: Cell) -> bool:
        r, c = cell
        return cell in self.walls or not (0 <= r < self.height and 0 <= c < self.width)

    def solved(self) -> bool:
        return self.boxes <= self.goals

    def move(self, direction: str) -> "Board | None":
        """The board after moving `direction`, or None if that move is not legal."""
        dr, dc = DIRECTIONS[direction]
        to = (self.player[0] + dr, self.player[1] + dc)
        if self.blocked(to):
            return None
        boxes = self.boxes
        if to in boxes:
            beyond = (to[0] + dr, to[1] + dc)
            if self.blocked(beyond) or beyond in boxes:
                return None
            boxes = (boxes - {to}) | {beyond}
        return replace(self, boxes=boxes, player=to)

    def dead(self) -> bool:
        """A box off a goal with walls on two orthogonal sides can never move again."""
        for r, c in self.boxes - self.goals:
            vertical = self.blocked((r - 1, c)) or self.blocked((r + 1, c))
            horizontal = self.blocked((r, c - 1)) or self.blocked((r, c + 1))
            if vertical and horizontal:
                return True
        return False

    def render(self) -> str:
        rows = []
        for r in range(self.height):
            rows.append(" ".join(self._symbol((r, c)) for c in range(self.width)))
        return "\n".join(rows)

    def _symbol(self, cell: Cell) -> str:
        if cell in self.walls:
            return "#"
        if cell == self.player:
            return "+" if cell in self.goals else "P"
        if cell in self.boxes:
            return "*" if cell in self.goals else "B"
        return "G" if cell in self.goals else "."


def parse_board(text: str, symbols: dict[str, str] | None = None) -> Board:
    """A board from rows of symbols (ours, see LEGEND; spaces between cells ignored). `symbols`
    maps another notation to ours first (e.g. reasoning_gym's, `_RG_SYMBOLS`)."""
    rows = [line.replace(" ", "") for line in text.strip("\n").splitlines() if line.strip()]
    if symbols:
        rows = ["".join(symbols.get(ch, "?") for ch in row) for row in rows]
    walls, goals, boxes, players = set(), set(), set(), []
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch not in "#.PBG*+":
                raise ValueError(f"unknown Sokoban symbol {ch!r} at row {r}, column {c}")
            if ch == "#":
                walls.add((r, c))
            if ch in "G*+":
                goals.add((r, c))
            if ch in "B*":
                boxes.add((r, c))
            if ch in "P+":
                players.append((r, c))
    if len(players) != 1 or not boxes or len(goals) < len(boxes):
        raise ValueError(f"a board needs one player, a box, and a goal per box: {len(players)} players, "
                         f"{len(boxes)} boxes, {len(goals)} goals")
    width = max(len(row) for row in rows)
    walls.update((r, c) for r, row in enumerate(rows) for c in range(len(row), width))  # ragged rows: walls
    return Board(len(rows), width, frozenset(walls), frozenset(goals), frozenset(boxes), players[0])


def _cells_text(cells) -> str:
    """Cells as "row r column c" (counted from 1), in reading order."""
    return "; ".join(f"row {r + 1} column {c + 1}" for r, c in sorted(cells))


def nearest_distance(cell: Cell, cells) -> int | None:
    """Manhattan distance from `cell` to the nearest of `cells` (None: there are none)."""
    return min((abs(cell[0] - r) + abs(cell[1] - c) for r, c in cells), default=None)


def _squares(n: int) -> str:
    return f"{n} square{'' if n == 1 else 's'}"


def _change(before: int | None, after: int | None) -> str:
    if before == after:
        return f"stays {_squares(after)}"
    return f"goes from {before} to {_squares(after)}"


@dataclass(frozen=True)
class MoveFacts:
    """What a legal move does (`move_facts`): where you stand after it, whether it pushes the box
    (to `box`), and the distance it changes — yours to the nearest box off a goal for a step (None:
    every box is on a goal), the box's to the nearest free goal for a push — before and after; for
    a push also whether the box lands on a goal, solves the board, or is stuck in a corner."""

    player: Cell
    pushed: bool
    box: Cell | None
    before: int | None
    after: int | None
    on_goal: bool = False
    solved: bool = False
    stuck: bool = False


def move_facts(board: Board, direction: str) -> MoveFacts:
    """The facts of a legal move on `board`; ValueError if it is not legal."""
    after = board.move(direction)
    if after is None:
        raise ValueError(f"{direction!r} is not a legal move here")
    if after.boxes == board.boxes:
        loose = after.boxes - after.goals
        return MoveFacts(after.player, False, None, nearest_distance(board.player, loose),
                         nearest_distance(after.player, loose))
    (moved,) = after.boxes - board.boxes
    (left,) = board.boxes - after.boxes
    free = after.goals - (after.boxes - {moved})
    return MoveFacts(after.player, True, moved, nearest_distance(left, free), nearest_distance(moved, free),
                     on_goal=moved in after.goals, solved=after.solved(), stuck=after.dead())


def describe_move(board: Board, direction: str) -> str:
    """What a legal move does, in words (see the module docstring and `move_facts`)."""
    f = move_facts(board, direction)
    if not f.pushed:
        text = f"you step to {_cells_text([f.player])}"
        if f.after is not None:
            text += f"; your distance to the nearest box off a goal {_change(f.before, f.after)}"
        return text
    text = f"you push the box to {_cells_text([f.box])}"
    if f.on_goal:
        return text + (", onto a goal: every box is then on a goal" if f.solved else ", onto a goal")
    text += f"; its distance to the nearest free goal {_change(f.before, f.after)}"
    if f.stuck:
        text += "; it is then stuck against walls and can never reach a goal"
    return text


def legal_moves(board: Board) -> list[tuple[str, Board]]:
    return [(d, after) for d in DIRECTIONS if (after := board.move(d)) is not None]


def shortest_solution(board: Board, max_moves: int, limit: int = SEARCH_LIMIT) -> int | None:
    """Fewest moves that solve `board` if at most `max_moves`, else None. -1: the search hit `limit`
    states before deciding."""
    if board.solved():
        return 0
    start = (board.player, board.boxes)
    seen = {start}
    frontier = deque([(board, 0)])
    while frontier:
        state, depth = frontier.popleft()
        if depth >= max_moves:
            continue
        for _, after in legal_moves(state):
            key = (after.player, after.boxes)
            if key in seen or after.dead():
                continue
            if after.solved():
                return depth + 1
            if len(seen) >= limit:
                return -1
            seen.add(key)
            frontier.append((after, depth + 1))
    return None


@dataclass(frozen=True)
class SokobanOptions:
    """Board size (width and height, border walls included), boxes, the generator's A* depth bound
    (`max_depth`), the episode length `max_steps`, `only_solvable`, `end_on_deadlock` and
    `reach_shaping` (a failed episode's reward for its moves that kept the board solvable;
    `MenuEnvironment`)."""

    min_size: int = 5
    max_size: int = 6
    min_boxes: int = 1
    max_boxes: int = 1
    max_depth: int = 20
    max_steps: int = 20
    only_solvable: bool = True
    end_on_deadlock: bool = False
    reach_shaping: float = 0.0
    describe_moves: bool | str = False      # False, True / "observation", or "menu"

    def validate(self) -> None:
        check_int("min_size", self.min_size, 5, 10)
        check_int("max_size", self.max_size, 5, 10)
        check_range("min_size", self.min_size, "max_size", self.max_size)
        check_int("min_boxes", self.min_boxes, 1, 3)
        check_int("max_boxes", self.max_boxes, 1, 3)
        check_range("min_boxes", self.min_boxes, "max_boxes", self.max_boxes)
        check_int("max_depth", self.max_depth, 2, 200)
        check_int("max_steps", self.max_steps, 1, 500)
        check_bool("only_solvable", self.only_solvable)
        check_bool("end_on_deadlock", self.end_on_deadlock)
        check_fraction("reach_shaping", self.reach_shaping)
        if self.describe_moves not in (False, True, "observation", "menu"):
            raise ConfigError("option describe_moves must be false, true, observation or menu, "
                              f"got {self.describe_moves!r}")


class SokobanEnv(MenuEnvironment):
    """Seeded small Sokoban (`rlid.types.Environment`); see the module docstring for the rules."""

    name = "sokoban"
    instruction = INSTRUCTION

    def __init__(self, options: SokobanOptions | None = None) -> None:
        super().__init__()
        self.options = options or SokobanOptions()
        self.options.validate()
        o = self.options
        self.max_steps = o.max_steps
        self.reach_shaping = float(o.reach_shaping)
        self._dataset = reasoning_gym.create_dataset(
            "sokoban", size=PUZZLE_STRIDE, seed=0, min_w=o.min_size, max_w=o.max_size, min_h=o.min_size,
            max_h=o.max_size, min_boxes=o.min_boxes, max_boxes=o.max_boxes, max_depth=o.max_depth)
        self.board: Board | None = None

    def puzzle(self, seed: int, attempt: int = 0) -> Board:
        """The generator's board for a seed's attempt."""
        gamestr = self._dataset[puzzle_index(seed, attempt)]["metadata"]["gamestr"]
        return parse_board(gamestr, _RG_SYMBOLS)

    def reset_to(self, board: Board | str) -> None:
        """Start an episode from a hand-made board (our symbols, see LEGEND; seed None)."""
        self.seed = None
        self.board = parse_board(board) if isinstance(board, str) else board
        self._start()

    def _load(self, seed: int) -> None:
        self.board = first_usable(self.name, seed, self.puzzle, self._usable,
                                  "raise max_steps or change the size and box options")

    def _usable(self, board: Board) -> bool:
        if board.solved():
            return False
        return not self.options.only_solvable or shortest_solution(board, self.max_steps) not in (None, -1)

    def observation(self) -> str:
        b = self.board
        text = (f"Board (rows from the top, columns from the left):\n{b.render()}\nLegend: {LEGEND}\n"
                f"You: {_cells_text([b.player])}. Boxes: {_cells_text(b.boxes)}. Goals: {_cells_text(b.goals)}.")
        if self.options.describe_moves in (True, "observation"):
            text += "\nWhat each move does:\n" + "\n".join(f"- {d}: {describe_move(b, d)}." for d in self.menu())
        return text

    def menu_notes(self) -> list[str]:
        """What each menu entry does, with `describe_moves: menu` ([] otherwise)."""
        if self.options.describe_moves != "menu" or self.done:
            return []
        return [describe_move(self.board, d) for d in self.menu()]

    def _legal(self) -> list[str]:
        return [d for d, _ in legal_moves(self.board)]

    def _apply(self, index: int, text: str) -> dict[str, Any]:
        before = self.board.boxes
        self.board = self.board.move(text)
        return {"pushed": self.board.boxes != before}

    def _solved(self) -> bool:
        return self.board.solved()

    def _stuck(self) -> bool:
        if not self._legal():
            return True
        return self.options.end_on_deadlock and not self.alive()

    def solvable_within(self, moves: int) -> bool:
        return shortest_solution(self.board, moves) is not None

    def solvable(self) -> bool:
        """Whether every box can still reach a goal within the moves left (BFS; see module doc)."""
        return self.solvable_within(self.steps_left)

    def solution_length(self) -> int | None:
        """Fewest moves from here to a solved board within the moves left (None: not possible)."""
        found = shortest_solution(self.board, self.steps_left)
        return None if found == -1 else found
