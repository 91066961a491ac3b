"""Test helpers: a model-free generator and a tiny benchmark data folder.

`register_fake()` adds method `fake` to `eval.methods.METHODS`. The fake answers from a lookup of
question -> answer text (by default the gold answer, so scores are predictable), costs one forward
pass per new "token" (word), and can sleep or raise after a number of calls to simulate a kill.
Mode "sample" stands in for sampling: at temperature > 0 row i of a call seeded `s` is right or
wrong by a draw seeded from (s + i, prompt), like `runtime.sampling` seeds row i with s + i (no
seed: unseeded draws). `log_path` gets one line per prompt generated (to count redone rows).
`register_scripted()` adds scripted `single`/`adafuse`/`token-union` for `adafuse tune` runs
whose choice depends on the members and options (no models), e.g. in a killed subprocess.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from runtime.outputs import Cost, GenerationOutput
from eval import methods


class FakeGenerator:
    """Answers each prompt with `answer_fn(prompt)`; truncates at the first stop string."""

    def __init__(self, members: list[str], *, mode: str = "gold", delay: float = 0.0, fail_after: int | None = None,
                 exc: type[BaseException] = KeyboardInterrupt, log_path: str | None = None,
                 script: dict[str, Any] | None = None) -> None:
        if mode not in ("gold", "echo", "sample", "scripted"):
            raise ValueError(f"fake mode {mode!r}: use gold, echo, sample or scripted")
        self.members, self.mode, self.delay, self.fail_after, self.exc = members, mode, delay, fail_after, exc
        self.log_path, self.script = log_path, script or {}
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
        if last.startswith("What is twice "):  # gsm8k_chat: the question alone, a boxed answer
            n = int("".join(ch for ch in last if ch.isdigit()) or 0)
            return f"Twice {n} is {2 * n}, so the answer is \\boxed{{{2 * n}}}."
        src = last.split(":", 1)[1].split("\n")[0].strip()
        return " " + src + "\n"

    def generate(self, prompts: list[str], *, max_new_tokens: int, stop: list[str], temperature: float = 0.0,
                 seed: int | None = None) -> list[GenerationOutput]:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise self.exc()
        self.calls += 1
        if self.log_path:
            _log_prompts(self.log_path, prompts)
        if self.delay:
            time.sleep(self.delay)
        outs = []
        for i, p in enumerate(prompts):
            self.prompts.append(p)
            text, reason = self.answer(p), "eos"
            if self.mode == "sample" and temperature > 0:
                text = _sampled(text, p, None if seed is None else seed + i)
            elif self.mode == "scripted":
                text = _scripted(text, p, self.members, self.script)
            for s in stop:
                if s in text:
                    text, reason = text[: text.index(s)], "stop"
            words = text.split()[:max_new_tokens]
            cost = Cost()
            for m in self.members:
                cost.add(m, len(words) + 1, len(p.split()) + len(words))
            outs.append(GenerationOutput(text=text, num_tokens=len(words), finish_reason=reason, cost=cost))
        return outs


def _log_prompts(path: str, prompts: list[str]) -> None:
    """One line per prompt, one O_APPEND write (survives a kill of the writer)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, "".join(json.dumps(p[-40:]) + "\n" for p in prompts).encode())
    finally:
        os.close(fd)


def _digest(*parts: Any) -> int:
    return int(hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12], 16)


def _sampled(text: str, prompt: str, seed: int | None) -> str:
    """The gold text or a wrong one with a seeded word appended: a stand-in for seeded sampling."""
    rng = random.Random() if seed is None else random.Random(_digest(seed, prompt))
    if rng.random() < 0.5:
        return text
    return f" guess {rng.randrange(10**6)}\n"


def _scripted(text: str, prompt: str, members: list[str], script: dict[str, Any]) -> str:
    """Right iff u(row) < p: p grows with the member count and with threshold 0.5 (a consistent table)."""
    p = 0.2 + 0.15 * len(members) + (0.3 if script.get("threshold") == 0.5 else 0.0) + 0.02 * sum(map(len, members))
    row = _digest(prompt.rsplit("\n\n", 1)[-1]) % 1000 / 1000
    return text if row < p else " wrong\n"


LAST: dict[str, FakeGenerator] = {}


def register_fake(name: str = "fake", **defaults: Any) -> None:
    """Register method `name` building a `FakeGenerator` (options, over `defaults`, pass to its
    constructor; defaults stay out of the run's options, e.g. a `log_path` per process)."""

    def build(members: list[str], **options: Any) -> FakeGenerator:
        gen = FakeGenerator(members, **{**defaults, **options})
        LAST[name] = gen
        return gen

    methods.METHODS[name] = build


def register_scripted(delay: float = 0.0, log_path: str | None = None) -> None:
    """Methods `single`, `adafuse` and `token-union` answer NQ-open-like rows from `_scripted`: the
    method options (threshold, weights, ...) only steer the script; no model is loaded."""

    def build(members: list[str], **options: Any) -> FakeGenerator:
        return FakeGenerator(members, mode="scripted", delay=delay, log_path=log_path, script=options)

    for name in ("single", "adafuse", "token-union"):
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


def error_text(stderr: str) -> str:
    """What a command printed on stderr besides model-load status lines ("loading NAME (DTYPE)", one per
    load in a log): where a bad input's one-line error must be the only line."""
    return "".join(line + "\n" for line in stderr.splitlines() if not line.startswith("loading "))
