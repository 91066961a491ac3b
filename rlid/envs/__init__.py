"""Offline, seeded text environments with legal menus (`rlid.types.Environment`).

`make_env(name, **options)` builds one of `ENVIRONMENTS`: "countdown" (`rlid.envs.countdown`),
"sokoban" (`rlid.envs.sokoban`), "arc_1d" (`rlid.envs.arc_1d`), and the TextWorldExpress household
games "twc" (`rlid.envs.twc`: put objects where they belong) and "cooking" (`rlid.envs.cooking`),
which run in one Java process per Python process (`rlid.envs.textworld`); the options are the fields
of that module's options dataclass. An unknown name or option, or a bad value, is a
`runtime.errors.ConfigError` whose one line names it and the valid choices."""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable

from runtime.errors import ConfigError
from rlid.envs.arc_1d import Arc1DEnv, Arc1DOptions
from rlid.envs.base import MenuEnvironment, options_from
from rlid.envs.cooking import CookingEnv, CookingOptions
from rlid.envs.countdown import CountdownEnv, CountdownOptions
from rlid.envs.sokoban import SokobanEnv, SokobanOptions
from rlid.envs.twc import TWCEnv, TWCOptions

_REGISTRY: dict[str, tuple[Callable[[Any], MenuEnvironment], type]] = {
    "countdown": (CountdownEnv, CountdownOptions),
    "sokoban": (SokobanEnv, SokobanOptions),
    "arc_1d": (Arc1DEnv, Arc1DOptions),
    "twc": (TWCEnv, TWCOptions),
    "cooking": (CookingEnv, CookingOptions),
}
ENVIRONMENTS: tuple[str, ...] = tuple(_REGISTRY)


def make_env(name: str, **options: Any) -> MenuEnvironment:
    """A fresh environment `name` with `options` (see each module's options dataclass)."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown environment {name!r}; choose one of: {', '.join(ENVIRONMENTS)}")
    env_cls, options_cls = _REGISTRY[name]
    return env_cls(options_from(options_cls, name, options))


def env_options(name: str) -> list[str]:
    """The option names `make_env(name, ...)` accepts."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown environment {name!r}; choose one of: {', '.join(ENVIRONMENTS)}")
    return [f.name for f in fields(_REGISTRY[name][1])]


__all__ = ["ENVIRONMENTS", "make_env", "env_options", "CountdownEnv", "SokobanEnv", "Arc1DEnv", "TWCEnv", "CookingEnv",
           "MenuEnvironment"]
