"""The `adafuse` console script, on the top floor: it dispatches to each floor's verb module
(`runtime.cli_models`, `adafuse.cli_generate`, `specdec.bound_cli`, `eval.cli_eval`,
`eval.report`), each exposing `add_arguments(parser)` and `run(args) -> int`.

Only the chosen verb's module is imported, so `adafuse --help` and `adafuse --version` stay
instant. Options are spelled with underscores (`--max_new_tokens`, like lm-eval's `--output_path`);
the dashed spelling (`--max-new-tokens`) is accepted too. Errors of our own, usage mistakes and a
full disk are one line, exit 2.
"""
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
    "eval": ("eval.cli_eval", "run an evaluation config (tasks x methods) and write predictions/metrics"),
    "tune": ("eval.tune_cli", "choose members, weights and method settings per task on dev rows; write a tuned config"),
    "report": ("eval.report", "compare evaluation runs: markdown table and score-vs-cost plot"),
    "rlid": ("rlid.cli", "decision-plane models: train (RL), distill, evaluate and report (experiments/rlid/rlid_*.yaml)"),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("adafuse")
    except PackageNotFoundError:
        return "unknown (not installed)"


def add_dashed_aliases(parser: argparse.ArgumentParser) -> None:
    """Accept `--max-new-tokens` wherever `--max_new_tokens` is defined (help shows the latter)."""
    for action in list(parser._actions):
        for opt in list(action.option_strings):
            dashed = opt[:2] + opt[2:].replace("_", "-")
            if opt.startswith("--") and "_" in opt and dashed not in parser._option_string_actions:
                parser._option_string_actions[dashed] = action


class OneLineParser(argparse.ArgumentParser):
    """argparse with our error style: a usage mistake is one line naming it and pointing at --help
    (exit 2), not the usage block plus the message. Subparsers inherit the class."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {self.prog}: {message} (see: {self.prog} --help)\n")


def build_parser(verb: str | None) -> tuple[argparse.ArgumentParser, dict[str, object], dict[str, argparse.ArgumentParser]]:
    """The parser with every verb listed and the arguments of `verb` (the one being run) added."""
    parser = OneLineParser(prog="adafuse", description="Ensemble decoding with speculative acceleration.")
    parser.add_argument("--version", action="version", version=f"adafuse {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    modules: dict[str, object] = {}
    subparsers: dict[str, argparse.ArgumentParser] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sp = subparsers[name] = sub.add_parser(name, help=help_text, description=help_text)
        if name == verb:
            module = importlib.import_module(module_name)
            module.add_arguments(sp)
            if name in LOADS_MODELS and "--threads" not in sp._option_string_actions:
                sp.add_argument("--threads", type=int, default=None, metavar="N",
                                help="CPU threads for model work (default: torch's, one per core); use 1 per process "
                                     "when several processes share the cores")
            add_dashed_aliases(sp)
            modules[name] = module
    return parser, modules, subparsers


LOADS_MODELS = ("generate", "bound", "eval", "tune", "rlid")


def _quiet_transformers(verb: str) -> None:
    """Our progress bars and errors are the CLI's output: transformers' weight-loading bars are not
    (verbs that load models import transformers anyway)."""
    if verb in LOADS_MODELS:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _set_threads(threads: int | None) -> None:
    """`--threads N`: torch's intra-op threads (one-line error for N < 1)."""
    if threads is None:
        return
    if threads < 1:
        raise AdafuseError(f"--threads {threads} is invalid: a number of threads >= 1")
    import torch

    torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = next((a for a in argv if not a.startswith("-")), None)
    parser, modules, subparsers = build_parser(verb if verb in SUBCOMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra:  # the verb's usage, not the top level's
        subparsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    _quiet_transformers(args.command)
    try:
        _set_threads(getattr(args, "threads", None))
        return int(modules[args.command].run(args) or 0)
    except AdafuseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        from runtime.files import disk_full, is_disk_full

        if not is_disk_full(exc):
            raise
        print(f"error: {disk_full(exc.filename or 'a file', exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
