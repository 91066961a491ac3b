"""Distillation: supervised fine-tuning of a generating LLM on a trained decision model's action
trajectories (prompt → action text), so a normal generating model results; and the token-level
evaluation (plain generation + parsing) that measures it.

`collect_examples` rolls the decision model out greedily on train seeds and keeps, per executed
decision, the token policy's prompt for that state and the chosen action's text (optionally only
from solved episodes). `DistillTrainer` fits a LoRA adapter (peft) by teacher forcing: the loss is
−mean over examples of log p(action text + newline | prompt), the same sequence log-probability
the token-level RL baseline optimises (`TokenPolicy.sequence_log_probs`). `evaluate_token_policy`
rolls a token policy out on held-out seeds: unparsable text is an invalid action (no move, counted)."""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from rlid.evaluate import EvalResult
from rlid.lora import LoraAdapter
from rlid.token_policy import TokenAction, TokenPolicy
from rlid.train_loop import lockstep
from rlid.types import DecisionState, Environment, Policy


@dataclass(frozen=True)
class DistillExample:
    """One supervised pair: the state the teacher decided in and the action text it chose."""

    state: DecisionState
    action: str

    def to_json(self) -> dict:
        s = self.state
        return {"observation": s.observation, "actions": list(s.actions), "memory": s.memory,
                "instruction": s.instruction, "notes": list(s.notes), "action": self.action}

    @classmethod
    def from_json(cls, d: dict) -> "DistillExample":
        state = DecisionState(d["observation"], tuple(d["actions"]), d.get("memory", ""), d.get("instruction", ""),
                              tuple(d.get("notes", ())))
        return cls(state, d["action"])


def collect_examples(teacher: Policy, make_env: Callable[[], Environment], seeds: Sequence[int], *,
                     memory_k: int = 0, only_successful: bool = True) -> tuple[list[DistillExample], EvalResult]:
    """The teacher's greedy trajectories on `seeds` as (state, action text) pairs, and its rollout result."""
    from rlid.evaluate import evaluate_policy

    result = evaluate_policy(teacher, make_env, seeds, greedy=True, memory_k=memory_k)
    examples = [DistillExample(t.state, t.state.actions[t.action]) for ep in result.episodes
                if ep.success or not only_successful for t in ep.transitions]
    return examples, result


def write_examples(path: str | Path, examples: Sequence[DistillExample]) -> None:
    from runtime.files import write_text_atomic

    write_text_atomic(path, "".join(json.dumps(e.to_json()) + "\n" for e in examples))


def read_examples(path: str | Path) -> list[DistillExample]:
    return [DistillExample.from_json(json.loads(line)) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]


def teacher_forced(policy: TokenPolicy, example: DistillExample) -> TokenAction:
    """The example as a generated answer: prompt ids, then the action text and a newline (where the
    token policy stops), so `sequence_log_probs` scores exactly the tokens SFT fits."""
    tok = policy.member.tokenizer
    output = tok.encode(example.action + "\n", add_special_tokens=False)
    index = example.state.actions.index(example.action)
    return TokenAction(example.action, index, list(policy.prompt_ids(example.state)), list(output))


class DistillTrainer:
    """SFT of `policy.member` through `adapter` (LoRA) on the examples: `epochs` passes in a seeded
    shuffled order, AdamW, mini-batches of `batch_size`. `run()` returns per-epoch log records."""

    def __init__(self, policy: TokenPolicy, adapter: LoraAdapter, examples: Sequence[DistillExample], *,
                 epochs: int = 2, lr: float = 2e-4, batch_size: int = 8, seed: int = 0,
                 log: Callable[[dict], None] | None = None) -> None:
        if not examples:
            raise ValueError("no distillation examples: the teacher solved no training episode "
                             "(train it longer, or set distill.only_successful: false)")
        self.policy, self.adapter, self.examples = policy, adapter, list(examples)
        self.epochs, self.batch_size, self.seed, self.log = epochs, batch_size, seed, log
        self.optimizer = torch.optim.AdamW(adapter.parameters(), lr=lr)

    def run(self) -> list[dict]:
        records, start = [], time.perf_counter()
        model = self.policy.member.model
        model.train()
        for epoch in range(self.epochs):
            order = list(range(len(self.examples)))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            total, count = 0.0, 0
            for i in range(0, len(order), self.batch_size):
                batch = [teacher_forced(self.policy, self.examples[j]) for j in order[i:i + self.batch_size]]
                loss = -self.policy.sequence_log_probs(batch).mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                self.adapter.weights_changed()
                total, count = total + float(loss.detach()) * len(batch), count + len(batch)
            rec = {"epoch": epoch + 1, "nll": total / count, "examples": count, "wall_s": time.perf_counter() - start}
            records.append(rec)
            if self.log:
                self.log(rec)
        model.eval()
        return records


def evaluate_token_policy(policy: TokenPolicy, make_env: Callable[[], Environment], seeds: Sequence[int], *,
                          greedy: bool = True, memory_k: int = 0, seed: int = 0) -> EvalResult:
    """Plain generation + parsing on `seeds`; unparsable answers are invalid actions (no move)."""
    generator = torch.Generator().manual_seed(seed)
    decisions = 0

    def act(states: list[DecisionState]):
        nonlocal decisions
        decisions += len(states)
        acts = policy.act(states, greedy=greedy, generator=generator)
        return [(a.index, None) for a in acts]

    start = time.perf_counter()
    with torch.no_grad():
        episodes, _ = lockstep(make_env, act, list(seeds), memory_k)
    return EvalResult(episodes, time.perf_counter() - start, decisions, invalid=sum(e.invalid for e in episodes))


__all__ = ["DistillExample", "DistillTrainer", "collect_examples", "evaluate_token_policy", "read_examples",
           "teacher_forced", "write_examples"]
