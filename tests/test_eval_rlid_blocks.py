"""rlid.eval_blocks.evaluate_in_blocks: held-out seeds rolled out in blocks, each episode written as its
block ends, resumed from the file; the summary equals the one-shot `EvalResult` + `live_moves` one."""
from __future__ import annotations

import json

import pytest
import torch

from rlid.eval_blocks import evaluate_in_blocks
from rlid.envs.sokoban import SokobanEnv, SokobanOptions
from rlid.evaluate import evaluate_policy, live_moves
from rlid.types import OptionLaw


class LastOption:
    """A deterministic policy without a model: π peaked on the menu's last option."""

    def laws(self, states):
        out = []
        for s in states:
            logits = torch.full((len(s.actions),), -5.0)
            logits[-1] = 0.0
            out.append(OptionLaw(torch.log_softmax(logits, 0), tuple(s.actions)))
        return out


def make():
    return SokobanEnv(SokobanOptions(max_steps=6, end_on_deadlock=True))


def test_blocks_are_written_as_they_go_and_summarised_like_one_rollout(tmp_path):
    seeds = list(range(40, 45))
    blocks, lines = [], []

    def rollout(block):
        blocks.append(block)
        return evaluate_policy(LastOption(), make, block)

    path = tmp_path / "p.episodes.jsonl"
    got = evaluate_in_blocks(rollout, make, seeds, path, batch=2, source="last", label="p", log=lines.append)
    assert blocks == [[40, 41], [42, 43], [44]]
    assert [line.split(",")[0] for line in lines] == ["p: 2 / 5 seeds", "p: 4 / 5 seeds", "p: 5 / 5 seeds"]
    assert [json.loads(x)["id"] for x in path.read_text().splitlines()] == seeds

    whole = evaluate_policy(LastOption(), make, seeds)
    want = {**whole.summary(), **live_moves(make, whole.episodes), "per_seed": whole.successes}
    assert set(got) == set(want)
    for key in set(want) - {"wall_s", "decisions_per_s"}:
        assert got[key] == pytest.approx(want[key]), key

    blocks.clear()                                     # all recorded: no rollout at all, same summary
    assert evaluate_in_blocks(rollout, make, seeds, path, batch=2, source="last", label="p", log=lines.append) == got
    assert blocks == []


def test_a_resumed_run_rolls_out_only_the_missing_seeds(tmp_path):
    path = tmp_path / "p.episodes.jsonl"
    rollout = lambda block: evaluate_policy(LastOption(), make, block)  # noqa: E731
    full = evaluate_in_blocks(rollout, make, [1, 2, 3, 4], path, batch=4, source="last", label="p", log=lambda _: None)
    kept = path.read_text().splitlines(keepends=True)
    path.write_text(kept[0] + kept[2] + kept[3][:5])   # seed 2 lost, seed 4 torn by a kill
    asked = []
    again = evaluate_in_blocks(lambda b: (asked.append(b), rollout(b))[1], make, [1, 2, 3, 4], path, batch=4,
                               source="last", label="p", log=lambda _: None)
    assert asked == [[2, 4]]
    assert set(again) == set(full) and again["per_seed"] == full["per_seed"]
    for key in set(full) - {"wall_s", "decisions_per_s", "per_seed"}:
        assert again[key] == pytest.approx(full[key]), key


def test_episodes_of_another_policy_are_refused(tmp_path):
    from runtime.errors import ConfigError

    path = tmp_path / "p.episodes.jsonl"
    rollout = lambda block: evaluate_policy(LastOption(), make, block)  # noqa: E731
    evaluate_in_blocks(rollout, make, [1, 2], path, source="ckpt-5", batch=4, label="p", log=lambda _: None)
    with pytest.raises(ConfigError, match="holds episodes of ckpt-5, not of ckpt-9; rerun with --force"):
        evaluate_in_blocks(rollout, make, [1, 2, 3], path, source="ckpt-9", batch=4, label="p", log=lambda _: None)


def test_steps_to_success_and_mean_score_from_the_records(tmp_path):
    from rlid.eval_blocks import summarize_episodes
    from rlid.report import table

    def rec(seed, success, reward, steps):
        return {"id": seed, "source": "p", "success": success, "reward": reward, "invalid": 0, "steps": steps,
                "wall_s": 1.0, "live": None}

    records = [rec(0, True, 1.0, 4), rec(1, False, 0.5, 12), rec(2, True, 1.0, 7)]
    got = summarize_episodes(records)
    assert got["steps_to_success"] == pytest.approx(5.5) and got["mean_reward"] == pytest.approx(2.5 / 3)
    assert summarize_episodes([rec(0, False, 0.0, 12)])["steps_to_success"] is None
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "decision.json").write_text(json.dumps(got))
    row = next(line for line in table(tmp_path).splitlines() if line.startswith("| decision"))
    assert "| 0.833 | 5.5 |" in row


def test_learning_curves_split_gold_steps_from_rollout_steps(tmp_path):
    """`adafuse rlid report`'s plot: gold steps feed the imitation panel (their loss), rollout steps
    the success curve (running mean of 5); a run of gold steps only plots both panels, one empty."""
    from rlid.report import curves, plot

    rows = [{"step": 1, "wall_s": 60, "gold": True, "loss": 3.0, "success_rate": None},
            {"step": 2, "wall_s": 120, "gold": True, "loss": 1.5, "success_rate": None},
            {"step": 3, "wall_s": 180, "loss": 0.1, "success_rate": 0.5},
            {"step": 4, "wall_s": 240, "loss": 0.2, "success_rate": 0.0}]
    (tmp_path / "decision").mkdir()
    (tmp_path / "decision" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = curves(tmp_path / "decision" / "log.jsonl")
    assert c["imitation"] == ([1.0, 2.0], [3.0, 1.5])
    assert c["success"] == ([3.0, 4.0], [50.0, 25.0])
    (tmp_path / "decision" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    assert plot(tmp_path).exists()
