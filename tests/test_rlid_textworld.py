"""The TextWorldExpress household games (`rlid.envs.twc`, `rlid.envs.cooking`): the menu is the game's
valid actions, the official folds are disjoint and enforced, a seeded reset reproduces its game, the
reward follows the game's score, the compiled memory lists what it should, and the JVM dies with its
Python process even on SIGKILL. They need the textworld-express package and a Java runtime: without
either they fail (CI installs both), they never skip."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from textworld_express import TextWorldExpressEnv

from rlid.config import parse_rlid
from runtime.errors import ConfigError
from rlid.envs import make_env
from rlid.envs.text_memory import compact_exit, compact_thing, held, room_facts
from rlid.envs.textworld import java_pool, shutdown_java
from rlid.envs.twc import TWCEnv, TWCOptions
from rlid.rollout import run_episodes

REPO = Path(__file__).resolve().parents[1]
JAR = "textworld-express.jar"


def play(env, actions) -> list:
    return [env.step(env.menu().index(a)) for a in actions]


def our_jvms() -> set[int]:
    """Pids of the TextWorldExpress JVMs this test process started that are still running."""
    found = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and any(JAR in part for part in p.cmdline()):
                found.add(p.pid)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.parametrize("name, params", [("twc", {}), ("cooking", {"num_locations": 2})])
def test_menu_is_the_games_valid_actions(name, params):
    """Checked against the package's own wrapper (its own JVM), at the start and along the gold path."""
    env = make_env(name, **params)
    env.reset(3)
    reference = TextWorldExpressEnv(envStepLimit=100)
    try:
        _, infos = reference.reset(seed=3, gameFold="train", gameName=env.game_name, gameParams=env.game_params())
        assert env.menu() == sorted(set(infos["validActions"])) and len(env.menu()) == len(infos["validActions"])
        for action in env.gold_actions()[:6]:
            if env.done:
                break
            env.step(env.menu().index(action))
            _, _, _, infos = reference.step(action)
            assert env.menu() == sorted(set(infos["validActions"]))
            assert env.observation().endswith(infos["observation"].strip())
    finally:
        reference.close()
        env.close()


def test_folds_are_disjoint_and_enforced():
    for name in ("twc", "cooking"):
        env = make_env(name)
        folds = env.folds()
        assert set(folds) == {"train", "dev", "test"} and all(len(s) >= 100 for s in folds.values())
        assert not set(folds["train"]) & set(folds["dev"]) and not set(folds["train"]) & set(folds["test"])
        assert not set(folds["dev"]) & set(folds["test"])
        assert [env.fold_of(min(folds[f])) for f in ("train", "dev", "test")] == ["train", "dev", "test"]
        env.reset(min(folds["test"]))
        assert env.fold == "test"
        env.close()


def test_a_seed_from_another_fold_is_a_one_line_config_error():
    train_only = make_env("twc", fold="train")
    test_seed = min(train_only.folds()["test"])
    with pytest.raises(ConfigError) as other_fold:
        train_only.reset(test_seed)
    message = str(other_fold.value)
    assert "\n" not in message and f"seed {test_seed}" in message and "train fold" in message and "0..999" in message
    with pytest.raises(ConfigError, match="none of TextWorldExpress's folds") as nowhere:
        make_env("cooking").reset(5000)
    assert "\n" not in str(nowhere.value)
    with pytest.raises(ConfigError, match="eval seeds must come from TextWorldExpress's test fold"):
        make_env("twc").check_stage_seeds("eval", range(0, 10))
    for bad in ({"num_locations": 4}, {"fold": "valid"}, {"max_steps": 0}, {"num_items_to_put_away": 5}):
        with pytest.raises(ConfigError):
            make_env("twc", **bad)
    with pytest.raises(ConfigError):
        make_env("cooking", num_ingredients=6)
    train_only.close()


def test_a_config_holds_each_stage_to_its_fold():
    base = {"output_path": "runs/x", "model": "smollm2-135m", "env": {"name": "twc", "memory_k": 1},
            "train": {"seeds": {"start": 0, "count": 10}, "max_steps": 1}, "eval": {"seeds": {"start": 20000, "count": 5}}}
    assert parse_rlid(base, "ok.yaml").eval_seeds == range(20000, 20005)
    with pytest.raises(ConfigError, match=r"bad.yaml: twc: eval seeds .* test fold") as bad:
        parse_rlid({**base, "eval": {"seeds": {"start": 10000, "count": 5}}}, "bad.yaml")
    assert "\n" not in str(bad.value)
    with pytest.raises(ConfigError, match="train seeds"):
        parse_rlid({**base, "train": {"seeds": {"start": 900, "count": 200}, "max_steps": 1}}, "bad.yaml")


def test_a_seeded_reset_reproduces_the_game_across_envs_and_jvms():
    a, b = make_env("twc"), make_env("twc", compiled_memory=True)
    a.reset(7)
    b.reset(7)
    start = (a.observation(), a.menu(), a.gold_actions())
    assert (b.observation(), b.menu(), b.gold_actions()) == start
    play(a, a.gold_actions()[:3])
    a.reset(7)
    assert (a.observation(), a.menu(), a.gold_actions()) == start
    shutdown_java()                                   # a fresh JVM deals the same game
    a.reset(7)
    assert (a.observation(), a.menu(), a.gold_actions()) == start
    a.reset(8)
    assert (a.observation(), a.menu()) != start[:2]
    a.close()
    b.close()


@pytest.mark.parametrize("name", ["twc", "cooking"])
def test_steps_change_the_state_and_the_reward_follows_the_score(name):
    env = make_env(name, max_steps=40)
    env.reset(11)
    scores, rewards = [env.score], []
    first = env.observation()
    for action in env.gold_actions():
        result = env.step(env.menu().index(action))
        rewards.append(result.reward)
        scores.append(env.score)
        if result.done:
            break
    assert env.observation() != first and env.steps == len(rewards)
    assert result.done and result.success and env.score == pytest.approx(1.0)
    assert rewards == pytest.approx([after - before for before, after in zip(scores, scores[1:])])
    assert sum(rewards) == pytest.approx(1.0) and any(r > 0 for r in rewards[:-1])
    env.close()


def test_option_rewards_are_what_each_move_earns_and_leave_the_game_alone():
    """`option_rewards()` (each option on a replayed copy) at the states of a gold path: the gold
    move's entry is the reward the game then gives it; a right put earns, a wrong put costs; the
    game itself is not moved."""
    env = make_env("twc", num_locations=1, num_items_to_put_away=2)
    env.reset(5)   # TextWorldExpress 1.1, twc train seed 5: a chopping board and a used tissue in the kitchen
    put_seen = False
    for action in env.gold_actions():
        menu, observation = env.menu(), env.observation()
        rewards = env.option_rewards()
        assert len(rewards) == len(menu) and env.menu() == menu and env.observation() == observation
        result = env.step(menu.index(action))
        assert rewards[menu.index(action)] == pytest.approx(result.reward)
        puts = {a: r for a, r in zip(menu, rewards) if a.startswith("put ")}
        if action.startswith("put ") and len(puts) > 1:
            put_seen = True
            assert puts[action] > 0 and min(puts.values()) < 0
        if result.done:
            break
    assert put_seen and env.option_rewards() is None
    env.close()


def test_failed_puts_line_lists_each_wrong_put_once():
    env = make_env("twc", num_locations=1, num_items_to_put_away=2, compiled_memory=True, failed_puts=True)
    env.reset(5)   # train seed 5: a chopping board (belongs on the counter) and a used tissue in the kitchen
    assert "Tried, not where they belong: nothing yet." in env.memory(1).splitlines()
    play(env, ["take chopping board", "put chopping board in dining chair", "take chopping board",
               "put chopping board in dining chair"])
    lines = env.memory(1).splitlines()
    assert "Tried, not where they belong: chopping board in the dining chair." in lines
    plain = make_env("twc", num_locations=1, num_items_to_put_away=2, compiled_memory=True)
    plain.reset(5)
    assert not any(line.startswith("Tried") for line in plain.memory(1).splitlines())
    with pytest.raises(ConfigError, match="compiled_memory: true"):
        make_env("twc", failed_puts=True)
    env.close()
    plain.close()


def test_the_episode_ends_at_max_steps_with_the_score_so_far():
    env = make_env("twc", max_steps=2)
    env.reset(0)
    first, second = play(env, env.gold_actions()[1:3])  # take an object (+score), then a neutral move
    assert first.reward > 0 and not first.done and second.done and not second.success and env.menu() == []


def test_compiled_memory_lists_rooms_sightings_holdings_and_placements():
    env = make_env("twc", compiled_memory=True)
    env.reset(0)  # TextWorldExpress 1.1, twc train seed 0: a black duvet in the bedroom, a plaid bed sheet next door
    assert env.gold_actions()[:6] == ["look around", "take black duvet", "open chest of drawers",
                                      "put black duvet in chest of drawers", "move north", "take plaid bed sheet"]
    play(env, env.gold_actions()[:6])
    memory = env.memory(2).splitlines()
    assert memory[0] == "Rooms visited: bedroom, bathroom."
    assert memory[1].startswith("Seen in the bedroom: ") and "chest of drawers (open: a black duvet)" in memory[1]
    assert "Exits: north: bathroom." in memory[1] and memory[2].startswith("Seen in the bathroom: ")
    assert "Holding: plaid bed sheet." in memory
    assert "Placed where they belong: black duvet in the chest of drawers." in memory
    assert memory[-3:] == ["Last moves:", "Move 5: move north", "Move 6: take plaid bed sheet"]
    assert env.memory(0) == ""
    raw = make_env("twc")
    raw.reset(0)
    play(raw, raw.gold_actions()[:6])
    assert raw.memory(1) == "Move 6: take plaid bed sheet -> You take the plaid bed sheet."
    assert "Rooms visited" not in raw.memory(6) and len(raw.memory(6).splitlines()) == 6
    env.close()
    raw.close()


def test_compiled_memory_keeps_the_recipe_and_what_scored_in_cookingworld():
    env = make_env("cooking", compiled_memory=True)
    env.reset(3)
    gold = env.gold_actions()
    read = gold.index("read cookbook")
    play(env, gold[:read + 3])
    memory = env.memory(1)
    assert "Recipe: Ingredients: " in memory and "Directions: " in memory and "prepare meal" in memory
    assert "Holding: " in memory and "cookbook" in memory.split("Holding: ")[1].splitlines()[0]
    env.close()


def test_room_descriptions_compact_into_items_and_exits():
    look = ("You are in the kitchen. In one part of the room you see a stove. There is also An open fridge, that "
            "contains some water, and a carrot. You also see a counter that has a knife, and a cookbook on it. In "
            "another part of the room you see a dishwasher that is closed. There is also an open kitchen cupboard, "
            "that is empty. \nTo the South you see a closed frosted-glass door. Through an open wood door, to the "
            "West you see the living room. ")
    things, exits = room_facts(look)
    assert things == ["stove", "fridge (open: some water, a carrot)", "counter (on it: a knife, a cookbook)",
                      "dishwasher (closed)", "kitchen cupboard (open, empty)"]
    assert exits == ["south: a closed frosted-glass door", "west: living room (through an open wood door)"]
    assert compact_thing("a chair, that has nothing on it") == "chair (nothing on it)"
    assert compact_exit("To the North you see the bathroom.") == "north: bathroom"
    assert held("Inventory: \n  a cushion\n  some water\n") == ["cushion", "water"]
    assert held("Inventory: \n  Your inventory is currently empty.\n") == []


def test_batched_rollouts_share_one_jvm_and_copies_replay_their_game():
    envs = []

    def make():
        envs.append(make_env("twc"))
        return envs[-1]

    def gold_policy(states):                          # states come from the live envs, in order
        live = [e for e in envs if not e.done]
        return [s.actions.index(e.gold_actions()[e.steps]) for e, s in zip(live, states)]

    probe = make_env("twc")
    probe.reset(20)
    before, pid = our_jvms(), java_pool().process.pid
    episodes = run_episodes(make, gold_policy, [20, 21, 22, 23])
    assert [ep.success for ep in episodes] == [True] * 4 and sum(ep.total_reward for ep in episodes) == pytest.approx(4)
    assert java_pool().process.pid == pid and not our_jvms() - before     # one JVM for every game
    for action in probe.gold_actions():              # option_wins: each option tried on a replayed copy
        wins = probe.option_wins()
        if any(wins):
            break
        probe.step(probe.menu().index(action))
    assert any(wins) and not probe.done and probe.steps > 0
    assert probe.step(wins.index(True)).success       # the copies never moved this game
    for env in envs + [probe]:
        env.close()


def test_close_stops_the_jvm_once_no_environment_uses_it():
    shutdown_java()
    a, b = make_env("twc"), make_env("cooking")
    a.reset(1)
    b.reset(1)
    process = java_pool().process
    a.close()
    assert process.poll() is None                     # b still plays in it
    b.close()
    assert process.poll() is not None and not java_pool().running
    a.reset(1)                                        # a closed env starts a new JVM when it needs one
    assert java_pool().running and java_pool().process.pid != process.pid
    a.close()


KILLED_CHILD = """
import sys, time
from rlid.envs import make_env
from rlid.envs.textworld import java_pool
env = make_env("twc")
env.reset(0)
env.step(0)
print(java_pool().process.pid, flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigkill_of_the_python_process_leaves_no_jvm_behind():
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        jvm = int(child.stdout.readline())
        ours = {p.pid for p in psutil.Process(child.pid).children(recursive=True)
                if any(JAR in part for part in p.cmdline())}
        assert ours == {jvm} and alive(jvm)           # the game server this Python process started
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        deadline = time.monotonic() + 15
        while alive(jvm) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(jvm), f"the JVM {jvm} outlived its SIGKILLed Python process"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from test_rlid_helpers import save_tiny_char_model

    return save_tiny_char_model(tmp_path_factory.mktemp("twc_model"))


@pytest.mark.parametrize("memory", [False, True], ids=["raw", "compiled"])
def test_a_short_train_step_on_a_tiny_model_runs_end_to_end(tmp_path, tiny_model_dir, memory):
    """`adafuse rlid train` (both planes) and `rlid eval` on TWC games with a tiny random model:
    one GRPO step each on train-fold games, then held-out test-fold games rolled out and scored."""
    import json

    import yaml

    from eval.cli import main
    cfg = {"output_path": str(tmp_path / "run"), "model": tiny_model_dir, "seed": 0, "token_max_new_tokens": 4,
           "env": {"name": "twc", "options": {"num_locations": 1, "num_items_to_put_away": 1, "max_steps": 3,
                                              "compiled_memory": memory}, "memory_k": 2},
           "train": {"seeds": {"start": 0, "count": 4}, "seeds_per_step": 2, "group_size": 2, "max_steps": 1,
                     "checkpoint_every": 1, "lr": 1e-3, "lora": {"r": 2, "alpha": 4}},
           "eval": {"seeds": {"start": 20000, "count": 2}}}
    path = tmp_path / "twc.yaml"
    path.write_text(yaml.safe_dump(cfg))
    for plane in ("decision", "token"):
        assert main(["rlid", "train", str(path), "--plane", plane, "--no_progress"]) == 0
        log = [json.loads(line) for line in (tmp_path / "run" / plane / "log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in log] == [1]
    assert main(["rlid", "eval", str(path), "--policies", "untrained,decision,token"]) == 0
    for name in ("untrained", "decision", "token"):
        res = json.loads((tmp_path / "run" / "eval" / f"{name}.json").read_text())
        assert res["episodes"] == 2 and res["seeds"] == [20000, 20002]
        assert 0.0 <= res["success"] <= 1.0


def test_gold_moves_follow_the_games_solution():
    """`rlid.gold.gold_moves`: each recorded index names the gold action in that state's menu, and
    playing them from a fresh reset solves the game."""
    from rlid.gold import gold_moves

    make = lambda: TWCEnv(TWCOptions(num_locations=1, num_items_to_put_away=1, max_steps=20, compiled_memory=True))  # noqa: E731
    moves = gold_moves(make, [5], memory_k=2)
    env = make()
    try:
        env.reset(5)
        assert [s.actions[i] for s, i in moves] == env.gold_actions()[:len(moves)] and moves
        for state, index in moves:
            assert list(state.actions) == env.menu()
            result = env.step(index)
        assert result.success
    finally:
        env.close()


@pytest.mark.parametrize("plane", ["decision", "token"])
def test_gold_steps_imitate_the_gold_path_then_rl_takes_over(tmp_path, tiny_model_dir, plane):
    """`gold_steps: 1`: step 1 is behaviour cloning on the gold moves of its seeds (advantage 1 on each:
    the loss is −mean log-prob of the gold choice), step 2 a GRPO step, under one budget and log."""
    import json

    import yaml

    from eval.cli import main
    from rlid.gold import gold_moves
    from rlid.train_loop import step_seeds
    cfg = {"output_path": str(tmp_path / "run"), "model": tiny_model_dir, "seed": 0, "token_max_new_tokens": 4,
           "env": {"name": "twc", "options": {"num_locations": 1, "num_items_to_put_away": 1, "max_steps": 3,
                                              "compiled_memory": True}, "memory_k": 2},
           "train": {"seeds": {"start": 0, "count": 4}, "seeds_per_step": 2, "group_size": 2, "max_steps": 2,
                     "gold_steps": 1, "checkpoint_every": 1, "lr": 1e-3, "lora": {"r": 2, "alpha": 4},
                     "decision": {"shuffle_menus": True}},
           "eval": {"seeds": {"start": 20000, "count": 2}}}
    path = tmp_path / "twc.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["rlid", "train", str(path), "--plane", plane, "--no_progress"]) == 0
    gold, rl = [json.loads(line) for line in (tmp_path / "run" / plane / "log.jsonl").read_text().splitlines()]
    from rlid.config import load_rlid
    tc = load_rlid(path).train_config(plane)
    env = lambda: TWCEnv(TWCOptions(num_locations=1, num_items_to_put_away=1, max_steps=3, compiled_memory=True))  # noqa: E731
    assert gold["gold"] and gold["decisions"] == len(gold_moves(env, step_seeds(tc, 0), 2)) > 0
    assert gold["rescored"] == gold["decisions"] and gold["success_rate"] is None
    assert gold["pg_loss"] == pytest.approx(-gold["logp_chosen"], rel=1e-4)
    assert "gold" not in rl and rl["step"] == 2 and rl["success_rate"] is not None


def test_rl_lr_sets_the_learning_rate_of_the_steps_after_the_gold_steps(tmp_path, tiny_model_dir):
    """`rl_lr: 0`: the gold step moves the adapter at `lr`, the GRPO step after it (lr 0) leaves it
    exactly as the gold step left it; each log record names its step's lr."""
    import json

    import yaml
    import torch
    from safetensors.torch import load_file

    from eval.cli import main
    from rlid.config import parse_rlid
    cfg = {"output_path": str(tmp_path / "run"), "model": tiny_model_dir, "seed": 0, "token_max_new_tokens": 4,
           "env": {"name": "twc", "options": {"num_locations": 1, "num_items_to_put_away": 1, "max_steps": 3,
                                              "compiled_memory": True}, "memory_k": 2},
           "train": {"seeds": {"start": 0, "count": 4}, "seeds_per_step": 2, "group_size": 2, "max_steps": 2,
                     "gold_steps": 1, "rl_lr": 0.0, "checkpoint_every": 1, "lr": 1e-2,
                     "lora": {"r": 2, "alpha": 4}},
           "eval": {"seeds": {"start": 20000, "count": 2}}}
    path = tmp_path / "twc.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["rlid", "train", str(path), "--plane", "decision", "--no_progress"]) == 0
    log = [json.loads(line) for line in (tmp_path / "run" / "decision" / "log.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in log] == [1e-2, 0.0] and log[0]["gold"] and "gold" not in log[1]
    ckpts = tmp_path / "run" / "decision" / "checkpoints"
    after_gold, after_rl = (load_file(ckpts / f"ckpt-{n:08d}" / "adapter" / "adapter_model.safetensors") for n in (1, 2))
    assert all(torch.equal(after_gold[k], after_rl[k]) for k in after_gold)
    assert any(k.endswith("lora_B.weight") and after_gold[k].abs().sum() > 0 for k in after_gold)   # the gold step moved it
    from rlid.train_loop import TrainConfig
    fingerprints = [TrainConfig(train_seeds=(0,), max_steps=1, rl_lr=v).fingerprint() for v in (None, 0.0)]
    assert "rl_lr" not in fingerprints[0] and fingerprints[1]["rl_lr"] == 0.0   # a run can't resume another's lr
    with pytest.raises(ConfigError, match="rl_lr must be 0 or more"):
        parse_rlid({**cfg, "train": {**cfg["train"], "rl_lr": -1.0}}, "twc.yaml")


def test_gold_steps_on_a_game_without_gold_paths_is_a_one_line_config_error():
    from rlid.envs.countdown import CountdownEnv
    from rlid.gold import gold_moves

    with pytest.raises(ConfigError, match="gold_steps needs an environment with gold paths") as err:
        gold_moves(CountdownEnv, [0])
    assert "\n" not in str(err.value)
