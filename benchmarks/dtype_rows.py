"""Where bfloat16 pays on the CPU at hand: a decoder linear and a real member, float32 vs bfloat16, at
decode sizes (1-8 rows) and prompt sizes (hundreds of rows), one process, one thread, dtypes taking turns.

    OMP_NUM_THREADS=1 python benchmarks/dtype_rows.py [--model qwen2.5-coder-0.5b] [--prompt 512] [--new 64]

Part 1 times the linear `runtime.dtype_choice` measures (Qwen2.5-0.5B's 896 x 4864, packed as the loader
packs it) at each row count. Part 2 loads the member in each dtype and times what one evaluated example
costs: prefilling a `--prompt`-token prompt, then `--new` greedy decode steps on its KV cache. It prints
both tables and the ratio bfloat16 / float32 (below 1: bfloat16 faster), then what `dtype="auto"` picks.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from runtime.dtype_choice import DEFAULT_SHAPE, choose_dtype, cpu_name, measure_linears
from runtime.loader import default_loader, load as load_member

ROWS = (1, 8, 64, 256, 1024)


def linear_table() -> list[str]:
    lines = ["| rows | float32 ms | bfloat16 ms | bf16 / fp32 |", "|---:|---:|---:|---:|"]
    for rows in ROWS:
        calls = max(1, 40 // rows)
        ms = measure_linears((torch.float32, torch.bfloat16), DEFAULT_SHAPE, workload=((rows, calls),))
        fp32, bf16 = ms["float32"] / calls, ms["bfloat16"] / calls
        lines.append(f"| {rows} | {fp32:.2f} | {bf16:.2f} | {bf16 / fp32:.2f} |")
    return lines


def example_cost(model, prompt_len: int, new: int, rounds: int = 3) -> tuple[float, float]:
    """Median seconds of prefilling `prompt_len` tokens and of `new` greedy steps on the cache."""
    ids = torch.randint(100, 5000, (1, prompt_len))
    pre, dec = [], []
    with torch.inference_mode():
        model(ids[:, :16])                                             # warm-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            t1 = time.perf_counter()
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(new):
                out = model(tok, past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            t2 = time.perf_counter()
            pre.append(t1 - t0)
            dec.append(t2 - t1)
    return statistics.median(pre), statistics.median(dec)


def member_table(name: str, prompt_len: int, new: int) -> list[str]:
    lines = [f"| {name} | prefill {prompt_len} s | {new} decode steps s | example s |", "|---|---:|---:|---:|"]
    cost = {}
    for dtype in ("float32", "bfloat16"):
        member = load_member(name, dtype=dtype)
        cost[dtype] = example_cost(member.model, prompt_len, new)
        del member
        default_loader().release(set())
        gc.collect()
        p, d = cost[dtype]
        lines.append(f"| {dtype} | {p:.2f} | {d:.2f} | {p + d:.2f} |")
    (pf, df), (pb, db) = cost["float32"], cost["bfloat16"]
    lines.append(f"| bf16 / fp32 | {pb / pf:.2f} | {db / df:.2f} | {(pb + db) / (pf + df):.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"CPU: {cpu_name()}, torch {torch.__version__}, one thread\n")
    print("\n".join(linear_table()) + "\n")
    print("\n".join(member_table(args.model, args.prompt, args.new)) + "\n")
    print(f"dtype=auto picks: {choose_dtype().describe()}")


if __name__ == "__main__":
    main()
