"""The speculative part of `adafuse generate --model M`: `--drafter NAME|lookup|hybrid:NAME` and the tree
shape. Without --drafter it runs plain decoding through the same engine and prints the same figures.

    adafuse generate --model qwen2.5-coder-1.5b --drafter lookup --prompt "..."
    adafuse generate --model qwen2.5-coder-1.5b --drafter qwen2.5-coder-0.5b --scheme greedy --drafts 2 --depth 3 ...
    adafuse generate --model qwen2.5-coder-0.5b --drafter smollm2-135m --prompt "..."   (another tokenizer)
"""
from __future__ import annotations

import argparse
import time

from specdec.drafts import SCHEMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The speculative flags of `adafuse generate`."""
    g = parser.add_argument_group("speculative decoding (with --model)")
    g.add_argument("--drafter", default=None,
                   help="draft model (registry name, folder, hub id; another tokenizer than the target's drafts "
                        "through text), 'lookup' (model-free prompt lookup), 'hybrid:NAME' (lookup, else the "
                        "model); NAME@fp16 / NAME@int8: the drafter's linear layers and head stored in float16 / int8 "
                        "(CPU; @fp16 drafts what float32 drafts at about half the cost)")
    g.add_argument("--scheme", default=None, choices=list(SCHEMES),
                   help="how n drafts are drawn per tree node when sampling (default greedy)")
    g.add_argument("--drafts", type=int, default=None, help="drafts (children) per expanded tree node")
    g.add_argument("--depth", type=int, default=None, help="draft tree depth")
    g.add_argument("--stop_below", type=float, default=None,
                   help="model drafter: stop a branch where its top probability is below this (default 0.4)")
    g.add_argument("--verifier", default=None,
                   help="lossless verifier (rrs, rrs-without, k-seq, spechub, greedy, lp-optimal); default per scheme")


def build(args: argparse.Namespace, target):
    """The `SpeculativeGenerator` the flags describe (drafter None: plain decoding): the drafter's
    default shape with the flags that were given in place of its fields."""
    from specdec.drafters import default_shape, make_drafter
    from specdec.engine import SpeculativeGenerator

    from runtime.errors import AdafuseError, ConfigError

    try:
        drafter = make_drafter(args.drafter, dtype=args.dtype)
        return SpeculativeGenerator(target, drafter, default_shape(drafter), scheme=args.scheme,
                                    num_drafts=args.drafts or None, depth=args.depth,
                                    stop_below=getattr(args, "stop_below", None), verifier=args.verifier)
    except AdafuseError:
        raise
    except ValueError as exc:
        raise ConfigError(f"speculative options rejected: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Load --model, generate --prompt speculatively, print each text with its speculation figures."""
    from runtime.loader import load as load_member

    target = load_member(args.model, dtype=args.dtype)
    gen = build(args, target)
    t0 = time.perf_counter()
    outs = gen.generate(args.prompt, max_new_tokens=args.max_new_tokens, stop=args.stop, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed, chat=False if args.raw else None)
    wall = time.perf_counter() - t0
    total = sum(o.num_tokens for o in outs)
    for out in outs:
        print(out.text)
        if gen.drafter is None:  # plain decoding: speculation figures would mean nothing
            print(f"-- {out.num_tokens} tokens, {out.finish_reason}")
            continue
        st = out.stats
        acc = ", ".join(f"{a:.2f}" for a in st.get("acceptance_by_depth", [])) or "-"
        print(f"-- {out.num_tokens} tokens, {out.finish_reason}, block efficiency {st.get('block_efficiency', 1.0):.2f} "
              f"tokens/target forward, mean accepted {st.get('mean_accepted_length', 0.0):.2f}, acceptance by depth [{acc}]")
    what = gen if gen.drafter is not None else f"{target.name}, plain decoding"
    print(f"-- {total} tokens in {wall:.1f}s: {total / max(wall, 1e-9):.2f} tok/s ({what!s})")
    return 0
