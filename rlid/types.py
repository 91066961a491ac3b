"""What flows between RLiD's stages: environment states and steps, decision states, option laws,
rollout records. Environments (`rlid.envs`), the decision model, the trainers and the evaluator
all speak these types, so each can be tested with fakes of the others."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch


@dataclass(frozen=True)
class StepResult:
    """The outcome of executing one legal action: its reward, whether the episode ended, and
    whether it ended solved (`success`)."""

    reward: float
    done: bool
    success: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Environment(Protocol):
    """An offline, seeded, text environment with a finite legal menu at every state.

    `reset(seed)` starts the episode of that seed (same seed, same episode); `observation()` is the
    state as text; `menu()` the legal actions as short texts (never empty before `done`);
    `step(i)` executes `menu()[i]`; `memory(k)` a compact memory the environment compiles (e.g. the
    last k moves), "" if k == 0; `solvable()` whether the current state can still be solved."""

    name: str
    max_steps: int

    def reset(self, seed: int) -> None: ...
    def observation(self) -> str: ...
    def menu(self) -> list[str]: ...
    def menu_notes(self) -> list[str]: ...
    def step(self, index: int) -> StepResult: ...
    def memory(self, k: int) -> str: ...
    def solvable(self) -> bool: ...


@dataclass(frozen=True)
class DecisionState:
    """One decision to make: what the model reads (observation, optional memory, task instruction)
    and the legal menu of action texts. Labels are attached by the decision model. `notes`: empty,
    or one note per action that both prompts show beside it (e.g. what the move does); it is not
    part of the action's text."""

    observation: str
    actions: tuple[str, ...]
    memory: str = ""
    instruction: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.notes and len(self.notes) != len(self.actions):
            raise ValueError(f"{len(self.notes)} notes for a menu of {len(self.actions)} actions")


@dataclass
class OptionLaw:
    """π over one state's menu: `log_probs[i]` = log π(actions[i]); sums (in prob) to 1 over the menu.
    `labels[i]` is the label the prompt gave action i; `margin` = top-1 − top-2 probability."""

    log_probs: torch.Tensor
    labels: tuple[str, ...]

    @property
    def probs(self) -> torch.Tensor:
        return self.log_probs.exp()

    @property
    def margin(self) -> float:
        p = self.probs.detach()
        if p.numel() < 2:
            return 1.0
        top = torch.topk(p, 2).values
        return float(top[0] - top[1])


class Policy(Protocol):
    """Anything that maps a batch of decision states to option laws in one batched forward
    (`rlid.decision_model.DecisionModel`, `rlid.ensemble.DecisionEnsemble`)."""

    def laws(self, states: Sequence[DecisionState]) -> list[OptionLaw]: ...


@dataclass
class Transition:
    """One executed decision in a rollout: the state, the chosen menu index, and its result;
    `option_rewards`: every option's reward (or Q*) where the rollout asked for them."""

    state: DecisionState
    action: int
    result: StepResult
    option_rewards: list[float] | None = None


@dataclass
class Episode:
    """One rollout from `reset(seed)`: transitions in order; `success` if it ended solved;
    `invalid` counts actions that could not be executed (always 0 in the decision plane)."""

    env: str
    seed: int
    transitions: list[Transition] = field(default_factory=list)
    success: bool = False
    invalid: int = 0

    @property
    def total_reward(self) -> float:
        return sum(t.result.reward for t in self.transitions)
