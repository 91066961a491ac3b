"""Frozen layers packed while LoRA trains (`pack_frozen_linear_weights`, `LoraAdapter.pack_frozen`):
the same logits and the same LoRA gradients as the plain layers, to float rounding; a packed model
refuses to take the merged adapter."""
import pytest
import torch

from rlid.lora import LoraSpec, add_lora
from runtime.errors import ConfigError
from runtime.packed_linear import PackedLinear
from runtime.testing import tiny_member

SPEC = LoraSpec(r=4, alpha=8, target_modules=("q_proj", "v_proj"))


def adapted(seed: int = 5):
    member = tiny_member("llama", seed=seed, hidden=64)
    lora = add_lora(member, SPEC, seed=0)
    with torch.no_grad():
        for i, p in enumerate(lora.parameters()):
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.1)
    return member, lora


def loss_and_grads(member, lora, ids):
    lora.peft_model.zero_grad(set_to_none=True)
    logits = member.model(input_ids=ids).logits.float()
    loss = torch.log_softmax(logits, -1)[..., 3].sum()
    loss.backward()
    return logits.detach(), [p.grad.clone() for p in lora.parameters()]


def test_packed_frozen_layers_give_the_same_logits_and_lora_gradients():
    ids = torch.randint(5, 40, (3, 9), generator=torch.Generator().manual_seed(1))
    plain_member, plain = adapted()
    packed_member, packed = adapted()
    count = packed.pack_frozen()
    kinds = {name.rsplit(".", 1)[-1] for name, m in packed_member.model.named_modules() if isinstance(m, PackedLinear)}
    assert count > 0 and {"base_layer", "up_proj", "down_proj", "gate_proj"} <= kinds
    assert all(p.requires_grad for p in packed.parameters()) and len(packed.parameters()) == len(plain.parameters())
    want_logits, want_grads = loss_and_grads(plain_member, plain, ids)
    got_logits, got_grads = loss_and_grads(packed_member, packed, ids)
    assert torch.allclose(got_logits, want_logits, atol=1e-4, rtol=1e-4)
    for g, w in zip(got_grads, want_grads):
        assert torch.allclose(g, w, atol=1e-4, rtol=1e-3), float((g - w).abs().max())
    assert max(float(g.abs().max()) for g in got_grads) > 1e-3   # the gradients are not all zero


def test_no_grad_forward_and_reference_policy_work_packed():
    ids = torch.randint(5, 40, (2, 7), generator=torch.Generator().manual_seed(2))
    plain_member, plain = adapted()
    packed_member, packed = adapted()
    packed.pack_frozen()
    with torch.no_grad(), plain.reference(), packed.reference():
        assert torch.allclose(packed_member.model(input_ids=ids).logits, plain_member.model(input_ids=ids).logits, atol=1e-4)


def test_a_packed_model_refuses_the_merge():
    _, lora = adapted()
    lora.pack_frozen()
    with pytest.raises(ConfigError, match="freshly loaded model"):
        lora.merge_for_inference()
