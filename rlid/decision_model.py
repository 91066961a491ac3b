"""`DecisionModel`: a causal LM used as a classifier over a labelled action menu.

`.laws(states)` compiles each state into a prompt (`rlid.prompt.decision_text`, the member's chat
template), runs ONE left-padded batched forward over all of them, and turns each state's logits at
its last position into π over its menu (`rlid.option_law`), marginalised over each label's
realisations (`rlid.menu.menu_realisations`, cached per menu). Autograd follows torch's grad mode:
under `torch.enable_grad()` log π carries gradients to the model's parameters (training), under
`torch.no_grad()` it does not (rollouts). `.choose(states, greedy, generator)` samples from π (or
takes its argmax). `.counters` (`rlid.batching.PolicyCounters`) count calls, forwards, decisions,
tokens and seconds, for decisions per second and forwards per decision.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch

from rlid.batching import PolicyCounters, forward, left_pad, pad_token_id
from rlid.menu import labels as make_labels
from rlid.menu import menu_realisations
from rlid.option_law import batched_option_log_probs, pick
from rlid.prompt import compile_prompt, decision_text
from rlid.types import DecisionState, OptionLaw
from runtime.member import Member, load_member

__all__ = ["DecisionModel"]

CACHE_SIZE = 4096  # realisation sets kept (menus differ per state only when action text is realised)


class DecisionModel:
    """π over a labelled menu from one forward per batch of states (see the module docstring).
    `label_style`: "letters" (A, B, ...) or "numbers" (1, 2, ...); `realise_action_text`: the first
    token of " " + the action's text also realises that option; `lower_case_labels`: "a", " a"
    realise label "A" too (where single tokens)."""

    def __init__(self, member: Member, label_style: str = "letters", realise_action_text: bool = False,
                 lower_case_labels: bool = True):
        self.member = member
        self.label_style = label_style
        self.realise_action_text = realise_action_text
        self.lower_case_labels = lower_case_labels
        self.counters = PolicyCounters()
        self._realisations: OrderedDict[tuple, list[list[int]]] = OrderedDict()
        make_labels(1, label_style)  # a bad style fails here, not on the first batch

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype: str = "float32", trainable: bool = False,
                        device: str = "cpu", **kwargs) -> "DecisionModel":
        """Load a registry name, folder or hub id (`runtime.member.load_member`). `trainable=True`
        keeps plain `nn.Linear` layers (`pack_weights=False`): packed oneDNN layers cannot be
        trained or wrapped by LoRA."""
        member = load_member(name_or_path, dtype=dtype, device=device, pack_weights=False if trainable else None)
        return cls(member, **kwargs)

    def __repr__(self) -> str:
        return (f"DecisionModel({self.member.name!r}, labels={self.label_style}, "
                f"realise_action_text={self.realise_action_text})")

    # ---- prompts and realisations ------------------------------------------------------------
    def labels(self, state: DecisionState) -> tuple[str, ...]:
        return make_labels(len(state.actions), self.label_style)

    def prompt(self, state: DecisionState) -> str:
        """The compiled prompt text the model reads (chat template included where the member uses one)."""
        return compile_prompt(self.member, decision_text(state, self.labels(state)))

    def prompt_ids(self, state: DecisionState) -> list[int]:
        return self.member.encode_prompt(decision_text(state, self.labels(state)))

    def realisations(self, state: DecisionState) -> list[list[int]]:
        """Disjoint token-id sets per option of this state's menu (cached per menu)."""
        labs = self.labels(state)
        key = (labs, tuple(state.actions)) if self.realise_action_text else (labs,)
        sets = self._realisations.get(key)
        if sets is None:
            sets = menu_realisations(self.member.tokenizer, labs, state.actions, self.realise_action_text,
                                     self.lower_case_labels)
            self._realisations[key] = sets
            if len(self._realisations) > CACHE_SIZE:
                self._realisations.popitem(last=False)
        else:
            self._realisations.move_to_end(key)
        return sets

    # ---- the law -----------------------------------------------------------------------------
    def last_logits(self, prompts_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Next-token logits [B, V] after each prompt, from one left-padded batched forward."""
        ids, mask, positions = left_pad(prompts_ids, pad_token_id(self.member.tokenizer), self.member.device)
        out = forward(self.member.model, ids, mask, positions, keep=1)
        self.counters.forwards += 1
        self.counters.tokens += int(mask.sum())
        self.member.counters.count(int(mask.sum()))
        return out.logits[:, -1]

    def laws(self, states: Sequence[DecisionState]) -> list[OptionLaw]:
        """π over each state's menu, one batched forward for all states; grad follows torch's mode."""
        if not states:
            return []
        for i, s in enumerate(states):
            if not s.actions:
                raise ValueError(f"state #{i + 1} has an empty menu; only states before `done` are decided")
        self.counters.start()
        logits = self.last_logits([self.prompt_ids(s) for s in states])
        log_probs = batched_option_log_probs(logits, [self.realisations(s) for s in states])
        out = [OptionLaw(log_probs[b, : len(s.actions)], self.labels(s)) for b, s in enumerate(states)]
        self.counters.stop(len(states))
        return out

    def choose(self, states: Sequence[DecisionState], greedy: bool = False,
               generator: torch.Generator | None = None) -> tuple[list[int], list[OptionLaw]]:
        """(chosen menu indices, laws): argmax of π when `greedy`, else a sample from π drawn with
        `generator` (torch's global generator when None)."""
        laws = self.laws(states)
        return pick(laws, greedy, generator), laws
