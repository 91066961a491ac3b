"""Exact option values (`last_move_rewards`, `option_values`, discounted or not) on Countdown and
Sokoban, pinned by brute force and hand-made states, and the rollouts that record them."""
from __future__ import annotations

import copy
import random

import pytest

from rlid.envs.countdown import CountdownEnv, CountdownOptions
from rlid.envs.sokoban import SokobanEnv, SokobanOptions
from rlid.rollout import run_episodes
from test_rlid_envs import pick


def test_last_move_rewards_are_each_options_reward_and_leave_the_env_alone():
    env = CountdownEnv(CountdownOptions(reach_shaping=0.5))
    env.reset_to([3, 4, 5], 12)
    assert env.last_move_rewards() is None                   # 3 moves left: not a last move
    env2 = CountdownEnv(CountdownOptions(max_numbers=3, reach_shaping=0.5))  # max_steps 2
    env2.reset_to([3, 4, 5], 12)
    pick(env2, "3 + 4 = 7")
    menu, before = env2.menu(), (env2.numbers, env2.moves, env2.kept)
    rewards = env2.last_move_rewards()
    assert (env2.numbers, env2.moves, env2.kept, env2.done) == (*before, False)
    expected = []
    for i in range(len(menu)):
        twin = CountdownEnv(CountdownOptions(max_numbers=3, reach_shaping=0.5))
        twin.reset_to([3, 4, 5], 12)
        pick(twin, "3 + 4 = 7")
        expected.append(twin.step(i).reward)
    assert rewards == expected and rewards[menu.index("5 + 7 = 12")] == 1.0
    assert min(rewards) == pytest.approx(0.5 * 1 / 2)         # the failures kept it alive for one move


def best_return(env) -> float:
    """The largest return any continuation earns from `env`'s state (exhaustive search on copies)."""
    best = float("-inf")
    for i in range(len(env.menu())):
        twin = copy.deepcopy(env)
        result = twin.step(i)
        best = max(best, result.reward if result.done else best_return(twin))
    return best


@pytest.mark.parametrize("options", [dict(reach_shaping=0.5), dict(reach_shaping=0.5, end_on_dead_end=True), {}])
def test_option_values_are_each_options_best_return(options):
    """option_values() = Q*(s, a): the best return of any continuation after option a, by brute force,
    at every state of seeded episodes; the env is left as it was; at a last move = last_move_rewards()."""
    env = CountdownEnv(CountdownOptions(**options))
    checked = 0
    for seed in range(6):
        env.reset(seed)
        while not env.done:
            before = (env.numbers, env.moves, env.kept)
            values = env.option_values()
            assert (env.numbers, env.moves, env.kept, env.done) == (*before, False)
            expected = []
            for i in range(len(env.menu())):
                twin = copy.deepcopy(env)
                result = twin.step(i)
                expected.append(result.reward if result.done else best_return(twin))
            assert values == pytest.approx(expected)
            if env.steps_left == 1:
                assert values == env.last_move_rewards()
            checked += len(values)
            env.step(random.Random(seed).randrange(len(values)))
    assert checked > 50
    assert env.option_values() is None                       # the episode is over


def test_option_values_on_a_hand_made_countdown_state():
    env = CountdownEnv(CountdownOptions(reach_shaping=0.5))
    env.reset_to([3, 4, 5], 12)
    values = dict(zip(env.menu(), env.option_values()))
    assert values["3 * 4 = 12"] == 1.0                        # solves it
    assert values["3 + 4 = 7"] == 1.0                         # 7 + 5 = 12 is still possible
    assert values["4 * 5 = 20"] == 0.0                        # dead: 3 and 20 cannot make 12, nothing kept


def test_discounted_option_values_prefer_the_shorter_solution():
    """option_values(discount=γ): a live option is worth γ^(fewest moves still needed); wins and dead
    ends keep their rewards; γ = 1 is the undiscounted Q*; solution_length() pinned by hand."""
    env = CountdownEnv(CountdownOptions(reach_shaping=0.5))
    env.reset_to([3, 4, 5], 12)
    assert env.solution_length() == 1                        # 3 * 4
    values = dict(zip(env.menu(), env.option_values(discount=0.5)))
    assert values["3 * 4 = 12"] == 1.0                        # wins now
    assert values["3 + 4 = 7"] == 0.5                         # one move still needed (7 + 5)
    assert values["4 * 5 = 20"] == 0.0                        # dead end: its failure reward
    assert env.option_values(discount=1.0) == env.option_values()
    env.reset_to([2, 5, 20], 45)
    assert env.solution_length() == 2                        # 2 * 20 = 40, then 40 + 5
    with pytest.raises(ValueError, match="discount"):
        env.option_values(discount=0.0)
    board = "#####\n#...#\n#.B.#\n#.P.#\n#..G#\n#####"
    sok = SokobanEnv(SokobanOptions(max_steps=8, reach_shaping=0.5))
    sok.reset_to(board)
    twin = copy.deepcopy(sok)
    pick(twin, "left")
    assert dict(zip(sok.menu(), sok.option_values(discount=0.9)))["left"] == pytest.approx(0.9 ** twin.solution_length())


def test_sokoban_option_values_mark_the_cornering_push():
    board = "#####\n#...#\n#.B.#\n#.P.#\n#..G#\n#####"
    for options in (dict(max_steps=8, reach_shaping=0.5), dict(max_steps=8, reach_shaping=0.5, end_on_deadlock=True)):
        env = SokobanEnv(SokobanOptions(**options))
        env.reset_to(board)
        values = dict(zip(env.menu(), env.option_values()))
        # 7 moves to go in 8: only "left" keeps a solution in the 7 left ("up" corners the box for good)
        assert values == {"up": 0.0, "down": 0.0, "left": 1.0, "right": 0.0}
        for i, value in enumerate(env.option_values()):    # 1 exactly where BFS finds a solution in time
            twin = copy.deepcopy(env)
            twin.step(i)
            fits = twin.solution_length() is not None and twin.solution_length() <= twin.steps_left
            assert value == (1.0 if fits else twin.failure_reward())
        pick(env, "left")                                  # 6 to go, 7 left: one move of slack used up
        values = dict(zip(env.menu(), env.option_values()))
        assert values["right"] == pytest.approx(0.5 * 1 / 8)   # back: 7 to go, 6 left; one move was kept


def test_rollout_records_option_values_at_every_move_when_asked():
    make = lambda: CountdownEnv(CountdownOptions(reach_shaping=0.5))  # noqa: E731
    first = lambda states: [0] * len(states)  # noqa: E731
    episodes = run_episodes(make, first, [0, 1, 2], option_values=True)
    assert all(t.option_rewards is not None and len(t.option_rewards) == len(t.state.actions)
               for ep in episodes for t in ep.transitions)
    for both in ({"last_move_rewards": True}, {"option_rewards": True}):
        with pytest.raises(ValueError, match="ask for one of"):
            run_episodes(make, first, [0], option_values=True, **both)


def test_rollout_records_each_options_immediate_reward_when_asked():
    """`option_rewards=True`: every move records what each option would earn now; the chosen option's
    entry is the reward that move got."""
    make = lambda: CountdownEnv(CountdownOptions(reach_shaping=0.5))  # noqa: E731
    first = lambda states: [0] * len(states)  # noqa: E731
    episodes = run_episodes(make, first, [0, 1, 2], option_rewards=True)
    moves = [t for ep in episodes for t in ep.transitions]
    assert all(len(t.option_rewards) == len(t.state.actions) and t.option_rewards[t.action] == t.result.reward
               for t in moves)
    assert any(max(t.option_rewards) > min(t.option_rewards) for t in moves)


def test_rollout_records_last_move_rewards_only_when_asked():
    make = lambda: CountdownEnv(CountdownOptions(max_numbers=3, reach_shaping=0.5))  # noqa: E731
    first = lambda states: [0] * len(states)  # noqa: E731
    plain = run_episodes(make, first, [0, 1])
    asked = run_episodes(make, first, [0, 1], last_move_rewards=True)
    assert all(t.option_rewards is None for ep in plain for t in ep.transitions)
    for ep in asked:
        last = ep.transitions[-1]
        assert [t.option_rewards is not None for t in ep.transitions[:-1]] == [False] * (len(ep.transitions) - 1)
        if len(ep.transitions) == 2:                          # reached its last move
            assert last.option_rewards[last.action] == last.result.reward
