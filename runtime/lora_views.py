"""LoRA adapters on views: one base model in memory, each view with its own adapter (or none).

A view `{adapter: FOLDER}` (`runtime.views`) reads a peft LoRA adapter (`adapter_config.json` +
`adapter_model.safetensors`, as `PeftModel.save_pretrained` writes it) and runs it on the shared base
weights: every targeted linear layer gets a forward hook that adds `scale * x A^T B^T` to the rows of
the views that carry that adapter, so views with different adapters (and views with none) still go
through the model as rows of one forward (`runtime.stacked_forward`), as peft's mixed-adapter batches
do. The base weights are never changed (packed layers included: the hook adds to their output).

Supported: peft's plain LoRA (`peft_type: LORA`; `lora_alpha / r` scaling, or `/ sqrt(r)` with
`use_rslora`) on linear layers of the model body. Anything else (DoRA, LoRA on the embeddings or the
LM head, other adapter types) is a one-line ConfigError when the view is built.
"""
from __future__ import annotations

import contextlib
import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from runtime.errors import ConfigError

PREFIX = "base_model.model."


@dataclass
class LoraWeights:
    """One adapter: per targeted module name, (A [r, in], B [out, r]) and its scale."""

    path: str
    scale: float
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"LoraWeights({self.path!r}, layers={len(self.layers)}, scale={self.scale})"


class _Active(threading.local):
    def __init__(self) -> None:
        self.rows: list[tuple[int, int, LoraWeights]] = []


_active = _Active()
_HOOKED: "dict[int, set[str]]" = {}  # id(model) -> names of modules that carry our hook


def read_adapter(path: str | Path, model: nn.Module) -> LoraWeights:
    """The adapter in `path`, checked against `model` (one-line ConfigErrors)."""
    folder = Path(path).expanduser()
    config_file, weights_file = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not config_file.is_file() or not weights_file.is_file():
        raise ConfigError(f"view adapter '{path}' is not a peft LoRA folder (needs adapter_config.json and "
                          f"adapter_model.safetensors, as PeftModel.save_pretrained writes)")
    try:
        cfg = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"view adapter '{path}': adapter_config.json is unreadable ({exc})") from None
    if str(cfg.get("peft_type", "")).upper() != "LORA" or cfg.get("use_dora") or cfg.get("lora_bias"):
        raise ConfigError(f"view adapter '{path}': only plain LoRA adapters are supported (peft_type LORA, no DoRA, "
                          f"no LoRA bias)")
    r, alpha = int(cfg.get("r", 8)), float(cfg.get("lora_alpha", 8))
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    from safetensors.torch import load_file

    tensors = load_file(str(weights_file))
    modules = dict(model.named_modules())
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weights = LoraWeights(str(folder), scale)
    for key, a in tensors.items():
        if not key.endswith(".lora_A.weight"):
            if ".lora_B." not in key:
                raise ConfigError(f"view adapter '{path}': unsupported tensor {key} (only lora_A / lora_B)")
            continue
        name = key[len(PREFIX):] if key.startswith(PREFIX) else key
        name = name[: -len(".lora_A.weight")]
        b = tensors.get(key.replace(".lora_A.", ".lora_B."))
        module = modules.get(name)
        if b is None or module is None or module is head or not hasattr(module, "out_features"):
            raise ConfigError(f"view adapter '{path}': layer {name} is not a linear layer of the model body "
                              f"(or lacks its lora_B); is the adapter for this model?")
        dtype = next(model.parameters()).dtype
        device = next(model.parameters()).device
        weights.layers[name] = (a.to(device, dtype), b.to(device, dtype))
    if not weights.layers:
        raise ConfigError(f"view adapter '{path}' holds no LoRA layers")
    if cfg.get("fan_in_fan_out"):
        weights.layers = {n: (a.T.contiguous(), b.T.contiguous()) for n, (a, b) in weights.layers.items()}
    return weights


def _hook(name: str):
    def add_lora(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor | None:
        rows = _active.rows
        if not rows:
            return None
        x = inputs[0]
        for r0, r1, weights in rows:
            ab = weights.layers.get(name)
            if ab is not None:
                a, b = ab
                output[r0:r1] = output[r0:r1] + (x[r0:r1].to(a.dtype) @ a.T @ b.T * weights.scale).to(output.dtype)
        return output

    return add_lora


def attach_adapter(member: Any, path: str) -> None:
    """Give the view `member` the adapter in `path` (hooks installed once per model and layer)."""
    weights = read_adapter(path, member.model)
    hooked = _HOOKED.setdefault(id(member.model), set())
    modules = dict(member.model.named_modules())
    for name in weights.layers:
        if name not in hooked:
            modules[name].register_forward_hook(_hook(name))
            hooked.add(name)
    member.adapter = weights


@contextlib.contextmanager
def adapters_for(rows: Sequence[tuple[int, int, LoraWeights | None]]) -> Iterator[None]:
    """Inside this block (this thread), rows r0:r1 of each forward get `weights` added (None: none)."""
    previous = _active.rows
    _active.rows = [(r0, r1, w) for r0, r1, w in rows if w is not None]
    try:
        yield
    finally:
        _active.rows = previous
