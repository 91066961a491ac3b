"""Would running ensemble members concurrently beat running them one after another? One process.

An ensemble that runs its members one after another costs at least the sum of their forwards; the
question is whether putting members on separate cores buys more than giving every forward all the
cores (intra-op threads). On the same prefilled GSM8K prompts (batches of `--batch_size`), each
member greedily decodes `--tokens` tokens with its own KV cache, in three ways:

- one after another, 1 intra-op thread;
- one after another, `--threads` intra-op threads;
- concurrently: `--threads` Python workers (members dealt round-robin), 1 intra-op thread each
  (torch releases the GIL inside its kernels).

Prints seconds per way, each way's sum relative to the slowest member alone under the same
thread count (the floor of a sequential ensemble), and the concurrent way's speed-up over both
sequential ways. Every way runs `--repeats` times, interleaved; the first repetition is dropped.

    python benchmarks/member_concurrency.py --batch_size 4 --tokens 40
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def decode(state, tokens: int) -> float:
    """Seconds for `tokens` greedy one-token forwards continuing a prefilled `KVState`."""
    t0 = time.perf_counter()
    for _ in range(tokens):
        nxt = state.last_logits.argmax(-1).tolist()
        state.append([[t] for t in nxt])
    return time.perf_counter() - t0


def concurrent(members, prompt_ids, tokens: int, workers: int) -> float:
    """Wall seconds for every member to decode, members dealt round-robin to `workers` threads."""
    states = {m.name: m.start(prompt_ids[m.name]) for m in members}  # prefill is not timed

    def work(mine):
        for m in mine:
            decode(states[m.name], tokens)

    threads = [threading.Thread(target=work, args=(members[w::workers],)) for w in range(workers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def main() -> None:
    import torch

    from runtime.loader import load as load_member
    from adafuse_cost import DEFAULT_MEMBERS, gsm8k_prompts

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--members", default=DEFAULT_MEMBERS)
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--threads", type=int, default=2, help="cores to use (intra-op threads or workers)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    prompts, _, _ = gsm8k_prompts(args.batch_size, 4)
    members = [load_member(n) for n in args.members.split(",")]
    ids = {m.name: [m.encode_prompt(x) for x in prompts] for m in members}
    alone = {1: {m.name: [] for m in members}, args.threads: {m.name: [] for m in members}}
    conc = []
    for rep in range(args.repeats):
        for threads in alone:
            torch.set_num_threads(threads)
            for m in members:
                alone[threads][m.name].append(decode(m.start(ids[m.name]), args.tokens))
        torch.set_num_threads(1)
        conc.append(concurrent(members, ids, args.tokens, args.threads))

    def mean(xs):
        xs = xs[1:] if len(xs) > 1 else xs
        return sum(xs) / len(xs)

    print(f"batch {args.batch_size}, {args.tokens} tokens per member, {args.threads} cores, "
          f"{args.repeats} repetitions (first dropped)")
    print("| way | " + " | ".join(f"{m.name} s" for m in members) + " | all members s | / slowest alone |")
    print("|---|" + "--:|" * (len(members) + 2))
    sums = {}
    for threads, per in alone.items():
        secs = [mean(per[m.name]) for m in members]
        sums[threads] = sum(secs)
        print(f"| one after another, {threads} thread(s) | " + " | ".join(f"{s:.2f}" for s in secs)
              + f" | {sums[threads]:.2f} | {sums[threads] / max(secs):.2f}x |")
    slowest_t = max(mean(alone[args.threads][m.name]) for m in members)
    c = mean(conc)
    print(f"| concurrently, {args.threads} workers x 1 thread | " + " | ".join("-" for _ in members)
          + f" | {c:.2f} | {c / slowest_t:.2f}x (slowest at {args.threads} threads) |")
    print(f"\nconcurrent vs one after another: {sums[1] / c:.2f}x faster than at 1 thread, "
          f"{sums[args.threads] / c:.2f}x vs {args.threads} intra-op threads")


if __name__ == "__main__":
    main()
