"""Ensemble decoding across tokenizers with speculative acceleration.

Heavy names are imported lazily (module-level `__getattr__`), so `import adafuse` stays cheap (no
torch until a name is used). `Member`, `load_member`, `GenerationOutput` and `Cost` come from the
runtime floor below.
"""
from __future__ import annotations

from typing import Any

_LAZY = {
    "Ensemble": "adafuse.ensemble",
    "EnsembleConfig": "adafuse.ensemble",
    "Member": "runtime.member",
    "load_member": "runtime.member",
    "GenerationOutput": "runtime.outputs",
    "Cost": "runtime.outputs",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'adafuse' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
