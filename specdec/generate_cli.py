"""The speculative part of `adafuse generate --model M`: `--drafter NAME|lookup|hybrid:NAME` and the tree
shape. Without --drafter it runs plain decoding through the same engine and prints the same figures.

    adafuse generate --model qwen2.5-coder-1.5b --drafter lookup --prompt "..."
    adafuse generate --model qwen2.5-coder-1.5b --drafter qwen2.5-coder-0.5b --scheme greedy --drafts 2 --depth 3 ...
"""
from __future__ import annotations

import argparse
import time

# defaults measured on the real Qwen pair on this 2-core AVX2 CPU (benchmarks/specdec_speed.py): a target
# forward over 2-8 tokens costs ~2.5-3x a one-token forward here, so narrow trees win: a chain of 3 from the
# 0.5B, and one gated lookup continuation of up to 8 tokens
DEFAULTS = {"model": dict(scheme="greedy", drafts=1, depth=3), "lookup": dict(scheme="greedy", drafts=1, depth=8)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("speculative decoding (with --model)")
    g.add_argument("--drafter", default=None,
                   help="draft model sharing the target's tokenizer (registry name, folder, hub id), 'lookup' "
                        "(model-free prompt lookup) or 'hybrid:NAME' (lookup, else the model)")
    g.add_argument("--scheme", default=None, choices=["greedy", "with", "without"],
                   help="how n drafts are drawn per tree node when sampling (default greedy)")
    g.add_argument("--drafts", type=int, default=None, help="drafts (children) per expanded tree node")
    g.add_argument("--depth", type=int, default=None, help="draft tree depth")
    g.add_argument("--verifier", default=None,
                   help="lossless verifier (rrs, rrs-without, k-seq, spechub, greedy, lp-optimal); default per scheme")


def build(args: argparse.Namespace, target):
    """The `SpeculativeGenerator` the flags describe (drafter None: plain decoding)."""
    from specdec.drafters import make_drafter
    from specdec.engine import SpeculativeGenerator

    drafter = make_drafter(args.drafter, dtype=args.dtype)
    d = DEFAULTS["lookup" if args.drafter == "lookup" else "model"]
    return SpeculativeGenerator(target, drafter, scheme=args.scheme or d["scheme"],
                                num_drafts=args.drafts or d["drafts"], depth=args.depth if args.depth is not None else d["depth"],
                                verifier=args.verifier)


def run(args: argparse.Namespace) -> int:
    from adafuse.member import load_member

    target = load_member(args.model, dtype=args.dtype)
    gen = build(args, target)
    t0 = time.perf_counter()
    outs = gen.generate(args.prompt, max_new_tokens=args.max_new_tokens, stop=args.stop, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed, chat=False if args.raw else None)
    wall = time.perf_counter() - t0
    total = sum(o.num_tokens for o in outs)
    for out in outs:
        print(out.text)
        st = out.stats
        acc = ", ".join(f"{a:.2f}" for a in st.get("acceptance_by_depth", [])) or "-"
        print(f"-- {out.num_tokens} tokens, {out.finish_reason}, block efficiency {st.get('block_efficiency', 1.0):.2f} "
              f"tokens/target forward, mean accepted {st.get('mean_accepted_length', 0.0):.2f}, acceptance by depth [{acc}]")
    print(f"-- {total} tokens in {wall:.1f}s: {total / max(wall, 1e-9):.2f} tok/s ({gen!r})")
    return 0
