"""The options of the word-level methods (`adafuse`, `word-fixed`): `WordConfig`."""
from __future__ import annotations

from dataclasses import dataclass

from adafuse.scoring import CALIBRATIONS, NORMALISATIONS
from runtime.errors import ConfigError

DRAFT_CANDIDATES = ("model-free", "all", "off")
FUSIONS = ("mean", "confidence", "lead-keeps")


@dataclass
class WordConfig:
    """Knobs of the word-level methods (paper values as defaults, except two measured choices).

    Defaults `normalise="byte"`, `calibration="softmax"` were picked with
    `benchmarks/adafuse_cost.py --normalisation` (smollm2-135m + gemma3-270m + qwen2.5-coder-0.5b,
    teacher-forced on GSM8K gold chains of thought, 4 questions x first 5 words = 20 positions):
    the gold word was picked at 0.50 (byte/softmax) vs 0.40 (token/none, the paper's setting),
    0.45 (token/softmax) and 0.40 (byte/none); at the 13 uncertain positions 0.38 vs 0.31. A small
    sample (differences of 1-2 positions); re-measure with more questions when time allows.

    `draft_candidates`: which members complete their candidate words through their `specdec`
    drafter (same words either way): "all", "off", or "model-free" (default: prompt lookup, which
    costs no forward; `docs/results/adafuse_cost/gsm8k_20_fp32_drafted_candidates.md`: fewer
    forwards, same time). A model drafter's forwards cost more than the member forwards they save
    on candidate words of one or two tokens (0.5B drafting for a 1.5B member, bfloat16:
    `gsm8k_6_lead15_drafted_candidates.md`).

    `fusion` (the rule that turns the members' scores into the fused score, with `calibration`):
    - "mean": the weighted mean over members (the paper's rule, with the member weights);
    - "confidence": each member's weight is scaled by its own margin p1 - p2 at this word start, so a
      member that is unsure here counts for less (rows where every margin is 0 use the weights);
    - "lead-keeps": the mean, but the lead's own word (its greedy candidate, or its EOS) gets a bonus
      of `keep_margin`: it stands unless another candidate's fused score beats it by more than that
      (in fused-score units: log mixture probability with `calibration="softmax"`)."""

    threshold: float = 0.7       # gate: confident iff p1 - p2 >= threshold
    span: int = 3                # max words committed without ensembling
    candidates: int = 3          # B: candidate words proposed per member
    normalise: str = "byte"      # "token" (paper) | "byte" | "char" | "sum"; byte: see below
    calibration: str = "softmax"  # "none" (paper: mean of scores) | "softmax" (see adafuse.scoring.fuse_scores)
    max_word_tokens: int = 8     # a word longer than this (tokens) is cut there
    gate: bool = True            # False = word-fixed: ensemble every word
    flush_guesses: int = 16      # guesses fed with a non-lead's flush, split over its rows (0: off)
    draft_candidates: str = "model-free"  # which members' drafters draft their candidate words: see below
    fusion: str = "mean"         # how members' votes combine at an ensembled word: see below
    keep_margin: float = 0.0     # lead-keeps: how much the others' fused score must beat the lead's word by

    def validate(self) -> None:
        """Raise a one-line `ConfigError` naming the first invalid option."""
        def bad(name: str, want: str) -> ConfigError:
            """The one-line error for option `name`."""
            return ConfigError(f"option {name}={getattr(self, name)!r} is invalid: {want}")

        if not isinstance(self.threshold, (int, float)) or not 0.0 <= float(self.threshold) <= 1.0:
            raise bad("threshold", "a margin in [0, 1]")
        for name, low in (("span", 0), ("candidates", 1), ("max_word_tokens", 1), ("flush_guesses", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(name, f"an integer >= {low}")
        if self.normalise not in NORMALISATIONS:
            raise bad("normalise", f"one of {', '.join(NORMALISATIONS)}")
        if self.calibration not in CALIBRATIONS:
            raise bad("calibration", f"one of {', '.join(CALIBRATIONS)}")
        if not isinstance(self.gate, bool):
            raise bad("gate", "True or False")
        if self.draft_candidates not in DRAFT_CANDIDATES:
            raise bad("draft_candidates", f"one of {', '.join(DRAFT_CANDIDATES)}")
        if self.fusion not in FUSIONS:
            raise bad("fusion", f"one of {', '.join(FUSIONS)}")
        if isinstance(self.keep_margin, bool) or not isinstance(self.keep_margin, (int, float)) \
                or not 0.0 <= float(self.keep_margin) < float("inf"):
            raise bad("keep_margin", "a finite number >= 0")
