"""Multi-draft speculative decoding: draft schemes, lossless verifiers, the optimal acceptance bound,
and the engine that runs them on a `runtime.member.Member` (`SpeculativeGenerator`)."""
from specdec.acceptance import Acceptance, expected_acceptance
from specdec.bound import optimal_acceptance
from specdec.config import DEFAULT_SHAPE, DEFAULT_STOP_BELOW, DecodeControl, DraftLimit, TreeShape
from specdec.drafts import SCHEMES, sample_drafts
from specdec.results import DecodeResult, RowResult, RowStats
from specdec.verifiers import METHODS, VerifyResult, output_law, residual, verify
from specdec.drafters import (HybridDrafter, ModelDrafter, PromptLookupDrafter, TextDrafter, default_shape,
                              make_drafter, parse_drafter_spec)
from specdec.engine import SpeculativeGenerator

__all__ = ["Acceptance", "expected_acceptance", "optimal_acceptance", "DEFAULT_SHAPE", "DEFAULT_STOP_BELOW",
           "DecodeControl", "DraftLimit", "TreeShape", "SCHEMES", "sample_drafts", "DecodeResult", "RowResult",
           "RowStats", "METHODS", "VerifyResult", "output_law", "residual", "verify", "HybridDrafter", "ModelDrafter",
           "PromptLookupDrafter", "TextDrafter", "default_shape", "make_drafter", "parse_drafter_spec",
           "SpeculativeGenerator"]
