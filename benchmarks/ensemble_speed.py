"""What the winning GSM8K ensemble costs against the model alone at its best prompt (issue 61).

In one process, taking turns batch by batch on the same GSM8K problems (chat-native `gsm8k_chat`
prompts; default the old test split's rows, not the declared heldout test), three runs:
- `alone`: qwen2.5-coder-1.5b at its best prompt, plain batched greedy decoding (`Member.generate`);
- `ensemble`: the declared cot-and-programs vote (the CoT and a program view, two answers each, the
  weighted vote that stops when the greedy pair agrees), unaccelerated;
- `accelerated`: the same vote with a drafter for each member (`--drafter`: "rows", "lookup", a model).

It prints seconds per problem of each, the ratio of each ensemble to `alone`, and one JSON line with
`ratio` (accelerated over alone), `ratio_plain` (ensemble over alone) and `outputs_equal` (every answer
the accelerated vote drew equals the plain vote's, all rows), with the CPU named.

    python benchmarks/ensemble_speed.py --limit 8 --batch 1 --drafter rows --threads 2
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

PROGRAM = ("Write a Python program that solves the problem and prints the final answer as a single number. "
           "Reply with the program only, in one ```python code block.")
VOTE = {"samples": [2, 2], "sampling_temperature": 0.7, "top_p": 0.8, "vote": "weighted", "early_stop": 2,
        "draw": [2]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--offset", type=int, default=0, help="first row of the split")
    p.add_argument("--split", default="test")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--drafter", default="rows")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max_new_tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    import torch

    from adafuse import Ensemble
    from eval.data import resolve_data_dir
    from eval.task import get_task
    from runtime.loader import load

    torch.set_num_threads(args.threads)
    task = get_task("gsm8k_chat", split=args.split)
    docs, shots = task.load(resolve_data_dir(None))
    docs = docs[args.offset: args.offset + args.limit]
    members = [args.model, {"name": args.model, "view": {"kind": "program", "system": PROGRAM}}]
    alone = load(args.model, dtype=args.dtype)
    plain = Ensemble(members, method="view-vote", dtype=args.dtype, **VOTE)
    fast = Ensemble(members, method="view-vote", dtype=args.dtype, drafters=[args.drafter] * 2, **VOTE)
    kw = dict(max_new_tokens=args.max_new_tokens, seed=0)
    seconds = {"alone": 0.0, "ensemble": 0.0, "accelerated": 0.0}
    right = {name: 0.0 for name in seconds}
    equal = total = 0
    for i in range(0, len(docs), args.batch):
        batch = docs[i: i + args.batch]
        prompts = [task.prompt(d, shots) for d in batch]
        outs = {}
        for name, run in (("alone", lambda: alone.generate(prompts, **kw)),
                          ("ensemble", lambda: plain.generate(prompts, answer=task.extract, **kw)),
                          ("accelerated", lambda: fast.generate(prompts, answer=task.extract, **kw))):
            t0 = time.perf_counter()
            outs[name] = run()
            seconds[name] += time.perf_counter() - t0
            for doc, out in zip(batch, outs[name]):
                text = out.program["stdout"] if out.program else out.text
                right[name] += task.score(task.extract(text), doc)[0][task.primary_metric]
        for a, b in zip(outs["ensemble"], outs["accelerated"]):
            total += 1
            equal += [s.text for s in a.trace.samples] == [s.text for s in b.trace.samples]
        print(f"problems {i + len(batch)}/{len(docs)}: " + ", ".join(
            f"{n} {s / (i + len(batch)):.1f} s/problem" for n, s in seconds.items()), file=sys.stderr)
    n = len(docs)
    print(f"{args.model} ({args.dtype}), {n} GSM8K problems ({args.split} rows from {args.offset}), batch {args.batch}, "
          f"{args.threads} thread(s), drafter {args.drafter}; {cpu_name()}")
    print("| run | s / problem | x alone | accuracy % |\n|---|--:|--:|--:|")
    for name, s in seconds.items():
        print(f"| {name} | {s / n:.2f} | {s / seconds['alone']:.2f}x | {100 * right[name] / n:.1f} |")
    print(json.dumps({"ratio": round(seconds["accelerated"] / seconds["alone"], 3),
                      "ratio_plain": round(seconds["ensemble"] / seconds["alone"], 3),
                      "outputs_equal": equal == total, "equal_rows": equal, "rows": total, "batch": args.batch,
                      "drafter": args.drafter, "dtype": args.dtype, "cpu": cpu_name()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
