"""The `adafuse` console script. Each subcommand lives in its own module exposing
`add_arguments(parser)` and `run(args) -> int`; this file only dispatches."""
from __future__ import annotations

import argparse
import importlib
import sys

from runtime.errors import AdafuseError

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "models": ("runtime.cli_models", "list, fetch and locate the offline models"),
    "generate": ("adafuse.cli_generate", "generate text with one model (optionally speculative) or an ensemble"),
    "bound": ("specdec.bound_cli", "measure verifiers against the optimal acceptance rate on real distributions"),
    "eval": ("eval.cli", "run an evaluation config (tasks x methods) and write predictions/metrics"),
    "report": ("eval.report", "compare evaluation runs: markdown table and score-vs-cost plot"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="adafuse", description="Ensemble decoding with speculative acceleration.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a subcommand whose module is not built yet
            if exc.name != module_name:
                raise
            continue
        sp = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sp)
        modules[name] = module
    args = parser.parse_args(argv)
    try:
        return int(modules[args.command].run(args) or 0)
    except AdafuseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
