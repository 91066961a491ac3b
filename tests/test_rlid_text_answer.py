"""The decision model answering with the action's own text (`answer: text`, `rlid.text_law`): π(a) is
the model's own probability of a's text (as written or after a space) then a stop, normalised over
the menu — checked against a hand loop of full forwards, batched = per state, gradients, errors."""
from __future__ import annotations

import pytest
import torch

from rlid.decision_model import DecisionModel
from rlid.prompt import action_text
from rlid.text_law import stop_token_ids, text_forest, text_realisations
from rlid.types import DecisionState
from test_rlid_helpers import assert_gradients_reach_every_parameter
from runtime.testing import bpe_tokenizer, tiny_member

STATES = [
    DecisionState("Numbers: 3 4 7. Target 14.", ("3 + 4 = 7", "7 * 3 = 21", "7 - 4 = 3"), instruction="Reach the target."),
    DecisionState("You see a red dress and a bench.", ("take red dress", "take red", "look around", "put red dress in bench")),
    DecisionState("x", ("only",)),
    DecisionState("A much longer observation that spans a good many more tokens than the others do.", ("a", "b")),
]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _hand_law(member, prompt_ids, realisations, stops):
    """log π by brute force: one full forward per realisation, no cache, no trie, no padding."""
    scores = []
    for variants in realisations:
        mass = []
        for seq in variants:
            ids = torch.tensor([list(prompt_ids) + list(seq)])
            logp = torch.log_softmax(member.model(ids).logits[0].float(), -1)
            n = len(prompt_ids)
            lp = sum(logp[n - 1 + i, t] for i, t in enumerate(seq))
            lp = lp + torch.logsumexp(logp[n - 1 + len(seq), stops], 0)
            mass.append(lp)
        scores.append(torch.logsumexp(torch.stack(mass), 0))
    return torch.log_softmax(torch.stack(scores), 0)


def test_forest_shares_prefixes_and_keeps_every_realisation():
    tok = bpe_tokenizer()
    reals = text_realisations(tok, STATES[1].actions)
    forest = text_forest(reals)
    chains = [list(v) for vs in reals for v in vs]
    assert len(forest.paths) == len(chains)
    for path, seq in zip(forest.paths, chains):
        assert [forest.tokens[i] for i in path] == seq
        assert all(forest.parents[path[k]] == (path[k - 1] if k else -1) for k in range(len(path)))
    assert len(forest.tokens) < sum(len(c) for c in chains)   # "take red" is a prefix of "take red dress"
    assert all(p < i for i, p in enumerate(forest.parents))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_text_law_equals_the_models_own_sequence_probabilities(arch):
    m = tiny_member(arch, bpe_tokenizer(), seed=2)
    dm = DecisionModel(m, answer="text")
    stops = stop_token_ids(m.tokenizer, m.eos_token_ids)
    ids = [dm.prompt_ids(s) for s in STATES]
    assert len({len(i) for i in ids}) == len(ids)   # padding is exercised
    with torch.no_grad():
        batched = dm.laws(STATES)
        for s, law, p in zip(STATES, batched, ids):
            hand = _hand_law(m, p, text_realisations(m.tokenizer, s.actions), stops)
            torch.testing.assert_close(law.log_probs, hand, atol=2e-5, rtol=0)
            (alone,) = dm.laws([s])
            torch.testing.assert_close(alone.log_probs, hand, atol=2e-5, rtol=0)
            assert abs(float(law.probs.sum()) - 1) < 1e-6
    assert dm.counters.forwards == 2 * (1 + len(STATES))


def test_text_prompt_is_the_token_policys_and_gradients_flow():
    m = tiny_member("llama", bpe_tokenizer(), seed=4)
    dm = DecisionModel(m, answer="text")
    assert dm.prompt_ids(STATES[1]) == m.encode_prompt(action_text(STATES[1]))
    m.model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        laws = dm.laws(STATES)
        (laws[0].log_probs[1] + laws[1].log_probs[3]).backward()
    assert_gradients_reach_every_parameter(m.model)


def test_text_answer_errors_are_clear():
    m = tiny_member("llama", bpe_tokenizer(), seed=4)
    with pytest.raises(ValueError, match="answer"):
        DecisionModel(m, answer="json")
    with pytest.raises(ValueError, match="realise_action_text"):
        DecisionModel(m, answer="text", realise_action_text=True)
    with pytest.raises(ValueError, match="same text"):
        text_realisations(m.tokenizer, ["up", "up"])
