"""Prompts compiled from a `DecisionState`: deterministic text, then the member's chat template.

`decision_text(state, labels)`: instruction, observation, optional memory, the labelled menu
("A. 3 + 4 = 7" lines; a note, where the state has notes, in parentheses after its action), a
one-line ask, and the answer cue "Answer:" — the decision model reads the next token after the cue.
`action_text(state)`: the same with the menu listed without labels ("- up") and the ask "Answer with
the move exactly as written." — the token-level policy writes the action.
`compile_prompt(member, text)`: the member's chat template around the text when it uses one
(`Member.format_prompt`), else the text unchanged.
"""
from __future__ import annotations

from typing import Sequence

from rlid.types import DecisionState

__all__ = ["ANSWER_CUE", "decision_text", "action_text", "compile_prompt"]

ANSWER_CUE = "Answer:"
LABEL_ASK = "Reply with the label of one option."
ACTION_ASK = "Answer with the move exactly as written."


def _body(state: DecisionState, menu_lines: Sequence[str], ask: str) -> str:
    parts = []
    if state.instruction.strip():
        parts.append(state.instruction.strip())
    parts.append(state.observation.rstrip())
    if state.memory.strip():
        parts.append("Memory:\n" + state.memory.rstrip())
    parts.append("Options:\n" + "\n".join(menu_lines))
    parts.append(ask + "\n" + ANSWER_CUE)
    return "\n\n".join(parts)


def _entries(state: DecisionState) -> list[str]:
    """Each action's text, with its note (if the state has notes) in parentheses after it."""
    if not state.notes:
        return list(state.actions)
    return [f"{act} ({note})" for act, note in zip(state.actions, state.notes)]


def decision_text(state: DecisionState, labels: Sequence[str]) -> str:
    """The decision model's prompt text (before any chat template): the menu labelled by `labels`."""
    if len(labels) != len(state.actions):
        raise ValueError(f"{len(labels)} labels for a menu of {len(state.actions)} actions")
    return _body(state, [f"{lab}. {entry}" for lab, entry in zip(labels, _entries(state))], LABEL_ASK)


def action_text(state: DecisionState) -> str:
    """The token-level policy's prompt text: the menu without labels; the answer is the action's text."""
    return _body(state, [f"- {entry}" for entry in _entries(state)], ACTION_ASK)


def compile_prompt(member, text: str) -> str:
    """`text` as `member` sees it: its chat template when it uses one (`Member.format_prompt`)."""
    return member.format_prompt(text)
