"""The labelled menu: option labels, and the token ids that realise each label as the next token.

`labels(n, style)`: "letters" gives A..Z, then AA, AB, ... (spreadsheet order); "numbers" gives 1..n.
`realisations(tokenizer, label, action_text, with_action)`: the candidate first tokens of one
option after the prompt's answer cue — the label's first token written without and with a leading
space, in upper case and (if it is one token) lower case; with `with_action`, also the first token of
" " + the action's own text (e.g. " up"). A candidate whose first token is only whitespace (a
tokenizer that spells " A" as " " + "A") is dropped: it would not name the option.
`menu_realisations(tokenizer, labels, actions, with_action)`: the sets for a whole menu, made
disjoint, so that π(a) = mass(R(a)) / Σ_a' mass(R(a')) is a proper marginal over realisations.

Multi-token labels (e.g. "AA" spelled "A" + "A"): only the first token is the label's realisation,
so the labels' primary first tokens (the label as written, no space) must differ across the menu;
if two coincide, `menu_realisations` raises a `ConfigError` saying so (use fewer options or labels
that are single tokens for this tokenizer). Lower-case variants can be switched off
(`lower_case=False`): " a" is also the English article, so it can lend option A mass that is not a
choice of A; measure π both ways on a real model. Disjointness: a token claimed by the label variants of
two options is dropped from both; an action-text token that another option's label variants or
another action claim is dropped from the action variants (label variants take precedence: the
prompt names the label). An option left with no realisation is a `ConfigError`.
"""
from __future__ import annotations

from typing import Sequence

from runtime.errors import ConfigError

__all__ = ["LABEL_STYLES", "labels", "realisations", "menu_realisations"]

LABEL_STYLES = ("letters", "numbers")


def _letters(i: int) -> str:
    """Spreadsheet column name of index i: 0 -> A, 25 -> Z, 26 -> AA, 27 -> AB."""
    out = ""
    i += 1
    while i > 0:
        i, r = divmod(i - 1, 26)
        out = chr(ord("A") + r) + out
    return out


def labels(n: int, style: str = "letters") -> tuple[str, ...]:
    """The labels of an n-option menu in the given style ("letters" or "numbers")."""
    if style not in LABEL_STYLES:
        raise ConfigError(f"unknown label_style '{style}'; use one of: {', '.join(LABEL_STYLES)}")
    if n < 1:
        raise ConfigError(f"a menu needs at least one option, got {n}; give the state a non-empty menu")
    if style == "numbers":
        return tuple(str(i + 1) for i in range(n))
    return tuple(_letters(i) for i in range(n))


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _first_token(tokenizer, text: str) -> int | None:
    """The first token id of `text`, or None when it is whitespace only (names nothing)."""
    ids = _encode(tokenizer, text)
    if not ids or not tokenizer.decode(ids[:1]).strip():
        return None
    return ids[0]


def _label_variants(tokenizer, label: str, lower_case: bool = True) -> tuple[list[int], list[int]]:
    """(primary-case variants, lower-case single-token variants) of a label, in order, no repeats."""
    main: list[int] = []
    for text in (label, " " + label, label.upper(), " " + label.upper()):
        tok = _first_token(tokenizer, text)
        if tok is not None and tok not in main:
            main.append(tok)
    lower: list[int] = []
    if lower_case and label.lower() != label.upper():
        for text in (label.lower(), " " + label.lower()):
            ids = _encode(tokenizer, text)
            if len(ids) == 1 and tokenizer.decode(ids).strip() and ids[0] not in main + lower:
                lower.append(ids[0])
    return main, lower


def _action_variant(tokenizer, action_text: str | None) -> int | None:
    if not action_text or not action_text.strip():
        return None
    return _first_token(tokenizer, " " + action_text.strip())


def realisations(tokenizer, label: str, action_text: str | None = None, with_action: bool = False,
                 lower_case: bool = True) -> list[int]:
    """Token ids that realise `label` (one option, no menu context) as the next token: label without
    and with a leading space, upper and single-token lower case; with `with_action`, the first token
    of " " + `action_text`; `lower_case=False` leaves out the lower-case variants. See
    `menu_realisations` for the disjoint sets of a whole menu."""
    main, lower = _label_variants(tokenizer, label, lower_case)
    out = main + lower
    act = _action_variant(tokenizer, action_text) if with_action else None
    if act is not None and act not in out:
        out.append(act)
    return out


def _check_primary_unique(tokenizer, menu_labels: Sequence[str]) -> None:
    seen: dict[int, str] = {}
    for lab in menu_labels:
        tok = _first_token(tokenizer, lab)
        if tok is None:
            raise ConfigError(f"label '{lab}' has no non-space first token for this tokenizer; use another label_style")
        if tok in seen:
            raise ConfigError(f"labels '{seen[tok]}' and '{lab}' start with the same token for this tokenizer, "
                              f"so the option law cannot tell them apart; use menus of fewer options (at most "
                              f"26 letters where 'AA'.. are not single tokens, 9 numbers where '10'.. are not)")
        seen[tok] = lab


def _drop_shared(sets: list[list[int]], also_claimed: list[set[int]] | None = None) -> list[list[int]]:
    """Each set without the tokens another set claims (or `also_claimed[i]`, tokens others own)."""
    owners: dict[int, int] = {}
    for s in sets:
        for t in set(s):
            owners[t] = owners.get(t, 0) + 1
    return [[t for t in s if owners[t] == 1 and not (also_claimed and t in also_claimed[i])]
            for i, s in enumerate(sets)]


def menu_realisations(tokenizer, menu_labels: Sequence[str], actions: Sequence[str] | None = None,
                      with_action: bool = False, lower_case: bool = True) -> list[list[int]]:
    """Disjoint realisation sets, one per option: label variants made disjoint first (a shared token
    is dropped from every option claiming it), then action-text tokens added where neither another
    option's label variants nor another action claim them. Raises `ConfigError` if two labels share
    their primary first token or an option is left with no realisation."""
    _check_primary_unique(tokenizer, menu_labels)
    if with_action and (actions is None or len(actions) != len(menu_labels)):
        raise ConfigError("with_action needs one action text per label; pass actions=state.actions")
    variants = [_label_variants(tokenizer, lab, lower_case) for lab in menu_labels]
    label_sets = _drop_shared([main + lower for main, lower in variants])
    if with_action:
        acts = [[t] if (t := _action_variant(tokenizer, a)) is not None else [] for a in actions]
        others = [set().union(*(label_sets[j] for j in range(len(label_sets)) if j != i)) for i in range(len(acts))]
        acts = _drop_shared(acts, others)
        label_sets = [s + [t for t in a if t not in s] for s, a in zip(label_sets, acts)]
    for lab, s in zip(menu_labels, label_sets):
        if not s:
            raise ConfigError(f"option '{lab}' has no token of its own for this tokenizer (all its realisations "
                              f"are shared with other options); use another label_style or fewer options")
    return label_sets
