"""RL in the decision plane and the token-level baseline (issue 22): advantages, losses, the toy-bandit
estimator facts (exact enumeration), LoRA, checkpoints, and both trainers on tiny in-process models,
with fakes of the decision model and the token policy (`test_rlid_helpers`); the estimators that use
the menu (exact values, shuffled menus) are in `test_rlid_estimators`."""
from __future__ import annotations

import json
import math

import pytest
import torch

from runtime.errors import ConfigError
from runtime.testing import tiny_member
from rlid import bandit, checkpoint
from rlid.advantages import RunningBaseline, decision_returns, group_advantages
from rlid.lora import LoraSpec, add_lora, adapter_state, find_target_modules
from rlid.pg_loss import decision_pg_loss, k3_kl, menu_entropy, menu_kl, pad_log_probs, token_pg_loss
from rlid.token_train import TokenTrainer
from rlid.train import DecisionTrainer
from rlid.train_loop import TIME_FIELDS, TrainConfig, step_seeds
from test_rlid_helpers import (FakeMember, FakeTokenPolicy, PickEnv, TinyTextLM, WalkEnv, config,
                               decision_policy, decision_state_of, p_right)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield



# ---- advantages and losses: hand cases ----------------------------------------------------------
def test_group_advantages_hand_cases():
    a = group_advantages([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [0.0, 3.0, 0.0, 0.0]])
    s = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    assert torch.allclose(a[0], torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64) / (s + 1e-6))
    assert torch.equal(a[1], torch.zeros(4, dtype=torch.float64))            # all equal: zeros
    assert torch.allclose(a[2], torch.tensor([-0.75, 2.25, -0.75, -0.75], dtype=torch.float64) / (1.5 + 1e-6))
    assert torch.equal(group_advantages([[5.0], [1.0]]), torch.zeros(2, 1, dtype=torch.float64))
    with pytest.raises(ValueError):
        group_advantages([1.0, 2.0])


def test_running_baseline_and_returns():
    b = RunningBaseline()
    assert b.advantages([1.0, 3.0]).tolist() == [1.0, 3.0]
    b = b.update([1.0, 3.0])
    assert (b.value, b.count) == (2.0, 2)
    assert b.advantages([2.0, 5.0]).tolist() == [0.0, 3.0]
    assert b.update([5.0]).value == pytest.approx(3.0)                       # (1 + 3 + 5) / 3
    ema = RunningBaseline(momentum=0.5).update([4.0]).update([0.0, 2.0])
    assert ema.value == pytest.approx(0.5 * 4.0 + 0.5 * 1.0)
    assert decision_returns([0.0, 0.0, 1.0]) == [1.0, 1.0, 1.0]
    assert decision_returns([0.0, 0.0, 1.0], gamma=0.5) == [0.25, 0.25, 0.25]
    assert decision_returns([1.0, 0.0, 1.0], gamma=0.5, to_go=True) == [1.25, 0.5, 1.0]


def test_menu_kl_entropy_and_padding():
    p = torch.log(torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]))
    p[0, 2] = float("-inf")                                                   # a 2-option menu, padded
    q = torch.log(torch.tensor([[0.25, 0.75, 1.0], [0.2, 0.3, 0.5]]))
    kl = menu_kl(p, q)
    assert kl[0] == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75))
    assert kl[1] == pytest.approx(0.0, abs=1e-7)
    assert menu_entropy(p)[0] == pytest.approx(math.log(2))
    stacked = pad_log_probs([torch.zeros(1), torch.log(torch.tensor([0.5, 0.5]))])
    assert stacked.shape == (2, 2) and stacked[0, 1] == float("-inf")
    loss, stats = decision_pg_loss(stacked.requires_grad_(), torch.tensor([0, 1]), torch.tensor([1.0, 2.0]),
                                   stacked.detach(), beta=0.1, entropy_coef=0.01)
    loss.backward()
    assert torch.isfinite(stacked.grad).all() and stats["kl"] == pytest.approx(0.0)
    assert stats["pg_loss"] == pytest.approx(-(1.0 * 0.0 + 2.0 * math.log(0.5)) / 2)


def test_k3_is_an_exact_unbiased_kl_estimate():
    p = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64)
    q = torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64)
    k3 = k3_kl(p.log(), q.log())
    assert (k3 >= 0).all()
    assert float((p * k3).sum()) == pytest.approx(float((p * (p / q).log()).sum()), rel=1e-12)  # E_p[k3] = KL
    assert torch.allclose(k3_kl(p.log(), p.log()), torch.zeros(3, dtype=torch.float64))
    per_token = k3_kl(torch.log(torch.tensor([[0.5, 0.9]])), torch.log(torch.tensor([[0.25, 0.1]])),
                      mask=torch.tensor([[1.0, 0.0]]))
    assert float(per_token) == pytest.approx(0.5 - math.log(0.5) - 1)       # only the real token counts


# ---- the toy bandit (exact expectation) --------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bandit_decision_estimator_is_unbiased_with_lower_variance(seed):
    torch.manual_seed(seed)
    K, R = 4, 2
    law = bandit.two_token_law(R, K)                    # first token: one of 2 spellings; second: the label
    theta = torch.randn(R + R * K, dtype=torch.float64)
    rewards = torch.tensor([0.0, 1.0, 0.3, 0.0], dtype=torch.float64)
    adv = bandit.advantages(law, theta, rewards)
    exact = bandit.exact_gradient(law, theta, rewards)
    dec, tok = bandit.decision_moments(law, theta, adv), bandit.token_moments(law, theta, adv)
    assert torch.allclose(dec.mean, exact, atol=1e-12)   # (a) E[A ∇log π(a)] = ∇ E[r]
    assert torch.allclose(tok.mean, exact, atol=1e-12)   # the token-level one is unbiased too ...
    assert dec.variance < tok.variance                   # (b) ... but noisier
    cond_mean, extra = bandit.zero_mean_component(law, theta, adv)
    assert torch.allclose(cond_mean, torch.zeros_like(cond_mean), atol=1e-12)   # E[A ∇log p(s|a) | a] = 0
    assert tok.variance == pytest.approx(dec.variance + extra, rel=1e-10)      # Var_T = Var_D + E‖that‖²
    assert extra > 1e-3


def test_bandit_losses_give_the_estimators():
    """−∇ of our losses on one sampled decision / text is the estimator; its exact mean is ∇ E[r]."""
    torch.manual_seed(3)
    K, R = 3, 2
    law = bandit.two_token_law(R, K)
    theta = torch.randn(R + R * K, dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    adv = bandit.advantages(law, theta, rewards)
    pi, joint = law(theta).sum(0).detach(), law(theta).detach()
    dec_mean, tok_mean = torch.zeros_like(theta), torch.zeros_like(theta)
    for k in range(K):
        t = theta.clone().requires_grad_()
        loss, _ = decision_pg_loss(law(t).sum(0).log()[None], torch.tensor([k]), adv[k: k + 1])
        loss.backward()
        dec_mean -= pi[k] * t.grad
        for s in range(R):
            t = theta.clone().requires_grad_()
            first = torch.log_softmax(t[:R], 0)[s]
            second = torch.log_softmax(t[R:].view(R, K)[s], 0)[k]
            loss, _ = token_pg_loss(torch.stack([first, second])[None], adv[k: k + 1], mask=torch.ones(1, 2))
            loss.backward()
            tok_mean -= joint[s, k] * t.grad
    exact = bandit.exact_gradient(law, theta, rewards)
    assert torch.allclose(dec_mean, exact, atol=1e-12) and torch.allclose(tok_mean, exact, atol=1e-12)


# ---- LoRA ---------------------------------------------------------------------------------------
def test_lora_targets_per_family():
    from transformers import GPT2Config, GPT2LMHeadModel

    for arch in ("llama", "qwen2", "gemma3"):
        assert find_target_modules(tiny_member(arch).model) == ("q_proj", "k_proj", "v_proj", "o_proj")
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    assert find_target_modules(gpt2) == ("c_attn",)
    with pytest.raises(ConfigError, match="target_modules"):
        find_target_modules(TinyTextLM())
    with pytest.raises(ConfigError, match="not Linear layers"):
        add_lora(FakeMember(TinyTextLM()), LoraSpec(target_modules=("nope",)))


def test_fresh_adapter_is_the_reference_then_moves_away():
    """KL(π ‖ π_ref) = 0 at init (LoRA B = 0, π_ref = the adapter disabled); after an update it is not."""
    pol = decision_policy()
    tr = DecisionTrainer(pol, PickEnv, config(max_steps=2, beta=0.1))
    states = [decision_state_of(s) for s in range(6)]

    def kl():
        with torch.no_grad():
            now = pad_log_probs([law.log_probs for law in pol.laws(states)])
            with tr.adapter.reference():
                ref = pad_log_probs([law.log_probs for law in pol.laws(states)])
        return menu_kl(now, ref)

    assert torch.equal(kl(), torch.zeros(6))
    recs = tr.run()
    assert recs[0]["kl"] == 0.0 and recs[1]["kl"] > 0.0
    assert float(kl().max()) > 1e-4



def test_a_fresh_adapter_depends_on_its_seed_not_on_the_global_generator():
    # a run is a function of its config: two processes (different global RNG states) that add an
    # adapter with the same seed get the same A matrices, and the global generator is left as it was
    members = [tiny_member("llama", seed=0) for _ in range(3)]
    torch.manual_seed(1)
    a = adapter_state(add_lora(members[0], LoraSpec(r=2), seed=5))
    torch.manual_seed(2)
    before = torch.random.get_rng_state()
    b = adapter_state(add_lora(members[1], LoraSpec(r=2), seed=5))
    assert torch.equal(torch.random.get_rng_state(), before)
    c = adapter_state(add_lora(members[2], LoraSpec(r=2), seed=6))
    assert all(torch.equal(x, y) for x, y in zip(a.values(), b.values()))
    assert any(not torch.equal(x, y) for x, y in zip(a.values(), c.values()))


def test_a_merged_adapter_gives_the_same_logits_in_packed_weights():
    from runtime.packed_linear import is_packed, packing_available

    member = tiny_member("llama", seed=0)
    a = add_lora(member, LoraSpec(r=2))
    with torch.no_grad():
        for p in a.parameters():
            p.add_(0.2 * torch.randn_like(p))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        before = member.model(ids).logits
        a.merge_for_inference()
        after = member.model(ids).logits
    assert not any("lora" in n for n, _ in member.model.named_modules())
    assert is_packed(member.model) == packing_available()
    assert torch.allclose(before, after, atol=1e-5), (before - after).abs().max()


def test_adapter_save_load_roundtrip(tmp_path):
    a = add_lora(tiny_member("llama", seed=0), LoraSpec(r=2))
    with torch.no_grad():
        for p in a.parameters():
            p.add_(0.05 * torch.randn_like(p))  # (b below starts as a fresh a did: same seed)
    a.save(tmp_path / "adapter")
    b = add_lora(tiny_member("llama", seed=0), LoraSpec(r=2))
    assert any(not torch.equal(x, y) for x, y in zip(adapter_state(a).values(), adapter_state(b).values()))
    b.load(tmp_path / "adapter")
    assert all(torch.equal(x, y) for x, y in zip(adapter_state(a).values(), adapter_state(b).values()))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(a.member.model(ids).logits, b.member.model(ids).logits)


# ---- the decision trainer -----------------------------------------------------------------------


def test_decision_trainer_learns_the_good_option(tmp_path):
    pol = decision_policy()
    before = p_right(pol)
    recs = DecisionTrainer(pol, PickEnv, config(max_steps=8, out_dir=str(tmp_path))).run()
    after = p_right(pol)
    assert after > before + 0.3, (before, after)
    assert recs[-1]["reward_mean"] > recs[0]["reward_mean"]
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 9))
    for field in ("step", "wall_s", "reward_mean", "success_rate", "loss", "kl", "decisions", "decisions_per_s"):
        assert field in lines[0]
    assert all(r["invalid_rate"] == 0.0 and r["decisions"] == 8 for r in lines)
    assert all(r["rescore_gap"] is None or r["rescore_gap"] < 1e-5 for r in lines)  # re-score = rollout's π


def _strip(lines: list[str]) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k not in TIME_FIELDS} for x in lines]


class Killed(Exception):
    pass


def _kill_after(step: int):
    def hook(rec):
        if rec["step"] == step:
            raise Killed
    return hook


MAKERS = {
    "decision": (lambda: DecisionTrainer, lambda: decision_policy(seed=1)),
    "token": (lambda: TokenTrainer, lambda: FakeTokenPolicy(seed=1)),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_kill_and_resume_continues_the_same_run(tmp_path, kind):
    """Stopped after step 5 (checkpoint at 4, line 5 already written), resumed by a new trainer on a
    new model: the log and the final adapter equal the uninterrupted run's."""
    trainer_cls, make_policy = MAKERS[kind][0](), MAKERS[kind][1]
    lora = LoraSpec(r=4, alpha=8, target_modules=("q_proj",) if kind == "token" else None)
    cfg = dict(max_steps=7, checkpoint_every=2, beta=0.05, rescore_batch=5, memory_k=2, lora=lora)
    whole = trainer_cls(make_policy(), WalkEnv, config(out_dir=str(tmp_path / "whole"), **cfg))
    whole.run()
    first = trainer_cls(make_policy(), WalkEnv, config(out_dir=str(tmp_path / "cut"), **cfg))
    with pytest.raises(Killed):
        first.run(on_step=_kill_after(5))
    assert checkpoint.resume(tmp_path / "cut" / "checkpoints").step == 4
    assert len((tmp_path / "cut" / "log.jsonl").read_text().splitlines()) == 5
    second = trainer_cls(make_policy(), WalkEnv, config(out_dir=str(tmp_path / "cut"), **cfg))
    assert [r["step"] for r in second.run()] == [5, 6, 7]
    a = (tmp_path / "whole" / "log.jsonl").read_text().splitlines()
    b = (tmp_path / "cut" / "log.jsonl").read_text().splitlines()
    assert len(a) == 7 and _strip(a) == _strip(b)
    assert len({json.dumps(r["seeds"]) for r in _strip(a)}) > 1 and any(r["loss"] != 0.0 for r in _strip(a))
    assert all(torch.equal(x, y) for x, y in zip(adapter_state(whole.adapter).values(),
                                                 adapter_state(second.adapter).values()))


def test_resume_refuses_other_settings(tmp_path):
    DecisionTrainer(decision_policy(), PickEnv, config(max_steps=1, out_dir=str(tmp_path))).run()
    more = DecisionTrainer(decision_policy(), PickEnv, config(max_steps=2, out_dir=str(tmp_path)))
    assert [r["step"] for r in more.run()] == [2]                  # a bigger budget continues the run
    config_json = tmp_path / "config.json"
    saved = json.loads(config_json.read_text())
    config_json.write_text(json.dumps({**saved, "rescore_batch": 32}))  # as an older run wrote it
    smaller = DecisionTrainer(decision_policy(), PickEnv, config(max_steps=3, rescore_batch=1, out_dir=str(tmp_path)))
    assert [r["step"] for r in smaller.run()] == [3]               # a memory knob may change on resume
    other = DecisionTrainer(decision_policy(), PickEnv, config(max_steps=4, lr=0.5, out_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="lr"):
        other.run()


def test_checkpoint_killed_mid_write_resumes_from_the_previous(tmp_path, monkeypatch):
    tr = DecisionTrainer(decision_policy(), PickEnv, config(max_steps=1))
    root = tmp_path / "ck"
    checkpoint.save_checkpoint(root, 1, tr.adapter, tr.optimizer, {"n": 1}, checkpoint.rng_state())

    def die(folder):
        raise Killed

    monkeypatch.setattr(checkpoint, "_fsync_tree", die)
    with pytest.raises(Killed):
        checkpoint.save_checkpoint(root, 2, tr.adapter, tr.optimizer, {"n": 2}, checkpoint.rng_state())
    assert any(p.name.startswith(".ckpt-00000002") for p in root.iterdir())   # the half-written one
    found = checkpoint.resume(root)
    assert (found.step, found.state["n"]) == (1, 1)
    monkeypatch.undo()
    checkpoint.save_checkpoint(root, 3, tr.adapter, tr.optimizer, {"n": 3}, checkpoint.rng_state(), keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-00000003", "latest.json"]
    assert checkpoint.resume(root).step == 3 and checkpoint.resume(tmp_path / "none") is None


def test_seed_order_and_config_errors():
    c = config(max_steps=1, train_seeds=tuple(range(5)), seeds_per_step=2)
    order = [s for t in range(5) for s in step_seeds(c, t)]
    assert sorted(order[:5]) == list(range(5)) and sorted(order[5:10]) == list(range(5))  # each epoch a shuffle
    assert order[:5] != list(range(5)) or order[5:] != list(range(5))
    assert step_seeds(c, 3) == step_seeds(config(max_steps=9, train_seeds=tuple(range(5)), seeds_per_step=2), 3)
    for bad, match in [(dict(max_steps=None), "budget"), (dict(max_steps=1, group_size=1), "group_size"),
                       (dict(max_steps=1, advantage="ppo"), "advantage"), (dict(max_steps=1, train_seeds=()), "seeds")]:
        with pytest.raises(ConfigError, match=match):
            config(**bad)


# ---- the token-level trainer --------------------------------------------------------------------
def test_token_trainer_counts_invalid_actions_without_moving_the_env():
    envs: list[WalkEnv] = []

    def make_env():
        envs.append(WalkEnv())
        return envs[-1]

    cfg = config(max_steps=3, invalid_penalty=-0.1, advantage="baseline", lora=LoraSpec(target_modules=("q_proj",)))
    recs = TokenTrainer(FakeTokenPolicy(), make_env, cfg).run()
    decisions = sum(r["decisions"] for r in recs)
    invalid = sum(round(r["invalid_rate"] * r["decisions"]) for r in recs)
    assert 0 < invalid < decisions
    assert sum(e.executed for e in envs) == decisions - invalid      # an invalid action does not move the env
    assert any(r["reward_mean"] < 0 for r in recs) or any(r["loss"] != 0.0 for r in recs)
    assert all(r["loss"] != 0.0 for r in recs)                        # the penalty gives a signal every step


def test_wall_budget_and_config_from_dict():
    cfg = TrainConfig.from_dict({"train_seeds": [0, 1], "seeds_per_step": 1, "group_size": 2, "max_wall_s": 1e-9,
                                 "progress": False, "lora": {"r": 2, "target_modules": ["q_proj", "v_proj"]}})
    assert cfg.lora == LoraSpec(r=2, target_modules=("q_proj", "v_proj"))
    recs = DecisionTrainer(decision_policy(), PickEnv, cfg).run()
    assert [r["step"] for r in recs] == [1]                      # the budget is checked before each step
    with pytest.raises(ConfigError, match="unknown option .* for the training settings"):
        TrainConfig.from_dict({"train_seeds": [0], "max_steps": 1, "learning_rate": 0.1})
    with pytest.raises(ConfigError, match="lora"):
        TrainConfig.from_dict({"train_seeds": [0], "max_steps": 1, "lora": {"rank": 4}})


def test_decision_trainer_with_the_real_decision_model_learns():
    """The trainer on `rlid.decision_model.DecisionModel` (a tiny llama behind LoRA, char tokenizer):
    the rewarded option's probability rises and the re-scored law is the rollout's."""
    from rlid.decision_model import DecisionModel
    from runtime.testing import char_tokenizer, tiny_member

    torch.manual_seed(0)
    dm = DecisionModel(tiny_member("llama", tokenizer=char_tokenizer(), seed=1, hidden=64))
    states = [decision_state_of(s) for s in range(8)]

    def p_right():
        with torch.no_grad():
            return float(torch.stack([law.probs[1] for law in dm.laws(states)]).mean())

    before = p_right()
    recs = DecisionTrainer(dm, PickEnv, config(max_steps=10, lr=0.01)).run()
    after = p_right()
    assert after > before + 0.2, (before, after)
    assert all(r["rescore_gap"] is None or r["rescore_gap"] < 1e-4 for r in recs)


