"""Growing a token tree step by step: re-feeding the whole tree per step vs extending the open tree
(`OpenTree.grow`), one process.

This is what candidate-word completion (`adafuse.methods.word_level.complete_words`) and the model
drafter (`specdec.drafters.ModelDrafter`) do: per row, a first forward holds `--drafts` draft nodes
(two-token words) and `--branches` first tokens; each later step adds one token below every branch.
Both ways run on the same prefilled state (GSM8K 4-shot prompts, batches of `--batch_size`), with
LM-head logits at every node (the lead's completion tree) or only at the new branch ends
(`--ends_only`), alternating per repetition so load changes hit both alike. Prints seconds per tree,
tokens fed, the ratio, and the max |logit difference| between the two at the final branch ends.

    python benchmarks/tree_growth.py --members qwen2.5-coder-0.5b,gemma3-270m,smollm2-135m
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


def grow(state, rows_tokens, steps: int, branches: int, drafts: int, ends_only: bool, extend: bool):
    """Grow the same tree either way; returns (tokens fed, logits at the final branch ends [B, branches, V])."""
    B = state.batch_size
    tokens = [[] for _ in range(B)]
    parents = [[] for _ in range(B)]
    ends = [[] for _ in range(B)]
    for b in range(B):
        pool = rows_tokens[b]
        for d in range(drafts):  # two-token draft words
            tokens[b] += [pool[2 * d], pool[2 * d + 1]]
            parents[b] += [-1, len(tokens[b]) - 2]
        for i in range(branches):
            tokens[b].append(pool[100 + i])
            parents[b].append(-1)
            ends[b].append(len(tokens[b]) - 1)
    fed_total, fed = 0, [0] * B
    for step in range(steps):
        if step > 0:
            for b in range(B):
                for i, end in enumerate(ends[b]):
                    tokens[b].append(rows_tokens[b][200 + 10 * step + i])
                    parents[b].append(end)
                    ends[b][i] = len(tokens[b]) - 1
        start = fed if extend else [0] * B
        at = [[n for n in ends[b] if n >= start[b]] for b in range(B)] if ends_only else None
        # re-feed: a fresh tree of every node; extend: the new nodes, numbered tree-wide
        if not (extend and step > 0):
            tree = state.new_tree()
        tree.add_nodes([tokens[b][start[b]:] for b in range(B)], [parents[b][start[b]:] for b in range(B)])
        tree.grow(at)
        fed_total += sum(len(t) - s for t, s in zip(tokens, start))
        fed = [len(t) for t in tokens]
    final = tree.gather(ends)
    tree.accept([[] for _ in range(B)])
    return fed_total, final


def main() -> None:
    import torch

    from runtime.loader import load as load_member
    from adafuse_cost import gsm8k_prompts

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--members", default="qwen2.5-coder-0.5b,gemma3-270m,smollm2-135m")
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--branches", type=int, default=3)
    p.add_argument("--drafts", type=int, default=6)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--ends_only", action="store_true", help="LM head only at the new branch ends")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    prompts, _, _ = gsm8k_prompts(args.batch_size, 4)
    print(f"steps {args.steps}, branches {args.branches}, drafts {args.drafts}, batch {args.batch_size}, "
          f"logits {'at branch ends' if args.ends_only else 'at every node'}")
    print("| member | re-feed s / tree | extend s / tree | ratio | tokens fed (re-feed / extend) | max abs logit diff |")
    print("|---|--:|--:|--:|--:|--:|")
    for name in args.members.split(","):
        member = load_member(name)
        ids = [member.encode_prompt(x) for x in prompts]
        state = member.start(ids)
        g = torch.Generator().manual_seed(0)
        pool = [torch.randint(100, min(member.vocab_size, 30000), (400,), generator=g).tolist() for _ in ids]
        times = {False: [], True: []}
        fed, diff = {}, 0.0
        for _ in range(args.repeats):
            out = {}
            for extend in (False, True):
                t0 = time.perf_counter()
                fed[extend], out[extend] = grow(state, pool, args.steps, args.branches, args.drafts, args.ends_only, extend)
                times[extend].append(time.perf_counter() - t0)
            diff = max(diff, float((out[False] - out[True]).abs().max()))
        refeed, ext = (sum(times[k][1:]) / (len(times[k]) - 1) for k in (False, True))
        print(f"| {name} | {refeed:.3f} | {ext:.3f} | {refeed / ext:.2f}x | {fed[False]} / {fed[True]} | {diff:.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
