"""A batch that would not fit in free memory is cut into parts that do (`runtime.batch_memory`).

`batch_parts(generator, prompts, max_new_tokens)` returns consecutive index ranges covering the
prompts: one range when the whole batch fits (or the generator's models are unknown, e.g. a test
fake), several when it would not. The estimate sums every model that keeps a cache for the batch:
each member and each drafter model (a drafting member keeps a cache of its own as a drafter).
`generate_in_parts` runs them and, should an allocation fail anyway, halves the part and retries.
Outputs are the same: rows are independent and row i keeps its seed (`seed + i` of its part's first
row, i.e. seed + its id, as in one call)."""
from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

from runtime.batch_memory import GIB, batch_bytes, fitting_batches, is_out_of_memory, memory_budget
from runtime.member import Member
from specdec.drafter_base import drafter_member


def members_of(generator: Any) -> list[Member]:
    """The models that keep a KV cache while `generator` decodes a batch ([] when unknown)."""
    if isinstance(generator, Member):
        return [generator]
    found: list[Member] = []
    if isinstance(getattr(generator, "target", None), Member):  # a SpeculativeGenerator
        found.append(generator.target)
        member = drafter_member(getattr(generator, "drafter", None))
        found += [member] if member is not None else []
    for m in getattr(generator, "members", None) or []:  # an Ensemble
        if isinstance(m, Member):
            found.append(m)
    for spec in getattr(generator, "speculators", None) or []:
        member = drafter_member(getattr(spec, "drafter", None)) if spec is not None else None
        found += [member] if member is not None else []
    return found


def batch_parts(generator: Any, prompts: Sequence[str], max_new_tokens: int, budget: int | None = None) -> list[range]:
    """Consecutive ranges of `prompts` that each fit in `budget` bytes (default: `memory_budget()`)."""
    members = members_of(generator)
    if not members or len(prompts) <= 1:
        return [range(len(prompts))]
    lengths = [[len(m.encode_prompt(p)) for p in prompts] for m in members]

    def cost(rows: Sequence[int]) -> int:
        return sum(batch_bytes(m, [lens[i] for i in rows], max_new_tokens) for m, lens in zip(members, lengths))

    return fitting_batches(cost, len(prompts), memory_budget() if budget is None else budget)


def generate_in_parts(prompts: list[str], seed: int, generate: Callable[[list[str], int], list],
                      parts: list[range] | None = None, notice: Callable[[str], None] | None = None) -> list:
    """`generate(prompts[part], seed + part.start)` over `parts` (default: one), outputs concatenated;
    a part whose allocation fails is halved and retried (a single row's failure is raised)."""
    say = notice or (lambda text: print(text, file=sys.stderr))
    todo = list(parts or [range(len(prompts))])
    if len(todo) > 1:
        say(f"note: a batch of {len(prompts)} prompts would not fit in free memory; decoding it in "
            f"{len(todo)} parts ({', '.join(str(len(p)) for p in todo)} rows)")
    out: list = []
    while todo:
        part = todo.pop(0)
        try:
            out.extend(generate([prompts[i] for i in part], seed + part.start))
        except (MemoryError, RuntimeError) as exc:
            if not is_out_of_memory(exc) or len(part) == 1:
                raise
            half = part.start + len(part) // 2
            say(f"note: out of memory decoding {len(part)} rows together ({str(exc)[:80]}); retrying as "
                f"{half - part.start} + {part.stop - half}")
            todo[:0] = [range(part.start, half), range(half, part.stop)]
    return out


__all__ = ["members_of", "batch_parts", "generate_in_parts", "GIB"]
