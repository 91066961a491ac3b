"""Peak memory of one big batch vs the same batch cut to fit a budget (`eval.batch_fit`), one member.

Decodes the same GSM8K k-shot prompts (greedy) two ways, each in a fresh process (memory an
allocator has once taken is not given back, so one process cannot measure both): in one call, and
in the parts `batch_parts` cuts for `--budget_gib`; a thread samples the process's RSS every 50 ms.
Prints, per way, the peak RSS above what the loaded (and warmed-up) model held, the estimate of
`runtime.batch_memory` for the largest part, wall time, and whether the texts are identical.

    OMP_NUM_THREADS=1 python benchmarks/batch_split.py --model qwen2.5-coder-0.5b --batch 16 --budget_gib 0.25
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from specdec_speed import PeakRSS  # noqa: E402  (sampled every 50 ms)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--shots", type=int, default=4)
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--budget_gib", type=float, default=0.25)
    ap.add_argument("--way", choices=["one", "parts"], help="(internal) measure one way in this process, print JSON")
    args = ap.parse_args(argv)
    if args.way is None:
        return compare(argv or sys.argv[1:], args)
    import gc

    import psutil
    import torch

    from eval.batch_fit import batch_parts, generate_in_parts
    from eval.data import resolve_data_dir
    from eval.task import get_task
    from runtime.batch_memory import GIB, batch_bytes
    from runtime.member import load_member

    task = get_task("gsm8k", num_fewshot=args.shots)
    docs, shots = task.load(resolve_data_dir(None))
    prompts = [task.prompt(d, shots) for d in docs[: args.batch]]
    member = load_member(args.model)
    gen = dict(max_new_tokens=args.max_new_tokens, stop=list(task.until))
    member.generate(prompts[:1], max_new_tokens=2)  # warm up (first-call allocations)
    lengths = [len(member.encode_prompt(p)) for p in prompts]
    parts = batch_parts(member, prompts, args.max_new_tokens, budget=int(args.budget_gib * GIB))
    cut = [range(len(prompts))] if args.way == "one" else parts
    gc.collect()
    base = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    with PeakRSS() as peak:
        outs = generate_in_parts(prompts, 0, lambda ps, s: member.generate(ps, seed=s, **gen), parts=cut,
                                 notice=lambda text: None)
    wall = time.perf_counter() - t0
    largest = max(cut, key=len)
    from runtime.dtype_choice import cpu_name

    cpu = cpu_name()
    print(json.dumps({"parts": len(cut), "most": len(largest), "peak_mib": (peak.peak - base) / 2**20,
                      "estimate_mib": batch_bytes(member, [lengths[i] for i in largest], args.max_new_tokens) / 2**20,
                      "wall_s": wall, "texts": [o.text for o in outs], "lengths": [min(lengths), max(lengths)],
                      "threads": torch.get_num_threads(), "cpu": cpu}))
    return 0


def compare(argv: list[str], args) -> int:
    """Both ways, each in its own process; the table."""
    import subprocess

    res = {}
    for way in ("one", "parts"):
        run = subprocess.run([sys.executable, __file__, *argv, "--way", way], capture_output=True, text=True, check=True)
        res[way] = json.loads(run.stdout.strip().splitlines()[-1])
    one = res["one"]
    print(f"{args.model}, {args.batch} GSM8K {args.shots}-shot prompts ({one['lengths'][0]}-{one['lengths'][1]} tokens), "
          f"{args.max_new_tokens} new tokens, greedy, float32, {one['threads']} thread(s), {one['cpu']}\n")
    print("| way | parts | rows per part (max) | peak RSS above the loaded model, MiB | estimate for the largest part, MiB "
          "| wall s | texts equal to one call |")
    print("|---|--:|--:|--:|--:|--:|---|")
    for way, name in (("one", "one call"), ("parts", f"parts for {args.budget_gib} GiB")):
        r = res[way]
        print(f"| {name} | {r['parts']} | {r['most']} | {r['peak_mib']:.0f} | {r['estimate_mib']:.0f} | {r['wall_s']:.1f} | "
              f"{'yes' if r['texts'] == one['texts'] else '**no**'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
