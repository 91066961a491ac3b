"""Gold paths as supervision: the (state, gold option) pairs met along an environment's gold path.

`gold_moves(make_env, seeds, memory_k)` resets one environment to each seed and follows
`env.gold_actions()` (TextWorldExpress games: the game's own solution), recording before each move the
state the policy would read (`rlid.rollout.decision_state`) and the gold action's index in its menu.
A path stops early where its next action is not on the menu or the episode ends. Used by the trainers'
`gold_steps` (`rlid.train_loop.TrainerBase.imitate_gold`)."""
from __future__ import annotations

from typing import Callable, Sequence

from runtime.errors import ConfigError
from rlid.rollout import decision_state
from rlid.types import DecisionState, Environment


def gold_moves(make_env: Callable[[], Environment], seeds: Sequence[int],
               memory_k: int = 0) -> list[tuple[DecisionState, int]]:
    """Every (state, index of the gold action in its menu) along the gold paths of `seeds`, in order."""
    env = make_env()
    if not hasattr(env, "gold_actions"):
        raise ConfigError(f"gold_steps needs an environment with gold paths (twc, cooking); {env.name} has none: "
                          "set gold_steps: 0")
    moves: list[tuple[DecisionState, int]] = []
    try:
        for seed in seeds:
            env.reset(seed)
            for action in env.gold_actions():
                menu = env.menu()
                if action not in menu:
                    break
                moves.append((decision_state(env, memory_k), menu.index(action)))
                if env.step(menu.index(action)).done:
                    break
    finally:
        getattr(env, "close", lambda: None)()
    return moves


__all__ = ["gold_moves"]
