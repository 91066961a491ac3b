"""End to end on two real members with different tokenizers (SmolLM2 BPE + chat template, Gemma 3
SentencePiece base model): adafuse runs, its text is its committed units, and a speculative lead
and prompt-lookup drafted candidates give the same greedy output, and a batch gives what each row gives alone."""
import pytest

pytestmark = pytest.mark.slow

PROMPTS = ["Question: Tom has 3 apples and buys 2 more. How many apples does he have now?\nAnswer:",
           "Question: Natalia sold 48 clips in April and half as many in May. How many clips in May?\nAnswer:"]


@pytest.fixture(scope="module")
def gemma():
    from runtime.member import load_member

    from conftest import require_model

    require_model("gemma3-270m")
    return load_member("gemma3-270m", dtype="float32")


def test_adafuse_smollm2_gemma3(smollm2, gemma):
    from adafuse import Ensemble

    kw = dict(max_new_tokens=24, stop=["\n\nQuestion:"])
    ensemble = Ensemble([smollm2, gemma], method="adafuse")
    outs = ensemble.generate(PROMPTS, **kw)
    for out in outs:
        assert out.text.strip()
        assert "".join("".join(r.units) for r in out.trace) == out.text
        assert out.stats["rounds"] >= 1 and set(out.cost.forward_passes) == {smollm2.name, gemma.name}
    for prompt, out in zip(PROMPTS, outs):  # a batch writes what each row writes alone
        alone = ensemble.generate([prompt], **kw)[0]
        assert alone.text == out.text
        view = [[(r.kind, r.units, [g["decision"] for g in r.gate]) for r in o.trace] for o in (alone, out)]
        assert view[0] == view[1]  # (margins agree to float rounding across batch shapes)
    # speculative members: the lead's confident runs and both members' candidate words through
    # prompt-lookup drafters
    spec = Ensemble([smollm2, gemma], method="adafuse", drafters=["lookup", "lookup"]).generate(PROMPTS, **kw)
    assert [o.text for o in spec] == [o.text for o in outs]
    assert ([[[c.text for c in r.candidates] for r in o.trace] for o in spec]
            == [[[c.text for c in r.candidates] for r in o.trace] for o in outs])


def test_members_on_separate_devices_give_the_same_output(smollm2, gemma, monkeypatch):
    # each member on a "device" of its own (here: pretended, the machine has only its CPU), so an
    # ensembled word's flush and scoring forwards run in one thread per member (runtime.devices.run_by_device)
    from adafuse import Ensemble
    from adafuse.methods.word_level import ensembled_word

    kw = dict(max_new_tokens=24, stop=["\n\nQuestion:"])
    ensemble = Ensemble([smollm2, gemma], method="adafuse")
    together = ensemble.generate(PROMPTS, **kw)
    monkeypatch.setattr(ensembled_word, "device_key", lambda member: member.name)
    apart = ensemble.generate(PROMPTS, **kw)
    for x, y in zip(together, apart):
        assert x.text == y.text and x.cost.forward_passes == y.cost.forward_passes
        assert [(r.kind, r.units, r.gate) for r in x.trace] == [(r.kind, r.units, r.gate) for r in y.trace]
