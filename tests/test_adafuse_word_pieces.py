"""Word-level ensembling's cache discipline and its pieces, on tiny in-process members with different
tokenizers: incremental state equals a fresh encoding after every round, flush guesses change no
output, boundary repair, and the method classes / step dataclasses of `adafuse.methods.word_level`
(split from test_adafuse_ensemble.py, which pins the behaviour end to end)."""
import pytest
import torch

from adafuse.ensemble import Ensemble
from runtime.errors import ConfigError
from adafuse.methods.word_level import EnsembledWord, WordConfig, WordFusion
from runtime.testing import bpe_tokenizer, char_tokenizer
from test_adafuse_helpers import fresh_next_probs, scripted_member
from test_adafuse_ensemble import P, PROMPTS, units


# ---- cache discipline ---------------------------------------------------------------------------
@pytest.mark.parametrize("pair,lead", [("spacey", 0), ("bpe_pair", 0), ("bpe_pair", 1)])
def test_incremental_state_equals_fresh_encoding_after_every_round(request, pair, lead):
    spacey = request.getfixturevalue(pair)  # bpe_pair: chosen words often reach a member lazily
    cfg = WordConfig(threshold=0.05, span=2)
    fusion = WordFusion(list(spacey), PROMPTS, cfg, weights=[1, 1], lead=lead, chat=None, max_new_tokens=12,
                        stop=[], temperature=0.0, seed=None)
    rounds = 0
    while not fusion.done:
        fusion.step()
        fusion.sync_all()
        rounds += 1
        for m, view in zip(spacey, fusion.views):
            probs = view.state.next_probs(1.0)
            for b in range(len(PROMPTS)):
                assert view.texts[b] == fusion.texts[b]
                assert view.state.ids[b] == view.prompt_ids[b] + m.encode(fusion.texts[b])
                torch.testing.assert_close(probs[b], fresh_next_probs(m, view.state.ids[b]), atol=2e-5, rtol=1e-4)
    assert rounds >= 3


@pytest.mark.parametrize("pair,lead,method", [("spacey", 0, "adafuse"),
                                              ("bpe_pair", 0, "adafuse"), ("bpe_pair", 0, "word-fixed"),
                                              ("bpe_pair", 1, "adafuse")])
def test_flush_guesses_change_no_output(request, pair, lead, method, monkeypatch):
    """Guesses fed with a non-lead's lazy flush (`flush_guesses`) only move work between forwards:
    texts, gate decisions, candidates and (to float rounding) scores equal a run without them. With
    a shared BPE the non-lead's first tokens are often among the lead's guesses, which saves it
    forwards."""
    from runtime.kv_state import KVState

    members = request.getfixturevalue(pair)
    opened = []
    append_open = KVState.append_open

    def counting(self, tokens, tree_tokens, tree_parents):
        opened.append(sum(len(t) for t in tree_tokens))
        return append_open(self, tokens, tree_tokens, tree_parents)

    monkeypatch.setattr(KVState, "append_open", counting)
    kw = dict(method=method, lead=lead, threshold=0.05, max_word_tokens=6)
    without = Ensemble(list(members), flush_guesses=0, **kw).generate(PROMPTS, max_new_tokens=16)
    assert not opened
    with_guesses = Ensemble(list(members), flush_guesses=8, **kw).generate(PROMPTS, max_new_tokens=16)
    assert opened and max(opened) > 0
    for x, y in zip(without, with_guesses):
        assert x.text == y.text
        assert [(r.kind, r.units, r.gate, r.chosen) for r in x.trace] == [(r.kind, r.units, r.gate, r.chosen) for r in y.trace]
        for rx, ry in zip(x.trace, y.trace):
            assert [(c.text, c.proposed_by) for c in rx.candidates] == [(c.text, c.proposed_by) for c in ry.candidates]
            for cx, cy in zip(rx.candidates, ry.candidates):
                assert cx.scores == pytest.approx(cy.scores, abs=2e-3)
    other = members[1 - lead].name
    fwd = [sum(o.cost.forward_passes[other] for o in outs) for outs in (without, with_guesses)]
    assert fwd[1] <= fwd[0]
    if pair == "bpe_pair" and lead == 0:
        assert fwd[1] < fwd[0]


def test_boundary_repair_on_merging_tokens():
    # BPE lead: the word " 18." then "\n" -- ".\n"-style merges and " 1"+"8" splits must be repaired
    prompt = "Q:"
    script = " 1 8 18.\n\n 18. 1\n8"
    a = scripted_member(bpe_tokenizer(), script, prompt, "bpe")
    b = scripted_member(char_tokenizer(), script, prompt, "char")
    for method in ("adafuse", "word-fixed"):
        out = Ensemble([a, b], method=method).generate([prompt], max_new_tokens=100)[0]
        assert out.text == script and units(out) == script


# ---- the pieces of word-level fusion (adafuse.methods.word_level) ----------------------------------
def test_method_classes_equal_ensemble_runs(spacey):
    from adafuse.methods.base import GenerationRequest, Method
    from adafuse.methods.word_level import AdaFuse, WordFixed

    req = GenerationRequest.make(PROMPTS, max_new_tokens=10, temperature=0.8, seed=3)
    for cls, method in ((AdaFuse, "adafuse"), (WordFixed, "word-fixed")):
        impl = cls()
        assert isinstance(impl, Method) and impl.name == method and impl.Options is WordConfig
        opts = impl.parse_options({"threshold": 0.05, "max_word_tokens": 6})
        assert isinstance(opts, WordConfig) and opts.gate == (method == "adafuse")
        outs = impl.generate(list(spacey), req, opts, weights=[1.0, 1.0], lead=0, speculators=[None, None])
        ref = Ensemble(list(spacey), method=method, threshold=0.05, max_word_tokens=6).generate(
            PROMPTS, max_new_tokens=10, temperature=0.8, seed=3)
        view = [[(o.text, o.num_tokens, o.finish_reason, [r.to_dict() for r in o.trace]) for o in x] for x in (outs, ref)]
        assert view[0] == view[1]
        assert [o.cost.forward_passes for o in outs] == [o.cost.forward_passes for o in ref]
    assert WordFixed().parse_options({"gate": True}).gate is False
    outs = WordFixed().generate(list(spacey), req, WordConfig(threshold=0.05), weights=[1, 1], lead=0, speculators=None)
    assert all(r.kind == "ensemble" for o in outs for r in o.trace)


def test_method_classes_raise_one_line_config_errors(spacey):
    from adafuse.methods.base import GenerationRequest
    from adafuse.methods.word_level import AdaFuse

    for options, needle in (({"bogus": 1}, "unknown option 'bogus'"), ({"span": -1}, "span"), ({"threshold": 2}, "threshold")):
        with pytest.raises(ConfigError) as exc:
            AdaFuse().parse_options(options)
        assert needle in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ConfigError) as exc:  # word-level methods sample with a temperature only
        AdaFuse().generate(list(spacey), GenerationRequest.make([P], temperature=1.0, top_k=5), WordConfig(),
                           weights=[1, 1], lead=0, speculators=None)
    assert "top_k" in str(exc.value) and "\n" not in str(exc.value)


def test_ensembled_word_hands_dataclasses_from_step_to_step(spacey):
    """propose -> Proposal -> score -> Scored -> fuse -> picks -> commit: what passes between the
    steps is returned, nothing is left on the object; driven by hand it picks what a step commits."""
    from adafuse.methods.word_level import Proposal, Scored

    def fusion():
        return WordFusion(list(spacey), PROMPTS, WordConfig(gate=False, max_word_tokens=4), weights=[1, 1], lead=0,
                          chat=None, max_new_tokens=12, stop=[], temperature=0.0, seed=None)

    by_hand = fusion()
    word = by_hand.ensembled_word
    attrs = dict(vars(word))
    rows = by_hand.active_rows()
    for m in range(len(spacey)):
        by_hand.flush(m, rows)
    proposal = word.propose(rows)
    assert isinstance(proposal, Proposal) and proposal.rows == rows and set(proposal.open_trees) == {0, 1}
    assert proposal.open_trees[0] is by_hand.views[0].state.tree  # the lead's tree, open for scoring
    scored = word.score(proposal)
    assert isinstance(scored, Scored) and scored.proposal is proposal
    assert len(scored.logprobs) == len(scored.paths) == len(scored.trees) == len(spacey)
    for m, member in enumerate(spacey):
        assert set(scored.paths[m]) == {(b, j) for b in rows for j, c in enumerate(proposal.cands[b]) if not c.eos}
        for b in rows:
            assert len(scored.logprobs[m][b]) == len(proposal.cands[b])
            for (row, j), path in scored.paths[m].items():
                if row == b:
                    assert len(scored.logprobs[m][b][j]) == len(path) and (scored.logprobs[m][b][j] <= 0).all()
    picks = word.fuse(scored)
    holders = word.commit(scored, picks)
    assert set(picks) == set(holders) == set(rows) and all(0 in holders[b] for b in rows)
    assert vars(word).keys() == attrs.keys() and all(vars(word)[k] is v for k, v in attrs.items())
    stepped = fusion()
    stepped.step()
    for b in rows:
        chosen = proposal.cands[b][picks[b]].text
        assert stepped.traces[b][0].chosen == chosen and by_hand.views[0].texts[b] == chosen
        assert [c.text for c in stepped.traces[b][0].candidates] == [c.text for c in proposal.cands[b]]


def test_lead_branches_go_to_the_next_ensembled_word_once(spacey, monkeypatch):
    """The lead advances the candidate words of waiting rows in its confident forwards and hands them
    (`take_branches`) to the ensembled word that follows, keeping none."""
    from adafuse.methods.word_level import Branches

    handed = []
    run = EnsembledWord.run
    fusion = WordFusion(list(spacey), PROMPTS, WordConfig(threshold=0.06, max_word_tokens=6), weights=[1, 1], lead=0,
                        chat=None, max_new_tokens=16, stop=[], temperature=0.0, seed=None)

    def recording(self, rows, gates, lead_branches=None):
        assert not fusion.lead_decoder.branches
        handed.append(dict(lead_branches or {}))
        assert set(handed[-1]) <= set(rows) and all(isinstance(x, Branches) for x in handed[-1].values())
        return run(self, rows, gates, lead_branches)

    monkeypatch.setattr(EnsembledWord, "run", recording)
    fusion.run()
    assert len(handed) > 1 and any(handed)
