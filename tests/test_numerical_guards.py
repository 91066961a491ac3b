"""NaN / inf logits from a member (an overflow, broken weights) stop with one error naming the member
instead of sampling garbage; filler positions (padding) never trigger it. Tiny in-process models."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eval.testing import error_text

from runtime.errors import NonFiniteLogitsError
from runtime.testing import tiny_member


def _poison(member, value: float = float("nan"), after_calls: int = 0, where=lambda out: out[..., 3]):
    """Make the member's LM head write `value` into `where(out)` from its (after_calls+1)-th call on."""
    calls = {"n": 0}

    def hook(module, inputs, out):
        calls["n"] += 1
        if calls["n"] > after_calls:
            out = out.clone()
            where(out).fill_(value)
        return out

    return member.model.get_output_embeddings().register_forward_hook(hook)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logits_stop_generation_naming_the_member(one_thread, value: float) -> None:
    member = tiny_member("llama", seed=1, name="tiny-a")
    _poison(member, value, after_calls=3)  # the prefill and two steps are fine
    with pytest.raises(NonFiniteLogitsError, match=r"member 'tiny-a' gave NaN/inf logits \(row 0, after \d+ tokens\)"):
        member.generate(["Question: what is 2 + 2?"], max_new_tokens=8, temperature=0.7, seed=0)
    member.model.to(torch.bfloat16)
    with pytest.raises(NonFiniteLogitsError, match="its activations overflow in bfloat16: load it in float32"):
        member.generate(["Question: what is 2 + 2?"], max_new_tokens=8)


def test_the_row_is_named_and_padding_is_not_checked(one_thread) -> None:
    member = tiny_member("qwen2", seed=2, name="tiny-b")
    state = member.start([member.encode("The quick brown fox"), member.encode("1 + 2 = 3")])
    # append rows of 3 and 1 tokens: row 1's positions 1 and 2 are padding, their logits filler
    hook = _poison(member, where=lambda out: out[1, 1:])
    logits = state.append([member.encode(" ju"), member.encode(",")])
    assert torch.isfinite(logits[0]).all() and torch.isfinite(logits[1, 0]).all()
    hook.remove()
    _poison(member, where=lambda out: out[1, :1])
    with pytest.raises(NonFiniteLogitsError, match=r"member 'tiny-b' gave NaN/inf logits \(row 1, after 10 tokens\)"):
        state.append([member.encode("mps"), member.encode(" ")])


def test_speculative_drafter_and_ensemble_members_are_guarded(one_thread) -> None:
    from adafuse.ensemble import Ensemble
    from specdec.drafters import make_drafter
    from specdec.engine import SpeculativeGenerator

    target, drafter = tiny_member("llama", seed=3, name="target"), tiny_member("llama", seed=4, name="drafter")
    _poison(drafter, after_calls=1)
    gen = SpeculativeGenerator(target, make_drafter(drafter))
    with pytest.raises(NonFiniteLogitsError, match="member 'drafter'"):
        gen.generate(["In the beginning there was text"], max_new_tokens=12)
    lead, other = tiny_member("llama", seed=5, name="lead"), tiny_member("gemma3", seed=6, name="other")
    _poison(other, float("inf"))
    with pytest.raises(NonFiniteLogitsError, match="member 'other'"):
        Ensemble([lead, other], method="word-fixed").generate(["Question: who wrote it? Answer:"], max_new_tokens=6)


def test_cli_reports_one_line(tmp_path: Path, capsys, one_thread) -> None:
    """A saved model whose LM head is NaN: `adafuse generate` stops with one line, exit 2."""
    from eval.cli import main

    member = tiny_member("llama", seed=7)
    with torch.no_grad():
        member.model.get_output_embeddings().weight.fill_(float("nan"))
    folder = tmp_path / "nan-model"
    member.model.save_pretrained(folder)
    member.tokenizer.save_pretrained(folder)
    capsys.readouterr()
    assert main(["generate", "--model", str(folder), "--prompt", "hello", "--max_new_tokens", "3"]) == 2
    err = error_text(capsys.readouterr().err).strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: member 'nan-model' gave NaN/inf logits (row 0, after ")
    assert "so nothing can be sampled; its weights hold NaN/inf or overflow" in err[0]
