"""Member views (`runtime.views`): a model and a prompt recipe, several views sharing one model's weights,
their forwards stacked into one (`runtime.forward_group`, `runtime.stacked_forward`)."""
from __future__ import annotations

import copy

import pytest
import torch

from adafuse.methods import get_method, run_method
from runtime.errors import ConfigError
from runtime.forward_group import one_after_another, run_together
from runtime.loader import MemberLoader
from runtime.prompts import FewShotPrompt
from runtime.testing import bpe_tokenizer, char_tokenizer, tiny_member
from runtime.views import (ViewSpec, exemplars_needed, make_view, member_spec, normalise_member, parse_view,
                           split_member_spec)

POOL = [(f"Question: what is {i} plus {i}?\nAnswer:", f"The answer is {2 * i}.") for i in range(6)]


def few_shot(question: str, k: int = 2) -> FewShotPrompt:
    return FewShotPrompt(f"Question: {question}?\nAnswer:", POOL, range(k), "Solve it.\n\n")


@pytest.fixture(scope="module")
def views():
    """A tiny qwen2-style model with a chat template, and three views of it."""
    tokenizer = copy.deepcopy(bpe_tokenizer())  # (the cached one is shared with other tests)
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}")
    base = tiny_member("qwen2", tokenizer, seed=3)
    return [base, make_view(base, parse_view({"shots": "2:4"})),
            make_view(base, parse_view({"shots": [4, 0, 5], "chat": False, "system": "Think."}))]


# ---- specs -------------------------------------------------------------------------------------
def test_view_specs_parse_to_one_canonical_form():
    assert normalise_member({"name": "m", "view": {"shots": "2:4", "chat": False}}) == "m[shots=2:4,chat=false]"
    assert normalise_member("m[chat=false, shots=2:4]") == "m[shots=2:4,chat=false]"
    assert normalise_member("m[shots=3]") == "m[shots=3]" and normalise_member({"name": "m"}) == "m"
    assert normalise_member({"name": "m", "view": {"shots": {"seed": 7, "k": 4}}}) == "m[shots=seed7x4]"
    assert normalise_member({"name": "m", "view": {"shots": [3, 1]}}) == "m[shots=3|1]"
    spec = member_spec("m", ViewSpec(system="Be brief, please."))
    assert spec == 'm[system="Be brief, please."]' and split_member_spec(spec) == ("m", ViewSpec(system="Be brief, please."))
    assert split_member_spec("m[]") == ("m", None)  # an empty recipe is the default prompt
    assert exemplars_needed(["m", "m[shots=8:12]", "m[shots=seed1x3]"]) == 12


@pytest.mark.parametrize("bad, match", [
    ({"shot": "0:2"}, "did you mean 'shots'"),
    ({"shots": "4:2"}, "shots='4:2' is invalid"),
    ({"shots": "a:b"}, "is invalid"),
    ({"chat": "no"}, "chat='no' is invalid"),
    ({"system": ""}, "system='' is invalid"),
])
def test_bad_view_specs_are_one_line_errors(bad, match):
    with pytest.raises(ConfigError, match=match) as err:
        parse_view(bad)
    assert "\n" not in str(err.value)


def test_bad_view_strings_are_one_line_errors():
    for spec in ("m[shots]", "m[shots=0:2,shots=2:4]", '[chat=true]', 'm[system="unterminated]'):
        with pytest.raises(ConfigError):
            split_member_spec(spec)


# ---- prompts -----------------------------------------------------------------------------------
def test_a_views_prompt_shows_its_exemplars_its_template_and_its_system(views):
    base, chat_view, raw_view = views
    prompt = few_shot("what is 7 plus 7")
    default = base.format_prompt(prompt)
    assert default.startswith("<system>Solve it.") and "0 plus 0" in default and "1 plus 1" in default
    assert "2 plus 2" not in default and default.endswith("<assistant>")
    shown = chat_view.format_prompt(prompt)
    assert "2 plus 2" in shown and "3 plus 3" in shown and "0 plus 0" not in shown and shown.startswith("<system>")
    raw = raw_view.format_prompt(prompt)
    assert raw == ("Think.\n\n" + "\n\n".join(f"{q} {a}" for q, a in (POOL[4], POOL[0], POOL[5]))
                   + "\n\nQuestion: what is 7 plus 7?\nAnswer:")
    assert str(prompt) == ("Solve it.\n\n" + "\n\n".join(f"{q} {a}" for q, a in POOL[:2])
                           + "\n\nQuestion: what is 7 plus 7?\nAnswer:")  # the default rendering, as before views


def test_exemplar_choices_need_a_prompt_with_its_pool(views):
    with pytest.raises(ConfigError, match="exemplar pool"):
        views[1].format_prompt("Question: plain?\nAnswer:")
    with pytest.raises(ConfigError, match="needs 9 exemplars but the pool holds 6"):
        make_view(views[0], parse_view({"shots": "0:9"})).format_prompt(few_shot("x"))
    seeded = make_view(views[0], parse_view({"shots": "seed3x2", "chat": False}))
    assert seeded.format_prompt(few_shot("x")) == seeded.format_prompt(few_shot("x"))  # a seed is a fixed choice


def test_views_share_one_copy_of_the_weights(monkeypatch):
    loads = []

    def fake_load(spec, dtype, device, pack_weights=True):
        loads.append(spec)
        return tiny_member("llama", char_tokenizer(), seed=1, name=spec)

    monkeypatch.setattr("runtime.loader._load", fake_load)
    loader = MemberLoader()
    a, b, c = loader.members(["m", "m[shots=0:2]", {"name": "m", "view": {"chat": False}}])
    assert loads == ["m"] and a.view is None and b.view == ViewSpec(shots="0:2")
    assert b.model is a.model and c.model is a.model and b.counters is a.counters
    assert all(p.data_ptr() == q.data_ptr() for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert b.prefix_cache is not a.prefix_cache and loader.member("m[shots=0:2]") is b
    assert b.name == "m[shots=0:2]" and b.model_name == "m"


# ---- views run together --------------------------------------------------------------------------
@pytest.mark.parametrize("method, options", [
    ("adafuse", {}), ("word-fixed", {}), ("token-union", {}), ("sample-rerank", {}), ("view-vote", {}),
    ("adafuse", {"threshold": 0.2, "flush_guesses": 0}),
])
def test_views_together_equal_views_one_after_another(views, method, options, one_thread):
    prompts = [few_shot(q) for q in ("what is 1 plus 5", "what is 7 times 2", "how many apples")]
    kw = dict(max_new_tokens=10, stop=["\n"], seed=0, **options)
    together = run_method(get_method(method), views, prompts, **kw)
    with one_after_another():
        apart = run_method(get_method(method), views, prompts, **kw)
    assert [o.text for o in together] == [o.text for o in apart]
    fwd = lambda outs: sum(sum(o.cost.forward_passes.values()) for o in outs)  # noqa: E731
    assert fwd(together) < fwd(apart)
    assert set(together[0].cost.forward_passes) == {views[0].model_name}  # costs count the model once


def test_sampled_views_together_equal_one_after_another(views, one_thread):
    prompts = [few_shot("what is 3 plus 4")] * 2
    kw = dict(max_new_tokens=8, temperature=0.9, seed=5)
    together = run_method(get_method("token-union"), views, prompts, **kw)
    with one_after_another():
        apart = run_method(get_method("token-union"), views, prompts, **kw)
    assert [o.text for o in together] == [o.text for o in apart]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_a_stacked_forward_leaves_each_state_as_its_own_forward_would(arch, one_thread):
    base = tiny_member(arch, char_tokenizer(), seed=1)
    other = make_view(base, parse_view({"chat": False}))
    prompts = [["Hello there, how are you", "Hi"], ["The quick brown fox", "x y z w"]]

    def work(i: int):
        m = [base, other][i]
        st = m.start([m.encode(p) for p in prompts[i]])
        a = st.append([[5, 6, 7], [8]], return_logits=True)
        t = st.forward_tree([[3, 4, 5], [9]], [[-1, 0, 0], [-1]], logits_at=[[1, 2], [0]])
        st.accept([[0, 1], [0]])
        sc = st.score([[[4, 5, 6], [7]], [[1]]])
        return a, t, sc, st.next_probs(1.0), st.ids, st.slot_pos.clone()

    apart = [work(0), work(1)]
    before = base.counters.forward_passes
    together = run_together([0, 1], work)
    assert base.counters.forward_passes - before == 4  # prefill, append, tree, score: one forward each for both
    for x, y in zip(apart, together):
        assert x[4] == y[4] and torch.equal(x[5], y[5])
        for u, v in [(x[0], y[0]), (x[1], y[1]), (x[3], y[3])]:
            assert torch.allclose(u, v, atol=1e-5)
        for r1, r2 in zip(x[2], y[2]):
            for c1, c2 in zip(r1, r2):
                assert torch.allclose(c1, c2, atol=1e-5)


def test_a_failing_item_stops_alone_and_its_error_is_raised(views):
    def work(i: int):
        st = views[i].start([views[i].encode("Hello")])
        if i == 1:
            raise ValueError("boom")
        st.append([[5, 6]])
        return i

    with pytest.raises(ValueError, match="boom"):
        run_together([0, 1, 2], work)
    assert run_together([0, 2], work) == [0, 2]


def test_a_view_with_a_lora_adapter_equals_peft(tmp_path, one_thread):
    from peft import LoraConfig, get_peft_model

    base = tiny_member("qwen2", bpe_tokenizer(), seed=3)
    peft_model = get_peft_model(copy.deepcopy(base.model),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                           init_lora_weights=False))
    peft_model.save_pretrained(tmp_path)
    adapted = make_view(base, parse_view({"adapter": str(tmp_path)}))
    ids = base.encode("The quick brown fox jumps over")
    with torch.no_grad():
        want = peft_model(torch.tensor([ids])).logits[0, -1]
        plain = base.model(torch.tensor([ids])).logits[0, -1]

    def last_logits(m):
        st = m.start([ids])
        st.next_probs()
        return st.last_logits[0].clone()

    assert torch.allclose(last_logits(adapted), want, atol=1e-5)
    got_plain, got_adapted = run_together([base, adapted], last_logits)  # one forward, each row its own weights
    assert torch.allclose(got_plain, plain, atol=1e-5) and torch.allclose(got_adapted, want, atol=1e-5)
    with pytest.raises(ConfigError, match="not a peft LoRA folder"):
        make_view(base, parse_view({"adapter": str(tmp_path / "missing")}))


def test_views_following_the_leads_confident_tokens_change_no_output(views, monkeypatch, one_thread):
    """At batch 1 the other views are fed the lead's confident tokens in the lead's own forwards
    (no catch-up at the next ensembled word): the same texts as the lazy catch-up, with and without
    stacking."""
    from adafuse.methods.word_level import lead_decoder

    calls = []
    follow = lead_decoder.LeadDecoder._follow
    monkeypatch.setattr(lead_decoder.LeadDecoder, "_follow", lambda self, f, feed: calls.append(f) or follow(self, f, feed))
    prompt = [few_shot("what is 1 plus 5")]
    kw = dict(max_new_tokens=40, stop=["\n"], seed=0, threshold=0.0)  # confident runs, then forced words
    followed = run_method(get_method("adafuse"), views, prompt, **kw)[0]
    with one_after_another():
        followed_apart = run_method(get_method("adafuse"), views, prompt, **kw)[0]
    assert set(calls) == {1, 2}  # both other views followed the lead
    monkeypatch.setattr(lead_decoder, "FOLLOW_MAX_ROWS", 0)
    calls.clear()
    lazy = run_method(get_method("adafuse"), views, prompt, **kw)[0]
    assert not calls and followed.text == followed_apart.text == lazy.text
    assert any(r.kind == "confident" for r in followed.trace) and any(r.kind == "ensemble" for r in followed.trace)


def test_a_raw_view_ends_at_the_end_of_text_token_as_the_chat_prompt_does():
    # Qwen's generation config names only <|im_end|>; in a raw prompt the model ends a document with
    # <|endoftext|>, and what follows it is a new document (GSM8K: "Human: ..." up to the length limit)
    tok = bpe_tokenizer()
    tok.add_special_tokens({"eos_token": "<|im_end|>"})
    base = tiny_member("qwen2", tok, seed=1)
    raw = make_view(base, parse_view({"chat": False}))
    end_of_text, end_of_turn = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    assert {end_of_text, end_of_turn} <= raw.eos_token_ids
    assert {end_of_text, end_of_turn} <= base.eos_token_ids


@pytest.mark.parametrize("method, options", [("adafuse", {"threshold": 0.3}), ("token-union", {}), ("view-vote", {})])
def test_views_of_a_real_model_together_equal_one_after_another(smollm2, method, options):
    # smollm2-135m in float32: three views (its default chat prompt, other exemplars, raw text) as rows
    # of one batch write exactly what they write one after another
    views = [smollm2, make_view(smollm2, parse_view({"shots": "2:4"})),
             make_view(smollm2, parse_view({"shots": "0:2", "chat": False}))]
    prompts = [few_shot(q) for q in ("what is 3 plus 4", "what is 6 times 2")]
    kw = dict(max_new_tokens=16, stop=["\n"], seed=0, **options)
    together = run_method(get_method(method), views, prompts, **kw)
    with one_after_another():
        apart = run_method(get_method(method), views, prompts, **kw)
    assert [o.text for o in together] == [o.text for o in apart]
    assert all(o.text.strip() for o in together)
    if method == "adafuse":
        assert [[r.kind for r in o.trace] for o in together] == [[r.kind for r in o.trace] for o in apart]
        assert any(r.kind == "ensemble" for o in together for r in o.trace)  # the views did fuse words
