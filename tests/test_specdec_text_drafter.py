"""Cross-tokenizer drafting (`specdec.text_drafter.TextDrafter`, `runtime.retokenize`).

- the text <-> ids steps agree with full decodes / encodes while touching only the tail;
- greedy speculative decoding with a drafter of ANOTHER tokenizer equals plain greedy decoding, token
  for token (chains and trees, three tokenizer pairs, and a strong same-model drafter through text);
- at temperature > 0 the law of the first tokens equals the target's own, computed exactly by
  enumeration on a 6-token target vocabulary, with a drafter whose 5-token vocabulary spells the same
  characters differently (chi-square over 1500 seeded rows, as tests/test_specdec_engine_lossless.py);
  the same statistic rejects an engine that accepts drafts unverified.
"""
import functools
import random

import pytest
import torch
from test_specdec_engine_lossless import K, N, PROMPT, V, chi_square_pvalue, exact_law, sample_law, tv

from runtime.errors import ConfigError
from runtime.retokenize import IdsOfText, TextOfIds, appended_text, continuation_ids, decode_extension
from runtime.testing import CORPUS, bpe_tokenizer, char_tokenizer, pieces_tokenizer, tiny_member
from runtime.sampling import SamplingParams
from specdec.config import DecodeControl
from specdec.drafters import HybridDrafter, ModelDrafter, make_drafter
from specdec.engine import SpeculativeGenerator
from specdec.text_drafter import TextDrafter, fit_drafter
from specdec.tree import DraftTree, add_children, leaf_paths

pytestmark = pytest.mark.usefixtures("one_thread")

TARGET_PIECES = (("a", "b", "c", "ab", "ca", "</s>"), (("a", "b"), ("c", "a")))  # 6 ids (V of the law test)
DRAFTER_PIECES = (("a", "b", "c", "bc", "</s>"), (("b", "c"),))                # 5 ids, other merges


@functools.lru_cache(maxsize=None)
def law_members():
    """(target over TARGET_PIECES, drafter over DRAFTER_PIECES), moderately peaked random models."""
    target = tiny_member("llama", tokenizer=pieces_tokenizer(*TARGET_PIECES), seed=0, name="v6-target")
    drafter = tiny_member("qwen2", tokenizer=pieces_tokenizer(*DRAFTER_PIECES), seed=5, name="v5-drafter")
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(0.6)
        drafter.model.get_output_embeddings().weight.mul_(0.8)
    assert target.vocab_size == V
    return target, drafter


# ---- text <-> ids ---------------------------------------------------------------------------------
def test_text_of_ids_equals_a_full_decode_every_round():
    """Random byte-level ids (partial UTF-8 characters included) decoded piece by piece."""
    member = tiny_member("llama", tokenizer=bpe_tokenizer(), seed=0)
    rng = random.Random(0)
    words = [member.encode(w) for w in (" The", " héllo", " 🙂", " 16*16", "\n", " =", "é")]
    for _ in range(20):
        view, ids = TextOfIds(member), []
        for _ in range(12):
            piece = rng.choice(words) if rng.random() < 0.7 else [rng.randrange(len(member.tokenizer))]
            ids += piece[: rng.randint(1, len(piece))]  # cuts inside multi-byte characters too
            assert view.update(ids) == member.decode(ids)
        ids = ids[: rng.randint(1, len(ids))]  # a rollback re-decodes
        assert view.update(ids) == member.decode(ids)
    n = 5
    text = member.decode(list(range(10, 10 + n)))
    assert decode_extension(member, text, list(range(10, 20)), n) == member.decode(list(range(10, 20)))


def test_ids_of_text_reencode_only_the_tail():
    for tok in (bpe_tokenizer(), char_tokenizer(), bpe_tokenizer(400)):
        member = tiny_member("llama", tokenizer=tok, seed=0)
        view, text = IdsOfText(member), ""
        text = CORPUS[1]
        view.update(text)
        first = view.reencoded
        for word in CORPUS[2].split(" "):
            text += " " + word
            ids = view.update(text)
            assert member.decode(ids) == text
            assert ids == member.encode(text)  # whole words appended: the anchored encoding is the full one
        added = view.reencoded - first
        assert added < 2 * len(member.encode(CORPUS[2])) + 4 * len(CORPUS[2].split(" ")), added
        text = text[:30] + " rolled back"  # a change inside the text: back to an earlier boundary
        assert member.decode(view.update(text)) == text


@pytest.mark.parametrize("tok", [bpe_tokenizer, char_tokenizer], ids=["bpe", "char"])
def test_continuation_ids_continue_the_committed_ids(tok):
    """decode(committed + continuation) == committed text + addition, the committed ids unchanged,
    for committed ids cut anywhere (also inside words, where the boundary re-tokenises)."""
    member = tiny_member("llama", tokenizer=tok(), seed=0)
    rng = random.Random(1)
    for text in CORPUS:
        ids = member.encode(text)
        for _ in range(6):
            cut, extra = rng.randint(1, len(ids) - 1), rng.randint(1, 12)
            committed = ids[:cut]
            c_text = member.decode(committed)
            addition = text[len(c_text):len(c_text) + extra]
            cont = continuation_ids(member, committed, c_text, addition)
            assert cont is not None and member.decode(committed + cont) == c_text + addition
    # " 1" then "8": the canonical " 18" would merge; the committed " 1" stays
    committed = member.encode("Q: 1")
    cont = continuation_ids(member, committed, member.decode(committed), "8 apples")
    assert member.decode(committed + cont) == "Q: 18 apples"
    assert continuation_ids(member, committed, member.decode(committed), "") == []


def test_appended_text_stops_before_an_incomplete_character():
    member = tiny_member("llama", tokenizer=bpe_tokenizer(), seed=0)
    ids = member.encode("Weng earns")
    emoji = member.encode(" 🙂")
    assert len(emoji) > 1
    assert appended_text(member, ids, emoji) == " 🙂"
    assert appended_text(member, ids, emoji[:-1]) == " "
    assert appended_text(member, ids, []) == ""


def test_leaf_paths():
    tree = DraftTree()
    a, b = add_children(tree, 0, [5, 6], None)
    add_children(tree, a, [7, 8], None)
    assert leaf_paths(tree) == [[6], [5, 7], [5, 8]] and leaf_paths(DraftTree()) == []
    assert b == 2


# ---- wiring ---------------------------------------------------------------------------------------
def test_a_drafter_with_another_tokenizer_drafts_through_text():
    target = tiny_member("llama", tokenizer=char_tokenizer(), name="char-target")
    other = tiny_member("llama", tokenizer=bpe_tokenizer(), name="bpe-drafter")
    g = SpeculativeGenerator(target, ModelDrafter(other, stop_below=0.1))
    assert isinstance(g.drafter, TextDrafter) and g.drafter.member is other and g.stop_below == 0.1
    assert g.drafter_member is other
    hybrid = fit_drafter(HybridDrafter(ModelDrafter(other)), target)
    assert isinstance(hybrid.model, TextDrafter)
    same = SpeculativeGenerator(target, make_drafter(tiny_member("qwen2", tokenizer=char_tokenizer(), seed=3)))
    assert type(same.drafter) is ModelDrafter


def test_cli_generate_with_a_drafter_of_another_tokenizer(tmp_path, capsys):
    """`adafuse generate --model T --drafter D` with D's tokenizer unlike T's: the greedy text of
    plain decoding, through a TextDrafter."""
    from eval.cli import main

    folders = []
    for name, member in (("target", tiny_member("llama", tokenizer=bpe_tokenizer(), seed=0)),
                         ("drafter", tiny_member("qwen2", tokenizer=char_tokenizer(), seed=3))):
        folders.append(str(tmp_path / name))
        member.model.save_pretrained(folders[-1])
        member.tokenizer.save_pretrained(folders[-1])
    base = ["generate", "--model", folders[0], "--prompt", "The quick brown", "--max_new_tokens", "16"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main(base + ["--drafter", folders[1], "--depth", "4"]) == 0
    spec = capsys.readouterr().out
    assert spec.splitlines()[0] == plain.splitlines()[0] and "drafter='text(" in spec and "block efficiency" in spec


# ---- greedy equality --------------------------------------------------------------------------------
PAIRS = {"char<-bpe": (char_tokenizer, bpe_tokenizer), "bpe<-char": (bpe_tokenizer, char_tokenizer),
         "bpe300<-bpe400": (bpe_tokenizer, lambda: bpe_tokenizer(400))}


@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("shape", [dict(depth=4), dict(depth=3, num_drafts=2)], ids=["chain", "tree"])
def test_greedy_equals_plain_decoding_token_for_token(pair, shape):
    ttok, dtok = PAIRS[pair]
    target = tiny_member("llama", tokenizer=ttok(), seed=0)
    prompts = [target.encode_prompt(p) for p in CORPUS[:4]]
    control = DecodeControl(stop_at_eos=False)
    plain = SpeculativeGenerator(target, None).decode(target.start(prompts), 40, control=control)
    for drafter in (tiny_member("qwen2", tokenizer=dtok(), seed=3), target):  # a random one, the target itself
        text = TextDrafter(drafter, stop_below=0.0)
        g = SpeculativeGenerator(target, text, **shape)
        res = g.decode(target.start(prompts), 40, control=control)
        assert res.ids == plain.ids
        if drafter is target and pair.startswith("char"):  # same text, same model: long accepted runs
            assert sum(s.accepted for s in res.stats) > len(prompts) * 20


def test_drafter_cache_follows_the_text_not_the_whole_prefix():
    """The drafter's KV state is kept across rounds: over a 60-token decode it is fed the prompt once
    plus its drafts and the re-fed tails, far less than re-encoding the prefix every round; the text
    is re-encoded only in tails too."""
    target = tiny_member("llama", tokenizer=bpe_tokenizer(), seed=0)
    twin = tiny_member("llama", tokenizer=bpe_tokenizer(400), seed=0)  # another tokenizer, same sizes
    text = TextDrafter(twin, stop_below=0.0)
    g = SpeculativeGenerator(target, text, depth=4)
    prompt = target.encode_prompt(CORPUS[7] + " " + CORPUS[1])
    res = g.decode(target.start([prompt]), 60, control=DecodeControl(stop_at_eos=False))
    rounds = res.stats[0].steps
    fwd, fed = twin.counters.snapshot()
    n_prompt = len(twin.encode(target.decode(prompt)))
    assert rounds > 10 and fed < n_prompt + rounds * (4 + 1 + 6), (fed, n_prompt, rounds)
    assert fed < n_prompt * rounds / 4  # what re-encoding the prefix every round would cost, by far
    assert text.rows[0].drafter.reencoded < n_prompt + rounds * 12


# ---- exact law at temperature > 0 ---------------------------------------------------------------------
WARPS = {"T1": (1.0, 0, 1.0), "warped": (0.8, 4, 0.9)}


@functools.lru_cache(maxsize=None)
def law_for(warp):
    return exact_law(law_members()[0], *WARPS[warp])


LAW_CASES = [  # (drafter: "other" | "self", num_drafts, depth, sample, warp)
    ("other", 1, 3, False, "T1"),
    ("other", 2, 2, False, "warped"),
    ("other", 2, 3, True, "T1"),
    ("self", 1, 3, False, "T1"),
    ("self", 2, 2, True, "warped"),
]


@pytest.mark.parametrize("who,n,depth,sample,warp", LAW_CASES)
def test_cross_tokenizer_drafts_are_lossless(who, n, depth, sample, warp):
    target, other = law_members()
    drafter = TextDrafter(other if who == "other" else target, stop_below=0.0, sample=sample)
    g = SpeculativeGenerator(target, drafter, num_drafts=n, depth=depth)
    counts, stats = sample_law(g, *WARPS[warp], max_new=max(depth + 1, K))
    accepted = sum(s.accepted for s in stats)
    assert sum(sum(s.attempts_by_depth) for s in stats) > N and accepted > N // 4  # it drafted, and it helped
    law = law_for(warp)
    assert chi_square_pvalue(counts, law) > 1e-3, f"TV={tv(counts, law):.4f}"


def test_the_law_test_rejects_unverified_drafts(monkeypatch):
    """An engine that takes every deterministic draft's first child unverified is not lossless: the
    same statistic must reject it."""
    target, other = law_members()
    g = SpeculativeGenerator(target, TextDrafter(other, stop_below=0.0), num_drafts=1, depth=2)
    monkeypatch.setattr(DraftTree, "is_deterministic", lambda self, node: False)
    g._verify = lambda p, q, drafts, gen: (int(drafts[0]), 0)
    counts, _ = sample_law(g, *WARPS["T1"], max_new=K)
    assert chi_square_pvalue(counts, law_for("T1")) < 1e-6


def test_law_prompt_spells_text_in_both_tokenizers():
    target, other = law_members()
    text = target.decode(PROMPT)
    assert set(text) <= set("abc") and other.encode(text) != target.encode(text)


@pytest.mark.parametrize("warp", list(WARPS))
def test_deterministic_drafts_reproduce_plain_sampling_seed_for_seed(warp):
    """Stronger than the law: a deterministic tree is verified by the one draw y ~ p that plain
    sampling makes per token, so with the same generators the speculative output IS the plain one."""
    target, other = law_members()
    prompts = [PROMPT] * 64
    runs = []
    for drafter in (None, TextDrafter(other, stop_below=0.0), TextDrafter(target, stop_below=0.0)):
        g = SpeculativeGenerator(target, drafter, num_drafts=2, depth=3)
        gens = [torch.Generator().manual_seed(7 + i) for i in range(len(prompts))]
        res = g.decode(target.start(prompts), 12, T_SAMPLING[warp], gens, DecodeControl(stop_at_eos=False))
        runs.append(res.ids)
    assert runs[1] == runs[0] and runs[2] == runs[0]


T_SAMPLING = {w: SamplingParams(*WARPS[w]) for w in WARPS}


# ---- real models ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("target_name,drafter_spec", [("qwen2.5-coder-0.5b", "smollm2-135m"),
                                                      ("gemma3-270m", "smollm2-135m"),
                                                      ("gemma3-270m", "smollm2-135m@fp16")])
def test_real_smollm2_drafts_for_another_tokenizer_greedy_equality(target_name, drafter_spec):
    """smollm2-135m (49k-token BPE; also with its weights in float16) drafts for qwen2.5-coder-0.5b
    (151k BPE) or gemma3-270m (262k SentencePiece): 3 GSM8K + 3 WMT22 prompts x 32 tokens, the ids
    equal plain greedy decoding, and it drafts well enough to accept more than one token per target
    forward on average."""
    import json

    from runtime.member import load_member

    from conftest import model_or_skip, require_data

    for name in ("smollm2-135m", target_name):
        model_or_skip(name)
    data = require_data()
    qs = [json.loads(line)["question"] for line in (data / "gsm8k" / "test.jsonl").open()][:3]
    de = [line.strip() for line in (data / "wmt22" / "de-en.src").open()][:3]
    prompts = qs + [f"Translate the following German text into English.\n\nGerman: {s}\nEnglish:" for s in de]
    target = load_member(target_name, dtype="float32")
    g = SpeculativeGenerator(target, make_drafter(drafter_spec))
    assert isinstance(g.drafter, TextDrafter)
    ids = [target.encode_prompt(p) for p in prompts]
    control = DecodeControl(stop_at_eos=False)
    plain = SpeculativeGenerator(target, None).decode(target.start(ids), 32, control=control)
    res = g.decode(target.start(ids), 32, control=control)
    assert res.ids == plain.ids
    tokens, steps = sum(s.tokens for s in res.stats), sum(s.steps for s in res.stats)
    assert tokens / steps > 1.5, tokens / steps


def test_registry_drafters_of_another_tokenizer_pass_the_checks_before_loading():
    """Configs and `adafuse generate` take a registry drafter whose tokenizer differs from its
    target's (it drafts through text); only a bad spec is refused."""
    import argparse

    from adafuse.cli_generate import check_args
    from eval.methods import check_drafter

    for drafter in ("smollm2-135m", "hybrid:smollm2-135m", "smollm2-135m@int8", "smollm2-135m@fp16"):
        check_drafter("qwen2.5-coder-0.5b", drafter)
    with pytest.raises(ConfigError, match="no drafter kind"):
        check_drafter("qwen2.5-coder-0.5b", "foo:bar")
    args = argparse.Namespace(model="qwen2.5-coder-1.5b", drafter="smollm2-135m", members=None, prompt=["x"],
                              max_new_tokens=8, temperature=0.0, top_k=0, top_p=1.0, seed=0)
    check_args(args)
