"""`DecisionModel`: a causal LM used as a classifier over a labelled action menu.

`.laws(states)` compiles each state into a prompt (`rlid.prompt.decision_text`, the member's chat
template), runs ONE left-padded batched forward over all of them, and turns each state's logits at
its last position into π over its menu (`rlid.option_law`), marginalised over each label's
realisations (`rlid.menu.menu_realisations`, cached per menu). Autograd follows torch's grad mode:
under `torch.enable_grad()` log π carries gradients to the model's parameters (training), under
`torch.no_grad()` it does not (rollouts). `.choose(states, greedy, generator)` samples from π (or
takes its argmax). `.counters` (`rlid.batching.PolicyCounters`) count calls, forwards, decisions,
tokens and seconds, for decisions per second and forwards per decision.

`answer="text"`: the prompt lists the menu without labels (the token-level policy's prompt) and π(a)
is the probability of a's own text then a stop, normalised over the menu (`rlid.text_law`): the
prompt's forward, then one tree-attention forward over the trie of every option's text on its cache.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

import torch
from transformers import DynamicCache

from rlid.batching import PolicyCounters, forward, left_pad, pad_token_id
from rlid.menu import labels as make_labels
from rlid.menu import menu_realisations
from rlid.option_law import batched_option_log_probs, pick
from rlid.prompt import action_text, compile_prompt, decision_text
from rlid.text_law import stop_token_ids, text_forest, text_option_log_probs, text_realisations
from rlid.types import DecisionState, OptionLaw
from runtime.hf_compat import cache_kwargs
from runtime.member import Member, load_member
from runtime.tree_mask import tree_inputs

__all__ = ["DecisionModel", "ANSWERS"]

ANSWERS = ("label", "text")  # what the model's answer is: the option's label, or the action's own text

CACHE_SIZE = 4096  # realisation sets / text tries kept (menus differ per state only when action text is realised)


class DecisionModel:
    """π over a labelled menu from one forward per batch of states (see the module docstring).
    `label_style`: "letters" (A, B, ...) or "numbers" (1, 2, ...); `realise_action_text`: the first
    token of " " + the action's text also realises that option; `lower_case_labels`: "a", " a"
    realise label "A" too (where single tokens); `answer`: "label" (the labelled menu, the label's
    realisations) or "text" (the unlabelled menu, the action's own text; see the module docstring)."""

    def __init__(self, member: Member, label_style: str = "letters", realise_action_text: bool = False,
                 lower_case_labels: bool = True, answer: str = "label"):
        if answer not in ANSWERS:
            raise ValueError(f"unknown answer '{answer}'; use one of: {', '.join(ANSWERS)}")
        if answer == "text" and realise_action_text:
            raise ValueError("realise_action_text is for answer: label (answer: text realises the whole text)")
        self.member = member
        self.answer = answer
        self.label_style = label_style
        self.realise_action_text = realise_action_text
        self.lower_case_labels = lower_case_labels
        self.counters = PolicyCounters()
        self._stop_ids: list[int] | None = None
        self._realisations: OrderedDict[tuple, Any] = OrderedDict()   # realisation sets, or text tries
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
                f"realise_action_text={self.realise_action_text}, answer={self.answer})")

    # ---- prompts and realisations ------------------------------------------------------------
    def labels(self, state: DecisionState) -> tuple[str, ...]:
        return make_labels(len(state.actions), self.label_style)

    def prompt(self, state: DecisionState) -> str:
        """The compiled prompt text the model reads (chat template included where the member uses one)."""
        return compile_prompt(self.member, self._text(state))

    def prompt_ids(self, state: DecisionState) -> list[int]:
        return self.member.encode_prompt(self._text(state))

    def _text(self, state: DecisionState) -> str:
        return action_text(state) if self.answer == "text" else decision_text(state, self.labels(state))

    def realisations(self, state: DecisionState) -> list[list[int]]:
        """Disjoint token-id sets per option of this state's menu (cached per menu)."""
        labs = self.labels(state)
        key = (labs, tuple(state.actions)) if self.realise_action_text else (labs,)
        return self._cached(key, lambda: menu_realisations(self.member.tokenizer, labs, state.actions,
                                                           self.realise_action_text, self.lower_case_labels))

    def forest(self, state: DecisionState):
        """The trie of this menu's text realisations (`rlid.text_law.text_forest`, cached per menu)."""
        return self._cached(("text",) + tuple(state.actions),
                            lambda: text_forest(text_realisations(self.member.tokenizer, state.actions)))

    def _cached(self, key: tuple, build):
        sets = self._realisations.get(key)
        if sets is None:
            sets = build()
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
        if self.answer == "text":
            out = [OptionLaw(lp, self.labels(s)) for lp, s in zip(self._text_laws(states), states)]
        else:
            logits = self.last_logits([self.prompt_ids(s) for s in states])
            log_probs = batched_option_log_probs(logits, [self.realisations(s) for s in states])
            out = [OptionLaw(log_probs[b, : len(s.actions)], self.labels(s)) for b, s in enumerate(states)]
        self.counters.stop(len(states))
        return out

    def _text_laws(self, states: Sequence[DecisionState]) -> list[torch.Tensor]:
        """log π per state for `answer="text"`: the prompts' forward into a cache, then one forward of
        every state's realisation trie under tree attention on it."""
        m = self.member
        prompts = [self.prompt_ids(s) for s in states]
        forests = [self.forest(s) for s in states]
        ids, mask, positions = left_pad(prompts, pad_token_id(m.tokenizer), m.device)
        cache = DynamicCache()   # full layers (no sliding crop): the forest's masks carry the window
        first = forward(m.model, ids, mask, positions, keep=1, cache=cache).logits[:, -1]
        past_pos = torch.where(mask.bool(), positions, torch.full_like(positions, -1)).cpu()
        x = tree_inputs([f.tokens for f in forests], [f.parents for f in forests], past_pos,
                        [len(p) for p in prompts], sliding_window=m.sliding_window if m.has_sliding else None)
        nodes = m.model(input_ids=x.tokens.to(m.device), attention_mask=x.attention_mask(m.dtype, m.device),
                        position_ids=x.position_ids.to(m.device), use_cache=True,
                        **cache_kwargs(m.model, cache)).logits
        fed = int(mask.sum()) + int(x.valid.sum())
        self.counters.forwards += 2
        self.counters.tokens += fed
        m.counters.count(fed)
        stops = self._stops()
        return [text_option_log_probs(first[b], nodes[b], f, len(s.actions), stops)
                for b, (f, s) in enumerate(zip(forests, states))]

    def _stops(self) -> list[int]:
        if self._stop_ids is None:
            self._stop_ids = stop_token_ids(self.member.tokenizer, self.member.eos_token_ids)
        return self._stop_ids

    def choose(self, states: Sequence[DecisionState], greedy: bool = False,
               generator: torch.Generator | None = None) -> tuple[list[int], list[OptionLaw]]:
        """(chosen menu indices, laws): argmax of π when `greedy`, else a sample from π drawn with
        `generator` (torch's global generator when None)."""
        laws = self.laws(states)
        return pick(laws, greedy, generator), laws
