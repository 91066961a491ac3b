"""Grouped K/V attention under our tree masks equals transformers' sdpa (which repeats K/V heads)."""
import copy

import pytest
import torch

from runtime.gqa_attention import NAME, use_gqa_sdpa
from runtime.testing import char_tokenizer, tiny_model


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_gqa_sdpa_equals_sdpa_on_tree_forwards(arch):
    from runtime.member import Member

    ref_model = tiny_model(arch).cpu()  # a CPU optimisation: other devices keep transformers' sdpa
    model = copy.deepcopy(ref_model)
    assert use_gqa_sdpa(model) and model.config._attn_implementation == NAME
    assert ref_model.config._attn_implementation == "sdpa"
    outs = []
    for mdl in (ref_model, model):
        st = Member(mdl, char_tokenizer(), name="t").start([[5, 6, 7, 8, 9], [10, 11]])
        tree = st.forward_tree([[20, 21, 22, 23], [24, 25]], [[-1, 0, -1, 2], [-1, 0]])
        st.accept([[0, 1], [0]])
        chain = st.append([[30, 31, 32], [33]])
        outs.append((tree, chain))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_only_sdpa_models_are_switched():
    model = tiny_model("llama")
    model.set_attn_implementation("eager")
    assert not use_gqa_sdpa(model) and model.config._attn_implementation == "eager"


def test_transformers_generate_with_multi_token_steps_is_unchanged():
    """transformers' own prompt-lookup generate (multi-token forwards on a cache, masks built by
    transformers) gives the same greedy tokens with the grouped attention as with sdpa."""
    ref_model = tiny_model("qwen2").cpu()
    model = copy.deepcopy(ref_model)
    assert use_gqa_sdpa(model)
    x = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    kw = dict(attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False, prompt_lookup_num_tokens=4,
              pad_token_id=0)
    assert torch.equal(model.generate(x, **kw), ref_model.generate(x, **kw))
