"""The fast dtype on the CPU at hand, chosen by measurement (`dtype="auto"` anywhere a dtype is taken).

This project's machines change CPU between sessions (AVX2 EPYC, Xeon with AMX, EPYC with AVX512-BF16)
and which dtype decodes faster depends on it: where the CPU computes bfloat16 dot products natively,
oneDNN's packed bfloat16 linear streams half the bytes of float32; elsewhere bfloat16 is emulated
(unpacked `nn.Linear`), which still halves the bytes streamed and may or may not win (an idle 2-core
AVX2 EPYC, 2026-12-05: a qwen-0.5b forward took 79 ms in unpacked bfloat16 vs 136 ms in packed
float32), so it is measured there too rather than assumed slow. What is measured is the linear work of one
evaluated example, `EXAMPLE_WORKLOAD`: decode steps at 1 and 8 rows (one example, a batch of them) and
its prompt's prefill at 256 rows, a linear of a decoder's MLP shape (default Qwen2.5-0.5B's 896 x 4864)
in each candidate dtype, packed as the loader would pack it (`_linear`), the dtypes taking turns, and
`choose_dtype` keeps bfloat16 only if it is faster than float32 by a margin (bfloat16 changes the
outputs; noise must not flip a choice). The prompt matters: emulated bfloat16 can tie float32 at one
row and lose 9x at hundreds (an idle 2-core AVX2 EPYC, family 23, 2026-12-07, `benchmarks/dtype_rows.py`:
0.93x at 1 row, 3.7x at 8, 9.2x at 256; a whole qwen2.5-coder-0.5b example of 512 prompt tokens and 64
decode steps 3.7x slower in bfloat16), so a choice made on decode rows alone could pick a dtype that
makes every prompt, menu score and training step several times slower. It
measures on one thread: the ratio is a property of the core, and two threads on a loaded 2-core
machine spin against other jobs (measured here: 1 thread 11.9 vs 5.1 ms, bfloat16 2.3x faster; 2
threads beside two other jobs 34.1 vs 35.2 ms). The choice is cached per CPU (model name + bf16/AMX
flags) and torch version in `$ADAFUSE_CACHE/dtype_choice.json`, so it is measured once per machine
kind (a few seconds: 8 s on that AVX2 EPYC, where bfloat16 is the slow one).
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from runtime.files import write_json_atomic
from runtime.packed_linear import PackedLinear, native_bf16, packing_available

BF16_MARGIN = 0.85           # bfloat16 is chosen only at <= 0.85 x the float32 time
DEFAULT_SHAPE = (896, 4864)  # (in, out) features of the measured linear: Qwen2.5-0.5B's MLP up-projection
# one evaluated example's linear calls, as (rows, calls): 64 decode steps, half of them as a batch of 8,
# and a 512-token prompt prefilled as two 256-row calls
EXAMPLE_WORKLOAD = ((1, 32), (8, 32), (256, 2))


@dataclass
class DtypeChoice:
    """The measured choice: `dtype`, the median ms per call of each candidate, and the CPU it ran on."""

    dtype: str
    ms: dict[str, float] = field(default_factory=dict)
    cpu: str = ""

    def describe(self) -> str:
        times = ", ".join(f"{k} {v:.2f} ms" for k, v in self.ms.items())
        return f"{self.dtype} on {self.cpu} (one thread, one example's linear work: {times})"


def cpu_name() -> str:
    """The CPU model name and the flags that decide bfloat16 speed, e.g. 'AMD EPYC [avx512_bf16]'."""
    model, flags = "unknown CPU", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown CPU":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    marks = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model} [{' '.join(marks)}]"


def _linear(dtype: torch.dtype, in_f: int, out_f: int) -> nn.Module:
    layer = nn.Linear(in_f, out_f, bias=False).to(dtype)
    packed = packing_available() and (dtype == torch.float32 or native_bf16())
    return PackedLinear(layer) if packed else layer


def measure_linears(dtypes: tuple[torch.dtype, ...], shape: tuple[int, int] = DEFAULT_SHAPE,
                    workload: tuple[tuple[int, int], ...] = EXAMPLE_WORKLOAD, rounds: int = 5) -> dict[str, float]:
    """Median ms of one `workload` (each (rows, calls): `calls` linear calls on `rows` rows) per dtype,
    over `rounds` rounds after a warm-up; the dtypes take turns each round."""
    layers = {d: _linear(d, *shape) for d in dtypes}
    inputs = {(d, r): torch.randn(r, shape[0]).to(d) for d in dtypes for r, _ in workload}
    samples: dict[torch.dtype, list[float]] = {d: [] for d in dtypes}
    with torch.inference_mode():
        for round_index in range(rounds + 1):
            for d in dtypes:
                t0 = time.perf_counter()
                for r, calls in workload:
                    for _ in range(calls):
                        layers[d](inputs[(d, r)])
                if round_index:                      # round 0 warms up
                    samples[d].append((time.perf_counter() - t0) * 1e3)
    return {str(d).removeprefix("torch."): statistics.median(s) for d, s in samples.items()}


def choose_dtype(shape: tuple[int, int] = DEFAULT_SHAPE) -> DtypeChoice:
    """Measure now (no cache): bfloat16 if it beats float32 by the margin on this CPU (packed where the
    CPU has it natively, else unpacked: as the loader would run it)."""
    dtypes = (torch.float32, torch.bfloat16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ms = measure_linears(dtypes, shape)
    finally:
        torch.set_num_threads(threads)
    fast = "bfloat16" if "bfloat16" in ms and ms["bfloat16"] <= BF16_MARGIN * ms["float32"] else "float32"
    return DtypeChoice(fast, {k: round(v, 3) for k, v in ms.items()}, cpu_name())


def _cache_file() -> Path:
    from runtime.registry import cache_root

    return cache_root() / "dtype_choice.json"


MEASURE_VERSION = 3  # bumped when what `choose_dtype` measures changes (2: bfloat16 measured on every CPU;
                     # 3: one example's workload, its prompt included)


def _key() -> str:
    """The cache key: CPU, torch version and measurement version (a choice cached by an older
    measurement is measured again)."""
    return f"{cpu_name()} | torch {torch.__version__} | measure v{MEASURE_VERSION}"


_memo: dict[str, DtypeChoice] = {}


def fastest_dtype(device: str | torch.device = "cpu", remeasure: bool = False) -> DtypeChoice:
    """The fast dtype for `device`: on CPU measured once per (CPU, torch version) and cached on disk;
    on CUDA bfloat16 where supported, else float16 (no measurement)."""
    if torch.device(device).type == "cuda":
        return DtypeChoice("bfloat16" if torch.cuda.is_bf16_supported() else "float16", cpu="cuda")
    key = _key()
    if key in _memo and not remeasure:
        return _memo[key]
    path = _cache_file()
    try:
        saved = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        saved = {}
    if isinstance(saved.get(key), dict) and not remeasure:
        choice = DtypeChoice(**{k: v for k, v in saved[key].items() if k in ("dtype", "ms", "cpu")})
    else:
        choice = choose_dtype()
        saved[key] = asdict(choice)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, saved)
        except OSError:
            pass                                        # a read-only cache: measure again next time
    _memo[key] = choice
    return choice
