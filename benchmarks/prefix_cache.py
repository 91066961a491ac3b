"""Prompt prefill with and without the prefix-chunk cache (`runtime.prefix_cache.PrefixCache`), one process.

k-shot evaluation prompts share their exemplars. For each member, the GSM8K k-shot prompts of
`--limit` test questions are prefilled in batches of `--batch_size` (`Member.start`, which is what
every method calls first), alternating per batch between `prefix_chunk=0` (one plain batched
forward over the whole prompts) and the cached chunks, so load changes hit both alike. The cache is
cleared before the run; its first batch pays for computing the exemplar chunks. Also checks that
both prefills leave the same next-token distribution (max |logit difference|) and prints the
seconds per batch and the ratio.

    python benchmarks/prefix_cache.py --members qwen2.5-coder-0.5b,gemma3-270m --limit 16 --batch_size 4
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    import torch

    from runtime.loader import load as load_member
    from adafuse_cost import gsm8k_prompts

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--members", default="qwen2.5-coder-0.5b,gemma3-270m,smollm2-135m")
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--shots", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    prompts, _, _ = gsm8k_prompts(args.limit, args.shots)
    print("| member | prompt tokens (mean) | batches | plain s / batch | cached s / batch | ratio | "
          "cached, first batch s | max abs logit diff |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for name in args.members.split(","):
        member = load_member(name)
        ids = [member.encode_prompt(x) for x in prompts]
        batches = [ids[i: i + args.batch_size] for i in range(0, len(ids), args.batch_size)]
        member.prefix_cache.clear()
        plain, cached, diff = [], [], 0.0
        for batch in batches:
            times = {}
            for chunk in (0, 64):
                member.prefix_chunk = chunk
                t0 = time.perf_counter()
                state = member.start(batch)
                times[chunk] = (time.perf_counter() - t0, state.last_logits.clone())
            plain.append(times[0][0])
            cached.append(times[64][0])
            diff = max(diff, float((times[0][1] - times[64][1]).abs().max()))
            print(f"  {name}: batch {len(plain)}/{len(batches)} plain {plain[-1]:.2f}s cached {cached[-1]:.2f}s",
                  file=sys.stderr, flush=True)
        warm = cached[1:] or cached
        p_mean = sum(plain[1:] or plain) / len(warm)
        c_mean = sum(warm) / len(warm)
        n_tok = sum(len(x) for x in ids) / len(ids)
        print(f"| {name} | {n_tok:.0f} | {len(batches)} | {p_mean:.2f} | {c_mean:.2f} | {p_mean / c_mean:.2f}x | "
              f"{cached[0]:.2f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
