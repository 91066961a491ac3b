"""`single`: the lead member alone, through its speculative generator when it has one (the
baseline every ensemble is compared with, in the same API). A program view's outputs are run in the
sandbox (`runtime.program_answers`): each output's `program` holds what its program printed."""
from __future__ import annotations

from typing import Any, Sequence

from adafuse.methods.base import GenerationRequest, Method, NoOptions, register_method
from runtime.member import Member
from runtime.outputs import GenerationOutput
from runtime.program_answers import attach_programs
from runtime.views import is_program


@register_method
class Single(Method):
    name = "single"
    Options = NoOptions
    min_members = 1

    def generate(self, members: Sequence[Member], request: GenerationRequest, options: NoOptions, *,
                 weights: Sequence[float], lead: int, speculators: Sequence[Any | None]) -> list[GenerationOutput]:
        s = request.sampling
        runner = speculators[lead] if speculators and speculators[lead] is not None else members[lead]
        outs = runner.generate(request.prompts, max_new_tokens=request.max_new_tokens, stop=request.stop.stops,
                               temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed,
                               chat=request.chat)
        return attach_programs(outs) if is_program(members[lead]) else outs
