"""Keyword names that differ across the transformers 5.x releases we support (pyproject: >=5.0,<6).

transformers renamed a model's cache argument from `past_key_values` to `cache` during 5.x; a name
the model's `forward` does not declare is swallowed by its `**kwargs`, so passing the wrong one runs
the forward WITHOUT the cache (no error; the keys then miss every earlier token). `cache_kwargs`
names the one this model takes; `forward_params` what a forward declares.
"""
from __future__ import annotations

import inspect

_PARAMS: dict[type, frozenset[str]] = {}


def forward_params(model) -> frozenset[str]:
    """The keyword names `model.forward` declares (peft wrappers are looked through); cached per class."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kind = type(base)
    if kind not in _PARAMS:
        _PARAMS[kind] = frozenset(inspect.signature(base.forward).parameters)
    return _PARAMS[kind]


def cache_kwargs(model, cache) -> dict:
    """{"cache": cache} or {"past_key_values": cache}, whichever `model.forward` declares."""
    params = forward_params(model)
    return {"cache" if "cache" in params or "past_key_values" not in params else "past_key_values": cache}
