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

from adafuse.methods.answer_level import SelfConsistency, ViewVote
from adafuse.methods.base import GenerationRequest, Method, run_method
from adafuse.methods.sample_rerank import SampleRerank
from adafuse.methods.single import Single
from adafuse.methods.token_union import TokenUnion
from adafuse.methods.word_level import AdaFuse, WordFixed
from runtime.errors import ConfigError

METHODS: dict[str, type[Method]] = {m.name: m for m in (Single, AdaFuse, WordFixed, TokenUnion, SampleRerank,
                                                         SelfConsistency, ViewVote)}


def get_method(name: str) -> Method:
    """The method registered as `name`; an unknown name raises a one-line `ConfigError`."""
    if name not in METHODS:
        raise ConfigError(f"unknown method '{name}'; use one of: {', '.join(METHODS)}")
    return METHODS[name]()


__all__ = ["METHODS", "GenerationRequest", "Method", "get_method", "run_method"]
