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


# ---- votes over text and program answers, and early stop ---------------------------------------
def test_prove_keeps_the_text_answers_a_program_confirms():
    from adafuse.voting import prove_vote

    # text: 5, 6, 6; program: 5 -> only "5" is confirmed, though "6" has more text votes
    assert prove_vote(["5", "6", "6", "5"], [False, False, False, True]) == 0
    # no program confirms any text answer: the majority over every answer
    assert prove_vote(["5", "6", "6", "7"], [False, False, False, True]) == 1
    # two confirmed answers: the majority among the confirmed text answers
    assert prove_vote(["5", "6", "6", "5", "6"], [False, False, False, True, True]) == 1
    assert pick("prove", ["1", "2"], programs=[False, True]) == 0  # nothing confirmed: majority, ties to the first


def _majority_winner(answers):
    chosen = majority_vote(answers)
    return normalise_answer(answers[chosen]) if answers else None


def test_decided_majority_is_exactly_when_no_answers_to_come_can_change_the_winner():
    """Exact enumeration over a small alphabet: `vote_decided` is True iff every completion by
    `to_come` more answers (None included) keeps the majority's winner."""
    import itertools

    from adafuse.voting import vote_decided

    alphabet = ["a", "b", "c", None]
    for n in range(0, 5):
        for drawn in itertools.product(alphabet, repeat=n):
            for to_come in range(0, 4):
                now = _majority_winner(list(drawn)) if any(drawn) else None
                finals = {_majority_winner(list(drawn + rest)) if any(drawn + rest) else None
                          for rest in itertools.product(alphabet + ["d"], repeat=to_come)}
                assert vote_decided("majority", list(drawn), to_come) == (finals == {now}), (drawn, to_come)


def test_decided_weighted_vote_never_stops_where_answers_to_come_could_change_it():
    import itertools
    import math

    from adafuse.voting import vote_decided

    conf = [math.log(w) for w in (0.9, 0.3, 0.6, 0.2)]
    for drawn in itertools.product(["a", "b", None], repeat=4):
        for to_come in range(0, 3):
            if not vote_decided("weighted", list(drawn), to_come, conf):
                continue
            now = normalise_answer(drawn[weighted_vote(list(drawn), conf)])
            for rest in itertools.product(["a", "b", "c"], repeat=to_come):  # each answer to come at confidence 1
                final = list(drawn) + list(rest)
                assert normalise_answer(final[weighted_vote(final, conf + [0.0] * to_come)]) == now


def test_view_vote_options_for_samples_and_early_stop_are_checked(member):
    method = get_method("view-vote")
    for bad, match in (({"samples": 0}, "samples=0 is invalid"), ({"early_stop": 1}, "early_stop=1 is invalid"),
                       ({"early_stop": "decided", "vote": "prove"}, "needs vote majority or weighted"),
                       ({"draw": [2]}, "draw needs early_stop"), ({"early_stop": 2, "draw": [3, 2]}, "draw=.* invalid")):
        with pytest.raises(ConfigError, match=match):
            method.parse_options(bad)
    with pytest.raises(ConfigError, match="samples lists 2 counts for 3 members"):
        run_method(method, [member] * 3, ["x"], max_new_tokens=2, samples=[1, 2])


def test_answers_are_drawn_by_rounds_lead_first():
    from adafuse.methods.answer_draws import AnswerSlot as S, answer_order, draw_batches

    order = answer_order([2, 1, 3], lead=1)
    assert order == [S(1, 0), S(0, 0), S(2, 0), S(0, 1), S(2, 1), S(2, 2)]
    assert draw_batches(order, None) == [order[:3], order[3:5], order[5:]]
    assert draw_batches(order, [2, 4]) == [order[:2], order[2:4], order[4:]]


def _views(member):
    return [member, make_view(member, parse_view({"system": "A."})), make_view(member, parse_view({"system": "B."}))]


def test_early_stop_on_a_decided_vote_gives_the_full_votes_answer_with_fewer_answers(member, one_thread):
    """Lossless: the answer of every prompt equals the vote over every answer; prompts whose vote was
    decided early draw (and cost) less."""
    first_char = lambda text: text[:1] or None  # noqa: E731 - coarse answers, so votes collide
    prompts = ["Question: 1 plus 5?", "Natalia sold", "The quick brown", "Translate German", "In the beginning"]
    kw = dict(max_new_tokens=5, seed=0, answer=first_char, samples=[3, 2, 2], sampling_temperature=1.3)
    full = run_method(get_method("view-vote"), _views(member), prompts, **kw)
    early = run_method(get_method("view-vote"), _views(member), prompts, early_stop="decided", **kw)
    for f, e in zip(full, early):
        assert len(f.trace.samples) == 7 and f.stats["samples"] == 7
        drawn = len(e.trace.samples)
        assert [s.text for s in e.trace.samples] == [s.text for s in f.trace.samples[:drawn]]  # the same draws
        assert normalise_answer(e.trace.samples[e.trace.chosen].answer) == \
            normalise_answer(f.trace.samples[f.trace.chosen].answer)
        assert e.stats["answers_planned"] == 7 and drawn in (3, 6, 7)  # rounds of 3, 3 and 1 answers
    stopped = [e for e in early if len(e.trace.samples) < 7]
    assert stopped, "no prompt stopped early: the test's answers never agree"
    # fewer tokens through the model (more, smaller forwards: one draw after another)
    tokens = lambda out: sum(out.cost.tokens_processed.values())  # noqa: E731
    assert sum(map(tokens, early)) < sum(map(tokens, full))
    assert all(tokens(e) < tokens(f) for e, f in zip(early, full) if len(e.trace.samples) < 7)


def test_early_stop_once_k_agree(member, one_thread):
    same = lambda text: "x"  # noqa: E731 - every answer agrees
    outs = run_method(get_method("view-vote"), _views(member), ["Question: 1 plus 5?", "Natalia sold"],
                      max_new_tokens=4, seed=0, answer=same, samples=2, early_stop=2, draw=[2])
    assert [len(o.trace.samples) for o in outs] == [2, 2]  # the first draw's two answers agree: stop


def test_program_views_answer_with_what_their_program_prints(member, one_thread, monkeypatch):
    """A program view's answer is its program's printed output (the sandbox's result on the sample and
    the output); the prove vote keeps the text answer the program confirms."""
    from adafuse.methods import answer_draws
    from runtime.sandbox import ProgramResult

    program_view = make_view(member, parse_view({"kind": "program", "system": "Write a program."}))
    text_view = make_view(member, parse_view({"system": "Think."}))
    # the tiny model's text is no program: run for real, the sandbox records the failure, no answer
    out = run_method(get_method("view-vote"), [text_view, program_view], ["Natalia sold"], max_new_tokens=4,
                     answer=lambda t: t.strip()[:1] or None)[0]
    sample = out.trace.samples[1]
    assert sample.program is not None and sample.program["error"] is not None and sample.answer is None
    # scripted programs: what they print is the answer
    monkeypatch.setattr(answer_draws, "run_output", lambda text: ProgramResult(stdout="42\n", error=None))
    outs = run_method(get_method("view-vote"), [text_view, text_view, program_view], ["Natalia sold"],
                      max_new_tokens=4, answer=lambda t: "42" if t.strip() == "42" else "7", vote="prove")
    trace = outs[0].trace
    assert [s.answer for s in trace.samples] == ["7", "7", "42"]
    assert trace.chosen == 0  # no text answer confirmed: the majority ("7")
    assert outs[0].program is None
    outs = run_method(get_method("view-vote"), [program_view, text_view], ["Natalia sold"], max_new_tokens=4,
                      answer=lambda t: "42" if t.strip() == "42" else "7", vote="majority")
    assert outs[0].trace.chosen == 0 and outs[0].program["stdout"] == "42\n"  # the chosen program's result


# ---- speculative decoding inside the vote -------------------------------------------------------------
def test_cross_row_lookup_finds_what_a_sibling_wrote_after_the_same_words():
    from specdec.cross_row import SiblingBoard, continuations_in

    board = SiblingBoard()
    board.write(0, "a", [5, 6, 7, 8, 9])
    board.write(0, "b", [1, 6, 7, 3])
    board.write(1, "c", [6, 7, 4])                       # another problem: never read
    assert board.siblings(0, "a") == [[1, 6, 7, 3]]
    sibs = board.siblings(0, "z")
    assert continuations_in(sibs, [2, 6, 7], 3, 2, depth=2, num=3) == [[3], [8, 9]]   # latest row first
    assert continuations_in(sibs, [2, 2], 3, 2, depth=2, num=3) == []


@pytest.mark.parametrize("drafter", ["rows", "lookup"])
def test_a_vote_decoded_speculatively_writes_the_same_tokens(member, one_thread, drafter):
    """Lossless: with a drafter (cross-row or prompt lookup) every answer of the vote, greedy and
    sampled, is token for token the one plain decoding writes with the same generators."""
    from specdec.drafters import make_drafter
    from specdec.engine import SpeculativeGenerator

    views = _views(member)
    prompts = ["Question: 1 plus 5?", "Natalia sold clips", "The quick brown fox"]
    kw = dict(max_new_tokens=10, seed=0, answer=lambda t: t[:1] or None, samples=[2, 2, 1], sampling_temperature=1.2)
    plain = run_method(get_method("view-vote"), views, prompts, **kw)
    specs = [SpeculativeGenerator(v, make_drafter(drafter)) for v in views]
    fast = run_method(get_method("view-vote"), views, prompts, speculators=specs, **kw)
    for p, f in zip(plain, fast):
        assert [s.text for s in f.trace.samples] == [s.text for s in p.trace.samples]
        assert [s.logprob for s in f.trace.samples] == pytest.approx([s.logprob for s in p.trace.samples], abs=1e-4)
        assert f.trace.chosen == p.trace.chosen
    # drafts were taken (the tiny model repeats itself, so lookups match): not a vacuous equality
    from adafuse.methods.answer_draws import AnswerSlot, write_answers
    from adafuse.methods.base import GenerationRequest
    from specdec.cross_row import SiblingBoard

    request = GenerationRequest.make(prompts, 24, seed=0)
    slots = [AnswerSlot(0, 0), AnswerSlot(0, 1), AnswerSlot(1, 0)]
    fast_rows = write_answers(views, request, slots, range(3), 1.2, 1.0, speculators=specs, board=SiblingBoard())
    plain_rows = write_answers(views, request, slots, range(3), 1.2, 1.0)
    assert {k: a.text for k, a in fast_rows.items()} == {k: a.text for k, a in plain_rows.items()}
    assert sum(a.accepted for a in fast_rows.values()) > 0
    sc_plain = run_method(get_method("self-consistency"), [member], prompts, max_new_tokens=10, seed=1, samples=3,
                          sampling_temperature=1.2)
    sc_fast = run_method(get_method("self-consistency"), [member], prompts, max_new_tokens=10, seed=1, samples=3,
                         sampling_temperature=1.2, speculators=[SpeculativeGenerator(member, make_drafter(drafter))])
    assert [[s.text for s in o.trace.samples] for o in sc_fast] == [[s.text for s in o.trace.samples] for o in sc_plain]
