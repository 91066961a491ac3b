"""Tiny random models and tokenizers built in-process, for unit tests (no downloads).

- `char_tokenizer()`: one token per character (plus BOS/EOS), a character-level tokenizer.
- `bpe_tokenizer(vocab_size)`: a byte-level BPE trained on the fly on a small English corpus.
- `pieces_tokenizer(pieces, merges)`: a BPE over given pieces and merges (tiny vocabularies that
  spell the same characters differently, for exact-law tests across tokenizers).
- `tiny_model(arch, vocab_size, seed)`: a 2-layer llama / qwen2 / gemma3 (gemma3 with a sliding
  window of 4 on alternate layers, so sliding masks are exercised).
- `tiny_member(arch, tokenizer, seed)`: both wrapped as an `runtime.member.Member`.

`ADAFUSE_TEST_DEVICE=cuda` puts every tiny model on that device (default cpu): the same unit tests
then check the runtime, the speculative engine and its exact-law tests on an accelerator.
"""
from __future__ import annotations

import functools
import os
import string

import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? The answer is 72.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "Question: who wrote the origin of species? Answer: Charles Darwin",
    "Translate German to English: Guten Morgen, wie geht es dir? Good morning, how are you?",
    "1 + 2 = 3, 16 * 16 = 256, 100 - 1 = 99. She has 18 apples and 8 pears.",
    "In the beginning there was text, and the text was shared between models with different tokenizers.",
]
TEST_DEVICE = os.environ.get("ADAFUSE_TEST_DEVICE", "cpu")
CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"


@functools.lru_cache(maxsize=None)
def char_tokenizer():
    """A character-level fast tokenizer: every character of CHARS is one token; BOS=1, EOS=2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for ch in CHARS:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")


@functools.lru_cache(maxsize=None)
def bpe_tokenizer(vocab_size: int = 300):
    """A byte-level BPE tokenizer trained on CORPUS (leading-space word pieces, like GPT-2/Qwen)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


@functools.lru_cache(maxsize=None)
def pieces_tokenizer(pieces: tuple[str, ...], merges: tuple[tuple[str, str], ...], eos: str = "</s>"):
    """A BPE tokenizer whose vocabulary is exactly `pieces` (ids in that order; single characters and
    merged pieces, `eos` among them) and whose `merges` say how pieces combine; the text is not
    pre-split, so merges apply across the whole string. EOS = `eos`."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=list(merges)))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos)


def tiny_model(arch: str = "llama", vocab_size: int = 64, seed: int = 0, hidden: int = 32, layers: int = 2):
    """A small randomly initialised causal LM of the given architecture, fp32, eval mode, on TEST_DEVICE."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config

    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=1 if vocab_size > 2 else None, eos_token_id=2 if vocab_size > 2 else None,
                  tie_word_embeddings=False)
    if arch == "llama":
        cfg = LlamaConfig(**common)
    elif arch == "qwen2":
        cfg = Qwen2Config(**common)
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(**common, head_dim=8, sliding_window=4,
                               layer_types=["sliding_attention", "full_attention"] * (layers // 2) + ["full_attention"] * (layers % 2))
    else:
        raise ValueError(f"unknown tiny arch {arch!r}")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    # sharpen the random logits a little so greedy/sampled text is not uniform noise
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model.eval().to(TEST_DEVICE)


def tiny_member(arch: str = "llama", tokenizer=None, seed: int = 0, name: str | None = None, **kwargs):
    """A `Member` around `tiny_model`, with a vocabulary sized to the tokenizer."""
    from runtime.member import Member

    tokenizer = tokenizer if tokenizer is not None else char_tokenizer()
    model = tiny_model(arch, vocab_size=len(tokenizer), seed=seed, **kwargs)
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.config.bos_token_id = model.generation_config.bos_token_id = tokenizer.bos_token_id
    return Member(model, tokenizer, name=name or f"tiny-{arch}-{seed}")
