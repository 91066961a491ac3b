"""`adafuse generate`: one model (optionally speculative, see `specdec.generate_cli`) or an ensemble
(`--members`, see `adafuse.ensemble_cli`)."""
from __future__ import annotations

import argparse

from adafuse import ensemble_cli
from runtime.errors import AdafuseError
from specdec import generate_cli


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
    parser.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16", "float16"],
                        help="auto: the fast one on this CPU, measured (adafuse models dtype)")
    parser.add_argument("--raw", action="store_true", help="do not wrap prompts in the chat template")
    generate_cli.add_arguments(parser)
    ensemble_cli.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if bool(args.model) == bool(args.members):
        raise AdafuseError("give exactly one of --model NAME or --members A,B,C")
    if args.members:
        return ensemble_cli.run(args)
    return generate_cli.run(args)
