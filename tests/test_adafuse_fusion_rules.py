"""Fusion rules of the word-level methods (`fusion`: mean, confidence, lead-keeps) and the trace
statistics that say why words are won or lost (`overruled`, `won_by`)."""
import pytest

from adafuse.ensemble import Ensemble
from adafuse.methods.word_level import Candidate, Proposal, Round, round_stats
from adafuse.methods.word_level.ensembled_word import EnsembledWord
from runtime.errors import ConfigError

PROMPTS = ["Question: what is 16*16?\nAnswer:", "The quick brown fox"]


def run(members, **kw):
    return Ensemble(list(members), method="word-fixed", **kw).generate(PROMPTS, max_new_tokens=24)


def ensembled(outs):
    return [r for o in outs for r in o.trace if r.kind == "ensemble"]


def test_mean_is_the_default_and_lead_keeps_with_no_margin_is_the_mean(spacey):
    base = run(spacey)
    assert [o.text for o in run(spacey, fusion="mean")] == [o.text for o in base]
    kept0 = run(spacey, fusion="lead-keeps", keep_margin=0.0)
    assert [o.text for o in kept0] == [o.text for o in base]
    # the trace names the lead's own word of every ensembled round
    assert all(r.lead_word is not None for r in ensembled(base))


def test_lead_keeps_with_a_large_margin_never_overrules_the_lead(spacey):
    base = ensembled(run(spacey))
    assert any(r.chosen != r.lead_word for r in base), "the fixture must have overruled words to pin"
    kept = run(spacey, fusion="lead-keeps", keep_margin=1e6)
    rounds = ensembled(kept)
    assert rounds and all(r.chosen == r.lead_word for r in rounds)
    assert all(o.stats["overruled"] == 0 for o in kept)
    assert sum(o.stats["overruled"] for o in run(spacey)) == sum(r.chosen != r.lead_word for r in base)


def test_confidence_weights_scale_each_member_by_its_margin(spacey):
    word = EnsembledWord.__new__(EnsembledWord)
    word.config = type("C", (), {"fusion": "confidence"})()
    word.weights = [1.0, 2.0]
    prop = Proposal([0, 1], {}, {}, margins={0: [0.5, 0.0], 1: [0.25, 0.0]})
    assert word._weights(prop, 0) == [0.5, 0.5]
    assert word._weights(prop, 1) == [1.0, 2.0]  # every margin 0: the weights alone
    word.config.fusion = "mean"
    assert word._weights(prop, 0) == [1.0, 2.0]
    # and it changes what is chosen on real tiny members somewhere (a knob that does something)
    outs = run(spacey, fusion="confidence")
    assert [r.candidates for r in ensembled(outs)] and all(o.text for o in outs)


def test_round_stats_count_winners_and_overruled_words():
    a, b = "char-llama", "bpe-qwen"
    trace = [Round("confident", [" 16"], [{"margin": 0.9, "decision": "confident"}], a),
             Round("ensemble", [" is"], [{"margin": 0.1, "decision": "uncertain"}], a,
                   [Candidate(" is", [a, b]), Candidate(" was", [b])], " is", " is"),
             Round("ensemble", [" was"], [{"margin": 0.2, "decision": "uncertain"}], a,
                   [Candidate(" is", [a]), Candidate(" was", [b])], " was", " is"),
             Round("ensemble", [], [{"margin": 0.2, "decision": "forced"}], a,
                   [Candidate("", [a], eos=True), Candidate(" so", [b])], "<eos>", "<eos>")]
    s = round_stats(trace, " 16 is was")
    assert s["ensemble_rounds"] == 3 and s["overruled"] == 1
    assert s["won_by"] == {a: 2, b: 2}


@pytest.mark.parametrize("kw,needle", [(dict(fusion="median"), "fusion"), (dict(keep_margin=-1.0), "keep_margin"),
                                       (dict(keep_margin=float("inf")), "keep_margin")])
def test_bad_fusion_options_are_one_line(spacey, kw, needle):
    with pytest.raises(ConfigError) as exc:
        Ensemble(list(spacey), **kw)
    assert needle in str(exc.value) and "\n" not in str(exc.value)
