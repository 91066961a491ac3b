"""Training checkpoints that survive a kill: a checkpoint is complete or it is not there.

`save_checkpoint(root, step, adapter, optimizer, state, rng)` writes into a hidden temp folder of
`root`: the adapter (peft's own format, `rlid.lora.LoraAdapter.save`), `optimizer.pt`, `rng.pt` (RNG
states), `state.json` (step, trainer counters, the JSONL log's byte offset...); fsyncs every file
and the folder, then renames it to `ckpt-<step>` in one `os.rename` and records it in `latest.json`
(`runtime.files.write_json_atomic`). A run killed mid-write leaves only the temp folder, which
`resume` ignores (and the next save sweeps away): `resume(root)` returns the newest complete
`ckpt-*` (or None), so a kill costs at most the steps since the previous checkpoint. The newest
`keep` checkpoints are kept.
`restore(ckpt, adapter, optimizer)` loads the weights and optimizer state and returns the RNG states
for `set_rng_state`.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.files import write_json_atomic

PREFIX = "ckpt-"
ADAPTER, OPTIMIZER, RNG, STATE, LATEST = "adapter", "optimizer.pt", "rng.pt", "state.json", "latest.json"


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint folder, its step, and the trainer state saved with it."""

    path: Path
    step: int
    state: dict[str, Any]


def rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    """The RNG states a run draws from: torch's global CPU RNG, Python's `random`, and `generator`."""
    out: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if generator is not None:
        out["generator"] = generator.get_state()
    return out


def set_rng_state(states: dict[str, Any], generator: torch.Generator | None = None) -> None:
    """Put back the states `rng_state` returned."""
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if generator is not None and "generator" in states:
        generator.set_state(states["generator"])


def _fsync_tree(folder: Path) -> None:
    """fsync every file under `folder`, then every folder (so the names are on disk too)."""
    dirs = [folder]
    for path in sorted(folder.rglob("*")):
        if path.is_dir():
            dirs.append(path)
        else:
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for d in reversed(dirs):
        _fsync_dir(d)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _torch_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)


def _sweep(root: Path) -> None:
    """Remove temp folders of saves that never finished (a kill mid-write)."""
    for path in root.glob(f".{PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)


def save_checkpoint(root: str | Path, step: int, adapter, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                    rng: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint `step` atomically (module docstring); returns its folder."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _sweep(root)
    tmp = Path(tempfile.mkdtemp(prefix=f".{PREFIX}{step:08d}.", dir=root))
    adapter.save(tmp / ADAPTER)
    _torch_save(optimizer.state_dict(), tmp / OPTIMIZER)
    _torch_save(rng, tmp / RNG)
    write_json_atomic(tmp / STATE, {**state, "step": step})
    _fsync_tree(tmp)
    final = root / f"{PREFIX}{step:08d}"
    old = None
    if final.exists():  # the same step saved again: swap it out, then drop the old copy
        old = root / f".{PREFIX}old-{step:08d}"
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(root)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    write_json_atomic(root / LATEST, {"step": step, "path": final.name})
    for stale in _complete(root)[keep:]:
        shutil.rmtree(stale.path, ignore_errors=True)
    return final


def _read_state(folder: Path) -> dict[str, Any] | None:
    """The checkpoint's state.json if the folder holds a whole checkpoint, else None."""
    if not all((folder / name).exists() for name in (ADAPTER, OPTIMIZER, RNG, STATE)):
        return None
    try:
        state = json.loads((folder / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and isinstance(state.get("step"), int) else None


def _complete(root: Path) -> list[Checkpoint]:
    """The complete checkpoints under `root`, newest first."""
    found = []
    for path in root.glob(f"{PREFIX}*"):
        state = _read_state(path) if path.is_dir() else None
        if state is not None:
            found.append(Checkpoint(path, state["step"], state))
    return sorted(found, key=lambda c: c.step, reverse=True)


def resume(root: str | Path) -> Checkpoint | None:
    """The newest complete checkpoint under `root`, or None (no folder, or nothing complete in it)."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = _complete(root)
    return found[0] if found else None


def restore(ckpt: Checkpoint, adapter, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load the checkpoint's adapter weights and optimizer state; returns its RNG states."""
    adapter.load(ckpt.path / ADAPTER)
    with open(ckpt.path / OPTIMIZER, "rb") as f:
        optimizer.load_state_dict(torch.load(f, weights_only=True))
    with open(ckpt.path / RNG, "rb") as f:
        return torch.load(f, weights_only=True)
