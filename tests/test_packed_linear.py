"""oneDNN-packed Linear layers compute the same function as nn.Linear (to float32 rounding)."""
import copy

import pytest
import torch
from torch import nn

from adafuse.packed_linear import PackedLinear, is_packed, pack_linear_weights, packing_available
from adafuse.testing import tiny_model

pytestmark = pytest.mark.skipif(not packing_available(), reason="torch built without oneDNN")


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


def test_non_float32_models_are_left_alone():
    model = tiny_model("llama").to(torch.bfloat16)
    assert pack_linear_weights(model) == 0 and not is_packed(model)


def test_int8_drafter_refuses_packed_member():
    from adafuse.testing import tiny_member
    from specdec.drafters import quantize_int8

    m = tiny_member("llama")
    pack_linear_weights(m.model)
    with pytest.raises(ValueError, match="pack_weights=False"):
        quantize_int8(m)
