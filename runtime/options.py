"""One options parser for every "mapping -> options dataclass" in the toolkit: method options, RLiD
environments and trainers, config blocks.

`parse_options(cls, data, what)` refuses unknown keys (all of them, in one line, each with the closest
known name), checks each value against the field's annotation (bool, int, float, str, their
`| None`, lists / tuples / mappings; an int is a float), builds the dataclass and runs its
`validate()` if it has one. Every mistake is one `ConfigError` line naming `what` and the key.
`unknown_keys_error(keys, known, what)` is the did-you-mean message alone (for YAML schemas).
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Iterable, Mapping

from runtime.errors import ConfigError

_NAMES = {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
          tuple: "a list", dict: "a mapping", type(None): "null"}


def unknown_keys_error(keys: Iterable[str], known: Iterable[str], what: str) -> ConfigError:
    """One line naming every unknown key of `what`, with the closest known names ("did you mean")."""
    known = sorted(known)
    keys = list(keys)
    close = {k: difflib.get_close_matches(str(k), known, n=1, cutoff=0.6) for k in keys}
    noun = "option" if len(keys) == 1 else "options"
    msg = f"unknown {noun} {', '.join(repr(str(k)) for k in keys)} for {what}"
    if len(keys) == 1 and close[keys[0]]:
        return ConfigError(f"{msg} (did you mean '{close[keys[0]][0]}'?)")
    guesses = [f"'{c[0]}' for '{k}'" for k, c in close.items() if c]
    if guesses:
        return ConfigError(f"{msg} (did you mean {', '.join(guesses)}?)")
    return ConfigError(f"{msg}; known: {', '.join(known) or '(none)'}")


def _accepted(hint: Any) -> tuple[type, ...] | None:
    """The Python types a value of annotation `hint` may have (None: not checked)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        out: tuple[type, ...] = ()
        for arg in typing.get_args(hint):
            got = _accepted(arg)
            if got is None:
                return None
            out += got
        return out
    if origin is typing.Literal:
        return None
    base = origin or hint
    if base is float:
        return (float, int)
    if base in (list, tuple):
        return (list, tuple)
    if base in (bool, int, str, dict, type(None)):
        return (base,)
    return None


def check_value(key: str, value: Any, hint: Any, what: str) -> None:
    """A one-line ConfigError when `value` cannot be of type `hint` (bools are not numbers here)."""
    accepted = _accepted(hint)
    if accepted is None:
        return
    if isinstance(value, bool) and bool not in accepted:
        ok = False
    else:
        ok = isinstance(value, accepted)
    if not ok:
        names = " or ".join(dict.fromkeys(_NAMES.get(t, t.__name__) for t in accepted))
        raise ConfigError(f"option {key}={value!r} of {what} must be {names}")


def parse_options(cls: type, data: Mapping[str, Any] | None, what: str, *, validate: bool = True):
    """`cls(**data)` for an options dataclass, checked (see the module docstring)."""
    data = dict(data or {})
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise unknown_keys_error(unknown, names, what)
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        check_value(key, value, hints.get(key), what)
    try:
        built = cls(**data)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"options of {what} rejected: {exc}") from None
    if validate and hasattr(built, "validate"):
        built.validate()
    return built
