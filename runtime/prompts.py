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


class FewShotPrompt(ChatPrompt):
    """A k-shot prompt that knows its exemplar pool, so a view can show other exemplars of it.

    The string is the prompt with the exemplars `shots` (indices into `pool`, a list of (question,
    answer) pairs), lm-evaluation-harness style: description + exemplars + question, joined by
    `fewshot_delimiter`; `messages` the same as chat turns. `render(shots, description)` builds the
    same prompt with other exemplars or another description (None: keep)."""

    question: str
    pool: list[tuple[str, str]]
    shots: list[int]
    description: str
    target_delimiter: str
    fewshot_delimiter: str

    def __new__(cls, question: str, pool: Sequence[tuple[str, str]], shots: Sequence[int], description: str = "",
                target_delimiter: str = " ", fewshot_delimiter: str = "\n\n"):
        pairs = [tuple(pool[i]) for i in shots]
        parts = [q + target_delimiter + a for q, a in pairs] + [question]
        raw = description + fewshot_delimiter.join(parts)
        obj = super().__new__(cls, raw, fewshot_messages(pairs, question, description.strip() or None))
        obj.question, obj.pool, obj.shots = question, [tuple(p) for p in pool], list(shots)
        obj.description, obj.target_delimiter, obj.fewshot_delimiter = description, target_delimiter, fewshot_delimiter
        return obj

    def render(self, shots: Sequence[int] | None = None, description: str | None = None) -> "FewShotPrompt":
        """The same question with exemplars `shots` of the pool and/or another description."""
        return FewShotPrompt(self.question, self.pool, self.shots if shots is None else list(shots),
                             self.description if description is None else description,
                             self.target_delimiter, self.fewshot_delimiter)

    def __reduce__(self):
        return (FewShotPrompt, (self.question, self.pool, self.shots, self.description, self.target_delimiter,
                                self.fewshot_delimiter))


def view_prompt(prompt: str, view, use_chat: bool) -> str:
    """`prompt` as a view (`runtime.views.ViewSpec`) shows it: its exemplars and system text. A plain
    string prompt takes a system text only (raw: above the prompt); exemplar choices need a
    `FewShotPrompt` (one-line ConfigError otherwise)."""
    if view is None or (view.shots is None and view.system is None):
        return prompt
    if isinstance(prompt, FewShotPrompt):
        shots = view.exemplars(len(prompt.pool), prompt.shots)
        description = None if view.system is None else (view.system if use_chat else view.system + "\n\n")
        return prompt.render(shots, description)
    if view.shots is not None:
        from runtime.errors import ConfigError

        raise ConfigError(f"view shots={view.shots} needs prompts that carry their exemplar pool "
                          f"(runtime.prompts.FewShotPrompt, what `adafuse eval` builds); this prompt is a plain "
                          f"string: drop 'shots' from the view or pass FewShotPrompt prompts")
    return prompt if use_chat else view.system + "\n\n" + str(prompt)
