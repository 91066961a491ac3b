"""rlid.envs and rlid.rollout: legal menus and rewards on hand-made states, seeds, solvability
against brute force, make_env's errors, and lockstep rollouts with scripted policies (exact option
values: test_rlid_option_values.py)."""
from __future__ import annotations

import itertools
import random
from collections import deque

import pytest

from runtime.errors import ConfigError
from rlid.envs import ENVIRONMENTS, make_env
from rlid.envs.arc_1d import Arc1DEnv, Arc1DOptions
from rlid.envs.countdown import CountdownEnv, CountdownOptions, legal_moves, reachable
from rlid.envs.sokoban import SokobanEnv, SokobanOptions, describe_move, parse_board, shortest_solution
from rlid.rollout import decision_state, run_episode, run_episodes
from rlid.types import DecisionState


def pick(env, text):
    return env.step(env.menu().index(text))


# -- Countdown ------------------------------------------------------------------------------------

def test_countdown_menu_and_win_on_hand_made_state():
    env = CountdownEnv()
    env.reset_to([5, 3, 4], 12)
    assert env.observation() == "Target: 12\nNumbers: 3, 4, 5"
    assert env.menu() == ["3 + 4 = 7", "4 - 3 = 1", "3 * 4 = 12", "3 + 5 = 8", "5 - 3 = 2", "3 * 5 = 15",
                          "4 + 5 = 9", "5 - 4 = 1", "4 * 5 = 20"]
    first = pick(env, "3 + 4 = 7")
    assert (first.reward, first.done, first.success) == (0.0, False, False)
    assert env.menu() == ["5 + 7 = 12", "7 - 5 = 2", "5 * 7 = 35"]
    assert env.memory(0) == ""
    assert env.memory(3) == "Move 1: 3 + 4 = 7, leaving 5, 7"
    last = pick(env, "5 + 7 = 12")
    assert (last.reward, last.done, last.success) == (1.0, True, True)
    assert env.menu() == [] and env.solvable()
    assert env.memory(1) == "Move 2: 5 + 7 = 12, leaving 12"
    with pytest.raises(RuntimeError):
        env.step(0)


def test_countdown_rules_dedupe_positive_exact():
    menu = [text for text, _ in legal_moves((2, 2, 5))]
    assert "2 + 2 = 4" in menu and "2 * 2 = 4" not in menu  # same multiset after: one move
    assert "2 / 2 = 1" in menu and "2 - 2 = 0" not in menu  # no zero results
    assert menu.count("2 + 5 = 7") == 1  # the two 2s give one move each, not two
    assert [t for t, _ in legal_moves((3, 7))] == ["3 + 7 = 10", "7 - 3 = 4", "3 * 7 = 21"]
    assert "9 / 3 = 3" in [t for t, _ in legal_moves((3, 9))]
    ones = [t for t, _ in legal_moves((1, 6, 8))]
    assert "1 * 6 = 6" in ones and "6 / 1 = 6" not in ones  # both leave 6, 8: the first listed stays
    assert [t for t, _ in legal_moves((4, 6), operators=("+",))] == ["4 + 6 = 10"]


def test_countdown_failure_reward_and_shaping():
    env = CountdownEnv()
    env.reset_to([3, 4, 5], 12)
    pick(env, "4 * 5 = 20")
    assert not env.solvable()  # 3 and 20 cannot make 12
    end = pick(env, "3 + 20 = 23")
    assert (end.reward, end.done, end.success) == (0.0, True, False)
    shaped = CountdownEnv(CountdownOptions(shaping=0.5))
    shaped.reset_to([3, 4, 5], 12)
    pick(shaped, "3 + 4 = 7")
    assert pick(shaped, "7 - 5 = 2").reward == pytest.approx(0.5 * (1 - 10 / 12))


def test_countdown_reach_shaping_pays_the_moves_that_kept_the_target_reachable():
    env = CountdownEnv(CountdownOptions(reach_shaping=0.5))  # 3 numbers: max_steps 2 (max_numbers 4: 3)
    env.reset_to([3, 4, 5], 12)
    pick(env, "3 + 4 = 7")  # 7 + 5 = 12 is still possible
    assert env.kept == 1
    end = pick(env, "7 - 5 = 2")
    assert (end.done, end.success, env.kept) == (True, False, 1)
    assert end.reward == pytest.approx(0.5 * 1 / env.max_steps)
    env.reset_to([3, 4, 5], 12)
    pick(env, "4 * 5 = 20")  # dead already: 3 and 20 cannot make 12
    assert pick(env, "3 + 20 = 23").reward == 0.0 and env.kept == 0
    env.reset_to([3, 4, 5], 12)
    pick(env, "3 + 4 = 7")
    assert pick(env, "5 + 7 = 12").reward == 1.0  # a success is worth more than any failure


def test_countdown_end_on_dead_end_ends_at_the_first_unreachable_state():
    env = CountdownEnv(CountdownOptions(end_on_dead_end=True, reach_shaping=1.0))
    env.reset_to([3, 4, 5], 12)
    end = pick(env, "4 * 5 = 20")
    assert (end.reward, end.done, end.success, env.steps) == (0.0, True, False, 1)
    env.reset_to([3, 4, 5], 12)
    assert not pick(env, "3 + 4 = 7").done  # still reachable: the episode goes on


def test_countdown_asks_solvable_once_per_step(monkeypatch):
    env = CountdownEnv(CountdownOptions(end_on_dead_end=True, reach_shaping=1.0))
    env.reset_to([3, 4, 5], 12)
    calls = []
    real = CountdownEnv.solvable
    monkeypatch.setattr(CountdownEnv, "solvable", lambda self: calls.append(1) or real(self))
    pick(env, "3 + 4 = 7")  # both the reach count and the dead-end check need it
    assert len(calls) == 1


@pytest.mark.parametrize("options", [dict(shaping=0.5, reach_shaping=0.5), dict(reach_shaping=2),
                                     dict(reach_shaping=True), dict(end_on_dead_end="yes")])
def test_countdown_bad_shaping_options_are_config_errors(options):
    with pytest.raises(ConfigError):
        CountdownEnv(CountdownOptions(**options))


def brute_values(numbers: tuple[int, ...]) -> set[int]:
    """Every positive integer an expression tree over all of `numbers` can take (subset split)."""
    if len(numbers) == 1:
        return {numbers[0]}
    out: set[int] = set()
    idx = range(len(numbers))
    for mask in range(1, 2 ** len(numbers) - 1):
        left = tuple(numbers[i] for i in idx if mask >> i & 1)
        right = tuple(numbers[i] for i in idx if not mask >> i & 1)
        for x in brute_values(left):
            for y in brute_values(right):
                out.update({x + y, x * y} | ({abs(x - y)} - {0}))
                out.update({x // y} if x % y == 0 else set())
    return out


def brute_reachable(numbers: tuple[int, ...], target: int) -> bool:
    return any(target in brute_values(sub) for r in range(1, len(numbers) + 1)
               for sub in itertools.combinations(numbers, r))


def test_countdown_solvable_agrees_with_brute_force():
    rng = random.Random(0)
    verdicts = []
    for _ in range(250):
        numbers = tuple(sorted(rng.randint(1, 12) for _ in range(rng.randint(2, 4))))
        target = rng.randint(1, 80)
        expected = brute_reachable(numbers, target)
        assert reachable(numbers, target, len(numbers) - 1) == expected, (numbers, target)
        if target not in numbers:
            env = CountdownEnv()
            env.reset_to(list(numbers), target)
            assert env.solvable() == expected
        verdicts.append(expected)
    assert 20 < sum(verdicts) < 230  # both answers are exercised


def test_countdown_seeds_are_deterministic_and_solvable():
    a, b = CountdownEnv(), CountdownEnv()
    puzzles = []
    for seed in range(15):
        a.reset(seed)
        b.reset(seed)
        assert (a.observation(), a.menu()) == (b.observation(), b.menu())
        assert 3 <= len(a.numbers) <= 4 and 10 <= a.target <= 99 and a.target not in a.numbers
        assert a.solvable() and a.max_steps == 3
        puzzles.append((a.numbers, a.target))
    assert len(set(puzzles)) > 10
    # with 2 moves only, some 4-number puzzles cannot be done: only_solvable resamples those
    raw = CountdownEnv(CountdownOptions(only_solvable=False, max_steps=2))
    unsolvable = [s for s in range(40) if not (raw.reset(s) or raw.solvable())]
    assert unsolvable
    short = CountdownEnv(CountdownOptions(max_steps=2))
    short.reset(unsolvable[0])
    assert short.solvable() and (short.numbers, short.target) != raw.puzzle(unsolvable[0])
    raw.reset(unsolvable[0] + 1)
    short.reset(unsolvable[0] + 1)
    assert (short.numbers, short.target) == (raw.numbers, raw.target) or not raw.solvable()


# -- Sokoban --------------------------------------------------------------------------------------

PUSH_INTO_WALL = """
######
#G.B.#
#..P.#
#....#
######"""


def test_sokoban_push_into_wall_not_legal_and_scripted_win():
    env = SokobanEnv()
    env.reset_to(PUSH_INTO_WALL)
    assert env.menu() == ["down", "left", "right"]  # "up" would push the box into the wall
    assert env.solution_length() == 4 and env.solvable()
    results = [pick(env, move) for move in ["right", "up", "left", "left"]]
    assert [r.done for r in results] == [False, False, False, True]
    assert (results[-1].reward, results[-1].success) == (1.0, True)
    assert results[2].info["pushed"] and not results[0].info["pushed"]
    assert env.memory(2) == "Move 3: left\nMove 4: left"


def test_sokoban_one_push_win_and_box_into_box():
    env = SokobanEnv()
    env.reset_to("#####\n#PBG#\n#####")
    assert env.menu() == ["right"]
    assert parse_board("###\n#PBG#\n#####").blocked((0, 3))  # a ragged row is walled off
    result = env.step(0)
    assert (result.reward, result.done, result.success) == (1.0, True, True)
    env.reset_to("#######\n#.PBB.#\n#..GG.#\n#######")
    assert env.menu() == ["down", "left"]  # "right" would push a box into the other box
    assert not env.solvable()  # boxes on the top wall can never come down (no corner: BFS decides)


def test_sokoban_cornered_box_is_unsolvable_and_can_end_the_episode():
    env = SokobanEnv()
    env.reset_to("#####\n#B..#\n#.P.#\n#..G#\n#####")
    assert not env.solvable() and env.solution_length() is None
    board = "#####\n#...#\n#.B.#\n#.P.#\n#..G#\n#####"
    plain, ending = SokobanEnv(), SokobanEnv(SokobanOptions(end_on_deadlock=True))
    for e in (plain, ending):
        e.reset_to(board)
        assert e.solvable()
    # "up" pushes the box against the top wall, off the goal's row and column for good
    assert not pick(plain, "up").done and not plain.solvable()
    end = pick(ending, "up")
    assert (end.reward, end.done, end.success) == (0.0, True, False)


def test_sokoban_reach_shaping_counts_moves_until_the_slack_runs_out():
    env = SokobanEnv(SokobanOptions(max_steps=8, end_on_deadlock=True, reach_shaping=0.5))
    env.reset_to("#####\n#...#\n#.B.#\n#.P.#\n#..G#\n#####")
    assert env.solution_length() == 7  # one move of slack
    assert not pick(env, "left").done and env.kept == 1  # 6 to go, 7 left
    end = pick(env, "right")  # back where it started: 7 to go, 6 left
    assert (end.done, end.success, env.kept) == (True, False, 1)
    assert end.reward == pytest.approx(0.5 * 1 / 8)
    with pytest.raises(ConfigError):
        SokobanEnv(SokobanOptions(reach_shaping=-0.1))


def test_sokoban_describe_moves_states_each_moves_effect():
    env = SokobanEnv(SokobanOptions(describe_moves=True))
    env.reset_to("#####\n#...#\n#.B.#\n#.P.#\n#..G#\n#####")
    lines = env.observation().split("What each move does:\n")[1].splitlines()
    assert lines == [
        "- up: you push the box to row 2 column 3; its distance to the nearest free goal goes from 3 to 4 squares.",
        "- down: you step to row 5 column 3; your distance to the nearest box off a goal goes from 1 to 2 squares.",
        "- left: you step to row 4 column 2; your distance to the nearest box off a goal goes from 1 to 2 squares.",
        "- right: you step to row 4 column 4; your distance to the nearest box off a goal goes from 1 to 2 squares."]
    assert [line.split(":")[0][2:] for line in lines] == env.menu()  # one line per legal move, menu order
    env.reset_to("#####\n#PBG#\n#####")
    assert env.observation().endswith("- right: you push the box to row 2 column 4, onto a goal: every box is then on a goal.")
    assert describe_move(parse_board("######\n#PB.G#\n######"), "right") == (
        "you push the box to row 2 column 4; its distance to the nearest free goal goes from 2 to 1 square")
    assert describe_move(parse_board("#####\n#...#\n#B..#\n#P.G#\n#####"), "up") == (
        "you push the box to row 2 column 2; its distance to the nearest free goal goes from 3 to 4 squares;"
        " it is then stuck against walls and can never reach a goal")  # a corner off a goal
    with pytest.raises(ValueError, match="not a legal move"):
        describe_move(parse_board("#####\n#PBG#\n#####"), "left")
    menu = SokobanEnv(SokobanOptions(describe_moves="menu"))
    menu.reset_to("#####\n#...#\n#.B.#\n#.P.#\n#..G#\n#####")
    state = decision_state(menu, memory_k=1)
    assert state.notes == tuple(line.split(": ", 1)[1].rstrip(".") for line in lines)  # the same facts, per option
    assert "What each move does" not in state.observation
    menu.step(1)
    assert decision_state(menu).notes[0].startswith("you step to row 4 column 3")  # recomputed after a move
    plain = SokobanEnv()
    plain.reset_to("#####\n#PBG#\n#####")
    assert plain.menu_notes() == []
    assert "What each move does" not in plain.observation()  # off by default
    with pytest.raises(ConfigError):
        SokobanOptions(describe_moves="yes").validate()
    assert decision_state(plain).notes == ()


def test_sokoban_max_steps_ends_with_zero_reward():
    env = SokobanEnv(SokobanOptions(max_steps=2))
    env.reset_to(PUSH_INTO_WALL)
    assert not pick(env, "down").done
    end = pick(env, "up")
    assert (end.reward, end.done, end.success) == (0.0, True, False)
    assert not env.solvable()


def brute_distance(board, depth: int) -> int | None:
    """Fewest moves to solve within `depth`: plain BFS over (player, boxes), own move rule, no pruning."""
    start = (board.player, board.boxes)
    seen, frontier = {start}, deque([(start, 0)])
    while frontier:
        (player, boxes), d = frontier.popleft()
        if boxes <= board.goals:
            return d
        if d == depth:
            continue
        for dr, dc in [(-1, 0), (1, 0), (0, -1), (0, 1)]:
            to = (player[0] + dr, player[1] + dc)
            new_boxes = boxes
            if to in board.walls:
                continue
            if to in boxes:
                beyond = (to[0] + dr, to[1] + dc)
                if beyond in board.walls or beyond in boxes:
                    continue
                new_boxes = (boxes - {to}) | {beyond}
            if (to, new_boxes) not in seen:
                seen.add((to, new_boxes))
                frontier.append(((to, new_boxes), d + 1))
    return None


def random_board(rng: random.Random, boxes: int) -> str:
    inner = [["#"] + ["." if rng.random() > 0.1 else "#" for _ in range(4)] + ["#"] for _ in range(4)]
    rows = [["#"] * 6] + inner + [["#"] * 6]
    free = [(r, c) for r in range(1, 5) for c in range(1, 5) if rows[r][c] == "."]
    cells = rng.sample(free, 1 + 2 * boxes)
    rows[cells[0][0]][cells[0][1]] = "P"
    for r, c in cells[1:1 + boxes]:
        rows[r][c] = "B"
    for r, c in cells[1 + boxes:]:
        rows[r][c] = "G"
    return "\n".join("".join(row) for row in rows)


def test_sokoban_solvable_agrees_with_brute_force():
    rng = random.Random(1)
    verdicts = []
    for n in range(120):
        board = parse_board(random_board(rng, 1 + (n % 3 == 0)))
        for depth in (4, 12):
            expected = brute_distance(board, depth)
            assert shortest_solution(board, depth) == expected, (board.render(), depth)
            verdicts.append(expected is not None)
    assert 30 < sum(verdicts) < len(verdicts) - 30


def test_sokoban_seeds_deterministic_small_and_solvable():
    a, b = SokobanEnv(), SokobanEnv()
    boards = []
    for seed in range(12):
        a.reset(seed)
        b.reset(seed)
        assert (a.observation(), a.menu()) == (b.observation(), b.menu())
        assert 5 <= a.board.height <= 6 and 5 <= a.board.width <= 6 and len(a.board.boxes) == 1
        assert not a.board.solved() and 1 <= a.solution_length() <= a.max_steps
        assert parse_board(a.board.render()) == a.board
        assert "Legend: # wall" in a.observation()
        boards.append(a.board)
    assert len(set(boards)) > 8


# -- ARC-1D ---------------------------------------------------------------------------------------

def test_arc_menu_has_the_answer_once_and_pays_for_it():
    env = Arc1DEnv()
    tasks = set()
    for seed in range(40):
        env.reset(seed)
        menu = env.menu()
        answer = " ".join(map(str, env.answer))
        assert len(menu) == 4 and len(set(menu)) == 4 and menu.count(answer) == 1
        assert env.observation().endswith("Test input: " + " ".join(map(str, env.test_input)))
        assert env.solvable()
        tasks.add(env.task_name)
        wrong = next(i for i in range(4) if i != env.answer_index)
        result = env.step(wrong if seed % 2 else env.answer_index)
        assert result.done and result.success == (seed % 2 == 0) and result.reward == float(seed % 2 == 0)
        assert env.solvable() == result.success
    assert len(tasks) > 10
    again = Arc1DEnv()
    again.reset(7)
    env.reset(7)
    assert (again.observation(), again.menu()) == (env.observation(), env.menu())


def test_arc_distractor_fallback_and_task_subset():
    env = Arc1DEnv(Arc1DOptions(options=6))
    zeros = (0,) * 8
    env.reset_to([(zeros, zeros)], zeros, zeros)  # every transformation is the answer itself
    assert len(set(env.menu())) == 6 and env.menu().count("0 0 0 0 0 0 0 0") == 1
    only = make_env("arc_1d", tasks=["gravity_left"])
    only.reset(3)
    assert only.task_name == "gravity_left"
    with pytest.raises(ConfigError, match="no_such_task"):
        make_env("arc_1d", tasks=["no_such_task"])


# -- make_env -------------------------------------------------------------------------------------

def test_make_env_names_options_and_errors():
    assert ENVIRONMENTS == ("countdown", "sokoban", "arc_1d", "twc", "cooking")
    for name in ENVIRONMENTS:
        env = make_env(name)       # twc / cooking start no JVM until their first reset (tests/test_rlid_textworld.py)
        assert env.name == name and env.instruction and env.max_steps >= 1
    assert make_env("countdown", operators=["+", "*"]).operators == ("+", "*")
    with pytest.raises(ConfigError) as bad_name:
        make_env("chess")
    assert "'chess'" in str(bad_name.value) and "countdown, sokoban, arc_1d" in str(bad_name.value)
    with pytest.raises(ConfigError) as bad_option:
        make_env("sokoban", boxes=2)
    message = str(bad_option.value)
    assert "'boxes'" in message and "min_boxes" in message and "\n" not in message
    for name, options in [("countdown", {"min_numbers": 5, "max_numbers": 4}), ("countdown", {"operators": ["^"]}),
                          ("sokoban", {"max_steps": 0}), ("arc_1d", {"options": "4"})]:
        with pytest.raises(ConfigError):
            make_env(name, **options)


# -- rollout --------------------------------------------------------------------------------------

def countdown_solver(states: list[DecisionState]) -> list[int]:
    """A scripted policy that reads numbers and target off the observation and keeps the target reachable."""
    choices = []
    for state in states:
        lines = dict(line.split(": ") for line in state.observation.splitlines())
        target, numbers = int(lines["Target"]), tuple(int(n) for n in lines["Numbers"].split(", "))
        moves = legal_moves(numbers)
        assert [t for t, _ in moves] == list(state.actions)
        choices.append(next(i for i, (_, after) in enumerate(moves) if reachable(after, target, len(after) - 1)))
    return choices


def test_run_episodes_lockstep_with_a_scripted_solver():
    batches = []

    def policy(states):
        batches.append(len(states))
        return countdown_solver(states)

    episodes = run_episodes(lambda: make_env("countdown"), policy, range(10), memory_k=2)
    assert [e.seed for e in episodes] == list(range(10)) and batches[0] == 10
    assert batches == sorted(batches, reverse=True) and sum(batches) == sum(len(e.transitions) for e in episodes)
    assert all(e.success and e.total_reward == 1.0 and e.invalid == 0 for e in episodes)
    assert all(e.success == e.transitions[-1].result.success for e in episodes)
    multi = next(e for e in episodes if len(e.transitions) > 1)
    assert multi.transitions[0].state.memory == "" and multi.transitions[1].state.memory.startswith("Move 1: ")
    single = run_episode(make_env("countdown"), countdown_solver, multi.seed, memory_k=2)
    assert [t.action for t in single.transitions] == [t.action for t in multi.transitions]
    assert single.transitions[0].state.instruction == make_env("countdown").instruction


def test_run_episodes_first_action_policy_and_bad_policies():
    episodes = run_episodes(lambda: make_env("sokoban", max_steps=6), lambda s: [0] * len(s), [0, 1, 2])
    assert all(1 <= len(e.transitions) <= 6 and e.invalid == 0 for e in episodes)
    assert all(e.success == e.transitions[-1].result.success for e in episodes)
    with pytest.raises(ValueError, match="index 9"):
        run_episodes(lambda: make_env("arc_1d"), lambda s: [9] * len(s), [0, 1])
    with pytest.raises(ValueError, match="1 indices for 2 states"):
        run_episodes(lambda: make_env("arc_1d"), lambda s: [0], [0, 1])
    with pytest.raises(ValueError):
        run_episode(make_env("arc_1d"), lambda s: ["A"], 0)


def test_a_rollout_cut_short_by_invalid_steps_still_gets_the_shaped_failure_reward():
    from rlid.train_loop import lockstep

    class Puzzle(CountdownEnv):
        def reset(self, seed):
            self.reset_to([3, 4, 5], 12)

    make = lambda: Puzzle(CountdownOptions(max_numbers=3, reach_shaping=0.5))  # noqa: E731 (max_steps 2)

    def act(states):  # a keeping move, then unparsable text
        return [(states[0].actions.index("3 + 4 = 7") if "3 + 4 = 7" in states[0].actions else None, None)]

    (episode,), _ = lockstep(make, act, [0], invalid_reward=-0.1)
    rewards = [t.result.reward for t in episode.transitions]
    assert rewards == [0.0, pytest.approx(-0.1 + 0.5 * 1 / 2)]
    assert episode.invalid == 1 and not episode.success
