"""Prompts that carry both a raw few-shot text and the same exemplars as chat turns.

`ChatPrompt` is a `str` (the raw few-shot text, what base models and logs see) with a `messages`
attribute: the exemplars as alternating user/assistant turns, then the question as the last user
turn (lm-evaluation-harness's `--apply_chat_template --fewshot_as_multiturn`). A member that uses a
chat template formats `messages` with it; any other member reads the raw text.
"""
from __future__ import annotations

from typing import Sequence


class ChatPrompt(str):
    """A raw prompt string that also knows its chat-turn form."""

    messages: list[dict[str, str]]

    def __new__(cls, text: str, messages: Sequence[dict[str, str]]):
        obj = super().__new__(cls, text)
        obj.messages = [dict(m) for m in messages]
        return obj

    def __reduce__(self):
        return (ChatPrompt, (str(self), self.messages))


def fewshot_messages(shots: Sequence[tuple[str, str]], question: str, system: str | None = None) -> list[dict[str, str]]:
    """[system?] + (user, assistant) per exemplar + the final user question."""
    messages = [{"role": "system", "content": system}] if system else []
    for user, assistant in shots:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": question})
    return messages
