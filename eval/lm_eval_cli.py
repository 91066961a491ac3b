"""`python -m eval.lm_eval_cli ARGS` (also `adafuse-lm-eval ARGS`): lm-evaluation-harness's own CLI
with `--model adafuse` registered and our tasks (`eval/lm_eval_tasks/`: `adafuse_gsm8k`,
`adafuse_nq_open`) on its task path. ARGS are lm-eval's, e.g.

    python -m eval.lm_eval_cli --model adafuse --model_args members=smollm2-135m \\
        --tasks adafuse_gsm8k,adafuse_nq_open --limit 5 --apply_chat_template --fewshot_as_multiturn

lm-eval finds models only in its registry (no entry points), hence this entry: it imports
`eval.lm_eval_model` (which registers the name) and does what `lm_eval.__main__.cli_evaluate`
does, checking `--model adafuse`'s arguments and model names before lm-eval indexes its tasks. Our
errors are one line, exit code 2; without lm-eval installed, so is the hint to install it.
"""
from __future__ import annotations

import sys
from pathlib import Path

TASK_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"
INSTALL_HINT = "lm-eval is not installed: pip install 'adafuse[lm-eval]' (or pip install lm-eval)"


def with_task_path(argv: list[str]) -> list[str]:
    """`argv` with TASK_DIR on lm-eval's task path: `--include_path TASK_DIR` added, or appended
    to a given `--include_path` (lm-eval splits it at ':'). Help and a bare call are left as they are."""
    out = list(argv)
    if not out or any(a in ("-h", "--help") for a in out):
        return out
    for i, arg in enumerate(out):
        if arg.startswith("--include_path="):
            out[i] = f"{arg}:{TASK_DIR}"
            return out
        if arg == "--include_path" and i + 1 < len(out):
            out[i + 1] = f"{out[i + 1]}:{TASK_DIR}"
            return out
    return [*out, "--include_path", str(TASK_DIR)]


def check_model_args(model_args: dict) -> None:
    """`--model adafuse`'s arguments and model names, checked before lm-eval indexes its tasks
    (a typo in a member's name is then a one-line error at once, not after a minute)."""
    from eval.cli_eval import check_model_names
    from eval.config import RunSpec
    from eval.lm_eval_model import LMArgs

    spec = LMArgs.parse(**model_args)
    check_model_names([RunSpec("adafuse", spec.method, spec.members, spec.generator_options(None))], "--model_args")


def main(argv: list[str] | None = None) -> int:
    """lm-eval's `cli_evaluate` (logging, `HarnessCLI` parse and execute) with our model and tasks."""
    from runtime.errors import AdafuseError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        import eval.lm_eval_model  # noqa: F401  (registers --model adafuse)
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "lm_eval":
            raise
        print(f"error: {INSTALL_HINT}", file=sys.stderr)
        return 2
    sys.argv = ["lm-eval", *with_task_path(argv)]
    try:
        setup_logging()
        parser = HarnessCLI()
        args = parser.parse_args()
        if getattr(args, "model", None) == "adafuse":
            check_model_args(dict(getattr(args, "model_args", None) or {}))
        parser.execute(args)
    except AdafuseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
