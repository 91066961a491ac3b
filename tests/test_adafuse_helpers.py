"""Test members for the word-level ensemble tests (no tests here).

- `scripted_member(tokenizer, script, ...)`: a model-free "LM" that, at output position i (counted
  from the end of the prompt, by position id), puts `scale` logits on the i-th token of its own
  encoding of `script`, then EOS. Its opinions are fully known, so the tests can pin exact outputs,
  gate decisions and choices across members with different tokenizers.
- `spacey_member(arch, tokenizer, seed)`: a tiny random LM with a bias towards tokens that start with
  whitespace, so it writes short words (random tiny models otherwise never end a word).
- `spacey_pair()`: a character-level and a BPE spacey member (the usual pair).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import torch

from runtime.member import Member
from runtime.testing import bpe_tokenizer, char_tokenizer, tiny_model


class ScriptedLM(torch.nn.Module):
    def __init__(self, script_ids: list[int], vocab_size: int, eos_id: int,
                 scale: float | Callable[[int], float] = 12.0, noise_seed: int = 0):
        super().__init__()
        self.script_ids = script_ids
        self.eos_id = eos_id
        self.scale = scale
        self.start = 0  # position of the first output token; set by `scripted_member`
        self.head = torch.nn.Linear(1, vocab_size, bias=False)
        g = torch.Generator().manual_seed(noise_seed)
        self.register_buffer("noise", torch.randn(4096, vocab_size, generator=g) * 0.5)
        self.config = SimpleNamespace(_name_or_path="scripted", layer_types=[], sliding_window=None)
        self.generation_config = SimpleNamespace(eos_token_id=eos_id)

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids, position_ids, logits_to_keep=0, **_):
        B, N = input_ids.shape
        pos = position_ids + 1 - self.start  # output index of the token predicted here
        logits = self.noise[position_ids.clamp(0, 4095)].clone()
        for b in range(B):
            for n in range(N):
                i = int(pos[b, n])
                if i < 0:
                    continue
                tok = self.script_ids[i] if i < len(self.script_ids) else self.eos_id
                s = self.scale(i) if callable(self.scale) else self.scale
                logits[b, n, tok] += s
        if isinstance(logits_to_keep, torch.Tensor):
            logits = logits[:, logits_to_keep]
        elif logits_to_keep:
            logits = logits[:, -int(logits_to_keep):]
        return SimpleNamespace(logits=logits)


def scripted_member(tokenizer, script: str, prompt: str, name: str, scale=12.0, noise_seed: int = 0) -> Member:
    """A Member that writes `script` after `prompt` (rows must share the prompt's length)."""
    ids = list(tokenizer(script, add_special_tokens=False)["input_ids"])
    eos = tokenizer.eos_token_id
    model = ScriptedLM(ids, len(tokenizer), eos, scale, noise_seed)
    member = Member(model, tokenizer, name=name)
    model.start = len(member.encode_prompt(prompt))
    return member


def spacey_member(arch: str, tokenizer, seed: int, name: str, boost: float = 6.0) -> Member:
    """A tiny random LM biased towards whitespace-initial tokens (short words, frequent boundaries)."""
    model = tiny_model(arch, vocab_size=len(tokenizer), seed=seed)
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.config.bos_token_id = model.generation_config.bos_token_id = tokenizer.bos_token_id
    old = model.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True, device=old.weight.device)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        for tok, idx in tokenizer.get_vocab().items():
            text = tokenizer.decode([idx])
            if text[:1] in (" ", "\n"):
                head.bias[idx] = boost
            if idx == tokenizer.eos_token_id:
                head.bias[idx] = -20.0  # no early stop: rows run to the length limit
    model.lm_head = head
    return Member(model, tokenizer, name=name)


def spacey_pair() -> tuple[Member, Member]:
    """The tests' usual pair of spacey members with different tokenizers: character-level llama, BPE qwen2."""
    return (spacey_member("llama", char_tokenizer(), 0, "char-llama", 3.0),
            spacey_member("qwen2", bpe_tokenizer(), 1, "bpe-qwen", 3.0))


def bpe_shared_pair() -> tuple[Member, Member]:
    """Two tiny LMs sharing one BPE: each other's words are often one token (scored from logits)."""
    return (spacey_member("llama", bpe_tokenizer(), 2, "bpe-llama", 3.0),
            spacey_member("qwen2", bpe_tokenizer(), 1, "bpe-qwen", 3.0))


def fresh_next_probs(member: Member, ids: list[int]) -> torch.Tensor:
    """The member's next-token law after `ids`, from a fresh forward (no cache): the reference."""
    with torch.no_grad():
        return member.model(input_ids=torch.tensor([ids], device=member.device)).logits[0, -1].float().softmax(-1)
