"""Rollouts in the decision plane: a policy picks menu indices, environments execute them.

`run_episodes` steps many episodes in lockstep: each call of `policy_fn` is ONE batch over the
decision states of every episode still running, so a batched decision model does one forward per
round. Only menu entries are ever executed, so `Episode.invalid` stays 0; a policy that returns a
wrong number of indices, or an index outside a state's menu, is a bug and raises ValueError.
With `last_move_rewards`, each transition that was its episode's last move (an environment with
`last_move_rewards()`, one move left) also records every option's reward (`Transition.option_rewards`);
with `option_values`, every transition records every option's Q* (`env.option_values()`) there; with
`option_rewards`, every option's immediate reward (`env.option_rewards()`)."""
from __future__ import annotations

import functools
import operator
from typing import Callable, Iterable, Sequence

from rlid.types import DecisionState, Environment, Episode, Transition

PolicyFn = Callable[[list[DecisionState]], Sequence[int]]


def decision_state(env: Environment, memory_k: int = 0) -> DecisionState:
    """What the policy reads at `env`'s current state: observation, legal menu, memory, instruction."""
    actions = tuple(env.menu())
    if not actions:
        raise RuntimeError(f"{env.name}: empty menu before the episode ended (environment bug)")
    notes = getattr(env, "menu_notes", lambda: [])()
    return DecisionState(observation=env.observation(), actions=actions, memory=env.memory(memory_k),
                         instruction=getattr(env, "instruction", ""), notes=tuple(notes))


def checked_choices(choices: Sequence[int], states: Sequence[DecisionState]) -> list[int]:
    """`choices` as ints, one valid menu index per state; ValueError otherwise."""
    choices = list(choices)
    if len(choices) != len(states):
        raise ValueError(f"policy_fn returned {len(choices)} indices for {len(states)} states")
    out = []
    for n, (choice, state) in enumerate(zip(choices, states)):
        try:
            i = operator.index(choice)
        except TypeError:
            raise ValueError(f"policy_fn returned {choice!r} for state {n}; menu indices are ints") from None
        if not 0 <= i < len(state.actions):
            raise ValueError(f"policy_fn returned index {i} for state {n}, whose menu has {len(state.actions)} actions")
        out.append(i)
    return out


def _lockstep(envs: Sequence[Environment], policy_fn: PolicyFn, seeds: Sequence[int], memory_k: int,
              last_move_rewards: bool = False, option_values: bool = False,
              value_discount: float = 1.0, option_rewards: bool = False) -> list[Episode]:
    if last_move_rewards + option_values + option_rewards > 1:
        raise ValueError("ask for one of last_move_rewards, option_values, option_rewards (each fills option_rewards)")
    peek_name = ("option_values" if option_values else "last_move_rewards" if last_move_rewards else
                 "option_rewards" if option_rewards else None)
    episodes = [Episode(env=env.name, seed=seed) for env, seed in zip(envs, seeds)]
    for env, seed in zip(envs, seeds):
        env.reset(seed)
    live = list(range(len(envs)))
    while live:
        states = [decision_state(envs[i], memory_k) for i in live]
        choices = checked_choices(policy_fn(states), states)
        still = []
        for i, state, choice in zip(live, states, choices):
            peek = getattr(envs[i], peek_name, None) if peek_name else None
            if peek is not None and option_values and value_discount != 1.0:
                peek = functools.partial(peek, discount=value_discount)
            options = peek() if peek is not None else None
            result = envs[i].step(choice)
            episodes[i].transitions.append(Transition(state=state, action=choice, result=result, option_rewards=options))
            if result.done:
                episodes[i].success = result.success
            elif len(episodes[i].transitions) < envs[i].max_steps:
                still.append(i)               # an env that does not end itself is cut at max_steps (unsolved)
        live = still
    return episodes


def run_episode(env: Environment, policy_fn: PolicyFn, seed: int, memory_k: int = 0) -> Episode:
    """One episode of `env` from `reset(seed)`, `policy_fn` called with one state at a time."""
    return _lockstep([env], policy_fn, [seed], memory_k)[0]


def run_episodes(make_env_fn: Callable[[], Environment], policy_fn: PolicyFn, seeds: Iterable[int],
                 memory_k: int = 0, last_move_rewards: bool = False, option_values: bool = False,
                 value_discount: float = 1.0, option_rewards: bool = False) -> list[Episode]:
    """One episode per seed (in `seeds` order), each in its own `make_env_fn()` environment, stepped
    in lockstep: every `policy_fn` call is one batch over all episodes still running. `option_values`
    records `env.option_values(discount=value_discount)` at every decision, `option_rewards` records
    `env.option_rewards()` (each option's immediate reward)."""
    seeds = list(seeds)
    envs = [make_env_fn() for _ in seeds]
    return _lockstep(envs, policy_fn, seeds, memory_k, last_move_rewards, option_values, value_discount, option_rewards)
