"""The cache keyword a model takes (transformers renamed it during 5.x; a wrong name is silently
swallowed and the forward runs without its cache), and draws that happen where their generator lives."""
import torch
from torch import nn

from runtime.hf_compat import cache_kwargs
from runtime.sampling import on_generator
from runtime.testing import tiny_model


class OldStyle(nn.Module):
    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None, **kwargs):
        return past_key_values


class NewStyle(nn.Module):
    def forward(self, input_ids, attention_mask=None, cache=None, use_cache=None, **kwargs):
        return cache


class Wrapped(nn.Module):
    """A peft-like wrapper: the base model's signature decides."""

    def __init__(self, base):
        super().__init__()
        self.base = base

    def get_base_model(self):
        return self.base

    def forward(self, *args, **kwargs):
        return self.base(*args, **kwargs)


def test_the_cache_reaches_the_model_under_either_name():
    marker = object()
    for model in (OldStyle(), NewStyle(), Wrapped(OldStyle()), Wrapped(NewStyle())):
        assert model(torch.zeros(1, 1), **cache_kwargs(model, marker)) is marker
    assert list(cache_kwargs(OldStyle(), marker)) == ["past_key_values"]
    assert list(cache_kwargs(NewStyle(), marker)) == ["cache"]


def test_this_transformers_models_take_their_cache():
    """The installed transformers' models: the named keyword is one their forward declares."""
    import inspect

    model = tiny_model("qwen2")
    (name,) = cache_kwargs(model, None)
    assert name in inspect.signature(model.forward).parameters


def test_on_generator_moves_to_the_generators_device_only_when_given():
    t = torch.ones(3)
    assert on_generator(t, None) is t
    g = torch.Generator(device="cpu").manual_seed(0)
    assert on_generator(t, g).device == torch.device("cpu")
