"""Members drafting for each other (`member_drafting`): another member of the ensemble drafts the
lead's confident runs through their shared text (`specdec.text_drafter.TextDrafter` where the
tokenizers differ). Greedy outputs and gate decisions are identical with and without it; the
drafting member is the same loaded model (no second copy) and its forwards are counted."""
import pytest

from adafuse.ensemble import Ensemble, drafting_member
from runtime.errors import ConfigError
from runtime.testing import bpe_tokenizer, char_tokenizer
from specdec.drafters import HybridDrafter, ModelDrafter
from specdec.text_drafter import TextDrafter
from test_adafuse_helpers import scripted_member, spacey_member

P = "Question: what is 16*16?\nAnswer:"
PROMPTS = [P, "The quick brown fox"]
REPEATING = " 16*16 = 256\n-3 + 4 = 1\n\nShe has 18 apples. 16*16 = 256 and 16*16 = 256"


@pytest.fixture(scope="module")
def trio():
    """Lead (BPE), a char-level member, and a second BPE member (same tokenizer as the lead)."""
    return (spacey_member("qwen2", bpe_tokenizer(), 1, "bpe-qwen", 3.0),
            spacey_member("llama", char_tokenizer(), 0, "char-llama", 3.0),
            spacey_member("llama", bpe_tokenizer(), 4, "bpe-llama", 3.0))


def gates(out):
    return [(r.kind, r.units, r.gate) for r in out.trace]


@pytest.mark.parametrize("drafting", [1, 2, "cheapest", "char-llama"])
@pytest.mark.parametrize("lead_drafter", [None, "lookup"])
def test_greedy_output_and_gates_are_identical_with_member_drafting(trio, drafting, lead_drafter):
    for kw in (dict(threshold=0.0, span=3), dict(threshold=0.05, span=2)):
        plain = Ensemble(list(trio), max_word_tokens=6, **kw).generate(PROMPTS, max_new_tokens=16)
        ens = Ensemble(list(trio), max_word_tokens=6, drafters=[lead_drafter, None, None],
                       member_drafting=drafting, **kw)
        drafted = ens.generate(PROMPTS, max_new_tokens=16)
        for x, y in zip(plain, drafted):
            assert x.text == y.text
            assert gates(x) == gates(y)
        drafter = ens.speculators[0].drafter
        model = drafter.model if lead_drafter == "lookup" else drafter
        assert isinstance(drafter, HybridDrafter) == (lead_drafter == "lookup")
        assert any(model.member is m for m in ens.members)  # a member itself, not a copy
        assert isinstance(model, TextDrafter if model.member.name == "char-llama" else ModelDrafter)


def test_drafting_member_forwards_are_counted_and_output_equals_script():
    # a scripted lead and a scripted char-level member that knows the same text: every draft it makes
    # is accepted, so the lead needs fewer forwards; the drafting member's own forwards show in the cost
    lead = scripted_member(bpe_tokenizer(), REPEATING, P, "bpe-script")
    other = scripted_member(char_tokenizer(), REPEATING, P, "char-script")
    plain = Ensemble([lead, other]).generate([P], max_new_tokens=200)[0]
    drafted = Ensemble([lead, other], member_drafting="char-script").generate([P], max_new_tokens=200)[0]
    assert plain.text == drafted.text == REPEATING
    assert gates(plain) == gates(drafted)
    assert drafted.cost.forward_passes["bpe-script"] < plain.cost.forward_passes["bpe-script"]
    assert drafted.cost.forward_passes["char-script"] > plain.cost.forward_passes["char-script"]


def test_cheapest_is_the_smallest_member_other_than_the_lead(trio):
    sizes = [m.num_parameters for m in trio]
    assert sizes[1] != sizes[2]
    want = 1 if sizes[1] < sizes[2] else 2
    assert drafting_member("cheapest", list(trio), 0, None) == want
    assert drafting_member("cheapest", list(trio), want, None) == (0 if sizes[0] <= sizes[3 - want] else 3 - want)
    assert drafting_member("off", list(trio), 0, None) is None


@pytest.mark.parametrize("value, lead_drafter, needle", [
    (0, None, "other than the lead"),
    (3, None, "other than the lead"),
    ("bpe-qwen", None, "names no member other than the lead"),
    ("nobody", None, "names no member"),
    (True, None, "is invalid"),
    (1.5, None, "is invalid"),
    (1, "hybrid:x", "set the lead's drafter to null or 'lookup'"),
])
def test_bad_member_drafting_is_one_line(trio, value, lead_drafter, needle):
    with pytest.raises(ConfigError) as exc:
        drafting_member(value, list(trio), 0, lead_drafter)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_member_drafting_needs_two_members(trio):
    with pytest.raises(ConfigError, match="at least two members"):
        drafting_member("cheapest", list(trio)[:1], 0, None)


def test_a_bad_member_drafting_fails_before_any_model_loads():
    with pytest.raises(ConfigError, match="other than the lead"):
        Ensemble(["no-such-model-a", "no-such-model-b"], member_drafting=0)   # names unchecked: nothing loaded
