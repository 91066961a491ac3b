"""The token-level baseline policy: the model writes the action's text, a parser maps it to the menu.

`TokenPolicy(member, max_new_tokens)`: `.prompt(state)` lists the menu without labels and asks for
the move exactly as written (`rlid.prompt.action_text`); `.act(states, greedy, generator)` decodes
all states in one left-padded batch with a KV cache (argmax, or samples from the full softmax at
temperature 1 with `generator`) until each row writes EOS, a newline after some text, or
`max_new_tokens`; each row becomes a `TokenAction` (index None = invalid output).
`.sequence_log_probs(actions)`: Σ log p(output token | prompt, earlier output) per action, from one
batched forward over prompt + output, with autograd when grad is enabled (the token-level RL loss).
The terminating token (EOS or the one holding the newline) is part of `output_ids`: the policy chose
to stop there, so it carries the advantage like every other generated token.
`parse_action(text, actions)`: the menu index the text names, or None.
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Sequence

import torch

from runtime.sampling import on_generator
from rlid.batching import PolicyCounters, forward, left_pad, new_cache, pad_token_id
from rlid.prompt import action_text, compile_prompt
from rlid.types import DecisionState
from runtime.member import Member

__all__ = ["TokenAction", "TokenPolicy", "parse_action"]

_PUNCT = string.punctuation + "“”‘’«»"


@dataclass
class TokenAction:
    """One generated answer: `text` as written (EOS excluded, cut after its first line of text),
    `index` the parsed menu index (None: invalid), and the ids the log-probability is taken over."""

    text: str
    index: int | None
    prompt_ids: list[int]
    output_ids: list[int]

    def __repr__(self) -> str:
        return f"TokenAction(text={self.text!r}, index={self.index}, prompt={len(self.prompt_ids)}, out={len(self.output_ids)})"


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _norm(text: str, strip_punct: bool) -> str:
    text = " ".join(text.split()).casefold()
    return text.strip(_PUNCT + " ") if strip_punct else text


def parse_action(text: str, actions: Sequence[str], notes: bool = False) -> int | None:
    """The index of the one menu action `text` names: the first non-empty line, stripped, equal to an
    action; else equal up to case and runs of whitespace; else also up to surrounding punctuation
    (quotes, a bullet, a final period); with `notes` (the menu showed a note after each action,
    `rlid.prompt`) also the line cut before its first " (" (an action copied with its note), by the
    same rules. None if no action, or more than one, matches."""
    line = _first_line(text)
    if not line:
        return None
    tiers = (lambda s: s.strip(), lambda s: _norm(s, False), lambda s: _norm(s, True))
    for candidate in dict.fromkeys((line, line.split(" (")[0].strip() if notes else line)):
        for key in tiers:
            want = key(candidate)
            hits = [i for i, a in enumerate(actions) if key(a) and key(a) == want]
            if len(hits) == 1:
                return hits[0]
            if len(hits) > 1:
                return None
    return None


class TokenPolicy:
    """Generate-and-parse policy over the same states as `rlid.decision_model.DecisionModel`."""

    def __init__(self, member: Member, max_new_tokens: int = 16):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.member = member
        self.max_new_tokens = max_new_tokens
        self.counters = PolicyCounters()

    def __repr__(self) -> str:
        return f"TokenPolicy({self.member.name!r}, max_new_tokens={self.max_new_tokens})"

    def prompt(self, state: DecisionState) -> str:
        """The compiled prompt text (chat template included where the member uses one)."""
        return compile_prompt(self.member, action_text(state))

    def prompt_ids(self, state: DecisionState) -> list[int]:
        return self.member.encode_prompt(action_text(state))

    def _finished(self, ids: list[int]) -> bool:
        if ids[-1] in self.member.eos_token_ids or len(ids) >= self.max_new_tokens:
            return True
        return "\n" in self.member.decode(ids).lstrip()

    def _text(self, ids: list[int]) -> str:
        if ids and ids[-1] in self.member.eos_token_ids:
            ids = ids[:-1]
        text = self.member.decode(ids)
        start = len(text) - len(text.lstrip())
        cut = text.find("\n", start)
        return text if cut < 0 else text[:cut]

    def _pick(self, logits: torch.Tensor, greedy: bool, generator: torch.Generator | None) -> list[int]:
        logits = logits.float()
        if greedy:
            return logits.argmax(-1).tolist()
        probs = torch.softmax(logits, -1).cpu()
        return torch.multinomial(on_generator(probs, generator), 1, generator=generator).squeeze(-1).tolist()

    @torch.no_grad()
    def generate_ids(self, prompts_ids: Sequence[Sequence[int]], greedy: bool,
                     generator: torch.Generator | None = None) -> list[list[int]]:
        """New token ids per prompt from one left-padded batched decode with a KV cache."""
        model, device = self.member.model, self.member.device
        pad = pad_token_id(self.member.tokenizer)
        ids, mask, positions = left_pad(prompts_ids, pad, device)
        cache = new_cache(model)
        out = forward(model, ids, mask, positions, keep=1, cache=cache)
        self._count(int(mask.sum()))
        new: list[list[int]] = [[] for _ in prompts_ids]
        done = [False] * len(prompts_ids)
        while True:
            for b, tok in enumerate(self._pick(out.logits[:, -1], greedy, generator)):
                if not done[b]:
                    new[b].append(tok)
                    done[b] = self._finished(new[b])
            if all(done):
                return new
            feed = torch.tensor([[pad if done[b] else new[b][-1]] for b in range(len(new))], device=device)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
            out = forward(model, feed, mask, positions, keep=1, cache=cache)
            self._count(done.count(False))

    def _count(self, tokens: int) -> None:
        self.counters.forwards += 1
        self.counters.tokens += tokens
        self.member.counters.count(tokens)

    def act(self, states: Sequence[DecisionState], greedy: bool = False,
            generator: torch.Generator | None = None) -> list[TokenAction]:
        """Generate an answer per state (one batch) and parse it against that state's menu."""
        if not states:
            return []
        self.counters.start()
        prompts = [self.prompt_ids(s) for s in states]
        outputs = self.generate_ids(prompts, greedy, generator)
        acts = []
        for s, p, o in zip(states, prompts, outputs):
            text = self._text(o)
            index = parse_action(text, s.actions, notes=bool(s.notes))
            acts.append(TokenAction(text=text, index=index, prompt_ids=p, output_ids=o))
        self.counters.stop(len(states))
        return acts

    def sequence_log_probs(self, actions: Sequence[TokenAction]) -> torch.Tensor:
        """[B] float32: Σ_t log p(output_ids[t] | prompt_ids, output_ids[:t]) per action, one batched
        forward over prompt + output (left-padded), with autograd when grad is enabled."""
        lengths = [len(a.output_ids) for a in actions]
        keep = max(lengths) + 1
        ids, mask, positions = left_pad([a.prompt_ids + a.output_ids for a in actions],
                                        pad_token_id(self.member.tokenizer), self.member.device)
        logits = forward(self.member.model, ids, mask, positions, keep=keep).logits  # [B, keep, V]
        self._count(int(mask.sum()))
        logp = torch.log_softmax(logits.float(), dim=-1)
        # row b's output tokens are its last L_b positions; the logits predicting them sit one earlier
        target = torch.zeros(len(actions), keep, dtype=torch.long, device=logp.device)
        valid = torch.zeros(len(actions), keep, dtype=torch.bool, device=logp.device)
        for b, a in enumerate(actions):
            if lengths[b]:
                target[b, keep - 1 - lengths[b]: keep - 1] = torch.tensor(a.output_ids, device=logp.device)
                valid[b, keep - 1 - lengths[b]: keep - 1] = True
        picked = logp.gather(-1, target[..., None]).squeeze(-1)
        return torch.where(valid, picked, torch.zeros_like(picked)).sum(-1)
