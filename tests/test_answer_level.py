"""Answer-level methods (`adafuse.methods.answer_level`) and their votes (`adafuse.voting`)."""
from __future__ import annotations

import pytest
import torch

from adafuse.methods import get_method, run_method
from adafuse.voting import (
    confidences,
    consensus_pick,
    majority_vote,
    most_confident,
    normalise_answer,
    pick,
    weighted_vote,
)
from runtime.errors import ConfigError
from runtime.testing import bpe_tokenizer, tiny_member
from runtime.views import make_view, parse_view


# ---- the votes, on hand cases ----------------------------------------------------------------
def test_majority_picks_the_most_frequent_answer_and_its_earliest_sample():
    assert majority_vote(["18", "20", "20", "18", "20"]) == 1
    assert majority_vote(["Paris", "paris.", " PARIS ", "Lyon"]) == 0  # compared after normalise_answer
    assert normalise_answer("  The  Answer. ") == "the answer" and normalise_answer(" . ") is None


def test_majority_ties_go_to_the_higher_summed_logprob_then_the_earliest():
    answers = ["7", "9", "9", "7"]
    assert majority_vote(answers) == 0  # no log-probs: the answer seen first
    assert majority_vote(answers, [-5.0, -1.0, -1.0, -5.0]) == 1  # "9": -2 against "7": -10
    assert majority_vote(["7", "9"], [-2.0, -2.0]) == 0  # equal mass: the earliest


def test_samples_without_an_answer_do_not_vote():
    assert majority_vote([None, "", "5", None]) == 2
    assert majority_vote([None, None]) == 0  # nobody answered: the first sample
    assert majority_vote([None, "3", "4", "4"], [0.0, -1.0, -9.0, -9.0]) == 2  # 2 votes beat 1, whatever the mass


def test_consensus_picks_the_candidate_closest_to_the_others():
    cands = ["the cat sat on the mat", "a cat sat on the mat", "dogs bark loudly at night"]
    assert consensus_pick(cands) in (0, 1)
    assert consensus_pick(["x", "x"]) == 0 and consensus_pick(["only"]) == 0
    sim = lambda a, b: float(len(set(a) & set(b)))  # noqa: E731 - a hand-checkable similarity
    assert consensus_pick(["ab", "abc", "c"], sim) == 1  # means: ab 1.0, abc 1.5, c 0.5
    with pytest.raises(ValueError, match="unknown vote"):
        pick("median", ["a"])


def test_weighted_vote_sums_each_answers_mean_token_probability():
    import math

    conf = confidences([-2.0, -0.3, -0.2, -9.0], [4, 3, 2, 3])
    assert conf == pytest.approx([-0.5, -0.1, -0.1, -3.0])
    # "7": e^-0.5 + e^-3 = 0.656 < e^-0.1 = 0.905 for "8" or "9" alone; 8 and 9 tie: the earliest
    assert weighted_vote(["7", "8", "9", "7"], conf) == 1
    assert weighted_vote(["7", "8", "7", "7"], [-0.5, -0.1, -0.5, -3.0]) == 0   # 2 e^-0.5 + e^-3 > e^-0.1
    assert math.exp(-0.5) * 2 + math.exp(-3) > math.exp(-0.1)
    assert weighted_vote([None, "", None], [0.0, 0.0, 0.0]) == 0       # nobody answered
    assert weighted_vote([None, "5", "5."], [0.0, -1.0, -2.0]) == 1    # "5." is "5"; None does not vote


def test_most_confident_takes_the_single_surest_answer():
    assert most_confident(["1", "2", None], [-0.9, -0.2, -0.01]) == 1  # a sample without an answer is out
    assert most_confident(["1", "2"], [-0.2, -0.2]) == 0               # ties: the earliest
    assert most_confident([None, None], [0.0, 0.0]) == 0


def test_confidence_votes_need_log_probabilities():
    with pytest.raises(ValueError, match="needs the samples' log-probabilities"):
        pick("weighted", ["1", "2"])
    with pytest.raises(ValueError, match="written without them"):
        pick("confident", ["1", "2"], [None, -1.0], [3, 3])
    assert pick("confident", ["1", "2"], [-3.0, -1.0], [3, 3]) == 1
    assert confidences([0.0], [0]) == [0.0]


# ---- the methods ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def member():
    return tiny_member("qwen2", bpe_tokenizer(), seed=3)


def test_self_consistency_returns_a_majority_sample(member, one_thread):
    first_char = lambda text: text[:1] or None  # noqa: E731 - a coarse "answer", so votes collide
    outs = run_method(get_method("self-consistency"), [member], ["Question: 1 plus 5?", "Natalia sold"],
                      max_new_tokens=6, seed=0, samples=5, sampling_temperature=1.5, answer=first_char)
    for out in outs:
        trace = out.trace
        answers = [s.answer for s in trace.samples]
        assert len(trace.samples) == 5 and out.text == trace.samples[trace.chosen].text
        assert trace.chosen == majority_vote(answers, [s.logprob for s in trace.samples])
        assert all(s.logprob is not None and s.logprob <= 0 for s in trace.samples)
    alone = run_method(get_method("self-consistency"), [member], ["Question: 1 plus 5?"], max_new_tokens=6, seed=0,
                       samples=5, sampling_temperature=1.5, answer=first_char)
    assert [s.text for s in alone[0].trace.samples] == [s.text for s in outs[0].trace.samples]  # row b: seed + b


def test_self_consistency_options_and_members_are_checked(member):
    with pytest.raises(ConfigError, match="samples must be a positive integer"):
        get_method("self-consistency").parse_options({"samples": 0})
    with pytest.raises(ConfigError, match="sampling_temperature must be a number > 0"):
        get_method("self-consistency").parse_options({"sampling_temperature": 0})
    with pytest.raises(ConfigError, match="vote must be one of"):
        get_method("view-vote").parse_options({"vote": "median"})
    with pytest.raises(ConfigError, match="samples one member"):
        run_method(get_method("self-consistency"), [member, member], ["x"], max_new_tokens=2)


def test_view_vote_ties_go_to_the_lead(member, one_thread):
    views = [member, make_view(member, parse_view({"system": "A."})), make_view(member, parse_view({"system": "B."}))]
    by_view = lambda text: None  # noqa: E731 - nobody has an extractable answer: no votes at all
    outs = run_method(get_method("view-vote"), views, ["Question: 1 plus 5?"], max_new_tokens=6, lead=1,
                      answer=by_view)
    trace = outs[0].trace
    assert trace.chosen == 0 and trace.samples[0].by == views[1].name  # the lead's answer, listed first
    greedy = [views[i].generate(["Question: 1 plus 5?"], max_new_tokens=6)[0].text for i in (1, 0, 2)]
    assert [s.text for s in trace.samples] == greedy  # each view's own greedy answer


def test_view_vote_records_each_views_log_probability_and_votes_by_confidence(member, one_thread):
    views = [member, make_view(member, parse_view({"system": "A."})), make_view(member, parse_view({"system": "B."}))]
    prompt = ["Question: 1 plus 5?"]
    first_char = lambda text: text[:1] or None  # noqa: E731
    plain = run_method(get_method("view-vote"), views, prompt, max_new_tokens=6, answer=first_char)[0].trace
    for i, s in enumerate(plain.samples):   # the greedy answer's own log-probability, teacher-forced
        m, ids, lp = views[i], views[i].encode_prompt(prompt[0]), [0.0]
        _, _, (new,) = m.decode_plain(m.start([ids], room=8), 6, (), logprobs=lp)
        state = m.start([ids], room=8)
        first = state.last_logits.float().log_softmax(-1)[0, new[0]]
        rest = state.append([new]).float().log_softmax(-1)[0, torch.arange(len(new) - 1), new[1:]]
        assert lp[0] == pytest.approx(float(first + rest.sum()), abs=1e-4)
        assert s.logprob == pytest.approx(lp[0], abs=1e-4) and s.num_tokens == len(new)
    for vote, rule in (("weighted", weighted_vote), ("confident", most_confident)):
        trace = run_method(get_method("view-vote"), views, prompt, max_new_tokens=6, answer=first_char,
                           vote=vote)[0].trace
        assert [s.text for s in trace.samples] == [s.text for s in plain.samples]
        conf = [s.logprob / s.num_tokens for s in trace.samples]
        assert trace.chosen == rule([s.answer for s in trace.samples], conf)
