"""Test helpers: a model-free generator and a tiny benchmark data folder.

`register_fake()` adds method `fake` to `eval.methods.METHODS`. The fake answers from a lookup of
question -> answer text (by default the gold answer, so scores are predictable), costs one forward
pass per new "token" (word), and can sleep or raise after a number of calls to simulate a kill.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from runtime.outputs import Cost, GenerationOutput
from eval import methods


class FakeGenerator:
    """Answers each prompt with `answer_fn(prompt)`; truncates at the first stop string."""

    def __init__(self, members: list[str], *, mode: str = "gold", delay: float = 0.0, fail_after: int | None = None,
                 exc: type[BaseException] = KeyboardInterrupt) -> None:
        self.members, self.mode, self.delay, self.fail_after, self.exc = members, mode, delay, fail_after, exc
        self.calls = 0
        self.prompts: list[str] = []

    def answer(self, prompt: str) -> str:
        last = prompt.rsplit("\n\n", 1)[-1]
        if self.mode == "echo":
            return last
        if "Question:" in last:  # gsm8k: the fake data's gold is twice the number in the question
            n = int("".join(ch for ch in last.split("Question:")[1] if ch.isdigit()) or 0)
            return f"{n} doubled is {2 * n}. The answer is {2 * n}.\n\nQuestion: next"
        if last.startswith("Q:"):
            return " " + last.split("Q:")[1].split("?")[0].strip().upper() + "\nQ: more"
        src = last.split(":", 1)[1].split("\n")[0].strip()
        return " " + src + "\n"

    def generate(self, prompts: list[str], *, max_new_tokens: int, stop: list[str], temperature: float = 0.0,
                 seed: int | None = None) -> list[GenerationOutput]:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise self.exc()
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        outs = []
        for p in prompts:
            self.prompts.append(p)
            text, reason = self.answer(p), "eos"
            for s in stop:
                if s in text:
                    text, reason = text[: text.index(s)], "stop"
            words = text.split()[:max_new_tokens]
            cost = Cost()
            for m in self.members:
                cost.add(m, len(words) + 1, len(p.split()) + len(words))
            outs.append(GenerationOutput(text=text, num_tokens=len(words), finish_reason=reason, cost=cost))
        return outs


LAST: dict[str, FakeGenerator] = {}


def register_fake(name: str = "fake") -> None:
    """Register method `name` building a `FakeGenerator` (options pass to its constructor)."""

    def build(members: list[str], **options: Any) -> FakeGenerator:
        gen = FakeGenerator(members, **options)
        LAST[name] = gen
        return gen

    methods.METHODS[name] = build


def make_data(root: Path, n: int = 12) -> Path:
    """A data folder shaped like ../shared/data with `n` rows per file (gsm8k gold = 2 x question number)."""
    (root / "gsm8k").mkdir(parents=True, exist_ok=True)
    for split, offset in (("train", 1000), ("test", 0)):
        with open(root / "gsm8k" / f"{split}.jsonl", "w") as f:
            for i in range(n):
                k = offset + i + 1
                f.write(json.dumps({"question": f"What is twice {k}?", "answer": f"Twice is <<{k}*2={2*k}>>{2*k}.\n#### {2*k:,}"}) + "\n")
    (root / "nq_open").mkdir(exist_ok=True)
    with open(root / "nq_open" / "dev.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({"question": f"capital number {i}", "answer": [f"Capital Number {i}", f"city {i}"]}) + "\n")
    (root / "wmt22").mkdir(exist_ok=True)
    for pair in ("de-en", "en-de", "zh-en", "en-zh"):
        src = [f"Satz nummer {i} ist hier ." for i in range(n)]
        ref = [f"Satz nummer {i} ist hier ." if i % 2 else f"sentence number {i} is here ." for i in range(n)]
        (root / "wmt22" / f"{pair}.src").write_text("\n".join(src) + "\n")
        (root / "wmt22" / f"{pair}.ref").write_text("\n".join(ref) + "\n")
    return root
