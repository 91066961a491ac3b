"""Member specs -> `Member`s, through one cache: the one place that decides what a member spec means.

A spec is one of:

- a `Member`: returned as is;
- a string (or `os.PathLike`): a registry name, a local `save_pretrained` folder or a hub id, loaded
  by `runtime.member.load_member` in the loader's dtype on its device and cached by (spec, dtype,
  device): asking twice gives the same `Member` (one model, one set of counters, one prefix cache).
  Dtype aliases ("fp32", torch.float32) and the spellings of one folder share an entry;
- a `(model, tokenizer)` pair: wrapped as a new `Member`, the model used as given (its own dtype and
  device); not cached.

A bad spec raises `runtime.errors.ConfigError`, one line naming the problem and the fix (unknown
names list the known ones). Errors of a good spec that cannot load now (a registry model not fetched
yet, not enough memory) keep their own `AdafuseError` types.

    loader = MemberLoader(dtype="bfloat16")
    lead = loader.member("qwen2.5-coder-0.5b")        # loaded once
    same = loader.member("qwen2.5-coder-0.5b")        # the same Member
    members = loader.members(["smollm2-135m", (model, tokenizer), lead])

`load(spec, dtype=..., device=...)` does the same through the process-wide `default_loader()`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch

from runtime.errors import ConfigError, UnknownModelError
from runtime.member import Member, resolve_dtype
from runtime.views import make_view, member_spec, model_of, split_member_spec

_KINDS = "a registry name (see: adafuse models list), a local save_pretrained folder, a hub id, a (model, tokenizer) pair or a Member"

CacheKey = tuple  # (spec, dtype, device) [+ ("unpacked",)]


class MemberLoader:
    """Loads members in `dtype` on `device` (both may be overridden per call) and caches them."""

    def __init__(self, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu"):
        self.dtype = resolve_dtype(dtype)
        self.device = _device(device)
        self._members: dict[CacheKey, Member] = {}
        self._views: dict[tuple, Member] = {}  # (("view", id(base), recipe)) -> the view member

    def __repr__(self) -> str:
        return f"MemberLoader(dtype={self.dtype}, device={self.device!r}, cached={len(self._members)})"

    def __len__(self) -> int:
        return len(self._members)

    def member(self, spec: Any, dtype: str | torch.dtype | None = None, device: str | torch.device | None = None,
               pack_weights: bool = True) -> Member:
        """The `Member` for `spec` (see the module docstring); `pack_weights=False` gives a copy with
        plain `nn.Linear` weights (what int8 quantisation starts from), cached apart."""
        if isinstance(spec, Member):
            return spec
        if isinstance(spec, (str, dict)):
            name, view = split_member_spec(spec)  # "name[shots=2:4,...]" / {name, view}: a view of name
            if view is not None:
                base = self.member(name, dtype, device, pack_weights)
                key = ("view", id(base), member_spec("", view))
                if key not in self._views:
                    self._views[key] = make_view(base, view)
                return self._views[key]
            spec = name
        if isinstance(spec, (tuple, list)) and len(spec) == 2 and not any(isinstance(x, (str, os.PathLike)) for x in spec):
            return Member(*_check_pair(spec[0], spec[1]))
        if isinstance(spec, os.PathLike):
            spec = os.fspath(spec)
        if not isinstance(spec, str):
            raise ConfigError(f"member {_short(spec)} is invalid: give {_KINDS}")
        if not spec.strip():
            raise ConfigError(f"member {spec!r} is empty: give {_KINDS}")
        torch_dtype = self.dtype if dtype is None else resolve_dtype(dtype)
        where = self.device if device is None else _device(device)
        key = (_spec_key(spec), torch_dtype, where) + (() if pack_weights else ("unpacked",))
        if key not in self._members:
            self._members[key] = _load(spec, torch_dtype, where, pack_weights)
        return self._members[key]

    def check_fit(self, specs: Sequence[tuple[Any, bool]], dtype: str | torch.dtype | None = None,
                  device: str | torch.device | None = None) -> None:
        """Before the first of several loads (an ensemble's members and drafters): raise a one-line
        `InsufficientMemoryError` with each model's size, the sum and the free RAM when the ones
        not loaded yet would not fit together (`registry.check_memory`). `specs`: (spec,
        pack_weights) pairs; Members, (model, tokenizer) pairs and cached specs count as loaded;
        a spec named twice counts once."""
        from runtime import registry

        torch_dtype = self.dtype if dtype is None else resolve_dtype(dtype)
        where = self.device if device is None else _device(device)
        todo: dict[CacheKey, str] = {}
        for spec, packed in specs:
            spec = model_of(spec) if isinstance(spec, (str, dict)) else spec  # views load their model once
            if isinstance(spec, os.PathLike):
                spec = os.fspath(spec)
            if not isinstance(spec, str) or not spec.strip():
                continue
            key = (_spec_key(spec), torch_dtype, where) + (() if packed else ("unpacked",))
            if key not in self._members:
                todo.setdefault(key, spec)
        if len(todo) > 1:  # one model alone is checked by load_member as it loads
            registry.check_memory(list(todo.values()), str(torch_dtype).replace("torch.", ""))

    def members(self, specs: Sequence[Any]) -> list[Member]:
        """`member(spec)` for each spec, in order."""
        return [self.member(s) for s in specs]

    def cached(self) -> list[Member]:
        """The members loaded so far, in load order."""
        return list(self._members.values())

    def clear(self) -> None:
        """Forget every cached member (their models are freed once nobody else holds them)."""
        self._members.clear()
        self._views.clear()

    def release(self, keep: set[str]) -> int:
        """Forget the cached members (and their views) whose model is not in `keep` (model keys as
        `model_key` gives them); returns how many models were let go."""
        gone = [k for k in self._members if k[0] not in keep]
        for k in gone:
            del self._members[k]
        alive = {id(m) for m in self._members.values()}
        for k in [k for k in self._views if k[1] not in alive]:
            del self._views[k]
        return len(gone)


def model_key(spec: Any) -> str:
    """The cache key of the model a member spec names (a view reduced to its model; registry names as
    given, local folders as absolute paths)."""
    return _spec_key(str(model_of(spec)))


_default: MemberLoader | None = None


def default_loader() -> MemberLoader:
    """The process-wide loader behind `load` (float32 on the CPU unless a call says otherwise)."""
    global _default
    if _default is None:
        _default = MemberLoader()
    return _default


def load(spec: Any, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu",
         pack_weights: bool = True) -> Member:
    """`default_loader().member(spec, dtype, device, pack_weights)`: one cached `Member` per (spec,
    dtype, device, packing)."""
    return default_loader().member(spec, dtype=dtype, device=device, pack_weights=pack_weights)


def check_spec(spec: str) -> None:
    """Fail now, not when a run starts, on a model name that cannot load: a string must be a registry
    name (fetched or not: fetching is a separate step), an existing folder, or look like a hub id
    ("org/name"). Raises a one-line `ConfigError` with the closest registry name."""
    from runtime import registry

    spec = model_of(spec)  # a view's recipe is checked by split_member_spec (one-line errors)
    if spec in registry.REGISTRY or Path(spec).expanduser().is_dir():
        return
    if "/" in spec and not spec.startswith((".", "/", "~")):
        return  # a hub id: only loading can tell
    try:
        registry.get_spec(spec)
    except UnknownModelError as exc:
        raise ConfigError(str(exc)) from None


# ---- helpers ---------------------------------------------------------------------------------
def _load(spec: str, dtype: torch.dtype, device: str, pack_weights: bool = True) -> Member:
    from runtime import member as member_module  # looked up per call, so tests can replace load_member

    try:
        kw = {} if pack_weights else {"pack_weights": False}
        return member_module.load_member(spec, dtype=dtype, device=device, **kw)
    except UnknownModelError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        if "/" in spec and not Path(spec).expanduser().exists():
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"member '{spec}' is not a loadable hub id ({first}); check the id, or give "
                              "a registry name or a local save_pretrained folder") from None
        raise


def _spec_key(spec: str) -> str:
    """One key per model: registry names as given, local folders as their absolute path."""
    from runtime import registry

    if spec in registry.REGISTRY:
        return spec
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.is_dir() else spec


def _device(device: str | torch.device) -> str:
    from runtime.devices import check_device

    return check_device(device)


def _is_model(x: Any) -> bool:
    return isinstance(x, torch.nn.Module) and hasattr(x, "config") and callable(getattr(x, "get_output_embeddings", None))


def _is_tokenizer(x: Any) -> bool:
    return callable(x) and callable(getattr(x, "decode", None)) and not isinstance(x, torch.nn.Module)


def _check_pair(model: Any, tokenizer: Any) -> tuple[Any, Any]:
    if _is_model(model) and _is_tokenizer(tokenizer):
        return model, tokenizer
    if _is_tokenizer(model) and _is_model(tokenizer):
        raise ConfigError("member pair is (tokenizer, model): give (model, tokenizer)")
    raise ConfigError(f"member pair ({type(model).__name__}, {type(tokenizer).__name__}) is invalid: give "
                      "(a causal LM such as AutoModelForCausalLM.from_pretrained(...), its tokenizer)")


def _short(spec: Any) -> str:
    text = repr(spec)
    return text if len(text) <= 60 else text[:57] + "..."
