"""Sample-rerank baseline: each member's answers, cross-member scores equal a fresh full forward,
the best weighted mean wins, sampling is seeded and batch-invariant, option errors."""
import pytest
import torch

from runtime.errors import ConfigError
from adafuse.methods import sample_rerank as sr
from adafuse.scoring import combine_scores, normalised_score
from runtime.testing import bpe_tokenizer, char_tokenizer, tiny_member

PROMPTS = ["Question: how many clips?", "The quick"]


def with_bias(member, bias_of):
    """Give the member's head a bias {token: value} (e.g. to ban partial-UTF-8 tokens)."""
    old = member.model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        for tok, value in bias_of.items():
            head.bias[tok] = value
    member.model.lm_head = head
    return member


def bpe_member(seed=1, name="bpe"):
    m = tiny_member("qwen2", tokenizer=bpe_tokenizer(), seed=seed, name=name)
    return with_bias(m, {i: -1e4 for i in range(len(m.tokenizer)) if "\ufffd" in m.tokenizer.decode([i])})


def char_member(seed=0, name="char"):
    return tiny_member("llama", tokenizer=char_tokenizer(), seed=seed, name=name)


def run(members, prompts=PROMPTS, **kw):
    args = dict(max_new_tokens=10, stop=[], temperature=0.0, seed=None, weights=None, lead=0, chat=None)
    args.update(kw)
    return sr.generate(members, prompts, **args)


@torch.no_grad()
def ref_score(member, prompt, answer, finish, mode):
    """A member's normalised score of an answer from one full forward, no cache."""
    ids = member.encode_prompt(prompt)
    cont = (member.encode(answer) if answer else []) + ([sr.end_token(member, None)] if finish == "eos" else [])
    logits = member.model(input_ids=torch.tensor([ids + cont])).logits[0].float()
    lp = torch.log_softmax(logits[len(ids) - 1 : -1], -1).gather(-1, torch.tensor(cont)[:, None]).squeeze(-1)
    return normalised_score(lp, answer, mode)


@pytest.fixture(scope="module")
def pair():
    return [char_member(), bpe_member()]


@pytest.mark.parametrize("mode", ["byte", "token"])
def test_answers_scores_and_choice(pair, mode):
    greedy = [m.generate(PROMPTS, max_new_tokens=10, temperature=0) for m in pair]
    chosen_by_weights = []
    for weights in ([1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 3.0]):
        outs = run(pair, weights=weights, normalise=mode)
        chosen = []
        for b, out in enumerate(outs):
            answers = out.trace.answers
            # every member's own greedy answer is a candidate, tagged with who wrote it
            for m, g in zip(pair, greedy):
                hit = [a for a in answers if a.text == g[b].text and a.finish == g[b].finish_reason]
                assert len(hit) == 1 and m.name in hit[0].by
            # each member's score equals a fresh full forward; choice = best weighted mean
            ref = torch.tensor([[ref_score(m, PROMPTS[b], a.text + a.stop, a.finish, mode) for a in answers]
                                for m in pair])
            got = torch.tensor([a.scores for a in answers]).T
            torch.testing.assert_close(got, ref, atol=2e-4, rtol=0)
            mean = combine_scores(ref, weights)
            best = int(torch.argmax(mean))
            assert out.trace.chosen == best and out.text == answers[best].text
            assert out.trace.answers[best].mean == pytest.approx(float(mean[best]), abs=2e-4)
            # the recorded samples: one per writer, its own token count, every member's score of it
            samples = out.trace.samples
            assert [s.by for s in samples] == [m.name for m in pair]
            for m, g in zip(pair, greedy):
                s = next(s for s in samples if s.by == m.name)
                assert s.text == g[b].text and s.num_tokens == g[b].num_tokens
                assert s.cross == dict(zip(out.trace.members, answers[[a.text for a in answers].index(s.text)].scores))
            chosen.append(best)
        chosen_by_weights.append(tuple(chosen))
        assert set(outs[0].cost.forward_passes) == {"char", "bpe"}
    assert len(set(chosen_by_weights)) > 1  # the weights change the pick


def test_identical_members_return_their_shared_greedy_answer():
    a, b = char_member(5, name="a"), char_member(5, name="b")
    greedy = a.generate(PROMPTS, max_new_tokens=10, temperature=0)
    outs = run([a, b])
    for out, g in zip(outs, greedy):
        assert out.text == g.text and out.finish_reason == g.finish_reason and out.num_tokens == g.num_tokens
        assert len(out.trace.answers) == 1 and out.trace.answers[0].by == ["a", "b"]


def test_empty_answer_pays_for_its_end_token(pair):
    """An answer that is just EOS is scored by each member's probability of ending there."""
    eager = with_bias(char_member(2, name="eager"), {char_tokenizer().eos_token_id: 50.0})
    members = [eager, pair[1]]
    out = run(members, prompts=PROMPTS[:1])[0]
    empty = [a for a in out.trace.answers if a.text == ""]
    assert len(empty) == 1 and empty[0].finish == "eos"
    assert empty[0].scores[0] == pytest.approx(0.0, abs=1e-3)
    assert empty[0].scores[1] == pytest.approx(ref_score(pair[1], PROMPTS[0], "", "eos", "byte"), abs=2e-4)
    assert empty[0].scores[1] < -0.5


def test_stop_ended_answers_score_their_stop_string(pair):
    greedy = pair[0].generate(PROMPTS[:1], max_new_tokens=10, temperature=0)[0].text
    stop = greedy[2:4]
    out = run(pair, prompts=PROMPTS[:1], stop=["@@", stop])[0]
    ended = [a for a in out.trace.answers if a.finish == "stop"]
    assert ended and all(a.stop == stop for a in ended)
    assert ended[0].text == greedy[:2] and "char" in ended[0].by
    for a in out.trace.answers:
        ref = [ref_score(m, PROMPTS[0], a.text + a.stop, a.finish, "byte") for m in pair]
        assert a.scores == pytest.approx(ref, abs=2e-4)


def test_sampling_is_seeded_and_batch_invariant(pair):
    kw = dict(temperature=1.0, samples_per_member=3)
    batched = run(pair, seed=11, **kw)
    again = run(pair, seed=11, **kw)
    assert [o.trace for o in batched] == [o.trace for o in again]
    for b, prompt in enumerate(PROMPTS):
        single = run(pair, prompts=[prompt], seed=11 + b, **kw)[0]
        assert [a.text for a in single.trace.answers] == [a.text for a in batched[b].trace.answers]
        assert single.text == batched[b].text
    tags = [t for a in batched[0].trace.answers for t in a.by]
    assert sorted(tags) == sorted(f"{m}#{j}" for m in ("char", "bpe") for j in range(3))
    assert 1 < len(batched[0].trace.answers) <= 6
    # lead first: the lead's answers come first in the list
    assert batched[0].trace.answers[0].by[0].startswith("char")
    assert run(pair, seed=11, lead=1, **kw)[0].trace.answers[0].by[0].startswith("bpe")


@pytest.mark.parametrize("kw,match", [
    (dict(top_k=3), "unknown option 'top_k'"),
    (dict(samples_per_member=2), "temperature > 0"),
    (dict(samples_per_member=0, temperature=1.0), "samples_per_member"),
    (dict(normalise="nats"), "normalise"),
    (dict(weights=[1.0, 1.0, 1.0]), "weights"),
    (dict(lead=-1), "lead"),
])
def test_bad_options(pair, kw, match):
    with pytest.raises(ConfigError, match=match):
        run(pair, **kw)
