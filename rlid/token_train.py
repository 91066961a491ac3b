"""The token-level RL baseline (`TokenTrainer`): the same model writes each action as text, a parser
maps it to a menu option, and the policy gradient puts the advantage on every generated token.

Same structure, budget, log fields, checkpoints and resume as `rlid.train.DecisionTrainer`
(`rlid.train_loop.TrainerBase`), so the two compare at equal wall time. Each step: G rollouts per
seed in lockstep, actions sampled by `policy.act(states, greedy=False, generator)` under no_grad; an
action whose text does not parse (`TokenAction.index is None`) earns `config.invalid_penalty`, does
not move the environment and counts as a step (the log's `invalid_rate` = such steps / all steps);
then the generated tokens are re-scored with grad (`policy.sequence_log_probs`, one batched forward
per `rescore_batch`) for −mean(A · Σ_t log p(y_t)) (+ β · k3 KL to the model with the adapter off,
on the sampled text; `rlid.pg_loss.token_pg_loss`).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from runtime.errors import ConfigError
from rlid.lora import LoraAdapter
from rlid.pg_loss import token_pg_loss
from rlid.train_loop import DECISION_ONLY, TrainConfig, TrainerBase, lockstep
from rlid.types import DecisionState, Environment, Episode


class TokenTrainer(TrainerBase):
    """`policy`: a TokenPolicy-like object (`.act(states, greedy, generator) -> [TokenAction]`,
    `.sequence_log_probs(actions) -> [N]` with autograd, `.member`); `make_env()`: a fresh env."""

    kind = "token"

    def __init__(self, policy, make_env: Callable[[], Environment], config: TrainConfig,
                 adapter: LoraAdapter | None = None):
        if config.entropy_coef:
            raise ConfigError("entropy_coef is for the decision plane (an exact menu entropy); the token-level "
                              "trainer has none: set entropy_coef: 0")
        for name in DECISION_ONLY:
            if getattr(config, name):
                raise ConfigError(f"{name} is for the decision plane (it works on the labelled menu); the token-level "
                                  "trainer has none: set it under train.decision")
        super().__init__(policy.member, make_env, config, adapter)
        self.policy = policy

    def act(self, states: list[DecisionState]) -> list[tuple[int | None, Any]]:
        """Sample action texts; (parsed index or None if it names no legal action, the TokenAction)."""
        actions = self.policy.act(states, greedy=False, generator=self.generator)
        if len(actions) != len(states):
            raise RuntimeError(f"the token policy returned {len(actions)} actions for {len(states)} states")
        out = []
        for state, action in zip(states, actions):
            index = action.index if action.index is not None and 0 <= action.index < len(state.actions) else None
            out.append((index, action))
        return out

    def gold_payload(self, state: DecisionState, index: int):
        """The gold move as generated text: its prompt, then the action and a newline (`teacher_forced`)."""
        from rlid.distill import DistillExample, teacher_forced

        return teacher_forced(self.policy, DistillExample(state, state.actions[index]))

    def collect(self, run_seeds: list[int]) -> tuple[list[Episode], list[list[Any]]]:
        """Lockstep rollouts; invalid text → `invalid_penalty`, no move; payload = the TokenAction."""
        return lockstep(self.make_env, self.act, run_seeds, self.config.memory_k, self.config.invalid_penalty)

    def _rescore(self, part: list[tuple[Any, int, float]], n: int) -> tuple[dict[str, float], None]:
        """Loss of one chunk of generated actions (normalised by the step's `n`), backpropagated."""
        c = self.config
        actions = [a for a, _, _ in part]
        log_probs = self.policy.sequence_log_probs(actions)
        ref = None
        if c.beta:
            with torch.no_grad(), self.adapter.reference():
                ref = self.policy.sequence_log_probs(actions)
        advs = torch.tensor([a for _, _, a in part], dtype=log_probs.dtype)
        loss, stats = token_pg_loss(log_probs, advs, ref, c.beta, normaliser=n)
        loss.backward()
        return stats, None
