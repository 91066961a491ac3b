"""Word-level ensembles with speculative members (tiny in-process members, different tokenizers):
greedy outputs identical with a speculative lead, lookup and model drafters; candidates through
drafters; the forward-tree pieces; the one place the lead calls specdec."""
import dataclasses

import pytest
import torch

from adafuse.ensemble import Ensemble
from adafuse.methods.word_level import LeadDecoder
from runtime.testing import bpe_tokenizer, char_tokenizer
from test_adafuse_ensemble import P, PROMPTS
from test_adafuse_helpers import scripted_member, spacey_member


# ---- speculative members ------------------------------------------------------------------------
REPEATING = " 16*16 = 256\n-3 + 4 = 1\n\nShe has 18 apples. 16*16 = 256 and 16*16 = 256"


@pytest.mark.parametrize("lead", [0, 1])
def test_greedy_output_is_identical_with_speculative_lead(lead):
    a = scripted_member(bpe_tokenizer(), REPEATING, P, "bpe-script")
    b = scripted_member(char_tokenizer(), REPEATING, P, "char-script")
    plain = Ensemble([a, b], lead=lead).generate([P], max_new_tokens=200)[0]
    spec = Ensemble([a, b], lead=lead, drafters=["lookup", "lookup"]).generate([P], max_new_tokens=200)[0]
    assert plain.text == spec.text == REPEATING
    assert [(r.kind, r.units, r.gate) for r in plain.trace] == [(r.kind, r.units, r.gate) for r in spec.trace]


def test_greedy_output_is_identical_with_speculation_on_random_members(spacey):
    for kw in (dict(threshold=0.0, span=3), dict(threshold=0.05)):
        plain = Ensemble(list(spacey), max_word_tokens=6, **kw).generate(PROMPTS, max_new_tokens=12)
        spec = Ensemble(list(spacey), max_word_tokens=6, drafters=["lookup", None], **kw).generate(PROMPTS, max_new_tokens=12)
        for x, y in zip(plain, spec):
            assert x.text == y.text
            assert [g for r in x.trace for g in r.gate] == [g for r in y.trace for g in r.gate]


@pytest.mark.parametrize("drafter_seed", [1, 7])  # 1: the target's own weights (every draft accepted)
def test_greedy_output_is_identical_with_a_model_drafter(spacey, drafter_seed):
    # a same-tokenizer model drafter on the BPE lead: runs of confident words through the specdec
    # engine, with the draft depth capped by the words left in the span (`_speculative_words`)
    drafter = spacey_member("qwen2", bpe_tokenizer(), drafter_seed, "bpe-draft", 3.0)
    for kw in (dict(threshold=0.0, span=3), dict(threshold=0.0, span=1)):
        plain = Ensemble(list(spacey), lead=1, max_word_tokens=6, **kw).generate(PROMPTS, max_new_tokens=16)
        ens = Ensemble(list(spacey), lead=1, max_word_tokens=6, drafters=[None, drafter], **kw)
        depths = []
        engine = ens.speculators[1]
        run = engine.decode

        def spy(state, n, sampling, generators, control, run=run):
            cap = control.draft_depth
            return run(state, n, sampling, generators, dataclasses.replace(
                control, draft_depth=lambda b, row: depths.append(cap(b, row)) or depths[-1]))

        engine.decode = spy
        spec = ens.generate(PROMPTS, max_new_tokens=16)
        for x, y in zip(plain, spec):
            assert x.text == y.text
            assert [g for r in x.trace for g in r.gate] == [g for r in y.trace for g in r.gate]
        assert depths and max(depths) == 1 + kw["span"] and min(depths) >= 1


def test_speculative_lead_costs_no_more_lead_forwards(spacey):
    # batch 1, every word confident: a drafter that never drafts must cost the lead exactly the plain
    # path's forwards (each speculative chunk keeps all the words it decoded: no re-decoding), and a
    # drafter with the lead's own weights fewer
    from specdec.drafters import PromptLookupDrafter

    never = PromptLookupDrafter(ngram_max=3, ngram_min=3, min_length=10 ** 6)
    same = spacey_member("qwen2", bpe_tokenizer(), 1, "bpe-draft", 3.0)
    fwd, texts = [], []
    for drafter in (None, never, same):
        out = Ensemble(list(spacey), lead=1, max_word_tokens=6, threshold=0.0, span=3,
                       drafters=[None, drafter]).generate(PROMPTS[:1], max_new_tokens=40)[0]
        fwd.append(out.cost.forward_passes["bpe-qwen"])
        texts.append(out.text)
    assert texts[0] == texts[1] == texts[2]
    assert fwd[1] == fwd[0] and fwd[2] < fwd[0]


def test_forward_tree_logits_at_matches_full_logits(spacey):
    # runtime/member.py: forward_tree(..., logits_at=) computes the LM head only at chosen nodes
    member = spacey[1]
    state = member.start([member.encode("The quick brown"), member.encode("Question: who")])
    tokens = [[5, 6, 7, 8], [9, 10]]
    parents = [[-1, 0, -1, 2], [-1, 0]]
    full = state.forward_tree(tokens, parents)
    state.accept([[], []])
    part = state.forward_tree(tokens, parents, logits_at=[[1, 3], [1]])
    torch.testing.assert_close(part[0], full[0, [1, 3]])
    torch.testing.assert_close(part[1, 0], full[1, 1])
    with pytest.raises(RuntimeError):
        state.accept([[0], []])       # node 0 has no logits: its next distribution is unknown
    n0, n1 = len(member.encode("The quick brown")), len(member.encode("Question: who"))
    assert state.lengths == [n0, n1]
    # a path ending at a node with logits is kept: same state as appending those tokens
    state.forward_tree(tokens, parents, logits_at=[[1, 3], [1]])
    state.accept([[2, 3], []])
    assert state.lengths == [n0 + 2, n1] and state.ids[0][-2:] == [7, 8]
    torch.testing.assert_close(state.last_logits[0], full[0, 3])
    ref = member.start([member.encode("The quick brown"), member.encode("Question: who")])
    ref.append([[7, 8], []])
    torch.testing.assert_close(state.next_probs(), ref.next_probs(), atol=2e-5, rtol=1e-4)


def test_tree_descendants():
    from runtime.open_tree import below
    #        0   1  2  3  4  5
    parents = [-1, 0, 1, -1, 3, 0]
    assert below(parents, [1]) == {1, 2} and below(parents, [0]) == {0, 1, 2, 5}
    assert below(parents, [3, 2]) == {2, 3, 4} and below(parents, []) == set()


@pytest.mark.parametrize("script", [" 16*16 = 256 ok", " 16*16 = 256 ok fine then"])
def test_speculative_trace_records_a_confident_eos_at_a_word_start(script):
    """EOS right after a (forced) ensembled word starts the lead's next speculative chunk: the trace
    records it as the plain path does (an empty confident word that chose <eos>)."""
    a = scripted_member(bpe_tokenizer(), script, P, "bpe-script")
    b = scripted_member(char_tokenizer(), script, P, "char-script")
    plain = Ensemble([a, b], lead=0).generate([P], max_new_tokens=200)[0]
    spec = Ensemble([a, b], lead=0, drafters=["lookup", "lookup"]).generate([P], max_new_tokens=200)[0]
    assert plain.text == spec.text == script
    view = [[(r.kind, r.units, r.gate, r.chosen) for r in o.trace] for o in (plain, spec)]
    assert view[0] == view[1]


@pytest.mark.parametrize("lead", [0, 1])
def test_candidates_through_drafters_change_no_output(spacey, lead):
    # every word ensembled (threshold 1): the members complete their candidate words with drafts
    # from their drafters (the char member, whose words are several tokens, a model drafter with its
    # own weights, so every draft is its greedy choice; the BPE member prompt lookup). Texts,
    # candidates and every member's scores are those of the plain run; with `draft_candidates="all"`
    # the char member needs fewer forwards of its own (and its drafter's forwards are counted); by
    # default ("model-free") only the lookup drafter is used.
    drafter = spacey_member("llama", char_tokenizer(), 0, "char-draft", 3.0)
    kw = dict(lead=lead, threshold=1.0, max_word_tokens=6)
    plain = Ensemble(list(spacey), **kw).generate(PROMPTS, max_new_tokens=14)
    runs = {which: Ensemble(list(spacey), drafters=[drafter, "lookup"], draft_candidates=which,
                            **kw).generate(PROMPTS, max_new_tokens=14) for which in ("off", "model-free", "all")}
    for outs in runs.values():
        for x, y in zip(plain, outs):
            assert x.text == y.text
            assert ([[(c.text, c.scores) for c in r.candidates] for r in x.trace]
                    == [[(c.text, c.scores) for c in r.candidates] for r in y.trace])

    def forwards(outs, name):
        return sum(o.cost.forward_passes.get(name, 0) for o in outs)

    assert forwards(runs["all"], "char-llama") < forwards(runs["model-free"], "char-llama") == forwards(plain, "char-llama")
    assert forwards(runs["all"], "char-draft") > 0 == forwards(runs["model-free"], "char-draft")
    assert forwards(runs["off"], "bpe-qwen") == forwards(plain, "bpe-qwen")


def test_the_speculative_lead_calls_specdec_in_one_place(spacey, monkeypatch):
    # every `decode` of the lead's speculator happens inside `LeadDecoder._speculate`, once per call
    calls = {"speculate": 0, "decode": 0}
    inside = []
    speculate = LeadDecoder._speculate

    def counting(self, *a, **k):
        calls["speculate"] += 1
        inside.append(1)
        try:
            return speculate(self, *a, **k)
        finally:
            inside.pop()

    monkeypatch.setattr(LeadDecoder, "_speculate", counting)
    ens = Ensemble(list(spacey), max_word_tokens=6, threshold=0.0, drafters=["lookup", None])
    engine = ens.speculators[0]
    decode = engine.decode

    def counted(*a, **k):
        assert inside
        calls["decode"] += 1
        return decode(*a, **k)

    engine.decode = counted
    spec = ens.generate(PROMPTS, max_new_tokens=12)
    plain = Ensemble(list(spacey), max_word_tokens=6, threshold=0.0).generate(PROMPTS, max_new_tokens=12)
    assert [o.text for o in spec] == [o.text for o in plain]
    assert calls["speculate"] > 0 and calls["decode"] == calls["speculate"]
