"""Token-union (UniTE-style) baseline: fusion by string over different tokenizers, text invariants,
greedy equality with a single member, batch invariance, option errors."""
import pytest
import torch

from runtime.errors import ConfigError
from runtime.kv_state import KVState
from adafuse.methods import token_union as tu
from runtime.testing import bpe_tokenizer, char_tokenizer, tiny_member

PROMPTS = ["Question: how many clips?", "The quick"]


def clean_bpe_member(arch="qwen2", seed=1, name="bpe"):
    """A tiny BPE member whose head never emits partial-UTF-8 byte tokens (token-union cannot commit
    those as text), so plain greedy decoding is comparable."""
    m = tiny_member(arch, tokenizer=bpe_tokenizer(), seed=seed, name=name)
    bad = [i for i in range(len(m.tokenizer)) if "\ufffd" in m.tokenizer.decode([i])]
    old = m.model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True, device=old.weight.device)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[bad] = -1e4
    m.model.lm_head = head
    return m


def char_member(seed=0, name="char", arch="llama"):
    return tiny_member(arch, tokenizer=char_tokenizer(), seed=seed, name=name)


def run(members, prompts=PROMPTS, **kw):
    args = dict(max_new_tokens=12, stop=[], temperature=0.0, seed=None, weights=None, lead=0, chat=None)
    args.update(kw)
    return tu.generate(members, prompts, **args)


# ---- scripted distributions -------------------------------------------------------------------
def token_of(member, text):
    ids = member.encode(text)
    assert len(ids) == 1 and member.tokenizer.decode(ids) == text, (member.name, text, ids)
    return ids[0]


@pytest.fixture
def scripted(monkeypatch):
    """Replace `KVState.next_probs` by scripted distributions {text or token id or None (EOS): prob}
    per member name (a dict, or a list with one dict per step); record each member's ids at every
    step."""
    script: dict = {}
    seen: dict = {}

    def next_probs(self, temperature=1.0, top_k=0, top_p=1.0):
        name = self.member.name
        seen.setdefault(name, []).append([list(r) for r in self.ids])
        spec = script[name]
        spec = spec[min(len(seen[name]) - 1, len(spec) - 1)] if isinstance(spec, list) else spec
        probs = torch.zeros(self.batch_size, self.member.vocab_size)
        for text, p in spec.items():
            if text is None:
                tok = self.member.tokenizer.eos_token_id
            else:
                tok = text if isinstance(text, int) else token_of(self.member, text)
            probs[:, tok] = p
        return probs

    monkeypatch.setattr(KVState, "next_probs", next_probs)
    return script, seen


# ---- fusion -----------------------------------------------------------------------------------
def test_fuse_union_renormalises_and_weights():
    fused = tu.fuse_union([[0.4, 0.4, 0.0], [0.1, 0.3, 0.6]], [1.0, 1.0])
    assert fused == pytest.approx([0.3, 0.4, 0.3])
    fused = tu.fuse_union([[0.4, 0.4, 0.0], [0.1, 0.3, 0.6]], [3.0, 1.0])
    assert fused == pytest.approx([(3 * 0.5 + 0.1) / 4, (3 * 0.5 + 0.3) / 4, 0.6 / 4])
    # a member with no mass on the union is left out
    assert tu.fuse_union([[0.0, 0.0], [0.2, 0.6]], [1.0, 1.0]) == pytest.approx([0.25, 0.75])


def test_picks_highest_averaged_probability(scripted):
    script, _ = scripted
    char, bpe = char_member(), clean_bpe_member()
    # top-2 of char: a, b; top-2 of bpe: " cli", b; union {" cli", b, a}
    script["char"] = {"a": 0.40, "b": 0.38, "c": 0.22}
    script["bpe"] = {" cli": 0.45, "b": 0.40, "a": 0.15}
    # char renormalised over the union: a .40/.78, b .38/.78, " cli" -> p(" ") = 0
    # mean: a (.513 + .15)/2 = .332, b (.487 + .40)/2 = .444, " cli" .225 -> "b" (nobody's top-1)
    out = run([char, bpe], prompts=["Q:"], max_new_tokens=1, lead=1, top_k=2)[0]
    assert out.text == "b" and out.finish_reason == "length" and out.num_tokens == 1
    step = out.trace.steps[0]
    assert step.piece == "b" and step.union == 3 and step.agree == 0
    assert step.prob == pytest.approx((0.38 / 0.78 + 0.40) / 2, abs=1e-4)
    # weights: only bpe counts -> its top-1
    assert run([char, bpe], ["Q:"], max_new_tokens=1, lead=1, top_k=2, weights=[0, 1])[0].text == " cli"
    # top_k=1: union {" cli", a}: char a 1.0; bpe a .25, cli .75 -> a
    assert run([char, bpe], ["Q:"], max_new_tokens=1, lead=1, top_k=1)[0].text == "a"


def test_missing_option_changes_the_choice(scripted):
    script, _ = scripted
    char, bpe = char_member(), clean_bpe_member()
    script["char"] = {" ": 0.40, "a": 0.32, "b": 0.28}
    script["bpe"] = {" cli": 0.50, "b": 0.30, "a": 0.20}
    # first-token (UniTE): char's p(" cli") = p(" ") = .40 -> " cli" wins (.393 vs b .25)
    out = run([char, bpe], ["Q:"], max_new_tokens=1, lead=1, top_k=2)[0]
    assert out.text == " cli"
    # zero: char gives " cli" 0 -> b wins (.29 vs a .26, " cli" .25)
    out = run([char, bpe], ["Q:"], max_new_tokens=1, lead=1, top_k=2, missing="zero")[0]
    assert out.text == "b"
    assert out.trace.steps[0].prob == pytest.approx((0.28 + 0.30) / 2, abs=1e-4)


PIECES = [" 1", "8", " cli", "ps", ",", "\n", "=", " t", "he", " an", "d", " =", "."]


def force(member, text):
    """A distribution putting .9 on `text` (or on the first token of the member's encoding of it)."""
    ids = member.encode(text)
    first = member.tokenizer.decode(ids[:1])
    return {first: 0.9, "~": 0.1} if first != "~" else {first: 0.9, "!": 0.1}


@pytest.mark.parametrize("lead", [0, 1])
def test_text_is_concatenation_and_caches_follow_text(scripted, lead):
    """Strings that are one token for BPE but several characters for the char member, and pieces a
    BPE merge spans (" cli" + "ps" -> " clips", " t" + "he" -> " the"), are committed by text: the output is exactly the
    concatenation of committed strings, and each non-lead cache equals a fresh encoding."""
    script, seen = scripted
    char, bpe = char_member(), clean_bpe_member()
    members = [char, bpe]
    for m in members:
        script[m.name] = [force(m, p) for p in PIECES] + [{None: 1.0}]
    outs = run(members, prompts=["Q:", "Answer: "], max_new_tokens=100, lead=lead)
    for out in outs:
        pieces = [s.piece for s in out.trace.steps]
        assert pieces == PIECES + [None]
        assert out.text == "".join(PIECES) and out.finish_reason == "eos"
    for m_idx, m in enumerate(members):
        for step, ids_rows in enumerate(seen[m.name]):
            text = "".join(PIECES[:step])
            for b, prompt in enumerate(["Q:", "Answer: "]):
                prompt_ids = m.encode_prompt(prompt)
                assert ids_rows[b][: len(prompt_ids)] == prompt_ids
                mine = ids_rows[b][len(prompt_ids):]
                if m_idx == lead:
                    assert m.decode(mine) == text  # the lead keeps the tokens it committed
                else:
                    assert mine == (m.encode(text) if text else [])
    assert outs[0].num_tokens == len(seen[members[lead].name][-1][0]) - len(members[lead].encode_prompt("Q:")) + 1


def test_eos_and_stop(scripted):
    script, seen = scripted
    char, bpe = char_member(), clean_bpe_member()
    script["char"] = [force(char, p) for p in PIECES]
    script["bpe"] = [force(bpe, p) for p in PIECES]
    out = run([char, bpe], ["Q:"], max_new_tokens=100, stop=["clips,"], lead=1)[0]
    assert out.text == " 18 " and out.finish_reason == "stop"
    seen.clear()  # restart the script
    out = run([char, bpe], ["Q:"], max_new_tokens=3, lead=1)[0]
    assert out.text == " 18 cli" and out.finish_reason == "length" and out.num_tokens == 3


@pytest.mark.parametrize("lead", [0, 1])
def test_incomplete_character_is_completed_by_its_member(scripted, lead):
    """BPE's top token is the first byte of "\u00e9" (0xC3): it competes with BPE's probability only;
    once chosen, BPE alone adds the next byte (0xA9), and "\u00e9" is committed as one piece."""
    script, seen = scripted
    char, bpe = char_member(), clean_bpe_member()
    c3, a9 = bpe.tokenizer.convert_tokens_to_ids(["\u00c3", "\u00a9"])
    assert bpe.decode([c3, a9]) == "\u00e9" and "\ufffd" in bpe.decode([c3])
    script["bpe"] = [{c3: 0.9, "a": 0.1}, {a9: 0.8, "a": 0.2}, {None: 1.0}]
    script["char"] = [{"b": 0.5, "c": 0.5}, {"b": 1.0}, {None: 1.0}]
    out = run([char, bpe], ["Q:"], max_new_tokens=10, lead=lead)[0]
    step = out.trace.steps[0]
    assert step.piece == "\u00e9" and step.completed_by == "bpe" and step.prob == pytest.approx(0.45)
    assert out.text == "\u00e9" and out.finish_reason == "eos" and len(out.trace.steps) == 2
    # the char member waited, then got the completed text; BPE holds its own two byte tokens
    prompt_c, prompt_b = char.encode_prompt("Q:"), bpe.encode_prompt("Q:")
    assert [ids[0][len(prompt_c):] for ids in seen["char"]] == [[], [], char.encode("\u00e9")]
    assert [ids[0][len(prompt_b):] for ids in seen["bpe"]] == [[], [c3], [c3, a9]]
    assert out.num_tokens == (3 if lead == 1 else len(char.encode("\u00e9")) + 1)


# ---- real (tiny) forwards ---------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: char_member(0),
    lambda: tiny_member("qwen2", tokenizer=bpe_tokenizer(), seed=1),  # emits many partial-UTF-8 bytes
    lambda: tiny_member("gemma3", tokenizer=bpe_tokenizer(), seed=3),
], ids=["char-llama", "bpe-qwen2", "bpe-gemma3"])
def test_single_member_equals_its_own_greedy(make):
    m = make()
    ref = m.generate(PROMPTS, max_new_tokens=24, temperature=0)
    got = run([m], max_new_tokens=24)
    for r, g in zip(ref, got):
        assert (g.text, g.num_tokens, g.finish_reason) == (r.text, r.num_tokens, r.finish_reason)
        assert g.text == "".join(s.piece for s in g.trace.steps)
        assert g.cost.forward_passes == r.cost.forward_passes
    # with a stop string taken from the greedy text
    stop = ref[0].text[6:8]
    ref = m.generate(PROMPTS, max_new_tokens=24, temperature=0, stop=[stop])
    got = run([m], max_new_tokens=24, stop=[stop])
    assert [(g.text, g.finish_reason) for g in got] == [(r.text, r.finish_reason) for r in ref]


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.9, 7)])
def test_batched_equals_per_row(temperature, seed):
    members = [char_member(0), clean_bpe_member("qwen2", 1)]
    batched = run(members, max_new_tokens=10, temperature=temperature, seed=seed, lead=1)
    for b, prompt in enumerate(PROMPTS):
        single = run(members, prompts=[prompt], max_new_tokens=10, temperature=temperature,
                     seed=None if seed is None else seed + b, lead=1)[0]
        assert (single.text, single.num_tokens, single.finish_reason) == \
            (batched[b].text, batched[b].num_tokens, batched[b].finish_reason)
        assert batched[b].text == "".join(s.piece for s in batched[b].trace.steps)
    assert set(batched[0].cost.forward_passes) == {"char", "bpe"}
    assert batched[0].cost.wall_time_s > 0


def test_seeded_sampling_is_reproducible_and_temperature_matters():
    members = [char_member(0), clean_bpe_member("qwen2", 1)]
    a = run(members, max_new_tokens=10, temperature=1.0, seed=3)
    b = run(members, max_new_tokens=10, temperature=1.0, seed=3)
    greedy = run(members, max_new_tokens=10)
    assert [o.text for o in a] == [o.text for o in b]
    assert [o.text for o in a] != [o.text for o in greedy]


@pytest.mark.parametrize("kw,match", [
    (dict(beam=2), "unknown option 'beam'"),
    (dict(top_k=0), "top_k"),
    (dict(missing="mean"), "missing"),
    (dict(weights=[1.0]), "weights"),
    (dict(weights=[-1.0, 2.0]), "weights"),
    (dict(lead=2), "lead"),
    (dict(temperature=-1.0), "temperature"),
    (dict(max_new_tokens=0), "max_new_tokens"),
])
def test_bad_options(kw, match):
    members = [char_member(0), char_member(1, name="char1")]
    with pytest.raises(ConfigError, match=match):
        run(members, **kw)


def test_union_keys_normalise_the_leading_space_marker():
    """Byte-level "Ġcli" and SentencePiece "▁The" both key as text with a real leading space, also
    for SentencePiece decoders that strip the marker off a lone token."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, "\u2581The": 2, "The": 3, "\u2581is": 4, "\u2581": 5}
    sp = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    sp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    sp.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    sp = PreTrainedTokenizerFast(tokenizer_object=sp, eos_token="</s>", unk_token="<unk>")
    assert sp.decode([2]) == "The"  # the decoder strips it: the key must not
    stub = SimpleNamespace(tokenizer=sp, eos_token_ids={1}, encode=lambda t: sp(t, add_special_tokens=False)["input_ids"])
    keys = tu._Vocab(stub)
    assert [keys.key(i) for i in range(1, 6)] == [tu.EOS, " The", "The", " is", " "]
    bpe = tiny_member("llama", tokenizer=bpe_tokenizer(), seed=0)
    v = tu._Vocab(bpe)
    cli = bpe.encode(" cli")[0]
    assert bpe.tokenizer.convert_ids_to_tokens(cli) == "\u0120cli" and v.key(cli) == " cli"
    assert v.find(" cli") == (cli, cli) and v.find(" clipsx")[0] is None


# ---- contrastive fusion ------------------------------------------------------------------------
def test_fuse_contrastive_hand_case():
    import math
    lead, amateur = [0.5, 0.4, 0.05, 0.05], [0.6, 0.1, 0.2, 0.1]
    scores = [1.5 * math.log(p) - 0.5 * math.log(q) for p, q in zip(lead, amateur)]
    z = sum(math.exp(x) for x in scores)
    fused = tu.fuse_contrastive([lead, amateur], [1.0, 1.0], lead=0, beta=0.5, alpha=0.1)
    assert fused == pytest.approx([math.exp(x) / z for x in scores])
    assert max(range(4), key=fused.__getitem__) == 1  # the amateur's favourite loses to the lead's second
    # plausibility: alpha 0.9 leaves the lead's top key alone
    assert tu.fuse_contrastive([lead, amateur], [1.0, 1.0], 0, 0.5, 0.9) == pytest.approx([1, 0, 0, 0])
    # keys below alpha x best get 0 even where the amateur gives them nothing
    fused = tu.fuse_contrastive([lead, [0.5, 0.5, 0.0, 0.0]], [1.0, 1.0], 0, 0.5, 0.2)
    assert fused[2:] == [0.0, 0.0] and sum(fused) == pytest.approx(1.0)
    # a zero-weight amateur (or none): the lead's own law over the plausible keys
    assert tu.fuse_contrastive([lead, amateur], [1.0, 0.0], 0, 0.5, 0.1) == pytest.approx([0.5, 0.4, 0.05, 0.05])
    # amateurs share the penalty by weight; the lead may be any member
    two = tu.fuse_contrastive([amateur, [0.3, 0.3, 0.3, 0.1], lead], [1.0, 3.0, 9.0], lead=2, beta=1.0, alpha=0.1)
    want = [2 * math.log(p) - (math.log(a) + 3 * math.log(b)) / 4 for p, a, b in zip(lead, amateur, [.3, .3, .3, .1])]
    z = sum(math.exp(x) for x in want)
    assert two == pytest.approx([math.exp(x) / z for x in want])


def _reference_contrastive(expert, amateur, prompts, n, beta, alpha):
    """Full-vocabulary contrastive greedy decoding of two members sharing a tokenizer, lockstep."""
    out = []
    for prompt in prompts:
        se, sa = expert.start([expert.encode_prompt(prompt)]), amateur.start([amateur.encode_prompt(prompt)])
        ids = []
        for _ in range(n):
            le, la = se.next_probs(1.0)[0].log(), sa.next_probs(1.0)[0].log()
            keep = le >= le.max() + torch.log(torch.tensor(alpha))
            tok = int(torch.where(keep, (1 + beta) * le - beta * la, torch.tensor(-float("inf"))).argmax())
            ids.append(tok)
            if tok in expert.eos_token_ids:
                break
            se.append([[tok]], return_logits=False)
            sa.append([[tok]], return_logits=False)
        out.append(ids)
    return out


@pytest.mark.parametrize("beta,alpha", [(0.5, 0.1), (1.0, 0.02)])
def test_contrastive_equals_full_vocabulary_contrastive_decoding(beta, alpha):
    """Two members sharing a tokenizer: the union (top_k large enough to hold the plausible set)
    gives exactly full-vocabulary contrastive decoding, and it departs from the lead's greedy text."""
    expert, amateur = clean_bpe_member("qwen2", 1, name="expert"), clean_bpe_member("qwen2", 2, name="amateur")
    ref = _reference_contrastive(expert, amateur, PROMPTS, 12, beta, alpha)
    got = run([expert, amateur], max_new_tokens=12, top_k=64, fusion="contrastive", beta=beta, alpha=alpha)
    for ids, g in zip(ref, got):
        eos = ids[-1] in expert.eos_token_ids
        assert g.text == expert.decode(ids[:-1] if eos else ids)
        assert g.num_tokens == len(ids) and g.finish_reason == ("eos" if eos else "length")
    greedy = run([expert], max_new_tokens=12)
    assert [g.text for g in got] != [g.text for g in greedy]
    # beta 0: the lead's own greedy text
    same = run([expert, amateur], max_new_tokens=12, top_k=64, fusion="contrastive", beta=0.0)
    assert [g.text for g in same] == [g.text for g in greedy]


def test_contrastive_across_tokenizers_scripted(scripted):
    script, _ = scripted
    char, bpe = char_member(), clean_bpe_member()
    # lead bpe: " cli" .45, b .40, a .15; amateur char loves b -> contrastive picks " cli" (mean picks b)
    script["char"] = {"a": 0.10, "b": 0.85, "c": 0.05}
    script["bpe"] = {" cli": 0.42, "b": 0.43, "a": 0.15}
    assert run([char, bpe], ["Q:"], max_new_tokens=1, lead=1, top_k=3)[0].text == "b"
    out = run([char, bpe], ["Q:"], max_new_tokens=1, lead=1, top_k=3, fusion="contrastive", missing="zero")[0]
    assert out.text == " cli"
    # alpha 1.0: only the lead's best is plausible
    assert run([char, bpe], ["Q:"], max_new_tokens=1, lead=1, top_k=3, fusion="contrastive", alpha=1.0)[0].text == "b"


@pytest.mark.parametrize("kw,match", [
    (dict(fusion="max"), "fusion"), (dict(beta=-0.1), "beta"), (dict(beta="x"), "beta"),
    (dict(alpha=0.0), "alpha"), (dict(alpha=1.5), "alpha"),
])
def test_bad_contrastive_options(kw, match):
    with pytest.raises(ConfigError, match=match):
        run([char_member(0), char_member(1, name="char1")], **kw)


def test_contrastive_falls_back_to_the_mean_when_the_lead_has_no_mass_and_traces_its_fusion():
    probs = [[0.0, 0.0], [0.2, 0.6]]
    assert tu.fuse_contrastive(probs, [1.0, 1.0], 0, 0.5, 0.1) == pytest.approx(tu.fuse_union(probs, [1.0, 1.0]))
    members = [char_member(0), char_member(1, name="char1")]
    assert run(members, max_new_tokens=2, fusion="contrastive")[0].trace.fusion == "contrastive"
    assert run(members, max_new_tokens=2)[0].trace.fusion == "mean"
