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


# ---- batch-invariant rows -----------------------------------------------------------------------------
def _cpu_member(arch: str, dtype: torch.dtype, seed: int = 3):
    """A tiny member as `load_member` sets up a CPU model: packed linears, grouped attention."""
    from runtime.member import Member
    from runtime.packed_linear import pack_linear_weights
    from runtime.testing import bpe_tokenizer

    tok = bpe_tokenizer()
    model = tiny_model(arch, vocab_size=len(tok), seed=seed, hidden=64, layers=2).cpu().to(dtype)
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    pack_linear_weights(model)
    use_gqa_sdpa(model)
    return Member(model, tok, name=f"tiny-{arch}")


@pytest.fixture
def invariant():
    from runtime import gqa_attention

    before = gqa_attention.ENABLED
    gqa_attention.batch_invariant(True)
    yield
    gqa_attention.batch_invariant(before)


PROMPTS = ["Question: 1 plus 5?", "Natalia sold clips to 48 of her friends in April, and then", "The quick",
           "Translate German to English: Guten Morgen", "In the beginning there was text, and", "1 + 2 =",
           "Weng earns $12 an hour for babysitting.", "Question: who wrote the origin of species? Answer:"]


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_tokens_do_not_depend_on_its_batch(arch, dtype, invariant, one_thread):
    """Batch-invariant mode: each prompt's greedy tokens alone equal its tokens in batches of 3 and 8
    (padded, rows finishing at different times) and as a row beside two other views, bit for bit."""
    from adafuse.methods import get_method, run_method
    from runtime.views import make_view, parse_view

    member = _cpu_member(arch, dtype)
    kw = dict(max_new_tokens=12)
    alone = [member.generate([p], **kw)[0].text for p in PROMPTS]
    for size in (3, 8):
        batched = [o.text for i in range(0, len(PROMPTS), size) for o in member.generate(PROMPTS[i: i + size], **kw)]
        assert batched == alone, size
    views = [make_view(member, parse_view({"system": "A."})), member, make_view(member, parse_view({"system": "Be."}))]
    outs = run_method(get_method("view-vote"), views, PROMPTS, **kw)
    assert [next(s.text for s in o.trace.samples if s.by == member.name) for o in outs] == alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_rows_sums_do_not_depend_on_how_many_rows_share_the_call(dtype, invariant):
    from runtime.packed_linear import PackedLinear

    layer = torch.nn.Linear(96, 160).to(dtype)
    packed = PackedLinear(layer)
    x = torch.randn(48, 96).to(dtype)
    ref = torch.cat([packed(x[i: i + 1]) for i in range(48)])
    for m in (2, 3, 7, 16, 48):
        assert torch.equal(torch.cat([packed(x[i: i + m]) for i in range(0, 48, m)]), ref), m


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_logits_are_the_same_bits_alone_and_padded_in_a_batch(arch, dtype, invariant, one_thread):
    """The sensitive form of the property (tiny models rarely flip a greedy token): the prompt's and
    the next step's logits of each row, alone vs in a padded batch of 8, bit for bit. (With the
    row-wise attention off, most rows differ in their last bits: SDPA over padded keys.)"""
    member = _cpu_member(arch, dtype)
    ids = [member.encode_prompt(p) for p in PROMPTS]

    def logits(rows):
        state = member.start(rows)
        first = state.last_logits.clone()
        state.append([[5]] * len(rows), return_logits=False)
        return torch.cat([first[:, None], state.last_logits[:, None]], 1)

    batched = logits(ids)
    for b, row in enumerate(ids):
        assert torch.equal(logits([row])[0], batched[b]), b
