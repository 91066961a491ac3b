"""GrowableLayer: the same keys/values as transformers' DynamicLayer under any mix of appends, crops
and assignments, without ever writing into a tensor it was handed; a model runs on it unchanged."""
import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from runtime.hf_compat import cache_kwargs
from runtime.kv_cache import MIN_CAPACITY, GrowableCache, GrowableLayer, grown_capacity
from runtime.testing import tiny_member

B, H, D = 2, 3, 4


def states(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(B, H, n, D, generator=gen), torch.randn(B, H, n, D, generator=gen)


@pytest.mark.parametrize("seed", range(20))
def test_random_appends_crops_and_assignments_match_dynamic_layer(seed):
    gen = torch.Generator().manual_seed(seed)
    ours, ref = GrowableLayer(), DynamicLayer()
    handed_out = []  # (tensor we assigned, a copy of its content at that time)
    for _ in range(40):
        op = int(torch.randint(0, 10, (1,), generator=gen))
        length = ref.get_seq_length()
        if op < 6 or length == 0:
            k, v = states(int(torch.randint(1, 40, (1,), generator=gen)), gen)
            got, want = ours.update(k, v), ref.update(k, v)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        elif op < 9:
            n = int(torch.randint(0, length + 1, (1,), generator=gen))
            ours.crop(-n)
            ref.crop(-n)
        else:  # what KVState.compact does: gather, then assign
            idx = torch.sort(torch.randperm(length, generator=gen)[: max(length // 2, 1)]).values
            k, v = ref.keys[:, :, idx].clone(), ref.values[:, :, idx].clone()
            ours.keys, ours.values = k, v
            ref.keys, ref.values = k.clone(), v.clone()
            handed_out.append((k, k.clone()))
        assert ours.get_seq_length() == ref.get_seq_length()
        if ref.get_seq_length():
            torch.testing.assert_close(ours.keys, ref.keys, rtol=0, atol=0)
            torch.testing.assert_close(ours.values, ref.values, rtol=0, atol=0)
    for tensor, content in handed_out:
        torch.testing.assert_close(tensor, content, rtol=0, atol=0)


def test_appends_write_in_place_until_the_capacity_is_reached():
    layer = GrowableLayer()
    gen = torch.Generator().manual_seed(0)
    layer.update(*states(10, gen))
    buffer = layer.keys.untyped_storage().data_ptr()
    for _ in range(MIN_CAPACITY - 10):
        layer.update(*states(1, gen))
    assert layer.keys.untyped_storage().data_ptr() == buffer  # no re-allocation up to the capacity
    layer.update(*states(1, gen))
    assert layer.keys.untyped_storage().data_ptr() != buffer
    assert layer.get_seq_length() == MIN_CAPACITY + 1
    assert grown_capacity(MIN_CAPACITY + 1, MIN_CAPACITY) == MIN_CAPACITY + MIN_CAPACITY // 2


def test_mismatched_assignment_is_refused():
    layer = GrowableLayer()
    with pytest.raises(ValueError, match="same length"):
        layer.keys, layer.values = torch.zeros(B, H, 3, D), torch.zeros(B, H, 4, D)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_model_decodes_the_same_on_both_caches(arch):
    m = tiny_member(arch)
    ids = torch.randint(4, m.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1)).to(m.device)
    outs = []
    for cache in (DynamicCache(), GrowableCache()):
        with torch.no_grad():
            out = m.model(input_ids=ids, use_cache=True, **cache_kwargs(m.model, cache))
            steps = [out.logits[:, -1]]
            for _ in range(5):
                nxt = steps[-1].argmax(-1, keepdim=True)
                steps.append(m.model(input_ids=nxt, use_cache=True, **cache_kwargs(m.model, cache)).logits[:, -1])
        outs.append(torch.stack(steps))
    assert all(type(layer) is GrowableLayer for layer in cache.layers) and len(cache.layers) > 0
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
