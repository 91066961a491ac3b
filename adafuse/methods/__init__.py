"""Ensemble methods, each a `Method` (`adafuse.methods.base`) with an options dataclass:

- `single`        the lead member alone (speculative when it has a drafter);
- `adafuse`       gated adaptive-span word-level ensembling (`word_level`);
- `word-fixed`    the same machinery with the gate off: every word is ensembled;
- `token-union`   UniTE-style union of the members' top-k token strings (`token_union`);
- `sample-rerank` every member writes answers, every member scores them (`sample_rerank`);
- `self-consistency` one member samples k answers, the vote picks one (`answer_level`);
- `view-vote`     every member (views of one model) answers greedily, the vote picks one (`answer_level`).
"""
from __future__ import annotations

from adafuse.methods.base import METHODS, GenerationRequest, Method, get_method, register_method, run_method
# importing a method module registers its methods, in this order (the order every listing shows)
from adafuse.methods import single, word_level, token_union, sample_rerank, answer_level  # noqa: F401,I001

__all__ = ["METHODS", "GenerationRequest", "Method", "get_method", "register_method", "run_method"]
