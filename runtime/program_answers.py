"""Program views' answers: a program view (`runtime.views`, `kind=program`) writes a Python program;
its answer is what the program prints, run in the sandbox (`runtime.sandbox.run_program`).

- `run_output(text)`: the program in an output (`extract_program`: its last fenced block) run in the
  sandbox -> a `ProgramResult` (`.stdout`, `.error`: None when it ran cleanly and printed something);
- `answer_text(text, program)`: the text a task's answer filter reads: the program's stdout for a
  program (its recorded result dict), the output itself otherwise;
- `attach_programs(outputs)`: run every output's program, recording the result on `out.program`;
- `ProgramGenerator(generator)`: a generator (a member, a speculative generator) whose outputs are
  run as programs: what a single run of a program view is.
"""
from __future__ import annotations

from typing import Any, Sequence

from runtime.outputs import GenerationOutput
from runtime.sandbox import ProgramResult, SandboxLimits, extract_program, run_program


def run_output(text: str, limits: SandboxLimits | None = None) -> ProgramResult:
    """The program in a model's output, run in the sandbox (never raises for a bad program)."""
    return run_program(extract_program(text), limits)


def answer_text(text: str, program: dict[str, Any] | None) -> str:
    """What an answer filter reads: a program's printed output (`program`: its recorded result), else `text`."""
    return text if program is None else str(program.get("stdout") or "")


def attach_programs(outputs: Sequence[GenerationOutput], limits: SandboxLimits | None = None
                    ) -> list[GenerationOutput]:
    """Run each output's program; its result (`ProgramResult.to_dict()`) goes on `out.program`."""
    for out in outputs:
        out.program = run_output(out.text, limits).to_dict()
    return list(outputs)


class ProgramGenerator:
    """Wraps a generator (anything with `generate(prompts, **kwargs) -> list[GenerationOutput]`) whose
    outputs are programs: each is run in the sandbox and its result recorded on `out.program`."""

    def __init__(self, inner: Any, limits: SandboxLimits | None = None):
        self.inner, self.limits = inner, limits

    def __getattr__(self, name: str) -> Any:  # name, counters, ... of the wrapped generator
        return getattr(self.inner, name)

    def generate(self, prompts: Sequence[str], **kwargs: Any) -> list[GenerationOutput]:
        return attach_programs(self.inner.generate(prompts, **kwargs), self.limits)
