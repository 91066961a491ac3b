"""LoRA adapters on a member's model with `peft` (its own layers, save and load), and the reference
policy as the same model with the adapter switched off (no second copy of the weights).

`add_lora(member, LoraSpec(...))` injects LoRA layers into `member.model` in place
(`peft.get_peft_model`), so every path that drives `member.model` (forwards, `Member.generate`, the
decision model) now runs the adapted model; the returned `LoraAdapter` holds the `PeftModel` for
what only it can do: `reference()` (`with peft_model.disable_adapter():` — π_ref = the start
policy, since a fresh adapter has B = 0), `save(dir)` / `load(dir)` (peft's `save_pretrained`,
`load_peft_weights` + `set_peft_model_state_dict`) and the trainable `parameters()`.
After each weight change call `weights_changed()`: the member's prompt-prefix KV cache was computed
with the old weights and is dropped (as it is around `reference()`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from runtime.errors import ConfigError
from runtime.packed_linear import is_packed

# attention projections by family: llama / qwen2 / gemma / mistral / phi3-style, then gpt2 / falcon
ATTENTION_TARGETS = (("q_proj", "k_proj", "v_proj", "o_proj"), ("c_attn",), ("qkv_proj", "o_proj"),
                     ("query_key_value",))


@dataclass(frozen=True)
class LoraSpec:
    """LoRA settings: rank `r`, scale `alpha` / r, `dropout` on the adapter input, and the module names
    to adapt (None: the attention projections found in the model, `find_target_modules`)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.r < 1:
            raise ConfigError(f"lora r must be a positive integer, got {self.r}; set e.g. r: 8")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora dropout must be in [0, 1), got {self.dropout}; set e.g. dropout: 0.0")


def _linear_names(model: nn.Module) -> set[str]:
    """Last name parts of the model's Linear (and GPT-2 Conv1D) layers."""
    from transformers.pytorch_utils import Conv1D

    return {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, (nn.Linear, Conv1D))}


def find_target_modules(model: nn.Module) -> tuple[str, ...]:
    """The attention projections of `model` that LoRA should adapt (first family of ATTENTION_TARGETS
    whose names are all among its Linear layers); ConfigError naming the layers found otherwise."""
    if is_packed(model):
        raise ConfigError("the model's Linear layers are packed for inference and cannot take LoRA; load it "
                          "with trainable=True (runtime.member.load_member(..., pack_weights=False))")
    names = _linear_names(model)
    for family in ATTENTION_TARGETS:
        if set(family) <= names:
            return family
    raise ConfigError(f"no attention projections to adapt among the model's Linear layers {sorted(names)}; "
                      f"name them in lora target_modules")


@dataclass
class LoraAdapter:
    """A `peft` LoRA adapter injected into `member.model` (see module docstring)."""

    peft_model: nn.Module
    member: object
    spec: LoraSpec = field(default_factory=LoraSpec)

    def parameters(self) -> list[nn.Parameter]:
        """The trainable (adapter) parameters, in a fixed order."""
        return [p for _, p in self.named_parameters()]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.peft_model.named_parameters() if p.requires_grad]

    def weights_changed(self) -> None:
        """Drop what was computed with the old weights (the member's prompt-prefix KV cache)."""
        cache = getattr(self.member, "prefix_cache", None)
        if cache is not None:
            cache.clear()

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """Run the member's model as the reference policy (adapter disabled), prefix caches kept apart."""
        self.weights_changed()
        try:
            with self.peft_model.disable_adapter():
                yield
        finally:
            self.weights_changed()

    def save(self, folder: str | Path) -> None:
        """The adapter weights and config into `folder` (peft's `save_pretrained`)."""
        self.peft_model.save_pretrained(str(folder))

    def load(self, folder: str | Path) -> None:
        """Adapter weights saved by `save` back into this adapter (peft's `load_peft_weights`)."""
        from peft import load_peft_weights, set_peft_model_state_dict

        result = set_peft_model_state_dict(self.peft_model, load_peft_weights(str(folder), device="cpu"))
        unexpected = getattr(result, "unexpected_keys", None) or []
        if unexpected:
            raise ConfigError(f"{folder} holds adapter weights for another model ({unexpected[0]} ...); "
                              f"resume with the model it was trained on")
        self.weights_changed()

    def pack_frozen(self) -> int:
        """Pack the model's frozen Linear layers for faster forwards while the adapter trains
        (`runtime.packed_linear.pack_frozen_linear_weights`: the LoRA base layers, MLPs and LM head;
        the input gradient still flows through them). Same outputs and gradients to float rounding.
        The adapter still trains, saves and loads; it can no longer be merged into this model (load it
        into a freshly loaded one). Returns how many layers were packed."""
        from runtime.packed_linear import pack_frozen_linear_weights

        count = pack_frozen_linear_weights(self.member.model)
        self.weights_changed()
        return count

    def merge_for_inference(self, pack: bool = True) -> nn.Module:
        """Fold the adapter into the base weights (peft's `merge_and_unload`: W + (alpha / r) B A, the
        LoRA layers replaced by plain Linear ones, in place) and, on CPU, pack them for speed
        (`runtime.packed_linear`) — the unmerged adapter runs two extra matmuls per adapted layer.
        Same outputs to float rounding; the adapter cannot be trained or saved afterwards. Returns
        the member's model."""
        from runtime.packed_linear import PackedLinear, pack_linear_weights, packable_dtypes

        if any(isinstance(m, PackedLinear) for m in self.peft_model.modules()):
            raise ConfigError("this model's frozen layers were packed for training (pack_frozen), so the adapter "
                              "cannot be merged into them; save it and load it into a freshly loaded model")
        model = self.peft_model.merge_and_unload()
        self.member.model = model
        if pack and next(model.parameters()).device.type == "cpu" and next(model.parameters()).dtype in packable_dtypes():
            pack_linear_weights(model)
        self.weights_changed()
        return model


def add_lora(member, spec: LoraSpec | None = None, seed: int = 0) -> LoraAdapter:
    """Inject LoRA layers into `member.model` (in place) and return the adapter; the model's other
    weights are frozen. A fresh adapter leaves the outputs unchanged (peft initialises B = 0); its A
    matrices are drawn from torch's generator seeded with `seed` (the global generator's state is
    restored after), so the same seed gives the same adapter in every process."""
    from peft import LoraConfig, get_peft_model

    spec = spec or LoraSpec()
    model = member.model
    targets = list(spec.target_modules or find_target_modules(model))
    missing = sorted(set(targets) - _linear_names(model))
    if missing:
        raise ConfigError(f"lora target_modules {missing} are not Linear layers of the model; "
                          f"choose among {sorted(_linear_names(model))}")
    config = LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=targets,
                        bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
    if peft_model.get_base_model() is not model:  # peft's contract: layers are injected into `model`
        raise RuntimeError("peft did not adapt the member's model in place")
    adapter = LoraAdapter(peft_model, member, spec)
    adapter.weights_changed()
    return adapter


def adapter_state(adapter: LoraAdapter) -> dict[str, torch.Tensor]:
    """Copies of the adapter's trainable tensors by name (for tests and comparisons)."""
    return {n: p.detach().clone() for n, p in adapter.named_parameters()}
