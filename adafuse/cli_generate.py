"""`adafuse generate`: one model (optionally speculative, see `specdec.generate_cli`) or an ensemble
(`--members`, see `adafuse.ensemble_cli`)."""
from __future__ import annotations

import argparse
import importlib

from runtime.errors import AdafuseError

_PARTS = ("specdec.generate_cli", "adafuse.ensemble_cli")


def _optional(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for a batch)")
    parser.add_argument("--model", help="one model: registry name, local folder or hub id")
    parser.add_argument("--members", help="comma-separated ensemble members (registry names, folders, hub ids)")
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top_k", type=int, default=0)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--raw", action="store_true", help="do not wrap prompts in the chat template")
    for module in _PARTS:
        part = _optional(module)
        if part is not None:
            part.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if bool(args.model) == bool(args.members):
        raise AdafuseError("give exactly one of --model NAME or --members A,B,C")
    if args.members:
        part = _optional("adafuse.ensemble_cli")
        if part is None:
            raise AdafuseError("ensemble generation is not available in this build")
        return part.run(args)
    part = _optional("specdec.generate_cli")
    if part is not None:
        return part.run(args)
    from runtime.member import load_member

    member = load_member(args.model, dtype=args.dtype)
    outs = member.generate(args.prompt, max_new_tokens=args.max_new_tokens, stop=args.stop,
                           temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                           chat=False if args.raw else None)
    for out in outs:
        print(out.text)
        wall = out.cost.wall_time_s
        print(f"-- {out.num_tokens} tokens, {out.finish_reason}, {out.num_tokens / max(wall, 1e-9):.2f} tok/s")
    return 0
