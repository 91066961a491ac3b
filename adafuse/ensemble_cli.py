"""`adafuse generate --members A,B,C ...`: ensemble generation from the command line.

Only ensemble-specific flags live here; the common ones (--members --prompt --max_new_tokens --stop
--temperature --seed --dtype --raw) come from `adafuse.cli_generate`. Output: the text of each
prompt with ensembled words marked ([brackets], or bold cyan on a terminal), then the cost counters.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from adafuse.methods import METHODS  # the registry: every method the CLI offers
from runtime.errors import ConfigError
from runtime.views import split_members

_KNOBS = ("threshold", "span", "candidates", "normalise", "calibration", "draft_candidates", "fusion", "keep_margin")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("ensemble (with --members)")
    g.add_argument("--method", default=None, choices=list(METHODS), help="ensemble method (default adafuse)")
    g.add_argument("--weights", help="comma-separated member weights, e.g. 1,1,2 (default equal)")
    g.add_argument("--threshold", type=float, help="gate: top-1 minus top-2 margin needed to skip ensembling (0.7)")
    g.add_argument("--span", type=int, help="max words committed without ensembling (3)")
    g.add_argument("--candidates", type=int, help="candidate words proposed per member (3)")
    g.add_argument("--normalise", choices=["token", "byte", "char", "sum"], help="candidate score normalisation (byte)")
    g.add_argument("--calibration", choices=["none", "softmax"], help="cross-member score calibration (softmax)")
    g.add_argument("--fusion", choices=["mean", "confidence", "lead-keeps", "contrastive"],
                   help="how members' votes combine: at an ensembled word mean / confidence / lead-keeps (default "
                        "mean); token-union: mean or contrastive")
    g.add_argument("--keep_margin", type=float, help="lead-keeps: margin the others must beat the lead's word by (0)")
    g.add_argument("--lead", type=int, default=None, help="index of the lead member (gate, confident words, EOS; "
                                                          "default 0)")
    g.add_argument("--drafters", help="comma-separated drafter per member: lookup, a model name, or empty/none")
    g.add_argument("--draft_candidates", choices=["model-free", "all", "off"],
                   help="which members' drafters also draft their candidate words (model-free: prompt lookup only)")
    g.add_argument("--show_trace", action="store_true", help="print every round: gate, candidates, scores")


def _floats(text: str | None, flag: str) -> list[float] | None:
    if not text:
        return None
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"{flag} must be comma-separated numbers, got '{text}'") from None


def parse_drafters(text: str | None, n: int) -> list[str | None] | None:
    if not text:
        return None
    items = [x.strip() for x in text.split(",")]
    if len(items) != n:
        raise ConfigError(f"--drafters needs one entry per member ({n}), got {len(items)}: '{text}'")
    return [None if x in ("", "none", "-") else x for x in items]


# flags of this group, by destination, that mean nothing without --members
ENSEMBLE_FLAGS = ("method", "weights", "threshold", "span", "candidates", "normalise", "calibration", "fusion",
                  "keep_margin", "lead", "drafters", "draft_candidates", "show_trace")


def mark_units(out: Any, use_ansi: bool) -> str:
    """The output text with ensembled units marked; plain text when the method has no trace."""
    trace = getattr(out, "trace", None)
    if not trace or not hasattr(trace[0], "units"):
        return out.text
    parts = []
    for r in trace:
        for u in r.units:
            if r.kind != "ensemble":
                parts.append(u)
            elif use_ansi:
                parts.append(f"\033[1;36m{u}\033[0m")
            else:
                lead = u[: len(u) - len(u.lstrip())]
                parts.append(f"{lead}[{u[len(lead):]}]")
    return "".join(parts)


def format_trace(out: Any) -> str:
    lines = []
    for i, r in enumerate(out.trace or []):
        gates = ", ".join(f"{g['decision']} m={g['margin']:.3f}" for g in r.gate)
        lines.append(f"  round {i}: {r.kind:9s} {r.text!r}  [{gates}] proposer={r.proposer}")
        for c in r.candidates:
            mark = "*" if (c.eos and r.chosen == "<eos>") or (not c.eos and c.text == r.chosen) else " "
            scores = " ".join(f"{k}={v:.3f}" for k, v in c.scores.items())
            label = "<eos>" if c.eos else repr(c.text)
            lines.append(f"    {mark} {label:18s} fused={c.fused:.3f}  {scores}  by {','.join(c.proposed_by)}")
    return "\n".join(lines)


def format_cost(out: Any) -> str:
    cost = out.cost
    per = ", ".join(f"{name}: {cost.forward_passes[name]:.0f} fwd / {cost.tokens_processed[name]:.0f} tok"
                    for name in cost.forward_passes)
    stats = out.stats or {}
    extra = ""
    if stats.get("rounds"):
        extra = (f", rounds {stats['rounds']} ({stats['ensemble_rounds']} ensembled), "
                 f"words {stats['units']}")
    return f"-- {out.finish_reason}, {out.num_tokens} lead tokens, {cost.wall_time_s:.2f} s{extra}\n-- {per}"


def run(args: argparse.Namespace) -> int:
    from adafuse.ensemble import Ensemble

    members = split_members(args.members)
    knobs = {k: getattr(args, k) for k in _KNOBS if getattr(args, k, None) is not None}
    ens = Ensemble(members, method=args.method or "adafuse", weights=_floats(args.weights, "--weights"),
                   drafters=parse_drafters(args.drafters, len(members)), lead=args.lead or 0, dtype=args.dtype,
                   chat=False if args.raw else None, **knobs)
    outs = ens.generate(args.prompt, max_new_tokens=args.max_new_tokens, stop=args.stop,
                        temperature=args.temperature, seed=args.seed)
    ansi = sys.stdout.isatty()
    for out in outs:
        print(mark_units(out, ansi))
        if args.show_trace and out.trace:
            print(format_trace(out))
        print(format_cost(out))
    return 0
