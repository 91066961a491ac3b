"""MemberText: after every extension the cache equals a fresh encoding of the same text."""
import random

import torch

from runtime.testing import bpe_tokenizer, char_tokenizer, tiny_member
from runtime.text_state import MemberText, common_prefix_len

WORDS = [" The", " quick", " 18", " apples", ",", " 16*16", " =", " 256", ".", "\n", " Answer:", " Natalia",
         "clips", " $12", " 1", "8", " years", " old"]


def fresh_last_logits(member, ids):
    with torch.no_grad():
        return member.model(input_ids=torch.tensor([ids], device=member.device)).logits[0, -1].float()


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_len([], [1]) == 0


def test_incremental_state_equals_fresh_encoding_every_round():
    rng = random.Random(0)
    for tok in (bpe_tokenizer(), char_tokenizer()):
        member = tiny_member("qwen2", tokenizer=tok, seed=2)
        prompts = ["Question: how many clips?", "Translate: Guten Morgen"]
        mt = MemberText(member, prompts)
        for _ in range(8):
            pieces = [rng.choice(WORDS) if rng.random() < 0.8 else "" for _ in prompts]
            mt.extend(pieces)
            for b in range(2):
                assert mt.state.ids[b] == mt.prompt_ids[b] + member.encode(mt.texts[b])
                probs = mt.state.next_probs(1.0)[b]
                ref = fresh_last_logits(member, mt.state.ids[b]).softmax(-1)
                torch.testing.assert_close(probs, ref, atol=2e-5, rtol=1e-4)


def test_boundary_retokenisation_is_repaired():
    tok = bpe_tokenizer()
    member = tiny_member("llama", tokenizer=tok, seed=1)
    mt = MemberText(member, ["Q:"])
    # feed " 1" then "8": canonical encoding of " 18" may merge; cache must follow
    mt.extend([" 1"])
    mt.extend(["8"])
    assert mt.state.ids[0] == mt.prompt_ids[0] + member.encode(" 18")
    # adopt: tokens the member generated itself, overshooting the committed text
    extra = member.encode(" apples and")
    mt.state.append([extra])
    mt.adopt(0, " apples")
    assert mt.texts[0] == " 18 apples"
    assert mt.state.ids[0] == mt.prompt_ids[0] + member.encode(" 18 apples")
