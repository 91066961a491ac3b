"""`exact_values` × `shuffle_menus` on the real Countdown environment and the real `DecisionModel` (a
tiny llama, char tokenizer): the per-option values the loss uses are `env.option_values()` of the
options AS SHOWN (after the permutation), scaled by 1 / the step's return std; the gradient the
trainer accumulates over re-score chunks of menus of different sizes is the gradient of the exact
−(scale / n) Σ_s Σ_a π(a | s) Q*(s, a); and one optimizer step raises Σ_a π(a) Q*(s, a) on those states."""
from __future__ import annotations

import pytest
import torch

import rlid.train as train_module
from rlid.decision_model import DecisionModel
from rlid.envs.countdown import CountdownEnv, CountdownOptions
from rlid.train import DecisionTrainer
from runtime.testing import char_tokenizer, tiny_member
from test_rlid_helpers import config

OPTIONS = CountdownOptions(min_numbers=3, max_numbers=3, reach_shaping=0.5, end_on_dead_end=True)  # menus <= 15 (A..O)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _replayed_values(episodes, discount: float = 1.0) -> dict[int, dict[str, float]]:
    """Q* by option text of every transition's state (id), replayed on a fresh env from its seed."""
    env, out = CountdownEnv(OPTIONS), {}
    for ep in episodes:
        env.reset(ep.seed)
        for t in ep.transitions:
            assert tuple(env.menu()) == t.state.actions
            out[id(t.state)] = dict(zip(env.menu(), env.option_values(discount=discount)))
            env.step(t.action)
    return out


@pytest.mark.parametrize("lr", [1e-3, 2e-2])
def test_exact_values_with_shuffled_countdown_menus_follow_the_shown_options_and_raise_expected_q(monkeypatch, lr):
    dm = DecisionModel(tiny_member("llama", tokenizer=char_tokenizer(), seed=1, hidden=64))
    trainer = DecisionTrainer(dm, lambda: CountdownEnv(OPTIONS), config(
        train_seeds=tuple(range(16)), seeds_per_step=4, group_size=2, lr=lr, max_steps=1, rescore_batch=3,
        exact_values=True, shuffle_menus=True, seed=3))
    got: dict = {}
    real_collect, real_rescore, real_loss = trainer.collect, trainer._rescore, train_module.decision_pg_loss
    chunks, rows = [], []

    def collect(seeds):
        got["episodes"], payloads = real_collect(seeds)
        return got["episodes"], payloads

    def rescore(part, n):
        chunks.append([s for s, _, _ in part])
        return real_rescore(part, n)

    def loss(log_pi, *args, option_values=None, exact=None, **kw):
        rows.extend(zip(option_values, exact, torch.isfinite(log_pi.detach())))
        return real_loss(log_pi, *args, option_values=option_values, exact=exact, **kw)

    def shown(state):
        return trainer._view(state)[0]

    def expected_q(states, q, grad=False):
        """(1 / n) Σ_s Σ_a π(a | shown s) Q*(s, a), Q* looked up by the option's text."""
        with torch.set_grad_enabled(grad):
            laws = dm.laws([shown(s) for s in states])
            return sum((law.probs * torch.tensor([q[id(s)][a] for a in shown(s).actions])).sum()
                       for law, s in zip(laws, states)) / len(states)

    real_step = trainer.optimizer_step

    def optimizer_step():                     # gradients accumulated, weights not yet moved
        states = [s for chunk in chunks for s in chunk]
        q = _replayed_values(got["episodes"])
        params = trainer.adapter.parameters()
        accumulated = torch.cat([p.grad.flatten() for p in params])
        returns = torch.tensor([ep.total_reward for ep in got["episodes"]], dtype=torch.float64)
        scale = 1.0 / (float(returns.std()) + 1e-6)
        n = sum(len(ep.transitions) for ep in got["episodes"])
        mine = torch.autograd.grad(-expected_q(states, q, grad=True) * len(states) * scale / n, params)
        got["grads"] = accumulated, torch.cat([g.flatten() for g in mine])
        got["states"], got["q"], got["before"] = states, q, float(expected_q(states, q))
        out = real_step()
        got["after"] = float(expected_q(states, q))
        got["scale"] = scale
        return out

    monkeypatch.setattr(trainer, "collect", collect)
    monkeypatch.setattr(trainer, "_rescore", rescore)
    monkeypatch.setattr(trainer, "optimizer_step", optimizer_step)
    monkeypatch.setattr(train_module, "decision_pg_loss", loss)
    (rec,) = trainer.run()

    states, q = got["states"], got["q"]
    assert rec["exact"] == 1.0 and rec["rescored"] == rec["decisions"] == len(states) > 3
    assert rec["rescore_gap"] < 1e-4                                 # chosen option mapped back and forth
    assert len(chunks) > 1                                           # several re-score chunks ...
    assert any(len({len(s.actions) for s in chunk}) > 1 for chunk in chunks)   # ... mixing menu sizes
    assert any(shown(s).actions != s.actions for s in states)        # menus really shuffled
    # (a) each loss row holds Q* of the options as shown, scaled; padding past the menu is 0
    assert len(rows) == len(states)
    for (values, exact, real), s in zip(rows, states):
        view = shown(s)
        assert exact and sorted(view.actions) == sorted(s.actions) and int(real.sum()) == len(view.actions)
        want = torch.tensor([q[id(s)][a] * got["scale"] for a in view.actions], dtype=values.dtype)
        assert torch.allclose(values[: len(want)], want, rtol=1e-5) and not values[len(want):].any()
    # (b) the accumulated gradient is that of the exact expected value, and one step raises it
    accumulated, mine = got["grads"]
    assert torch.allclose(accumulated, mine, rtol=1e-4, atol=1e-7)
    assert got["after"] > got["before"], (got["before"], got["after"])


def test_value_discount_records_discounted_option_values_and_is_validated():
    """`value_discount` γ: the rollouts record option_values(discount=γ) at every decision (replayed on a
    fresh env), and some live option is worth γ^d < 1; it needs exact_values and a γ in (0, 1]."""
    from runtime.errors import ConfigError
    dm = DecisionModel(tiny_member("llama", tokenizer=char_tokenizer(), seed=1, hidden=64))
    trainer = DecisionTrainer(dm, lambda: CountdownEnv(OPTIONS), config(
        train_seeds=tuple(range(8)), seeds_per_step=4, group_size=2, lr=1e-3, max_steps=1, rescore_batch=4,
        exact_values=True, value_discount=0.5, seed=3))
    episodes, _ = trainer.collect([0, 1, 2, 3])
    q = _replayed_values(episodes, discount=0.5)
    seen = [v for ep in episodes for t in ep.transitions for v in t.option_rewards]
    for ep in episodes:
        for t in ep.transitions:
            assert t.option_rewards == pytest.approx([q[id(t.state)][a] for a in t.state.actions])
    assert 0.5 in seen or 0.25 in seen                                # a live option, discounted
    with pytest.raises(ConfigError, match="exact_values"):
        config(max_steps=1, value_discount=0.5)
    with pytest.raises(ConfigError, match="value_discount must be"):
        config(max_steps=1, exact_values=True, value_discount=1.5)
