"""Does a row's greedy output depend on the other rows of its batch? (issue 61)

The same N prompts (GSM8K test questions under the chat-native `gsm8k_chat` prompt) are generated
greedily, in one process:
- `alone`: one prompt per call (the reference);
- `batch 8` and `batch 24`: the prompts in batches of that many rows (prompts of different lengths,
  so rows are padded and finish at different times);
- `beside views`: each prompt as one row of a view vote, its forwards stacked with two other views of
  the same model (`runtime.forward_group`), the way the harness reads a member off an ensemble's batch.

It prints, per way, how many outputs equal the reference token for token (and where the first
difference comes), then one JSON line with `identical` (outputs equal to `alone` over every way),
`total`, the dtype, the model and the CPU. `--compare` runs every way a second time with the
row-wise attention off (`runtime.gqa_attention.ENABLED`: SDPA over the padded batch), taking turns,
and prints what batch invariance costs (s with / without) and how many outputs differ without it.

    python benchmarks/batch_invariance.py --prompts 24 --dtype bfloat16 --max_new_tokens 128 [--compare]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.view_cost import cpu_name  # noqa: E402


def gsm8k_prompts(n: int, offset: int) -> list:
    from eval.data import resolve_data_dir
    from eval.task import get_task

    task = get_task("gsm8k_chat")
    docs, shots = task.load(resolve_data_dir(None))
    return [task.prompt(d, shots) for d in docs[offset: offset + n]]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max_new_tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compare", action="store_true", help="also run each way with the row-wise attention off")
    args = p.parse_args(argv)

    import torch

    from adafuse.methods import get_method, run_method
    from runtime import gqa_attention
    from runtime.loader import load
    from runtime.views import make_view, parse_view

    torch.set_num_threads(args.threads)
    member = load(args.model, dtype=args.dtype)
    prompts = gsm8k_prompts(args.prompts, args.offset)

    def ids(outs) -> list[list[int]]:
        return [member.encode(o.text) for o in outs]

    def batched(size: int) -> list[list[int]]:
        out = []
        for i in range(0, len(prompts), size):
            out += ids(member.generate(prompts[i: i + size], max_new_tokens=args.max_new_tokens))
        return out

    views = [member, make_view(member, parse_view({"system": "Solve it step by step."})),
             make_view(member, parse_view({"system": "You are a careful math tutor."}))]

    def beside_views() -> list[list[int]]:
        outs = run_method(get_method("view-vote"), views, prompts, max_new_tokens=args.max_new_tokens)
        return [member.encode(next(s.text for s in o.trace.samples if s.by == member.name)) for o in outs]

    ways = {"alone": lambda: batched(1), "batch 8": lambda: batched(8), "batch 24": lambda: batched(24),
            "beside views": beside_views}
    got, seconds = {}, {}
    for name, run in ways.items():
        for invariant in (True, False) if args.compare else (True,):  # taking turns
            gqa_attention.ENABLED = invariant
            t0 = time.perf_counter()
            got[name, invariant] = run()
            seconds[name, invariant] = time.perf_counter() - t0
    gqa_attention.ENABLED = True
    ref = got["alone", True]
    print(f"{args.model} ({args.dtype}), {len(prompts)} GSM8K prompts, greedy, {args.max_new_tokens} new tokens, "
          f"{args.threads} thread(s); {cpu_name()}")
    print("| way | attention | identical to alone | first difference at token (median) | s |\n|---|---|--:|--:|--:|")
    identical = total = 0
    for name, invariant in got:
        diffs = [first_difference(a, b) for a, b in zip(ref, got[name, invariant])]
        same = sum(d is None for d in diffs)
        where = sorted(d for d in diffs if d is not None)
        print(f"| {name} | {'row-wise' if invariant else 'batched'} | {same}/{len(prompts)} | "
              f"{where[len(where) // 2] if where else '-'} | {seconds[name, invariant]:.1f} |")
        if name != "alone" and invariant:
            identical, total = identical + same, total + len(prompts)
    cost = {name: round(seconds[name, True] / seconds[name, False], 3) for name in ways if (name, False) in seconds}
    print(json.dumps({"identical": identical, "total": total, "dtype": args.dtype, "model": args.model,
                      "prompts": len(prompts), "cpu": cpu_name(), **({"rowwise_over_batched_s": cost} if cost else {})}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
