"""`WordFusion`: one batch of word-level fusion, gated and routed step by step; the `adafuse` and
`word-fixed` methods (`AdaFuse`, `WordFixed`) and the module-level `generate` that runs them."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, ClassVar, Sequence

import torch

from adafuse.gate import gate_decision, top2_margin
from adafuse.methods.base import METHODS, GenerationRequest, Method, get_method, register_method, run_method
from adafuse.methods.word_level.batch import Batch
from adafuse.methods.word_level.ensembled_word import EnsembledWord
from adafuse.methods.word_level.lead_decoder import LeadDecoder
from adafuse.methods.word_level.options import WordConfig
from adafuse.methods.word_level.records import Round, round_stats
from runtime.errors import ConfigError
from runtime.member import Member
from runtime.outputs import CostMeter, GenerationOutput, batch_outputs
from runtime.stopping import StopStrings
from runtime.text_state import MemberText


class WordFusion:
    """The state of one batch (`Batch`: shared texts, each member's `MemberText`, traces) and the two
    ways a step advances it: the lead's confident words (`LeadDecoder`) or one ensembled word for the
    uncertain rows (`EnsembledWord`). Drive with `step()` until `done`, or call `run()`."""

    def __init__(self, members: Sequence[Member], prompts: Sequence[str], config: WordConfig, *,
                 weights: Sequence[float], lead: int, chat: bool | None, max_new_tokens: int,
                 stop: Sequence[str] | StopStrings, temperature: float, seed: int | None,
                 speculators: Sequence[Any | None] | None = None):
        self.members = list(members)
        self.config = config
        self.weights = [float(w) for w in weights]
        self.lead = lead
        self.max_new_tokens = max_new_tokens
        self.stop = stop if isinstance(stop, StopStrings) else StopStrings(stop)
        self.temperature = float(temperature)
        self.speculators = list(speculators) if speculators else [None] * len(self.members)
        self.batch = Batch(self.members, prompts, lead=lead, chat=chat, max_new_tokens=max_new_tokens,
                           stop=self.stop, seed=seed)
        self.lead_decoder = LeadDecoder(self.batch, config, self.temperature, self.speculators[lead])
        self.ensembled_word = EnsembledWord(self.batch, self.members, config, weights=self.weights,
                                            temperature=self.temperature, speculators=self.speculators)

    # ---- the batch, as seen from outside ---------------------------------------------------
    @property
    def views(self) -> list[MemberText]:
        """Each member's view of the batch."""
        return self.batch.views

    @property
    def texts(self) -> list[str]:
        """Each row's committed text."""
        return self.batch.texts

    @property
    def traces(self) -> list[list[Round]]:
        """Each row's rounds."""
        return self.batch.traces

    @property
    def finish(self) -> list[str | None]:
        """Why each row finished (None: still running)."""
        return self.batch.finish

    @property
    def done(self) -> bool:
        """Whether every row has finished."""
        return self.batch.done

    def active_rows(self) -> list[int]:
        """The rows still running."""
        return self.batch.active()

    def flush(self, m: int, rows: Sequence[int] | None = None) -> None:
        """Feed member m the committed text it has not seen yet (`Batch.flush`)."""
        self.batch.flush(m, rows)

    def sync_all(self) -> None:
        """Feed every member everything pending."""
        self.batch.sync_all()

    def lead_tokens(self, b: int) -> int:
        """Row b's committed text in lead member tokens."""
        return self.batch.lead_tokens(b)

    # ---- one step --------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        """Advance every unfinished row: the confident rows by one or more words of the lead (the
        others wait), or, when no row is confident, every row by one ensembled word."""
        rows = self.active_rows()
        if not rows:
            return
        margins = top2_margin(self.batch.lead_view.state.next_probs(1.0)).tolist()
        decisions = {b: self._gate(b, margins[b]) for b in rows}
        confident = [b for b in rows if decisions[b] == "confident"]
        ensemble = [b for b in rows if decisions[b] != "confident"]
        if confident:
            # rows at an ensembled word wait (their state does not change, so their gate reads the same
            # next step) until no row is confident: ensembled words of all rows then share one set of
            # member forwards instead of one set per step. Within `span` steps every row gets there.
            self.lead_decoder.advance(confident, {b: margins[b] for b in confident}, waiting=ensemble)
            return
        self.ensembled_word.run(ensemble, {b: (margins[b], decisions[b]) for b in ensemble},
                                self.lead_decoder.take_branches())

    def _gate(self, b: int, margin: float) -> str:
        """Row b's decision at its word start: "off" (gate off), "uncertain" (margin below the
        threshold), "forced" (`span` confident words since the last ensembled word) or "confident"."""
        cfg = self.config
        return gate_decision(margin, self.batch.streak[b], cfg.threshold, cfg.span, cfg.gate)

    # ---- whole run -------------------------------------------------------------------------
    def run(self, on_step: Callable[["WordFusion"], None] | None = None) -> list[GenerationOutput]:
        """Step until every row is done (`on_step(self)` after each step). Returns one output per
        row; the batch's cost (members, then the models their drafters run, each once) split evenly."""
        meter = CostMeter([*self.members, *(getattr(s, "drafter_member", None) for s in self.speculators)])
        while not self.done:
            self.step()
            if on_step is not None:
                on_step(self)
        rows = range(len(self.texts))
        return batch_outputs(meter.cost(), self.texts, [self.lead_tokens(b) for b in rows], self.finish,
                             traces=self.traces, stats=[round_stats(self.traces[b], self.texts[b]) for b in rows])


class _WordLevel(Method):
    """The word-level methods: options `WordConfig`, run by `WordFusion`."""

    Options: ClassVar[type] = WordConfig

    def config(self, options: WordConfig) -> WordConfig:
        """The options this method runs with."""
        return options

    def generate(self, members: Sequence[Member], request: GenerationRequest, options: WordConfig, *,
                 weights: Sequence[float], lead: int, speculators: Sequence[Any | None] | None = None
                 ) -> list[GenerationOutput]:
        """One output per prompt of `request` (rows processed together, finishing independently);
        `speculators`: None, or per member a `specdec.SpeculativeGenerator` or None. Word-level
        methods sample with a temperature only: top-k / top-p raise a `ConfigError`."""
        sampling = request.sampling
        if sampling.top_k or sampling.top_p != 1.0:
            raise ConfigError(f"method '{self.name}' samples with temperature only: top_k={sampling.top_k}, "
                              f"top_p={sampling.top_p} are not supported")
        fusion = WordFusion(members, request.prompts, self.config(options), weights=weights, lead=lead,
                            chat=request.chat, max_new_tokens=request.max_new_tokens, stop=request.stop,
                            temperature=request.temperature, seed=request.seed, speculators=speculators)
        return fusion.run()


@register_method
class AdaFuse(_WordLevel):
    """`adafuse`: gated, adaptive span (the lead alone where it is confident)."""

    name: ClassVar[str] = "adafuse"


@register_method
class WordFixed(_WordLevel):
    """`word-fixed`: the gate off, every word is ensembled (`gate=False` whatever the options say)."""

    name: ClassVar[str] = "word-fixed"

    def parse_options(self, options: dict[str, Any]) -> WordConfig:
        """The options with `gate=False`, validated."""
        return super().parse_options({**options, "gate": False})

    def config(self, options: WordConfig) -> WordConfig:
        """`options` with the gate off."""
        return replace(options, gate=False)


def generate(members: Sequence[Member], prompts: Sequence[str], *, method: str = "adafuse",
             **kwargs: Any) -> list[GenerationOutput]:
    """`run_method(AdaFuse() or WordFixed(), ...)`: validated keyword call (max_new_tokens, stop,
    temperature, seed, weights, lead, chat, speculators, and the `WordConfig` knobs)."""
    word_level = [name for name, cls in METHODS.items() if issubclass(cls, _WordLevel)]
    if method not in word_level:
        raise ConfigError(f"unknown word-level method '{method}'; use one of: {', '.join(word_level)}")
    return run_method(get_method(method), members, prompts, **kwargs)
