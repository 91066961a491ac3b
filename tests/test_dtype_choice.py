"""`dtype="auto"`: the fast dtype measured on the CPU at hand (`runtime.dtype_choice`)."""
from __future__ import annotations

import json

import pytest
import torch

from runtime import dtype_choice
from runtime.errors import ConfigError
from runtime.member import resolve_dtype


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAFUSE_CACHE", str(tmp_path))
    dtype_choice._memo.clear()
    yield tmp_path / "dtype_choice.json"
    dtype_choice._memo.clear()


def _times(fp32: float, bf16: float | None):
    def measure(dtypes, shape=None, **kw):
        return {"float32": fp32, **({"bfloat16": bf16} if torch.bfloat16 in dtypes and bf16 is not None else {})}
    return measure


@pytest.mark.parametrize("native, fp32, bf16, want", [
    (True, 10.0, 5.0, "bfloat16"),     # clearly faster
    (True, 10.0, 9.0, "float32"),      # within the margin: noise must not flip to a lossy dtype
    (True, 10.0, 12.0, "float32"),
    (False, 10.0, 5.0, "bfloat16"),    # no native bfloat16: measured all the same (unpacked)
    (False, 10.0, 9.0, "float32"),
])
def test_choice_follows_the_measurement(monkeypatch, native, fp32, bf16, want) -> None:
    monkeypatch.setattr(dtype_choice, "native_bf16", lambda: native)
    monkeypatch.setattr(dtype_choice, "measure_linears", _times(fp32, bf16))
    choice = dtype_choice.choose_dtype()
    assert choice.dtype == want and set(choice.ms) == {"float32", "bfloat16"}
    assert torch.get_num_threads() >= 1 and choice.cpu.startswith(dtype_choice.cpu_name().split(" [")[0])


def test_measured_once_then_cached_per_cpu(cache, monkeypatch) -> None:
    monkeypatch.setattr(dtype_choice, "native_bf16", lambda: True)
    monkeypatch.setattr(dtype_choice, "measure_linears", _times(10.0, 4.0))
    assert dtype_choice.fastest_dtype().dtype == "bfloat16"
    saved = json.loads(cache.read_text())
    assert list(saved) == [dtype_choice._key()] and saved[dtype_choice._key()]["ms"] == {"float32": 10.0, "bfloat16": 4.0}

    def boom(*a, **k):
        raise AssertionError("measured again")
    monkeypatch.setattr(dtype_choice, "measure_linears", boom)
    dtype_choice._memo.clear()
    assert dtype_choice.fastest_dtype().dtype == "bfloat16"          # from the file
    assert resolve_dtype("auto") == torch.bfloat16
    monkeypatch.setattr(dtype_choice, "measure_linears", _times(10.0, 11.0))
    assert dtype_choice.fastest_dtype(remeasure=True).dtype == "float32"
    cache.write_text("{not json")                                      # a broken cache is measured again
    dtype_choice._memo.clear()
    assert dtype_choice.fastest_dtype().dtype == "float32"


def test_emulated_bfloat16_is_measured_unpacked(monkeypatch) -> None:
    monkeypatch.setattr(dtype_choice, "native_bf16", lambda: False)
    assert type(dtype_choice._linear(torch.bfloat16, 64, 128)) is torch.nn.Linear
    ms = dtype_choice.measure_linears((torch.float32, torch.bfloat16), shape=(64, 128), workload=((1, 2),), rounds=2)
    assert set(ms) == {"float32", "bfloat16"} and min(ms.values()) > 0


def test_the_measured_workload_is_an_example_with_its_prompt(monkeypatch) -> None:
    """Decode rows alone would miss emulated bfloat16's cost on prompts (9x at 256 rows on an AVX2 EPYC):
    every dtype runs every (rows, calls) of the workload, the prompt-sized rows included, each round."""
    seen: dict[torch.dtype, list[int]] = {}

    class Recording(torch.nn.Module):
        def __init__(self, dtype):
            super().__init__()
            self.dtype = dtype

        def forward(self, x):
            assert x.dtype == self.dtype
            seen.setdefault(self.dtype, []).append(x.shape[0])
            return x

    monkeypatch.setattr(dtype_choice, "_linear", lambda d, i, o: Recording(d))
    dtype_choice.measure_linears((torch.float32, torch.bfloat16), shape=(16, 32), rounds=2)
    assert max(r for r, _ in dtype_choice.EXAMPLE_WORKLOAD) >= 256
    for d in (torch.float32, torch.bfloat16):
        want = [r for r, calls in dtype_choice.EXAMPLE_WORKLOAD for _ in range(calls)] * 3   # warm-up + 2 rounds
        assert seen[d] == want


def test_real_measurement_runs_and_unknown_dtype_is_one_line(cache) -> None:
    ms = dtype_choice.measure_linears((torch.float32,), shape=(64, 128), workload=((1, 2), (8, 1)), rounds=2)
    assert set(ms) == {"float32"} and ms["float32"] > 0
    with pytest.raises(ConfigError, match="unknown dtype 'fp64'; use one of: auto, float32"):
        resolve_dtype("fp64")


@pytest.mark.parametrize("native", [False, True])
def test_emulated_bfloat16_is_noted_once(monkeypatch, capsys, native) -> None:
    from runtime import member, packed_linear

    monkeypatch.setattr(member, "_NOTED_BF16", False)
    monkeypatch.setattr(packed_linear, "native_bf16", lambda: native)
    assert member.note_emulated_bf16() is (not native)
    assert member.note_emulated_bf16() is False                           # once per process
    err = capsys.readouterr().err
    assert (err.count("bfloat16 is emulated on this CPU") == 1) is (not native)
    assert not native or err == ""
