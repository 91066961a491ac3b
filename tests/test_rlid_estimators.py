"""Decision-plane estimators that use the labelled menu (issue 22): exact expectations over the menu
(`exact_last_move`, `exact_values`) and shuffled menus (`shuffle_menus`), on the trainers' fakes."""
from __future__ import annotations

import pytest
import torch

from runtime.errors import ConfigError
from runtime.testing import tiny_member
from rlid.pg_loss import decision_pg_loss
from rlid.token_train import TokenTrainer
from rlid.train import DecisionTrainer
from rlid.types import DecisionState, OptionLaw, StepResult
from test_rlid_helpers import PickEnv, config, decision_policy, p_right


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


# ---- exact last moves ---------------------------------------------------------------------------
def test_exact_rows_have_the_mean_gradient_of_the_sampled_term():
    """−Σ_a π(a) V(a) has gradient E_{a~π}[−V(a) ∇log π(a)]: the sampled term's mean, enumerated."""
    theta = torch.tensor([[0.3, -1.0, 0.8, 0.0], [0.1, 0.2, -0.4, float("-inf")]], requires_grad=True)
    values = torch.tensor([[1.0, 0.0, 2.0, -1.0], [0.5, 0.0, 1.5, 0.0]])
    advantages, actions = torch.tensor([0.7, -0.2]), torch.tensor([2, 0])
    exact = torch.tensor([True, False])
    loss, _ = decision_pg_loss(torch.log_softmax(theta, -1), actions, advantages, option_values=values, exact=exact)
    (grad,) = torch.autograd.grad(loss, theta)
    log_pi = torch.log_softmax(theta, -1)
    probs = log_pi.detach().exp()
    mean = sum(probs[0, a] * torch.autograd.grad(-values[0, a] * log_pi[0, a] / 2, theta, retain_graph=True)[0]
               for a in range(4))
    sampled = torch.autograd.grad(-advantages[1] * log_pi[1, 0] / 2, theta, retain_graph=True)[0]  # row 1 as before
    assert torch.allclose(grad, mean + sampled, atol=1e-6)


class PeekPickEnv(PickEnv):
    """PickEnv that can tell every option's reward at its one (so last) move."""

    steps_left = 1

    def last_move_rewards(self):
        return [self.step(i).reward for i in range(3)]


class PeekOrderEnv(PickEnv):
    """OrderEnv's rewards, told for every option at its one (so last) move."""

    steps_left = 1

    def step(self, i):
        return OrderEnv.step(self, i)

    def last_move_rewards(self):
        return [self.step(i).reward for i in range(3)]


def test_exact_last_move_scores_every_last_move_and_learns(tmp_path):
    pol = decision_policy()
    before = p_right(pol)
    recs = DecisionTrainer(pol, PeekPickEnv, config(max_steps=6, exact_last_move=True)).run()
    assert all(r["exact"] == 1.0 and r["rescored"] == r["decisions"] for r in recs)  # flat groups too
    assert p_right(pol) > before + 0.3


class TwoPickEnv(PickEnv):
    """Two decisions; only "right" twice solves it, any other move ends the episode unsolved.
    option_values() tells Q* at both moves (1 for "right" while still alive)."""

    max_steps = 2

    def reset(self, seed):
        self.seed, self.t, self.ok = seed, 0, True

    def step(self, i):
        self.t, self.ok = self.t + 1, self.ok and i == 1
        done = self.t == 2 or not self.ok
        return StepResult(1.0 if done and self.ok else 0.0, done, success=done and self.ok)

    def option_values(self):
        return [1.0 if i == 1 else 0.0 for i in range(3)]


def test_exact_values_scores_every_decision_and_learns():
    pol = decision_policy()
    before = p_right(pol)
    recs = DecisionTrainer(pol, TwoPickEnv, config(max_steps=6, exact_values=True)).run()
    assert all(r["exact"] == 1.0 and r["rescored"] == r["decisions"] for r in recs)  # first moves too
    assert p_right(pol) > before + 0.3


def test_exact_values_and_exact_last_move_are_one_choice():
    with pytest.raises(ConfigError, match="not both"):
        config(max_steps=1, exact_values=True, exact_last_move=True)


def test_exact_last_move_is_refused_by_the_token_trainer():
    from rlid.token_policy import TokenPolicy

    with pytest.raises(ConfigError, match="decision plane"):
        TokenTrainer(TokenPolicy(tiny_member("llama")), PickEnv, config(max_steps=1, exact_last_move=True))
    with pytest.raises(ConfigError, match="exact_values is for the decision plane"):
        TokenTrainer(TokenPolicy(tiny_member("llama")), PickEnv, config(max_steps=1, exact_values=True))


# ---- the immediate-reward term ---------------------------------------------------------------------
def test_aux_rows_add_lambda_times_the_exact_mean_gradient_to_the_sampled_term():
    """The auxiliary term adds λ·(−Σ_a π(a) R(a)) on its rows and leaves the sampled term in place."""
    theta = torch.tensor([[0.3, -1.0, 0.8, 0.0], [0.1, 0.2, -0.4, float("-inf")]], requires_grad=True)
    rewards = torch.tensor([[0.25, 0.0, -0.25, 0.0], [0.5, 0.0, 1.5, 0.0]])
    advantages, actions = torch.tensor([0.7, -0.2]), torch.tensor([2, 0])
    aux = torch.tensor([True, False])
    loss, _ = decision_pg_loss(torch.log_softmax(theta, -1), actions, advantages, aux_values=rewards, aux=aux,
                               aux_weight=0.5)
    (grad,) = torch.autograd.grad(loss, theta)
    log_pi = torch.log_softmax(theta, -1)
    sampled = sum(torch.autograd.grad(-advantages[n] * log_pi[n, actions[n]] / 2, theta, retain_graph=True)[0]
                  for n in range(2))
    expected = -(log_pi[0].exp() * rewards[0]).sum() / 2
    extra = torch.autograd.grad(0.5 * expected, theta)[0]
    assert torch.allclose(grad, sampled + extra, atol=1e-6)
    plain, _ = decision_pg_loss(torch.log_softmax(theta, -1), actions, advantages)
    zero, _ = decision_pg_loss(torch.log_softmax(theta, -1), actions, advantages, aux_values=rewards, aux=aux)
    assert float(plain.detach()) == float(zero.detach())                 # weight 0: the sampled loss exactly


class FlatRewardEnv(PickEnv):
    """Every move ends the episode with reward 0 (so every group's advantage is 0), but the
    environment can tell each option's immediate reward: "right" (wherever listed) would earn 1."""

    def step(self, i):
        return StepResult(0.0, True, success=False)

    def option_rewards(self):
        return [1.0 if a == "right" else 0.0 for a in self.menu()]


def test_immediate_rewards_teach_what_flat_returns_cannot():
    """Flat returns give the sampled term nothing; the immediate-reward term alone moves π toward
    the option that earns."""
    pol = decision_policy()
    before = p_right(pol)
    recs = DecisionTrainer(pol, FlatRewardEnv, config(max_steps=6, immediate_rewards=1.0)).run()
    assert all(r["aux"] == 1.0 and r["rescored"] == r["decisions"] for r in recs)
    assert p_right(pol) > before + 0.3
    pol = decision_policy()
    recs = DecisionTrainer(pol, FlatRewardEnv, config(max_steps=2)).run()
    assert all(r["rescored"] == 0 for r in recs) and abs(p_right(pol) - before) < 1e-6    # off: nothing to learn


def test_immediate_rewards_follow_a_shuffled_menu(monkeypatch):
    """With shuffled menus each option's reward sits at the position where that option was shown."""
    import rlid.train as train_module

    seen: list[tuple[list[tuple[str, ...]], torch.Tensor]] = []
    real_loss, real_rescore = train_module.decision_pg_loss, DecisionTrainer._rescore
    shown: list[list[tuple[str, ...]]] = []

    def rescore(self, part, n):
        shown.append([self._view(state)[0].actions for state, _, _ in part])
        return real_rescore(self, part, n)

    def loss(log_pi, *args, aux_values=None, aux=None, **kw):
        seen.append(aux_values)
        return real_loss(log_pi, *args, aux_values=aux_values, aux=aux, **kw)

    monkeypatch.setattr(DecisionTrainer, "_rescore", rescore)
    monkeypatch.setattr(train_module, "decision_pg_loss", loss)
    DecisionTrainer(decision_policy(), FlatRewardEnv, config(max_steps=2, immediate_rewards=1.0, shuffle_menus=True)).run()
    menus = [m for chunk in shown for m in chunk]
    assert len(set(menus)) > 1                                          # the order did change
    values = torch.cat(seen)
    assert values.shape[0] == len(menus)
    for menu, row in zip(menus, values):
        assert row.tolist() == [1.0 if a == "right" else 0.0 for a in menu]


def test_immediate_rewards_settings():
    with pytest.raises(ConfigError, match="weight >= 0"):
        config(max_steps=1, immediate_rewards=-1.0)
    with pytest.raises(ConfigError, match="not both"):
        config(max_steps=1, immediate_rewards=1.0, exact_values=True)
    from rlid.token_policy import TokenPolicy

    with pytest.raises(ConfigError, match="immediate_rewards is for the decision plane"):
        TokenTrainer(TokenPolicy(tiny_member("llama")), PickEnv, config(max_steps=1, immediate_rewards=1.0))


class OrderEnv(PickEnv):
    """PickEnv whose paying option is "right" wherever the menu lists it."""

    def step(self, i):
        return StepResult(1.0 if self.menu()[i] == "right" else 0.0, True, success=self.menu()[i] == "right")


def test_shuffled_menus_show_permuted_options_and_map_choices_back(monkeypatch):
    """Rollout states are shown in random orders; a policy that always picks the option *saying*
    "right" must then always execute "right" (choices mapped back to the env's index), and the
    exact last-move values follow the shown order."""
    pol = decision_policy()
    real_laws, seen = pol.laws, []

    def laws(states):  # the model's law plus a large bonus on the option that says "right"
        seen.extend(s.actions for s in states)
        bonus = [torch.tensor([20.0 if a == "right" else 0.0 for a in s.actions]) for s in states]
        return [OptionLaw(torch.log_softmax(law.log_probs + b, -1), law.labels) for law, b in zip(real_laws(states), bonus)]

    pol.laws = laws
    import rlid.train as train_module

    values_seen = []
    real_loss = train_module.decision_pg_loss

    def loss(log_pi, *args, option_values=None, exact=None, **kw):
        values_seen.append((log_pi.detach().exp(), option_values))
        return real_loss(log_pi, *args, option_values=option_values, exact=exact, **kw)

    monkeypatch.setattr(train_module, "decision_pg_loss", loss)
    recs = DecisionTrainer(pol, PeekOrderEnv, config(max_steps=3, shuffle_menus=True)).run()
    assert len(set(seen)) > 1 and all(sorted(a) == ["left", "right", "stay"] for a in seen)
    assert all(r["success_rate"] == 1.0 for r in recs)               # "right" executed every time

    class NearlyRight(PeekOrderEnv):                                  # options pay 1 ("right") or 0.5 / 0
        def last_move_rewards(self):
            return [{"left": 0.5, "right": 1.0, "stay": 0.0}[a] for a in self.menu()]

    pol = decision_policy(seed=1)
    values_seen.clear()
    chunks: list[list[tuple[str, ...]]] = []                          # the shown menus of each re-scored chunk
    real_rescore = DecisionTrainer._rescore

    def rescore(self, part, n):
        chunks.append([self._view(state)[0].actions for state, _, _ in part])
        return real_rescore(self, part, n)

    monkeypatch.setattr(DecisionTrainer, "_rescore", rescore)
    DecisionTrainer(pol, NearlyRight, config(max_steps=2, exact_last_move=True, shuffle_menus=True)).run()
    pay = {"left": 0.5, "right": 1.0, "stay": 0.0}
    assert len(chunks) == len(values_seen)
    rows = [(row, shown) for (_, values), chunk in zip(values_seen, chunks) for row, shown in zip(values, chunk)]
    assert rows and len({shown for _, shown in rows}) > 1
    for row, shown in rows:                                           # values in the shown order, scaled
        scale = float(row.max())
        assert torch.allclose(row, torch.tensor([pay[a] * scale for a in shown]))


def test_shuffled_menus_keep_each_note_with_its_action():
    trainer = DecisionTrainer(decision_policy(), PeekOrderEnv, config(max_steps=1, shuffle_menus=True))
    state = DecisionState("x", ("a", "b", "c", "d"), notes=("note a", "note b", "note c", "note d"))
    views = [trainer._shuffle(state) for _ in range(8)]
    assert len({v.actions for v in views}) > 1
    assert all(v.notes == tuple(f"note {a}" for a in v.actions) for v in views)


def test_shuffle_menus_is_refused_by_the_token_trainer():
    from rlid.token_policy import TokenPolicy

    with pytest.raises(ConfigError, match="shuffle_menus is for the decision plane"):
        TokenTrainer(TokenPolicy(tiny_member("llama")), PickEnv, config(max_steps=1, shuffle_menus=True))

