"""Menu sizes, episode lengths and solvability of the default RLiD environments over many seeds.

    PYTHONPATH=. python benchmarks/rlid_env_stats.py --seeds 200

Per environment: how many decisions a uniformly random policy makes and how often it succeeds, the
menu sizes it meets, the fraction of start states solvable, the fewest moves a solution needs, how
many generator draws were skipped (start already solved / unsolvable), and the time per reset."""
from __future__ import annotations

import argparse
import random
import statistics
import time

from rlid.envs import ENVIRONMENTS, make_env
from rlid.envs.countdown import reachable
from rlid.rollout import run_episodes


def fewest_moves(env) -> int | None:
    """Shortest solution from the start state (Countdown: exact search; Sokoban: BFS; ARC: 1)."""
    if env.name == "sokoban":
        return env.solution_length()
    if env.name == "countdown":
        for depth in range(1, env.max_steps + 1):
            if reachable(env.numbers, env.target, depth, env.operators):
                return depth
        return None
    return 1


def skipped_draws(env, seed: int) -> int:
    """How many generator draws `reset(seed)` passed over before the puzzle it kept."""
    for attempt in range(1000):
        if env.name == "countdown" and env.puzzle(seed, attempt) == (env.numbers, env.target):
            return attempt
        if env.name == "sokoban" and env.puzzle(seed, attempt) == env.board:
            return attempt
        if env.name == "arc_1d":
            return 0
    return -1


def describe(xs: list[float]) -> str:
    return f"mean {statistics.mean(xs):.2f}, median {statistics.median(xs):g}, min {min(xs)}, max {max(xs)}"


def stats(name: str, seeds: list[int]) -> None:
    env = make_env(name)
    start = time.perf_counter()
    solvable, fewest, skipped, first_menu = [], [], [], []
    for seed in seeds:
        env.reset(seed)
        solvable.append(env.solvable())
        fewest.append(fewest_moves(env))
        skipped.append(skipped_draws(env, seed))
        first_menu.append(len(env.menu()))
    per_reset = (time.perf_counter() - start) / len(seeds)
    rng = random.Random(0)
    episodes = run_episodes(lambda: make_env(name), lambda states: [rng.randrange(len(s.actions)) for s in states], seeds)
    menus = [len(t.state.actions) for e in episodes for t in e.transitions]
    lengths = [len(e.transitions) for e in episodes]
    print(f"## {name} (defaults, seeds {seeds[0]}..{seeds[-1]}, max_steps {env.max_steps})")
    print(f"- start states solvable: {sum(solvable)}/{len(seeds)}; generator draws skipped: {sum(skipped)} "
          f"(seeds with any: {sum(s > 0 for s in skipped)})")
    print(f"- fewest moves to solve: {describe([f for f in fewest if f is not None])}")
    print(f"- menu size at the start: {describe(first_menu)}; over a random policy's decisions: {describe(menus)}")
    print(f"- random policy: success {sum(e.success for e in episodes)}/{len(seeds)}, episode length {describe(lengths)}")
    print(f"- time per reset (+ solvable + stats): {per_reset * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--env", choices=ENVIRONMENTS, action="append")
    args = parser.parse_args()
    for name in args.env or ENVIRONMENTS:
        stats(name, list(range(args.first, args.first + args.seeds)))


if __name__ == "__main__":
    main()
