"""Experiment-config validation, the task registry, data folder lookup and prompts (no models)."""
from __future__ import annotations

from pathlib import Path

import pytest

from runtime.errors import AdafuseError, ConfigError
from eval.config import load_config, parse_config
from eval.data import DataNotFoundError, resolve_data_dir
from eval.task import available_tasks, get_task
from eval.testing import make_data

REPO = Path(__file__).resolve().parents[1]
GOOD = {"tasks": ["gsm8k"], "runs": [{"name": "a", "method": "single", "members": ["smollm2-135m"]}]}


def _err(data: dict, **kw) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "configs/x.yaml", **kw)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("configs/x.yaml")
    return msg


def test_unknown_key_suggests_the_right_one() -> None:
    msg = _err({"tasks": ["gsm8k"], "runs": [{"method": "single", "membrs": ["smollm2-135m"]}]})
    assert "unknown key 'runs[0].membrs'" in msg and "did you mean 'members'?" in msg
    assert "did you mean 'limit'" in _err({**GOOD, "limt": 3})


def test_wrong_type_names_the_key() -> None:
    assert "key 'limit' must be an integer" in _err({**GOOD, "limit": "five"})
    assert "key 'runs[0].members' must be a list" in _err({"tasks": ["gsm8k"], "runs": [{"method": "single", "members": "x"}]})
    assert "tasks[0].generation.max_new_tokens" in _err({**GOOD, "tasks": [{"name": "gsm8k", "generation": {"max_new_tokens": "9"}}]})
    assert "'seed' must be an integer, got bool" in _err({**GOOD, "seed": True})


def test_missing_required_and_bad_values() -> None:
    assert "missing required key 'tasks'" in _err({"runs": GOOD["runs"]})
    assert "missing required key 'runs'" in _err({"tasks": ["gsm8k"]})
    assert "missing required key 'runs[0].members'" in _err({"tasks": ["gsm8k"], "runs": [{"method": "adafuse"}]})
    assert "did you mean 'adafuse'" in _err({"tasks": ["gsm8k"], "method": "adafuze", "members": ["a", "b"]})
    assert "unknown task 'gsm8kk'" in _err({**GOOD, "tasks": ["gsm8kk"]})
    assert "used twice" in _err({"tasks": ["gsm8k"], "runs": [GOOD["runs"][0], GOOD["runs"][0]]})
    assert "must be >= 1" in _err({**GOOD, "batch_size": 0})


def test_resolution_and_overrides() -> None:
    data = {"tasks": ["gsm8k", {"name": "nq_open", "num_fewshot": 2, "limit": 7, "generation": {"max_new_tokens": 9}}],
            "method": "single", "members": ["smollm2-135m"], "limit": 3, "generation": {"max_new_tokens": 99}}
    cfg = parse_config(data, "x.yaml")
    assert [r.name for r in cfg.runs] == ["smollm2-135m"]
    gsm, nq = cfg.tasks
    assert (gsm.limit, gsm.max_new_tokens, gsm.task.num_fewshot) == (3, 99, 4)
    assert (nq.limit, nq.max_new_tokens, nq.task.num_fewshot) == (7, 9, 2)
    cfg = parse_config(data, "x.yaml", limit=1, seed=5, batch_size=4, output_path="o", data_dir="d")
    assert [t.limit for t in cfg.tasks] == [1, 1] and (cfg.seed, cfg.batch_size, cfg.output_path, cfg.data_dir) == (5, 4, "o", "d")
    assert cfg.to_dict()["runs"][0]["method"] == "single"


def experiment_configs() -> list:
    """The configs of the committed experiments (`experiments/<name>/<name>.yaml`, `experiments/rlid/rlid_*.yaml`
    and the other configs kept beside records; a run folder's resolved `config.yaml` is a record, not a config)."""
    return sorted(p for p in (REPO / "experiments").glob("*/*.yaml") if p.name != "config.yaml")


def test_shipped_configs_are_valid() -> None:
    examples = sorted((REPO / "configs").glob("*.yaml"))
    assert any(p.name == "quickstart.yaml" for p in examples) and len(examples) <= 12   # a handful of examples
    paths = examples + experiment_configs()
    assert len(paths) > 60
    for path in paths:
        if path.name.startswith("rlid_"):              # RLiD experiment configs: their own schema
            from rlid.config import load_rlid

            assert load_rlid(path).train_seeds
            continue
        cfg = load_config(path)
        assert cfg.tasks and cfg.runs
    quick = load_config(REPO / "configs" / "quickstart.yaml")
    assert {t.name for t in quick.tasks} == {"gsm8k", "gsm8k_chat", "nq_open", "wmt22_de_en"}
    assert quick.baseline == "1.5b-best-prompt"   # every run paired with the strongest model at its best
    assert any(r.method == "adafuse" and len(r.members) == 3 for r in quick.runs)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(REPO / "configs" / "nope.yaml")


def test_task_registry() -> None:
    names = set(available_tasks())
    assert {"gsm8k", "nq_open", "wmt22_de_en", "wmt22_en_de", "wmt22_zh_en", "wmt22_en_zh"} <= names
    zh = get_task("wmt22_en_zh")
    assert zh.metric_list[0] == {"metric": "bleu", "tokenize": "zh"} and zh.version
    assert get_task("wmt22_de_en").metric_list[0] == {"metric": "bleu"}
    assert get_task("gsm8k", num_fewshot=1).num_fewshot == 1


def test_missing_data_is_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataNotFoundError) as info:
        resolve_data_dir(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(info.value) and "--data_dir" in str(info.value)
    assert isinstance(info.value, AdafuseError) and "\n" not in str(info.value)
    with pytest.raises(DataNotFoundError, match="gsm8k/test.jsonl.*--data_dir"):
        get_task("gsm8k").load(tmp_path)
    monkeypatch.setenv("ADAFUSE_DATA", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path.resolve()


def test_prompts_and_disjoint_exemplars(tmp_path: Path) -> None:
    data = make_data(tmp_path, n=12)
    gsm = get_task("gsm8k", num_fewshot=3)
    docs, shots = gsm.load(data)
    assert len(shots) == 3 and all("twice 100" in s["question"] for s in shots)  # from train, not test
    prompt = gsm.prompt(docs[0], shots)
    assert prompt.count("Question:") == 4 and prompt.count("The answer is") == 3 and prompt.endswith("Answer:")
    assert "<<" not in prompt and "####" not in prompt
    nq = get_task("nq_open", num_fewshot=5)
    docs, shots = nq.load(data)
    assert [d["id"] for d in docs][0] == 8 and {s["id"] for s in shots} == set(range(5))
    with pytest.raises(ConfigError, match="num_fewshot=9"):
        get_task("nq_open", num_fewshot=9).load(data)
    wmt = get_task("wmt22_de_en")
    docs, shots = wmt.load(data)
    assert not {d["id"] for d in docs} & {s["id"] for s in shots}
    assert wmt.prompt(docs[0], shots).endswith("German: Satz nummer 8 ist hier .\nEnglish:")
