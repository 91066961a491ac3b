"""Distillation: teacher forcing scores exactly the action text + newline after the token policy's
prompt, and SFT on a teacher's choices makes plain generation + parsing reproduce them."""
import torch

from rlid.distill import DistillExample, DistillTrainer, read_examples, teacher_forced, write_examples
from rlid.lora import LoraSpec, add_lora
from rlid.token_policy import TokenPolicy
from rlid.types import DecisionState
from runtime.testing import char_tokenizer, tiny_member


def policy():
    member = tiny_member("llama", tokenizer=char_tokenizer(), seed=3, hidden=64)
    member.model.config.eos_token_id = member.tokenizer.eos_token_id
    return TokenPolicy(member, max_new_tokens=6)


STATES = [DecisionState("board one", ("up", "down", "left")), DecisionState("board two", ("up", "down", "left"))]


def test_teacher_forced_ids_are_prompt_then_action_and_newline():
    pol = policy()
    ex = DistillExample(STATES[0], "down")
    forced = teacher_forced(pol, ex)
    assert forced.prompt_ids == list(pol.prompt_ids(STATES[0])) and forced.index == 1
    assert pol.member.tokenizer.decode(forced.output_ids) == "down\n"


def test_sft_makes_generation_reproduce_the_teacher(tmp_path):
    torch.manual_seed(0)
    pol = policy()
    lora = add_lora(pol.member, LoraSpec(r=16, alpha=32, dropout=0.0, target_modules=("q_proj", "v_proj", "up_proj", "down_proj")))
    examples = [DistillExample(STATES[0], "down"), DistillExample(STATES[1], "left")]
    write_examples(tmp_path / "ex.jsonl", examples)
    assert read_examples(tmp_path / "ex.jsonl") == examples
    before = [a.index for a in pol.act(STATES, greedy=True)]
    log = DistillTrainer(pol, lora, examples, epochs=150, lr=1e-2, batch_size=2).run()
    assert log[-1]["nll"] < 0.3 * log[0]["nll"]
    after = [a.index for a in pol.act(STATES, greedy=True)]
    assert after == [1, 2] and before != after
