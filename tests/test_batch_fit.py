"""A batch that would not fit in memory is decoded in parts (`runtime.batch_memory`, `eval.batch_fit`):
the estimate, the cut, the same outputs (greedy and seeded sampling), the retry after a failed
allocation, and the one-line error for a row that cannot fit alone."""
import pytest

from eval.batch_fit import batch_parts, generate_in_parts, members_of
from runtime.batch_memory import GIB, batch_bytes, fitting_batches, is_out_of_memory, kv_bytes_per_token, memory_budget
from runtime.errors import InsufficientMemoryError
from runtime.testing import char_tokenizer, tiny_member

PROMPTS = [f"Question {i}: what is {i} + {i}?" + " and then" * (i % 3) for i in range(7)]


@pytest.fixture(scope="module")
def member():
    return tiny_member("llama", char_tokenizer(), seed=0, name="tiny")


def test_kv_bytes_and_batch_estimate(member):
    cfg = member.model.config
    kv_heads = cfg.num_key_value_heads or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert kv_bytes_per_token(member) == cfg.num_hidden_layers * 2 * kv_heads * head_dim * 4
    one, two = batch_bytes(member, [10], 5), batch_bytes(member, [10, 10], 5)
    assert 0 < one < two <= 2 * one
    assert batch_bytes(member, [10, 3], 5) == two          # rows are padded to the longest
    assert batch_bytes(member, [10], 50) > one and batch_bytes(member, [], 5) == 0


def test_fitting_batches_cuts_consecutive_parts():
    cost = [3, 3, 3, 9, 1, 1]
    parts = fitting_batches(lambda rows: sum(cost[i] for i in rows), len(cost), budget=9)
    assert parts == [range(0, 3), range(3, 4), range(4, 6)]
    assert fitting_batches(lambda rows: len(rows), 5, budget=100) == [range(0, 5)]
    with pytest.raises(InsufficientMemoryError) as exc:
        fitting_batches(lambda rows: sum(cost[i] for i in rows), len(cost), budget=8)
    assert "prompt #3 alone needs" in str(exc.value) and "\n" not in str(exc.value)


def test_memory_budget_env(monkeypatch):
    monkeypatch.setenv("ADAFUSE_MEMORY_BUDGET_GIB", "0.5")
    assert memory_budget() == GIB // 2
    monkeypatch.delenv("ADAFUSE_MEMORY_BUDGET_GIB")
    assert memory_budget(available=10 * GIB) == 8 * GIB


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_parts_give_the_outputs_of_one_call(member, temperature):
    gen = dict(max_new_tokens=6, stop=["\n"], temperature=temperature)
    whole = member.generate(PROMPTS, seed=11, **gen)
    per_row = batch_bytes(member, [len(member.encode_prompt(p)) for p in PROMPTS[:1]], 6)
    parts = batch_parts(member, PROMPTS, 6, budget=int(2.5 * per_row))
    assert len(parts) >= 3 and [i for p in parts for i in p] == list(range(len(PROMPTS)))
    notes = []
    split = generate_in_parts(PROMPTS, 11, lambda ps, s: member.generate(ps, seed=s, **gen), parts=parts,
                              notice=notes.append)
    assert [o.text for o in split] == [o.text for o in whole]
    assert len(notes) == 1 and f"{len(parts)} parts" in notes[0]
    assert batch_parts(member, PROMPTS, 6, budget=10 * GIB) == [range(len(PROMPTS))]


def test_a_failed_allocation_halves_the_part_and_retries():
    calls = []

    def generate(prompts, seed):
        calls.append((len(prompts), seed))
        if len(prompts) > 2:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 123456 bytes")
        return [f"{p}@{seed + i}" for i, p in enumerate(prompts)]

    prompts = [str(i) for i in range(7)]
    notes = []
    out = generate_in_parts(prompts, 100, generate, notice=notes.append)
    assert out == [f"{i}@{100 + i}" for i in range(7)]          # order and per-row seeds kept
    assert calls == [(7, 100), (3, 100), (1, 100), (2, 101), (4, 103), (2, 103), (2, 105)]
    assert any("out of memory" in n for n in notes)
    with pytest.raises(RuntimeError, match="shape mismatch"):   # other errors are not retried
        generate_in_parts(prompts, 0, lambda ps, s: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(MemoryError):                            # a single row that fails is raised
        generate_in_parts(["x"], 0, lambda ps, s: (_ for _ in ()).throw(MemoryError()))
    assert is_out_of_memory(MemoryError()) and not is_out_of_memory(RuntimeError("boom"))


def test_members_of_counts_every_cache(member):
    from adafuse.ensemble import Ensemble
    from specdec.drafters import ModelDrafter
    from specdec.engine import SpeculativeGenerator

    other = tiny_member("llama", char_tokenizer(), seed=1, name="other")
    assert members_of(member) == [member] and members_of(object()) == []
    spec = SpeculativeGenerator(member, ModelDrafter(other))
    assert members_of(spec) == [member, other]
    ens = Ensemble([member, other], drafters=["lookup", None], member_drafting=1)
    assert members_of(ens) == [member, other, other]              # the drafting member keeps two caches
