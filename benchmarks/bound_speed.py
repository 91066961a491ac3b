"""Time `specdec.optimal_acceptance` (α*): the bucketed implementation against the previous full-sort
one (`benchmarks/bound_reference.py`), in one process, taking turns, one thread; or (--table) per vocabulary
size, n and scheme, beside the primal LP.

Compare mode (default) at V = --vocab (262,144, gemma3's vocabulary), n = --ns (8), on:
- "independent": target and draft softmax(3·randn) drawn independently;
- "llm-like": this benchmark's LLM-shaped pair (Gaussian logits, one boosted token, noisy copies);
- "real" (with --real_model): positions of a real model's greedy continuations of GSM8K / NQ / WMT22
  prompts. The target is the model, the draft its own early exit (the hidden state after
  --exit_layer, through the final norm and head: a self-speculative drafter), both from one forward
  of one model; the logits are cached in --real_cache.
Each call of each implementation is timed once per repeat after one warm-up call of each, old and
new alternating on the same input; the table gives medians over repeats (and positions), their
ratio, and the largest |α*_new − α*_old|.

    python benchmarks/bound_speed.py                                  # compare, synthetic pairs
    python benchmarks/bound_speed.py --real_model gemma3-270m         # + real positions
    python benchmarks/bound_speed.py --table --vocab_sizes 1000 --ns 2
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from runtime.dtype_choice import cpu_name
from specdec import SCHEMES, optimal_acceptance
from bound_reference import reference_optimal_acceptance  # beside this script
from specdec.lp import lp_optimal_acceptance


def llm_like_pair(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(target_probs [V], draft_probs [V]) float64 with an LLM-like shape."""
    g = torch.Generator().manual_seed(seed)
    tiny = vocab < 100  # tiny LP-sized vocabularies: flatter, else α* is trivially ~1
    base = torch.randn(vocab, generator=g, dtype=torch.float64) * (1.0 if tiny else 3.0)
    base[int(torch.randint(vocab, (1,), generator=g))] += 0.0 if tiny else 8.0
    target = torch.softmax(base + torch.randn(vocab, generator=g, dtype=torch.float64), 0)
    draft = torch.softmax(base + torch.randn(vocab, generator=g, dtype=torch.float64), 0)
    return target, draft


def independent_pair(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft softmax(3·randn), independent of each other."""
    g = torch.Generator().manual_seed(seed)
    return (torch.softmax(3 * torch.randn(vocab, generator=g, dtype=torch.float64), 0),
            torch.softmax(3 * torch.randn(vocab, generator=g, dtype=torch.float64), 0))


def time_ms(fn, repeats: int) -> tuple[float, float]:
    """(median wall ms, last result) over `repeats` calls."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times), out


# ---- real positions --------------------------------------------------------------------------------
@torch.no_grad()
def real_logits(model: str, num_prompts: int, positions: int, exit_layer: int, data: str | None,
                cache: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(target logits [N, V], early-exit draft logits [N, V]) float16, max-shifted, cached in `cache`."""
    path = cache / f"{model.replace('/', '_')}_p{num_prompts}x{positions}_exit{exit_layer}.pt"
    if path.exists():
        return torch.load(path)
    from runtime.loader import load
    from specdec.bound_cli import data_dir, load_prompts

    member = load(model, dtype="float32", pack_weights=False)
    hf = member.model
    targets, drafts = [], []
    for _, text in load_prompts(data_dir(data), num_prompts):
        ids = torch.tensor([member.encode_prompt(text)])
        seq = hf.generate(ids, max_new_tokens=positions, do_sample=False)
        out = hf(seq, output_hidden_states=True)
        at = slice(ids.shape[1] - 1, seq.shape[1] - 1)  # next-token logits at each continuation position
        early = hf.get_output_embeddings()(hf.model.norm(out.hidden_states[exit_layer][0, at]))
        for logits, dest in ((out.logits[0, at], targets), (early, drafts)):
            logits = logits.float()
            dest.append((logits - logits.max(-1, keepdim=True).values).half())
    pair = torch.cat(targets), torch.cat(drafts)
    cache.mkdir(parents=True, exist_ok=True)
    torch.save(pair, path)
    return pair


def real_pairs(args) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(p, q) float64 at --temperature for every cached real position."""
    t_logits, d_logits = real_logits(args.real_model, args.real_prompts, args.real_positions, args.exit_layer,
                                     args.data_dir, Path(args.real_cache))
    soft = lambda x: torch.softmax(x.double() / args.temperature, -1)  # noqa: E731
    return [(soft(t), soft(d)) for t, d in zip(t_logits, d_logits)]


# ---- compare mode ----------------------------------------------------------------------------------
def compare(pairs: list[tuple[torch.Tensor, torch.Tensor]], n: int, scheme: str, repeats: int) -> dict:
    """Old and new on every pair, taking turns: medians over (pair, repeat), ratio, worst |diff|."""
    old_fn = lambda p, q: reference_optimal_acceptance(p, q, n, scheme)  # noqa: E731
    new_fn = lambda p, q: optimal_acceptance(p, q, n, scheme)  # noqa: E731
    old_fn(*pairs[0]), new_fn(*pairs[0])  # warm-up
    old_ms, new_ms, worst, alphas = [], [], 0.0, []
    for rep in range(repeats):
        for i, (p, q) in enumerate(pairs):
            order = ((old_fn, old_ms), (new_fn, new_ms)) if (rep + i) % 2 == 0 else ((new_fn, new_ms), (old_fn, old_ms))
            got = []
            for fn, sink in order:
                t0 = time.perf_counter()
                got.append(fn(p, q))
                sink.append(1000 * (time.perf_counter() - t0))
            worst = max(worst, abs(got[0] - got[1]))
            alphas.append(got[0])
    old, new = statistics.median(old_ms), statistics.median(new_ms)
    return {"old": old, "new": new, "ratio": old / new, "worst": worst, "alpha": statistics.median(alphas)}


def run_compare(args) -> None:
    sources = {"independent": [independent_pair(args.vocab, args.seed)], "llm-like": [llm_like_pair(args.vocab, args.seed)]}
    if args.real_model:
        sources[f"real {args.real_model} (T={args.temperature:g})"] = real_pairs(args)
    print(f"CPU: {cpu_name()}; torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"old = benchmarks/bound_reference.py, new = specdec.bound; taking turns; medians over {args.repeats} "
          f"repeat(s) (synthetic) and over positions × {args.real_repeats} (real)\n")
    print("| pair | positions | V | n | scheme | median α* | old ms | new ms | old / new | max abs(new − old) |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for name, pairs in sources.items():
        repeats = args.real_repeats if name.startswith("real") else args.repeats
        for n in [int(x) for x in args.ns.split(",")]:
            for scheme in SCHEMES:
                r = compare(pairs, n, scheme, repeats)
                print(f"| {name} | {len(pairs)} | {pairs[0][0].shape[0]:,} | {n} | {scheme} | {r['alpha']:.6f} | "
                      f"{r['old']:.1f} | {r['new']:.1f} | {r['ratio']:.1f}× | {r['worst']:.1e} |", flush=True)


# ---- table mode (the previous benchmark) ----------------------------------------------------------
def run_table(args) -> None:
    vocab_sizes = [int(v) for v in args.vocab_sizes.split(",")]
    ns = [int(n) for n in args.ns.split(",")]
    lp_optimal_acceptance(*llm_like_pair(4, 0), 1, "with")  # warm-up: scipy import and HiGHS start-up
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}\n")
    print("| V | n | scheme | α* | α* ms | LP α* | LP ms | LP / α* time |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for vocab in vocab_sizes:
        p, q = llm_like_pair(vocab, args.seed)
        for n in ns:
            if n > vocab:
                continue
            for scheme in SCHEMES:
                ms, alpha = time_ms(lambda: optimal_acceptance(p, q, n, scheme), args.repeats if vocab < 100_000 else 1)
                lp_cells = "— | — | —"
                if vocab <= args.lp_vocab and n <= args.lp_max_n:
                    lp_ms, lp_alpha = time_ms(lambda: lp_optimal_acceptance(p, q, n, scheme), 1)
                    lp_cells = f"{lp_alpha:.6f} | {lp_ms:.1f} | {lp_ms / ms:.0f}×"
                print(f"| {vocab:,} | {n} | {scheme} | {alpha:.6f} | {ms:.1f} | {lp_cells} |", flush=True)
    print("\nLP: '—' = not solvable in practice (V^n draft tuples × V variables).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="the per-V table beside the LP instead of old vs new")
    parser.add_argument("--vocab", type=int, default=262_144, help="compare mode: vocabulary of the synthetic pairs")
    parser.add_argument("--vocab_sizes", default="8,1000,32000,151936,262144", help="table mode")
    parser.add_argument("--ns", default=None, help="comma-separated n (default: 8 compare, 2,4,8 table)")
    parser.add_argument("--lp_vocab", type=int, default=8, help="largest V at which the LP is also timed")
    parser.add_argument("--lp_max_n", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real_model", default=None, help="compare mode: gemma3-270m (V = 262,144) or smollm2-135m")
    parser.add_argument("--real_prompts", type=int, default=6, help="prompts, split over GSM8K / NQ / WMT22")
    parser.add_argument("--real_positions", type=int, default=8, help="greedy continuation positions per prompt")
    parser.add_argument("--real_repeats", type=int, default=1, help="timings per real position and implementation")
    parser.add_argument("--exit_layer", type=int, default=12, help="the draft: hidden state after this layer")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--data_dir", default=None, help="folder with gsm8k/, nq_open/, wmt22/")
    parser.add_argument("--real_cache", default=str(Path(tempfile.gettempdir()) / "adafuse_bound_speed"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.ns = args.ns or ("2,4,8" if args.table else "8")
    run_table(args) if args.table else run_compare(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
