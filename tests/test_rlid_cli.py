"""`adafuse rlid train|distill|eval|report` end to end on a tiny random model saved to a folder:
every verb runs, writes what it says, resumes, and bad configs are one-line errors (exit 2)."""
import json

import pytest
import torch
import yaml

from eval.cli import main
from eval.testing import error_text


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from test_rlid_helpers import save_tiny_char_model

    return save_tiny_char_model(tmp_path_factory.mktemp("rlid_model"))


def write_config(tmp_path, model_dir, **extra):
    cfg = {"output_path": str(tmp_path / "run"), "model": model_dir, "seed": 0,
           "env": {"name": "arc_1d"}, "token_max_new_tokens": 4,
           "train": {"seeds": {"start": 0, "count": 8}, "seeds_per_step": 2, "group_size": 2, "max_steps": 2,
                     "checkpoint_every": 1, "lr": 1e-3, "lora": {"r": 2, "alpha": 4}},
           "eval": {"seeds": {"start": 1000, "count": 4}},
           "distill": {"epochs": 1, "batch_size": 2, "only_successful": False, "seeds": {"start": 0, "count": 3}},
           "ensemble": {"members": [model_dir, model_dir], "adapters": ["decision", None], "threshold": 1.0}, **extra}
    path = tmp_path / "rlid.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path), tmp_path / "run"


def test_every_verb_end_to_end(tmp_path, model_dir, capsys):
    config, out = write_config(tmp_path, model_dir)
    assert main(["rlid", "train", config, "--plane", "decision", "--no_progress"]) == 0
    assert main(["rlid", "train", config, "--plane", "token", "--no_progress"]) == 0
    log = [json.loads(line) for line in (out / "decision" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    assert main(["rlid", "train", config, "--plane", "decision", "--max_steps", "3", "--no_progress"]) == 0
    log = [json.loads(line) for line in (out / "decision" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]                    # resumed from step 2, not restarted
    assert main(["rlid", "distill", config]) == 0
    assert (out / "distill" / "adapter").is_dir() and (out / "distill" / "examples.jsonl").exists()
    assert main(["rlid", "eval", config]) == 0
    results = {p.stem for p in (out / "eval").glob("*.json")}
    assert results == {"untrained", "untrained-token", "decision", "token", "distill", "ensemble"}
    dec = json.loads((out / "eval" / "decision.json").read_text())
    assert dec["episodes"] == 4 and dec["invalid"] == 0 and len(dec["per_seed"]) == 4
    assert dec["live_decisions"] == 4 and dec["live_moves"] == pytest.approx(dec["success"])  # ARC-1D: one move
    assert dec["win_decisions"] == 4 and dec["wins_taken"] == pytest.approx(dec["success"])   # ... with the answer on it
    ens = json.loads((out / "eval" / "ensemble.json").read_text())
    assert ens["consult_rate"] == 1.0 and ens["consulted"] == ens["decisions"]  # threshold 1.0: always consults
    assert ens[f"alone:member 0 ({model_dir} + decision)"] == dec["per_seed"]   # batched as its own eval
    assert main(["rlid", "eval", config, "--policies", "untrained,decision", "--seeds", "2000:3"]) == 0
    again = json.loads((out / "eval_2000_n3" / "decision.json").read_text())      # a replication set, its own folder
    assert again["seeds"] == [2000, 2003] and again["episodes"] == 3
    assert json.loads((out / "eval" / "decision.json").read_text()) == dec           # the config's set untouched
    # written as it goes: a kill after two episodes (a torn third line) resumes with the rest, same result
    lines = (out / "eval" / "decision.episodes.jsonl").read_text().splitlines(keepends=True)
    assert [json.loads(line)["id"] for line in lines] == [1000, 1001, 1002, 1003]
    (out / "eval" / "decision.episodes.jsonl").write_text("".join(lines[:2]) + lines[2][:9])
    (out / "eval" / "decision.json").unlink()
    assert main(["rlid", "eval", config, "--policies", "decision"]) == 0
    assert "decision: 4 / 4 seeds" in capsys.readouterr().out
    redone = json.loads((out / "eval" / "decision.json").read_text())
    assert (out / "eval" / "decision.episodes.jsonl").read_text().splitlines(keepends=True)[:2] == lines[:2]
    changes = {k for k in dec if redone[k] != dec[k]}
    assert changes <= {"wall_s", "decisions_per_s"} and redone["per_seed"] == dec["per_seed"]
    capsys.readouterr()
    assert main(["rlid", "report", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.index("held-out seeds 1000..1003 (eval/)") < text.index("held-out seeds 2000..2002 (eval_2000_n3/)")
    assert "| decision | 3 |" in text
    assert "| decision | 4 |" in text and (out / "learning_curve.png").exists() and (out / "report.md").exists()
    dis = json.loads((out / "eval" / "distill.json").read_text())
    kept = f"{dis['success'] / dec['success']:.0%}" if dec["success"] else "n/a"
    assert f"Distilled generating model: {kept}" in text
    assert "winning moves taken % (chance %)" in text and f"{100 * dec['wins_taken']:.1f} (" in text
    assert "moves kept solvable % (chance %)" in text and f"{100 * dec['live_moves']:.1f} (" in text
    # the ensemble's records name the adapters as loaded: after more training its episodes are another policy's
    assert main(["rlid", "train", config, "--plane", "decision", "--max_steps", "4", "--no_progress"]) == 0
    (out / "eval" / "ensemble.json").unlink()
    capsys.readouterr()
    assert main(["rlid", "eval", config, "--policies", "ensemble"]) == 2
    err = error_text(capsys.readouterr().err)
    assert "holds episodes of ensemble of" in err and "rerun with --force" in err and err.count("\n") == 1


def test_text_answer_trains_and_evaluates_end_to_end(tmp_path, model_dir, capsys):
    """`answer: text`: the decision plane trains (gold-free GRPO) and evaluates with the action's own text."""
    config, out = write_config(tmp_path, model_dir, answer="text")
    assert main(["rlid", "train", config, "--plane", "decision", "--max_steps", "1", "--no_progress"]) == 0
    assert main(["rlid", "eval", config, "--policies", "untrained,decision", "--no_progress"]) == 0
    dec = json.loads((out / "eval" / "decision.json").read_text())
    assert len(dec["per_seed"]) == 4 and dec["invalid"] == 0


def test_bad_configs_are_one_line_errors(tmp_path, model_dir, capsys):
    config, _ = write_config(tmp_path, model_dir, eval={"seeds": {"start": 4, "count": 10}})
    assert main(["rlid", "train", config]) == 2
    assert "overlap" in capsys.readouterr().err
    config, _ = write_config(tmp_path, model_dir)
    for spec, message in (("3:2", "overlaps the training seeds 0..7"), ("3000", "give START:COUNT")):
        assert main(["rlid", "eval", config, "--seeds", spec]) == 2
        err = error_text(capsys.readouterr().err)
        assert message in err and err.count("\n") == 1
    config, _ = write_config(tmp_path, model_dir, env={"name": "chess"})
    assert main(["rlid", "eval", config]) == 2
    assert "unknown env 'chess'" in capsys.readouterr().err
    config, _ = write_config(tmp_path, model_dir, train={"seeds": {"start": 0, "count": 4}, "max_steps": 1, "lr_rate": 1})
    assert main(["rlid", "train", config]) == 2
    err = error_text(capsys.readouterr().err)
    assert "lr_rate" in err and err.count("\n") == 1
    config, _ = write_config(tmp_path, model_dir, answer="text", realise_action_text=True)
    assert main(["rlid", "eval", config]) == 2
    err = error_text(capsys.readouterr().err)
    assert "realise_action_text is for answer: label" in err and err.count("\n") == 1
    config, _ = write_config(tmp_path, model_dir, answer="json")
    assert main(["rlid", "eval", config]) == 2
    assert "answer" in capsys.readouterr().err
    config, _ = write_config(tmp_path / "x", model_dir) if (tmp_path / "x").mkdir() is None else (None, None)
    assert main(["rlid", "distill", config]) == 2
    assert "no trained decision model" in capsys.readouterr().err


def test_ensemble_chosen_on_dev_seeds(tmp_path, model_dir):
    """Each member alone and each candidate run on the dev seeds; a tie keeps the single member
    (listed first), so here (two copies of one model) member 0 alone is chosen and evaluated."""
    ensemble = {"members": [model_dir, model_dir], "threshold": 1.0,
                "dev": {"seeds": {"start": 5000, "count": 3}, "candidates": [{"lead": 1, "weights": [1.0, 3.0]}]}}
    config, out = write_config(tmp_path, model_dir, ensemble=ensemble)
    assert main(["rlid", "eval", config, "--policies", "ensemble"]) == 0
    ens = json.loads((out / "eval" / "ensemble.json").read_text())
    dev = ens["dev"]
    assert dev["seeds"] == [5000, 5003]
    assert list(dev["scores"]) == [f"member 0 alone ({model_dir})", f"member 1 alone ({model_dir})",
                                   "candidate 0: weights [1.0, 3.0], lead 1"]
    assert len(set(dev["scores"].values())) == 1 and dev["chosen"] == f"member 0 alone ({model_dir})"
    assert ens["setting"] == {"alone": 0} and ens["consulted"] == 0
    # both copies are reported alone (one model listed twice must not overwrite its first record)
    assert [k for k in ens if k.startswith("alone:")] == [f"alone:member 0 ({model_dir})", f"alone:member 1 ({model_dir})"]


def test_ensemble_eval_writes_as_it_goes_and_resumes(tmp_path, model_dir, capsys, monkeypatch):
    """The ensemble and each member alone run in blocks of eval.batch seeds, written as they go; after a
    kill (a torn line, no summary) a rerun rolls out only what is missing, reuses the dev choice, and
    reports what the uninterrupted run did (wall time aside)."""
    from rlid import cli as rlid_cli

    ensemble = {"members": [model_dir, model_dir], "threshold": 0.5,
                "dev": {"seeds": {"start": 5000, "count": 2}, "candidates": [{"lead": 1, "threshold": 1.0}]}}
    config, out = write_config(tmp_path, model_dir, ensemble=ensemble, eval={"seeds": {"start": 1000, "count": 4}, "batch": 2})
    assert main(["rlid", "eval", config, "--policies", "ensemble"]) == 0
    assert "ensemble: 2 / 4 seeds" in capsys.readouterr().out             # block by block
    folder = out / "eval"
    first = json.loads((folder / "ensemble.json").read_text())
    files = sorted(p.name for p in folder.glob("ensemble.*"))
    assert files == ["ensemble.alone0.episodes.jsonl", "ensemble.alone1.episodes.jsonl", "ensemble.dev.json",
                     "ensemble.episodes.jsonl", "ensemble.json"]
    lines = (folder / "ensemble.episodes.jsonl").read_text().splitlines(keepends=True)
    assert [json.loads(line)["id"] for line in lines] == [1000, 1001, 1002, 1003]
    (folder / "ensemble.episodes.jsonl").write_text("".join(lines[:2]) + lines[2][:9])
    (folder / "ensemble.alone1.episodes.jsonl").unlink()
    (folder / "ensemble.json").unlink()

    def again(*a, **k):
        raise AssertionError("the dev choice is made once")
    monkeypatch.setattr(rlid_cli, "_choose_on_dev", again)
    assert main(["rlid", "eval", config, "--policies", "ensemble"]) == 0
    redone = json.loads((folder / "ensemble.json").read_text())
    assert (folder / "ensemble.episodes.jsonl").read_text().splitlines(keepends=True)[:2] == lines[:2]
    assert {k for k in first if redone[k] != first[k]} <= {"wall_s", "decisions_per_s"}
    # another dev setting in the config is refused in one line, not mixed with the kept choice
    config, _ = write_config(tmp_path, model_dir, ensemble={**ensemble, "dev": {**ensemble["dev"], "candidates": []}},
                             eval={"seeds": {"start": 1000, "count": 4}, "batch": 2})
    (folder / "ensemble.json").unlink()
    capsys.readouterr()
    assert main(["rlid", "eval", config, "--policies", "ensemble"]) == 2
    err = error_text(capsys.readouterr().err)
    assert "dev choice for another ensemble setting" in err and err.count("\n") == 1
    monkeypatch.undo()
    assert main(["rlid", "eval", config, "--policies", "ensemble", "--force"]) == 0   # --force starts over
    assert json.loads((folder / "ensemble.dev.json").read_text())["asked"]["dev"]["candidates"] == []


def test_pick_on_dev_takes_the_best_and_the_first_of_a_tie():
    from rlid.ensemble import pick_on_dev

    assert pick_on_dev([("a", 3), ("b", 5), ("c", 5)]) == "b"
    assert pick_on_dev([("alone", 4), ("fused", 4)]) == "alone"
    with pytest.raises(ValueError):
        pick_on_dev([])


@pytest.mark.parametrize("ensemble, needle", [
    ({"lead": 2}, "lead 2 is not a member index"),
    ({"weights": [1.0]}, "one weight per member"),
    ({"dev": {"seeds": {"start": 1000, "count": 5}}}, "overlap the eval seeds"),
    ({"dev": {"candidates": [{"lead": 5}]}}, "candidates[0].lead 5"),
    ({"dev": {"candidates": [{"rule": "vote"}]}}, "rule"),
])
def test_bad_ensemble_settings_are_one_line_errors(tmp_path, model_dir, capsys, ensemble, needle):
    config, _ = write_config(tmp_path, model_dir, ensemble={"members": [model_dir, model_dir], **ensemble})
    assert main(["rlid", "eval", config, "--policies", "ensemble"]) == 2
    err = error_text(capsys.readouterr().err)
    assert needle in err and err.count("\n") == 1


def test_plane_settings_go_to_their_own_plane(tmp_path, model_dir, capsys):
    from rlid.config import load_rlid

    train = {"seeds": {"start": 0, "count": 8}, "max_steps": 1, "decision": {"exact_last_move": True},
             "token": {"lr": 0.5}}
    config, _ = write_config(tmp_path, model_dir, train=train)
    cfg = load_rlid(config)
    assert cfg.train_config("decision").exact_last_move and cfg.train_config("decision").lr != 0.5
    assert not cfg.train_config("token").exact_last_move and cfg.train_config("token").lr == 0.5
    config, _ = write_config(tmp_path, model_dir, train={**train, "exact_last_move": True})
    assert main(["rlid", "train", config, "--plane", "decision"]) == 2
    err = error_text(capsys.readouterr().err)
    assert "move it under train.decision" in err and err.count("\n") == 1


def test_ensemble_member_from_another_runs_trained_plane(tmp_path, model_dir, capsys):
    """An `ensemble.adapters` entry naming another run's plane folder loads its newest checkpoint's
    adapter (here step 2 of 2); a folder without checkpoints or adapter weights is a one-line error."""
    from rlid.cli import _ensemble_adapter
    from rlid.config import load_rlid

    other, other_out = write_config(tmp_path / "a", model_dir) if (tmp_path / "a").mkdir() is None else (None, None)
    assert main(["rlid", "train", other, "--plane", "decision", "--no_progress"]) == 0
    ensemble = {"members": [model_dir, model_dir], "adapters": [None, str(other_out / "decision")], "threshold": 1.0}
    config, out = write_config(tmp_path, model_dir, ensemble=ensemble)
    assert _ensemble_adapter(load_rlid(config), str(other_out / "decision")) == \
        other_out / "decision" / "checkpoints" / "ckpt-00000002" / "adapter"
    assert main(["rlid", "eval", config, "--policies", "ensemble"]) == 0
    assert json.loads((out / "eval" / "ensemble.json").read_text())["consult_rate"] == 1.0
    (tmp_path / "b").mkdir()
    config, _ = write_config(tmp_path / "b", model_dir, ensemble={**ensemble, "adapters": [None, str(tmp_path / "b")]})
    assert main(["rlid", "eval", config, "--policies", "ensemble"]) == 2
    err = error_text(capsys.readouterr().err)
    assert "not found" in err and err.count("\n") == 1


@pytest.mark.parametrize("init", ["decision", "fresh"])
def test_distill_init_decision_starts_from_the_teacher_adapter(tmp_path, model_dir, init):
    """With lr 0 the saved student adapter is its starting point: the trained LDM's adapter for
    `init: decision`, peft's fresh one (B = 0, so not the teacher's) for `init: fresh`."""
    from safetensors.torch import load_file

    distill = {"epochs": 1, "batch_size": 2, "only_successful": False, "seeds": {"start": 0, "count": 2},
               "lr": 0.0, "init": init}
    config, out = write_config(tmp_path, model_dir, distill=distill)
    assert main(["rlid", "train", config, "--plane", "decision", "--no_progress"]) == 0
    assert main(["rlid", "distill", config]) == 0
    teacher = load_file(out / "decision" / "checkpoints" / "ckpt-00000002" / "adapter" / "adapter_model.safetensors")
    student = load_file(out / "distill" / "adapter" / "adapter_model.safetensors")
    same = set(teacher) == set(student) and all(torch.equal(teacher[k], student[k]) for k in teacher)
    assert same == (init == "decision")
    assert json.loads((out / "distill" / "log.json").read_text())["init"] == init


def test_distill_teacher_borrows_another_runs_trained_decision_model(tmp_path, model_dir, capsys):
    """`distill.teacher: RUN` distils RUN's trained LDM into this config's folder (with `init: decision`
    and lr 0 the student is exactly RUN's adapter); a teacher folder with no trained LDM is one line, exit 2."""
    from safetensors.torch import load_file

    for name in "abc":
        (tmp_path / name).mkdir()
    config_a, out_a = write_config(tmp_path / "a", model_dir)
    assert main(["rlid", "train", config_a, "--plane", "decision", "--no_progress"]) == 0
    distill = {"epochs": 1, "batch_size": 2, "only_successful": False, "seeds": {"start": 0, "count": 2},
               "lr": 0.0, "init": "decision", "teacher": str(out_a)}
    config_b, out_b = write_config(tmp_path / "b", model_dir, distill=distill)
    assert main(["rlid", "distill", config_b]) == 0
    teacher = load_file(out_a / "decision" / "checkpoints" / "ckpt-00000002" / "adapter" / "adapter_model.safetensors")
    student = load_file(out_b / "distill" / "adapter" / "adapter_model.safetensors")
    assert set(teacher) == set(student) and all(torch.equal(teacher[k], student[k]) for k in teacher)
    assert not (out_b / "decision").exists() and not (out_a / "distill").exists()
    assert json.loads((out_b / "distill" / "log.json").read_text())["teacher"].startswith(str(out_a / "decision"))
    capsys.readouterr()
    config_c, _ = write_config(tmp_path / "c", model_dir, distill={**distill, "teacher": str(tmp_path / "nowhere")})
    assert main(["rlid", "distill", config_c]) == 2
    err = error_text(capsys.readouterr().err)
    assert "no trained decision model" in err and "distill.teacher" in err and err.count("\n") == 1
