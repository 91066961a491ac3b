"""Keyword names that differ across the transformers 5.x releases we support (pyproject: >=5.0,<6).

transformers renamed a model's cache argument from `past_key_values` to `cache` during 5.x; a name
the model's `forward` does not declare is swallowed by its `**kwargs`, so passing the wrong one runs
the forward WITHOUT the cache (no error; the keys then miss every earlier token). `cache_kwargs`
names the one this model takes.
"""
from __future__ import annotations

import inspect

_CACHE_NAME: dict[type, str] = {}


def cache_kwargs(model, cache) -> dict:
    """{"cache": cache} or {"past_key_values": cache}, whichever `model.forward` declares (peft
    wrappers are looked through); cached per model class."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kind = type(base)
    if kind not in _CACHE_NAME:
        params = inspect.signature(base.forward).parameters
        _CACHE_NAME[kind] = "cache" if "cache" in params or "past_key_values" not in params else "past_key_values"
    return {_CACHE_NAME[kind]: cache}
