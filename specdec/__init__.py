"""Multi-draft speculative decoding: draft schemes, lossless verifiers, the optimal acceptance bound."""
from specdec.acceptance import Acceptance, expected_acceptance
from specdec.bound import optimal_acceptance
from specdec.drafts import SCHEMES, sample_drafts
from specdec.verifiers import METHODS, VerifyResult, output_law, residual, verify
from specdec.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter  # noqa: E402
from specdec.engine import SpeculativeGenerator  # noqa: E402
