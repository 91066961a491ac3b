"""Members and drafters that fit one by one but not together are refused before the first load,
in one line with the numbers (free RAM faked through psutil; `load_member` replaced, so nothing
real loads; the model folders hold tiny random weights, which the size estimate reads)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import yaml

from adafuse import Ensemble
from eval import methods
from eval.cli import main as adafuse_main
from eval.testing import make_data
from runtime import member as member_module
from runtime import registry
from runtime.errors import InsufficientMemoryError
from runtime.loader import default_loader
from runtime.testing import tiny_member, tiny_model

MiB = 2**20


@pytest.fixture
def folders(tmp_path: Path) -> list[str]:
    out = []
    for i in range(3):
        tiny_model("llama", vocab_size=100, seed=i).save_pretrained(tmp_path / f"m{i}")
        out.append(str(tmp_path / f"m{i}"))
    return out


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Specs that reached `load_member` (each gives a tiny in-memory member)."""
    seen: list[str] = []

    def fake_load(spec, dtype="float32", device="cpu", **kw):
        seen.append(spec)
        return tiny_member(name=Path(spec).name)

    monkeypatch.setattr(member_module, "load_member", fake_load)
    methods.clear_caches()
    yield seen
    methods.clear_caches()


def _free(monkeypatch: pytest.MonkeyPatch, mib: float) -> None:
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=int(mib * MiB)))


def test_each_fits_alone_but_not_together(folders, loads, monkeypatch) -> None:
    one = registry.estimate_bytes(folders[0])
    assert 200 * MiB < one < 260 * MiB              # tiny weights + the 200 MiB working margin
    _free(monkeypatch, 1.5 * one / MiB)
    with pytest.raises(InsufficientMemoryError) as info:
        Ensemble(folders[:2], method="token-union")
    msg = str(info.value)
    assert "\n" not in msg and loads == [] and len(default_loader()) == 0      # refused before the first load
    for f in folders[:2]:
        assert f"{f} ~0.2 GiB" in msg
    assert "need ~0.4 GiB, 0.3 GiB available" in msg and "bfloat16" in msg
    Ensemble([folders[0], folders[0]], method="token-union")                   # one model named twice: fits
    assert loads == [folders[0]]


def test_members_loaded_before_do_not_count_again(folders, loads, monkeypatch) -> None:
    _free(monkeypatch, 10 * 1024)
    default_loader().member(folders[0])
    _free(monkeypatch, 1.5 * registry.estimate_bytes(folders[0]) / MiB)        # room for one more
    Ensemble(folders[:2], method="token-union")
    assert loads == folders[:2]


def test_drafters_count_with_the_members(folders, loads, monkeypatch) -> None:
    _free(monkeypatch, 2.5 * registry.estimate_bytes(folders[0]) / MiB)        # two fit, three do not
    Ensemble(folders[:2], method="token-union", drafters=["lookup", None])
    methods.clear_caches()                                                      # nothing loaded again
    with pytest.raises(InsufficientMemoryError, match=f"{folders[2]} ~0.2 GiB.*need ~0.6 GiB"):
        Ensemble(folders[:2], method="token-union", drafters=[folders[2], None])
    with pytest.raises(InsufficientMemoryError, match=f"{folders[2]} ~0.2 GiB"):
        Ensemble(folders[:2], method="token-union", drafters=[None, f"{folders[2]}@int8"])
    assert loads == folders[:2] and len(default_loader()) == 0                 # the refused ones loaded nothing
    _free(monkeypatch, 1.5 * registry.estimate_bytes(folders[0]) / MiB)
    with pytest.raises(InsufficientMemoryError, match="need ~0.4 GiB"):       # a single member + its drafter
        methods.build_generator("single", [folders[1]], drafter=folders[2])
    assert loads == folders[:2]


def test_cli_eval_refuses_in_one_line(folders, loads, monkeypatch, tmp_path, capsys) -> None:
    cfg = {"tasks": ["gsm8k"], "limit": 2, "output_path": str(tmp_path / "out"),
           "data_dir": str(make_data(tmp_path / "data", n=4)),
           "runs": [{"name": "ens", "method": "token-union", "members": folders[:2]}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    _free(monkeypatch, 300)
    assert adafuse_main(["eval", str(tmp_path / "c.yaml"), "--no_progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not enough free memory" in err and "need ~0.4 GiB, 0.3 GiB available" in err
    assert loads == []
