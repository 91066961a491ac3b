"""oneDNN-packed Linear layers compute the same function as nn.Linear (to float32 rounding)."""
import copy

import pytest
import torch
from torch import nn

from runtime import packed_linear
from runtime.packed_linear import PackedLinear, is_packed, native_bf16, pack_linear_weights, packing_available
from runtime.testing import char_tokenizer, tiny_model



def test_the_pinned_torch_packs_linear_layers():
    """torch 2.13.0's CPU build (pyproject's pin) has oneDNN's packed linear: every test here relies
    on it, so its absence is a failure, not a reason to skip them."""
    assert packing_available()


@pytest.mark.parametrize("rows", [1, 2, 3, 16, 70])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_matches_linear(rows, bias):
    torch.manual_seed(0)
    lin = nn.Linear(48, 96, bias=bias)
    packed = PackedLinear(lin)
    x = torch.randn(2, rows, 48)
    torch.testing.assert_close(packed(x), lin(x), atol=1e-5, rtol=1e-5)
    assert packed(x).shape == (2, rows, 96)
    # non-contiguous input
    xt = torch.randn(48, rows).t()
    torch.testing.assert_close(packed(xt), lin(xt), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_packed_model_matches_and_is_idempotent(arch):
    model = tiny_model(arch)
    ref = copy.deepcopy(model)
    n = pack_linear_weights(model)
    assert n == sum(type(m) is nn.Linear for m in ref.modules()) and n > 0
    assert is_packed(model) and not is_packed(ref)
    assert pack_linear_weights(model) == 0  # idempotent
    ids = torch.randint(4, 60, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, ref(input_ids=ids).logits, atol=1e-4, rtol=1e-4)


def test_bfloat16_models_are_left_alone_without_native_bf16(monkeypatch):
    monkeypatch.setattr(packed_linear, "native_bf16", lambda: False)
    model = tiny_model("llama").to(torch.bfloat16)
    assert pack_linear_weights(model) == 0 and not is_packed(model)


def test_float16_models_are_left_alone():
    model = tiny_model("llama").to(torch.float16)
    assert pack_linear_weights(model) == 0 and not is_packed(model)


@pytest.mark.skipif(not native_bf16(), reason="this CPU has no native bfloat16 (AVX512-BF16 / AMX)")
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_packed_bfloat16_model_matches_linear(arch):
    """Where the CPU computes bfloat16 natively, bfloat16 layers are packed too and compute the same
    function as bfloat16 `nn.Linear` (to bfloat16 rounding), in bfloat16."""
    model = tiny_model(arch).to(torch.bfloat16)
    ref = copy.deepcopy(model)
    assert pack_linear_weights(model) == sum(type(m) is nn.Linear for m in ref.modules()) > 0
    lin = next(m for m in model.modules() if isinstance(m, PackedLinear))
    assert lin.packed_weight.dtype == torch.bfloat16
    ids = torch.randint(4, 60, (2, 11))
    with torch.no_grad():
        got, want = model(input_ids=ids).logits, ref(input_ids=ids).logits
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


def test_int8_drafter_refuses_packed_member():
    from runtime.testing import tiny_member
    from specdec.drafters import quantize_int8

    m = tiny_member("llama")
    pack_linear_weights(m.model)
    with pytest.raises(ValueError, match="pack_weights=False"):
        quantize_int8(m)


def test_only_tokens_computes_the_masked_rows_and_zeros_the_rest():
    from runtime.packed_linear import only_tokens

    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    body, head = PackedLinear(lin), PackedLinear(lin, role="head")
    x = torch.randn(3, 5, 24)
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    want = torch.tensor([[0, 1], [1, 0], [0, 0]], dtype=torch.bool)
    with only_tokens(valid, want):
        y = body(x)
        h = head(x[:, :2])
        other_shape = body(x[:, :4])  # another leading shape: computed in full
    torch.testing.assert_close(y[valid], lin(x)[valid], atol=1e-5, rtol=1e-5)
    assert bool((y[~valid] == 0).all())
    torch.testing.assert_close(h[want], lin(x[:, :2])[want], atol=1e-5, rtol=1e-5)
    assert bool((h[~want] == 0).all())
    torch.testing.assert_close(other_shape, lin(x[:, :4]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(body(x), lin(x), atol=1e-5, rtol=1e-5)  # context gone
    with only_tokens(valid, want, compact_head=True) as run:
        compact = head(x[:, :2])
        assert run.compacted
    torch.testing.assert_close(compact, lin(x[:, :2])[want][None], atol=1e-5, rtol=1e-5)  # [1, 2, 40]
    with only_tokens(valid, torch.ones_like(want), compact_head=True) as run:  # all wanted: as usual
        assert head(x[:, :2]).shape == (3, 2, 40) and not run.compacted


def test_pack_marks_the_lm_head():
    model = tiny_model("llama")
    pack_linear_weights(model)
    assert model.get_output_embeddings().role == "head"
    assert {m.role for m in model.modules() if isinstance(m, PackedLinear)} == {"head", "body"}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("packed", [True, False])
def test_ragged_tree_forwards_equal_one_row_at_a_time(arch, packed):
    """Rows with different node counts in one forward (padding skipped by packed layers, LM head only
    where asked, grouped K/V attention) give each row the logits it gets alone."""
    from runtime.gqa_attention import use_gqa_sdpa
    from runtime.member import Member

    model = tiny_model(arch, vocab_size=64)
    if packed:
        pack_linear_weights(model)
    assert use_gqa_sdpa(model)
    m = Member(model, char_tokenizer(), name="t")
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    tokens = [[20, 21, 22, 23, 24], [25], [26, 27]]
    parents = [[-1, 0, 1, 0, 3], [-1], [-1, -1]]
    at = [[2, 4], [0], [1]]

    def run(rows, logits_at):
        st = m.start(prompts)
        tok = [t if b in rows else [] for b, t in enumerate(tokens)]
        par = [p if b in rows else [] for b, p in enumerate(parents)]
        lat = None if logits_at is None else [a if b in rows else [] for b, a in enumerate(at)]
        return st.forward_tree(tok, par, logits_at=lat)

    for logits_at in (None, at):
        together = run({0, 1, 2}, logits_at)
        for b in range(3):
            alone = run({b}, logits_at)
            n = len(tokens[b]) if logits_at is None else len(at[b])
            torch.testing.assert_close(together[b, :n], alone[b, :n], atol=1e-4, rtol=1e-4)


def test_only_tokens_state_is_per_thread():
    # members on different devices run their forwards in threads of their own, each inside its own
    # only_tokens block: one thread's mask must not leak into another's layers
    import threading
    from runtime import packed_linear

    inside, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def other() -> None:
        with packed_linear.only_tokens(torch.tensor([[True, False]])):
            inside.set()
            release.wait(5)
            seen["other"] = packed_linear._state.subsets.get("body")

    t = threading.Thread(target=other)
    t.start()
    inside.wait(5)
    seen["main"] = packed_linear._state.subsets.get("body")
    with packed_linear.only_tokens(torch.tensor([[False, True, True]])):
        seen["main_inside"] = packed_linear._state.subsets["body"][1].tolist()
    release.set()
    t.join()
    assert seen["main"] is None
    assert seen["main_inside"] == [1, 2]
    assert seen["other"][1].tolist() == [0]
