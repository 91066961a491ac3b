"""rlid.evaluate.live_moves: how often a policy's move kept the puzzle solvable, against chance, by
replaying its episodes; checked against the option values recorded during the rollout itself."""
from __future__ import annotations

import pytest

from rlid.envs.arc_1d import Arc1DEnv
from rlid.envs.base import MenuEnvironment
from rlid.envs.countdown import CountdownEnv, CountdownOptions
from rlid.envs.sokoban import SokobanEnv, SokobanOptions
from rlid.evaluate import live_moves
from rlid.rollout import run_episode, run_episodes


@pytest.mark.parametrize("make", [lambda: CountdownEnv(CountdownOptions(reach_shaping=0.5, end_on_dead_end=True)),
                                  lambda: SokobanEnv(SokobanOptions(max_steps=10, end_on_deadlock=True))])
def test_replay_matches_the_option_values_seen_during_the_rollout(make):
    first = lambda states: [0] * len(states)  # noqa: E731
    episodes = run_episodes(make, first, range(12), option_values=True)
    seen = [(t.option_rewards, t.action) for ep in episodes for t in ep.transitions]
    stats = live_moves(make, episodes)
    assert stats["live_decisions"] == len(seen)
    assert stats["live_moves"] == pytest.approx(sum(v[a] == 1.0 for v, a in seen) / len(seen))
    assert stats["live_chance"] == pytest.approx(sum(sum(x == 1.0 for x in v) / len(v) for v, _ in seen) / len(seen))
    assert 0.0 < stats["live_chance"] < 1.0


def test_a_policy_that_keeps_every_move_live_solves_every_seed():
    make = lambda: CountdownEnv(CountdownOptions(end_on_dead_end=True))  # noqa: E731
    episodes = []
    for seed in range(10):
        env = make()  # the policy reads Q* off the very env being stepped
        episodes.append(run_episode(env, lambda states: [env.option_values().index(1.0)], seed))
    assert all(ep.success for ep in episodes)
    assert live_moves(make, episodes)["live_moves"] == 1.0


def test_invalid_token_steps_are_skipped_and_unsolvable_envs_give_none():
    from rlid.train_loop import lockstep

    make = lambda: CountdownEnv(CountdownOptions(max_numbers=3, reach_shaping=0.5))  # noqa: E731 (max_steps 2)
    (episode,), _ = lockstep(make, lambda states: [(None, None)], [0])   # unparsable text at every step
    assert episode.invalid == len(episode.transitions) > 0
    assert live_moves(make, [episode]) is None                          # nothing executed: nothing to count

    class NoCheck(CountdownEnv):                                        # several moves, no solvability check
        solvable = MenuEnvironment.solvable

    first = lambda states: [0] * len(states)  # noqa: E731
    assert live_moves(NoCheck, run_episodes(NoCheck, first, [0, 1])) is None
    arc = run_episodes(Arc1DEnv, first, range(6))                       # one move: Q* is the answer's reward
    stats = live_moves(Arc1DEnv, arc)
    assert stats["live_moves"] == pytest.approx(sum(ep.success for ep in arc) / 6)
    assert stats["live_chance"] == pytest.approx(sum(1 / len(ep.transitions[0].state.actions) for ep in arc) / 6)


def test_wins_taken_counts_the_decisions_where_a_winning_option_was_on_the_menu():
    env = CountdownEnv(CountdownOptions())
    env.reset_to([3, 4, 5], 12)
    assert [m for m, w in zip(env.menu(), env.option_wins()) if w] == ["3 * 4 = 12"]
    make = lambda: CountdownEnv(CountdownOptions(end_on_dead_end=True))  # noqa: E731
    probe = make()

    def take_a_win(states):       # the winning option when there is one, else the first (one env: seeds in turn)
        wins = probe.option_wins()
        return [wins.index(True) if any(wins) else 0]

    first = lambda states: [0] * len(states)  # noqa: E731
    episodes = []
    for seed in range(30):
        probe.reset(seed)
        episodes.append(run_episode(probe, take_a_win, seed))
    stats = live_moves(make, episodes)
    assert stats["win_decisions"] > 0 and stats["wins_taken"] == 1.0
    assert 0.0 < stats["win_chance"] < 1.0
    plain = run_episodes(make, first, range(30))
    seen = []                                                  # (wins, action) replayed by hand
    for ep in plain:
        env = make()
        env.reset(ep.seed)
        for t in ep.transitions:
            if any(env.option_wins()):
                seen.append((env.option_wins(), t.action))
            env.step(t.action)
    stats = live_moves(make, plain)
    assert stats["win_decisions"] == len(seen) > 0
    assert stats["wins_taken"] == pytest.approx(sum(w[a] for w, a in seen) / len(seen))
    assert stats["win_chance"] == pytest.approx(sum(sum(w) / len(w) for w, _ in seen) / len(seen))
