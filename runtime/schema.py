"""A tiny declarative validator for YAML configs: unknown keys, wrong types and missing required keys
become a one-line `ConfigError` naming the file and the key (with a did-you-mean hint)."""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from runtime.errors import ConfigError


@dataclass(frozen=True)
class Field:
    """One allowed key: accepted Python types, whether it is required, and a nested schema.

    `item` validates list elements (a `Field`), `fields` validates a nested mapping.
    """

    types: tuple[type, ...]
    required: bool = False
    fields: "dict[str, Field] | None" = None
    item: "Field | None" = None
    choices: tuple[Any, ...] | None = None


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true/false", list: "a list",
               dict: "a mapping", type(None): "null"}


def _type_name(types: tuple[type, ...]) -> str:
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def _isinstance(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:  # YAML `true` is not an int here
        return False
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def check_keys(data: dict, allowed: dict[str, Field] | list[str], where: str, source: str) -> None:
    """Raise one line naming every key of `data` that is not in `allowed`, each with the closest name."""
    names = list(allowed)
    parts = []
    for key in (k for k in data if k not in names):
        close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
        parts.append(f"'{where}{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    if not parts:
        return
    hint = "" if any("did you mean" in p for p in parts) else f" (allowed: {', '.join(sorted(names))})"
    raise ConfigError(f"{source}: unknown key{'s' if len(parts) > 1 else ''} {', '.join(parts)}{hint}")


def validate(data: Any, schema: dict[str, Field], source: str, where: str = "") -> dict:
    """Check `data` (a mapping) against `schema`; returns it unchanged. `where` is the key-path prefix."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {where.rstrip('.') or 'the file'} must be a mapping, got {type(data).__name__}")
    check_keys(data, schema, where, source)
    for key, spec in schema.items():
        if key not in data or data[key] is None and type(None) not in spec.types:
            if spec.required:
                raise ConfigError(f"{source}: missing required key '{where}{key}'")
            continue
        _validate_value(data[key], spec, source, f"{where}{key}")
    return data


def _validate_value(value: Any, spec: Field, source: str, path: str) -> None:
    if not _isinstance(value, spec.types):
        raise ConfigError(f"{source}: key '{path}' must be {_type_name(spec.types)}, got {type(value).__name__} {value!r}"[:300])
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"{source}: key '{path}' must be one of {', '.join(map(str, spec.choices))}, got {value!r}")
    if isinstance(value, dict) and spec.fields is not None:
        validate(value, spec.fields, source, f"{path}.")
    if isinstance(value, list) and spec.item is not None:
        for i, element in enumerate(value):
            _validate_value(element, spec.item, source, f"{path}[{i}]")
