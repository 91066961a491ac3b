"""`adafuse generate`: one model (optionally speculative, see `specdec.generate_cli`) or an ensemble
(`--members`, see `adafuse.ensemble_cli`)."""
from __future__ import annotations

import argparse

from adafuse import ensemble_cli
from runtime.errors import AdafuseError, ConfigError
from runtime.views import split_members
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


def check_args(args: argparse.Namespace) -> None:
    """The flags' values, checked before any model loads (one-line ConfigErrors): the prompts, the
    sampling settings, every member and drafter name."""
    from runtime.loader import check_spec
    from runtime.sampling import SamplingParams
    from specdec.drafters import parse_drafter_spec

    for i, prompt in enumerate(args.prompt):
        if not prompt.strip():
            raise ConfigError(f"--prompt #{i + 1} is empty; give the text to continue")
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}")
    try:
        SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    except ValueError as exc:
        raise ConfigError(f"--{exc}".replace("=", " ", 1)) from None
    if args.model:
        members, drafters = [args.model], [getattr(args, "drafter", None)]
    else:
        members = split_members(args.members)
        drafters = ensemble_cli.parse_drafters(args.drafters, len(members)) or [None] * len(members)
    for member, drafter in zip(members, drafters):
        check_spec(member)  # a typo in the last member fails before the first one loads
        _, model = parse_drafter_spec(drafter)
        if model:
            check_spec(model)  # another tokenizer is fine: it drafts through text (TextDrafter)


SPECULATIVE_FLAGS = ("drafter", "scheme", "drafts", "depth", "stop_below", "verifier")


def _given(args: argparse.Namespace, dests: tuple[str, ...]) -> list[str]:
    """The flags among `dests` that were given (their value is not the unset default)."""
    return ["--" + d for d in dests if getattr(args, d, None) not in (None, False)]


def check_flags(args: argparse.Namespace) -> None:
    """Every flag given must apply: the speculative flags to --model (members take --drafters), the
    ensemble flags to --members. A flag that would be ignored is a one-line ConfigError."""
    if args.members:
        stray = _given(args, SPECULATIVE_FLAGS)
        if stray:
            raise ConfigError(f"{', '.join(stray)} {'applies' if len(stray) == 1 else 'apply'} to one --model; an "
                              f"ensemble's members take --drafters "
                              f"(one per member, e.g. --drafters lookup,,lookup)")
    else:
        stray = _given(args, ensemble_cli.ENSEMBLE_FLAGS)
        if stray:
            raise ConfigError(f"{', '.join(stray)} {'applies' if len(stray) == 1 else 'apply'} to an ensemble "
                              f"(--members A,B,...), not to one --model")


def run(args: argparse.Namespace) -> int:
    if bool(args.model) == bool(args.members):
        raise AdafuseError("give exactly one of --model NAME or --members A,B,C")
    check_flags(args)
    check_args(args)
    if args.members:
        return ensemble_cli.run(args)
    return generate_cli.run(args)
