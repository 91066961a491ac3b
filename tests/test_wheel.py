"""A real `pip install .`: the wheel carries every module, the task YAMLs, the lm-eval tasks and the
configs (as eval/configs/), and shipped configs are found by name from any folder."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from eval.config import load_config, resolve_config_path
from runtime.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "specdec", "adafuse", "rlid", "eval")


def _package_files() -> set[str]:
    """What the wheel must hold: every module and every data file of our packages, and the configs."""
    out = {str(p.relative_to(REPO)) for pkg in PACKAGES for p in (REPO / pkg).rglob("*")
           if p.is_file() and p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts}
    return out | {f"eval/configs/{p.name}" for p in (REPO / "configs").glob("*.yaml")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """`pip wheel --no-deps` of a copy of the source (the checkout itself stays free of build/)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in (*PACKAGES, "configs"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(src)], check=True, capture_output=True, timeout=300)
    (path,) = dist.glob("adafuse-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_holds_modules_tasks_and_configs(wheel):
    names = set(wheel.namelist())
    missing = sorted(_package_files() - names)
    assert not missing, f"not in the wheel: {missing}"
    assert {"eval/tasks/gsm8k.yaml", "eval/tasks/nq_open.yaml", "eval/configs/quickstart.yaml",
            "eval/lm_eval_tasks/adafuse_gsm8k.yaml", "eval/lm_eval_tasks/utils.py"} <= names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "results/", "configs/", "experiments/"))]
    assert not [n for n in names if n.endswith((".jsonl", ".png"))]                       # no records
    assert len([n for n in names if n.startswith("eval/configs/") and n.endswith(".yaml")]) <= 12
    entry_points = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "adafuse = eval.cli:main" in entry_points and "adafuse-lm-eval = eval.lm_eval_cli:main" in entry_points
    metadata = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert "Provides-Extra: lm-eval" in metadata


def test_shipped_configs_are_found_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    quick = REPO / "configs" / "quickstart.yaml"
    assert resolve_config_path("configs/quickstart.yaml") == quick
    assert resolve_config_path("quickstart") == quick == resolve_config_path("quickstart.yaml")
    assert {t.name for t in load_config("configs/quickstart.yaml").tasks} == {"gsm8k", "gsm8k_chat", "nq_open",
                                                                             "wmt22_de_en"}
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "quickstart.yaml").write_text("tasks: [gsm8k]\nmethod: single\nmembers: [mine]\n")
    assert load_config("configs/quickstart.yaml").runs[0].members == ["mine"]  # a file of the user's wins
    assert resolve_config_path("elsewhere/quickstart.yaml") == Path("elsewhere/quickstart.yaml")
    with pytest.raises(ConfigError, match="shipped configs: .*quickstart"):
        load_config("configs/nope.yaml")
