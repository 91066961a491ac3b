"""RL in the decision plane: policy gradient on log π(option) with LoRA (`DecisionTrainer`).

Each step (`rollout_and_update`): this step's train seeds (`rlid.train_loop.step_seeds`), G =
`group_size` rollouts of each in lockstep (`rollout`, the contract's `run_episodes` signature;
default `rlid.rollout.run_episodes`), options sampled from π with the run's generator;
advantages (`rlid.train_loop.advantages_for`: GRPO group normalisation by default); the loss of
`rlid.pg_loss.decision_pg_loss` (+ β·KL(π ‖ π_ref), π_ref = the model with the adapter off), one
AdamW step on the LoRA parameters; budget, JSONL log, progress bar, checkpoints and resume come
from `rlid.train_loop.TrainerBase`.

Memory: the rollouts run under `no_grad` (they only choose actions); the loss is built afterwards
by re-scoring the recorded decision states in one batched forward with grad (`rescore_batch` caps
its size; chunks are backpropagated one by one and add up to the same gradient). For an on-policy
update this is the same gradient as keeping the rollout graphs: the weights do not change between
the rollout and the re-score, so the re-scored log π(a | s) is the same function of the same
weights (the log's `rescore_gap` is the largest |difference| seen, ~1e-6 from batching; with LoRA
dropout > 0 the re-score runs in train mode and also differs by the dropout noise). Decisions whose
advantage is 0 (a group with equal returns) add nothing to the policy-gradient term, so without KL
or entropy terms they are not re-scored; the loss still divides by all of the step's decisions.

`exact_last_move`: the rollout also records every option's reward at each episode's last move
(`rlid.rollout.run_episodes(last_move_rewards=True)`); those decisions are scored by the exact
expectation −Σ_a π(a) V(a), V = option reward / (std of the step's returns) — the mean of what the
sampled term estimates for that state (GRPO also divides by a std), with no sampling variance.
Last moves whose options all earn the same reward carry no signal and are skipped.
`exact_values`: the same at every decision, V = the options' Q* (`env.option_values()`: the
environment's solvability check as the critic; `rlid.run_episodes(option_values=True)`).
`immediate_rewards` λ: the rollout records every option's immediate reward at every decision
(`rlid.run_episodes(option_rewards=True)`); decisions whose options' rewards differ keep their sampled
term and add −λ Σ_a π(a) r(a) / (std of the step's returns) (`decision_pg_loss`'s auxiliary term).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import torch

from rlid.lora import LoraAdapter
from rlid.option_law import pick
from rlid.pg_loss import decision_pg_loss, pad_log_probs
from rlid.rollout import run_episodes
from rlid.train_loop import TrainConfig, TrainerBase
from rlid.types import DecisionState, Environment, Episode, Policy

Rollout = Callable[..., list[Episode]]  # (make_env_fn, policy_fn, seeds, memory_k) -> episodes


def _recorded(table: dict[int, tuple], state: DecisionState) -> tuple | None:
    """`table`'s record of this very state (keyed by id; the record's first item is the state), or None."""
    seen = table.get(id(state))
    return seen if seen is not None and seen[0] is state else None


class DecisionTrainer(TrainerBase):
    """`policy`: a DecisionModel-like `Policy` (`.laws(states)`, with autograd when grad is on) whose
    `.member.model` gets the LoRA adapter; `make_env()`: a fresh `Environment`."""

    kind = "decision"

    def __init__(self, policy: Policy, make_env: Callable[[], Environment], config: TrainConfig,
                 adapter: LoraAdapter | None = None, rollout: Rollout = run_episodes):
        super().__init__(policy.member, make_env, config, adapter)
        self.policy, self.rollout = policy, rollout
        self._acted: dict[int, tuple[DecisionState, list[float]]] = {}
        self._exact: dict[int, tuple[DecisionState, list[float]]] = {}
        self._aux: dict[int, tuple[DecisionState, list[float]]] = {}
        self._perm: dict[int, tuple[DecisionState, list[int], DecisionState]] = {}

    def choose(self, states: list[DecisionState]) -> list[int]:
        """The rollout's `policy_fn`: sample from π under no_grad, remembering log π of each state.
        With `shuffle_menus` each state is shown with its menu in a fresh random order (drawn from
        the run's generator) and the sampled position is mapped back to the environment's index."""
        shown = [self._shuffle(s) if self.config.shuffle_menus else s for s in states]
        with torch.no_grad():
            laws = self.policy.laws(shown)
        picked = pick(laws, greedy=False, generator=self.generator)
        chosen = []
        for state, law, j in zip(states, laws, picked):
            self._acted[id(state)] = (state, law.log_probs.detach().tolist())   # in the order shown
            perm = self._view(state)[1]
            chosen.append(perm[j] if perm is not None else j)
        return chosen

    def _shuffle(self, state: DecisionState) -> DecisionState:
        perm = torch.randperm(len(state.actions), generator=self.generator).tolist()
        view = dataclasses.replace(state, actions=tuple(state.actions[i] for i in perm),
                                   notes=tuple(state.notes[i] for i in perm) if state.notes else ())
        self._perm[id(state)] = (state, perm, view)
        return view

    def _view(self, state: DecisionState) -> tuple[DecisionState, list[int] | None]:
        """The state as the policy saw it and the permutation (shown position -> env index), or None."""
        seen = _recorded(self._perm, state)
        return (seen[2], seen[1]) if seen is not None else (state, None)

    def collect(self, run_seeds: list[int]) -> tuple[list[Episode], list[list[DecisionState]]]:
        """The rollouts (`self.rollout`, lockstep, options drawn by `choose`); payload = the state."""
        self._forget()
        c = self.config
        discount = {} if c.value_discount is None else {"value_discount": c.value_discount}
        rollout = (functools.partial(self.rollout, option_values=True, **discount) if c.exact_values else
                   functools.partial(self.rollout, last_move_rewards=True) if c.exact_last_move else
                   functools.partial(self.rollout, option_rewards=True) if c.immediate_rewards else self.rollout)
        episodes = rollout(self.make_env, self.choose, run_seeds, memory_k=c.memory_k)
        if c.exact_last_move or c.exact_values or c.immediate_rewards:
            into = self._aux if c.immediate_rewards else self._exact
            returns = torch.tensor([ep.total_reward for ep in episodes], dtype=torch.float64)
            std = float(returns.std()) if len(episodes) > 1 else 0.0
            scale = 1.0 / (std + 1e-6) if std > 0 else 1.0
            for ep in episodes:
                for t in ep.transitions:
                    if t.option_rewards is not None and max(t.option_rewards) > min(t.option_rewards):
                        into[id(t.state)] = (t.state, [r * scale for r in t.option_rewards])
        return episodes, [[t.state for t in ep.transitions] for ep in episodes]

    def imitate_gold(self, seeds: list[int]) -> dict:
        self._forget()
        return super().imitate_gold(seeds)

    def _forget(self) -> None:
        """Drop the last step's per-state records (log π at rollout, exact values, shown permutations)."""
        self._acted, self._exact, self._aux, self._perm = {}, {}, {}, {}

    def gold_payload(self, state: DecisionState, index: int) -> DecisionState:
        """The gold move's state (with `shuffle_menus`, registered in a fresh order, as a rollout's is)."""
        if self.config.shuffle_menus:
            self._shuffle(state)
        return state

    def scores_exactly(self, payload) -> bool:
        return any(_recorded(table, payload) is not None for table in (self._exact, self._aux))

    def _rows(self, table: dict, states: list[DecisionState], views, like: torch.Tensor):
        """(values [N, M] in the order shown, mask [N]) of the states recorded in `table`, or (None, None)."""
        if not table:
            return None, None
        records = [_recorded(table, s) for s in states]
        values = torch.zeros_like(like)
        for row, (seen, (_, perm)) in enumerate(zip(records, views)):
            if seen is not None:
                v = seen[1]                                       # in the environment's order
                v = [v[i] for i in perm] if perm is not None else v
                values[row, :len(v)] = torch.tensor(v, dtype=values.dtype)
        return values, torch.tensor([seen is not None for seen in records])

    def _rescore(self, part: list[tuple[DecisionState, int, float]], n: int) -> tuple[dict[str, float], float | None]:
        """Loss of one chunk of decisions (normalised by the step's `n`), backpropagated; its stats
        and the largest |log π(a) re-scored − log π(a) at rollout|."""
        c = self.config
        views = [self._view(s) for s, _, _ in part]            # (shown state, permutation or None)
        states = [s for s, _, _ in part]
        actions = torch.tensor([perm.index(a) if perm is not None else a for (_, perm), (_, a, _) in zip(views, part)])
        log_pi = pad_log_probs([law.log_probs for law in self.policy.laws([v for v, _ in views])])
        ref = None
        if c.beta:
            with torch.no_grad(), self.adapter.reference():
                ref = pad_log_probs([law.log_probs for law in self.policy.laws([v for v, _ in views])])
        advs = torch.tensor([a for _, _, a in part], dtype=log_pi.dtype)
        values, exact = self._rows(self._exact, states, views, log_pi.detach())
        aux_values, aux = self._rows(self._aux, states, views, log_pi.detach())
        loss, stats = decision_pg_loss(log_pi, actions, advs, ref, c.beta, c.entropy_coef, normaliser=n,
                                       option_values=values, exact=exact, aux_values=aux_values, aux=aux,
                                       aux_weight=c.immediate_rewards)
        if exact is not None:
            stats["exact"] = float(exact.float().mean())
        if aux is not None:
            stats["aux"] = float(aux.float().mean())
        loss.backward()
        gaps = [abs(float(row[action]) - seen[1][action]) for row, state, action in zip(log_pi.detach(), states, actions.tolist())
                if (seen := _recorded(self._acted, state)) is not None]
        return stats, max(gaps) if gaps else None
