"""How much Sokoban's move facts (`describe_moves`) carry, and how closely a policy follows them.

    PYTHONPATH=. python benchmarks/rlid_sokoban_facts.py --seeds 7000 7100
    PYTHONPATH=. python benchmarks/rlid_sokoban_facts.py --episodes runs/rlid_sokoban_qwen_menu_notes/eval/*.episodes.jsonl

A hand rule that reads only the stated facts ranks each legal move: onto a goal (5) > a push that
brings the box closer to a free goal (2) > a step that brings you closer to a box off a goal (1) >
other steps (0) > a push away (-1) > a box stuck for good (-5); ties at random. Without
`--episodes` it plays the rule and random legal moves on the seeds' boards (the eval env options of
the ninth-try configs) and prints their successes. With `--episodes` (JSONL from `adafuse rlid eval`)
it replays each episode and prints the share of moves that are among the rule's best, beside the
share a uniformly random legal move would have (chance)."""
from __future__ import annotations

import argparse
import json
import random

from rlid.envs.sokoban import Board, SokobanEnv, SokobanOptions, move_facts

OPTIONS = SokobanOptions(max_steps=10, end_on_deadlock=True, reach_shaping=0.5)


def fact_score(board: Board, direction: str) -> int:
    """The hand rule's rank of a legal move, from the facts `describe_move` states (`move_facts`)."""
    f = move_facts(board, direction)
    if not f.pushed:
        return 1 if f.after is not None and f.after < f.before else 0
    if f.on_goal:
        return 5
    if f.stuck:
        return -5
    return 2 if f.after < f.before else -1


def play(seeds: range, rule: bool, rng: random.Random) -> int:
    env, wins = SokobanEnv(OPTIONS), 0
    for seed in seeds:
        env.reset(seed)
        while not env.done:
            menu = env.menu()
            if rule:
                scores = [fact_score(env.board, d) + 0.1 * rng.random() for d in menu]
                env.step(max(range(len(menu)), key=scores.__getitem__))
            else:
                env.step(rng.randrange(len(menu)))
        wins += env.success
    return wins


def agreement(path: str) -> tuple[int, int, float]:
    """(moves among the rule's best, moves, expected count for uniformly random legal moves)."""
    env, agree, total, chance = SokobanEnv(OPTIONS), 0, 0, 0.0
    with open(path, encoding="utf-8") as f:
        for line in f:
            episode = json.loads(line)
            env.reset(episode["seed"])
            for action in episode["actions"]:
                menu = env.menu()
                scores = [fact_score(env.board, d) for d in menu]
                best = max(scores)
                agree += scores[menu.index(action)] == best
                chance += scores.count(best) / len(scores)
                total += 1
                env.step(menu.index(action))
    return agree, total, chance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs=2, default=[7000, 7100], help="board seeds [start, stop)")
    parser.add_argument("--episodes", nargs="*", default=None, help="episode JSONL files to replay")
    args = parser.parse_args()
    if args.episodes:
        for path in args.episodes:
            agree, total, chance = agreement(path)
            print(f"{path}: {agree}/{total} moves among the rule's best = {100 * agree / total:.1f} % "
                  f"(chance {100 * chance / total:.1f} %)")
        return
    seeds = range(*args.seeds)
    for name, rule in (("fact rule", True), ("random legal moves", False)):
        print(f"{name}: {play(seeds, rule, random.Random(0))} / {len(seeds)} boards solved")


if __name__ == "__main__":
    main()
