"""Why do the planes tie with compiled memory? Each evaluated TWC game replayed move by move in the game
(no model), every move classified by what the game gave it, for the text LDM and the token level of
experiments/rlid/rlid_twc1_gold_text_rllr.yaml on their 400 test games (20400-20799).

Reads runs/rlid_twc1_gold_text_rllr/{eval,eval_20600_n200}/{decision,token}.episodes.jsonl (run from the
repository root; one JVM, no model), or the episode files named on the command line (each its own line). Per policy: games solved; of the failed games, how many made a wrong
put (reward < 0: the object put where it does not belong), how many repeated the same wrong put (the same
object, the same place, again), how many wrote an invalid move (token level), how many ran out of moves
without a wrong put; and the rate of wrong puts among all puts. Where both planes fail alike, the plane
is not what limits success.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from rlid.config import load_rlid
from rlid.envs import make_env
from rlid.envs.twc import PUT_MOVE

RUN = Path("runs/rlid_twc1_gold_text_rllr")
FOLDERS = ("eval", "eval_20600_n200")


def replay(env, record: dict) -> dict:
    """Per-game facts from replaying its recorded moves (an off-menu move is an invalid one: the state stays)."""
    env.reset(record["seed"])
    wrong, puts, invalid = [], 0, 0
    for action in record["actions"]:
        menu = env.menu()
        if action not in menu:
            invalid += 1
            continue
        result = env.step(menu.index(action))
        if PUT_MOVE.match(action):
            puts += 1
            if result.reward < 0:
                wrong.append(action)
        if result.done:
            break
    return {"success": record["success"], "wrong": wrong, "puts": puts, "invalid": invalid,
            "repeated": any(n > 1 for n in Counter(wrong).values())}


def summary(env, name: str, paths: list[Path]) -> str:
    games = [replay(env, json.loads(line)) for path in paths for line in path.read_text().splitlines() if line.strip()]
    failed = [g for g in games if not g["success"]]
    puts, wrong = sum(g["puts"] for g in games), sum(len(g["wrong"]) for g in games)
    return (f"{name}: {len(games) - len(failed)} of {len(games)} solved; of {len(failed)} failed games: "
            f"{sum(bool(g['wrong']) for g in failed)} made a wrong put, {sum(g['repeated'] for g in failed)} "
            f"repeated one, {sum(g['invalid'] > 0 for g in failed)} wrote an invalid move, "
            f"{sum(not g['wrong'] and not g['invalid'] for g in failed)} neither (out of moves); "
            f"wrong puts {wrong} of {puts} puts ({100 * wrong / max(1, puts):.0f} %); "
            f"solved games with a wrong put: {sum(bool(g['wrong']) for g in games if g['success'])}")


def main() -> None:
    cfg = load_rlid("experiments/rlid/rlid_twc1_gold_text_rllr.yaml")
    env = make_env(cfg.env_name, **cfg.env_options)           # the games as that config played them
    if sys.argv[1:]:
        for arg in sys.argv[1:]:
            print(summary(env, arg, [Path(arg)]))
    else:
        for policy in ("decision", "token"):
            print(summary(env, policy, [RUN / folder / f"{policy}.episodes.jsonl" for folder in FOLDERS]))
    env.close()


if __name__ == "__main__":
    main()
