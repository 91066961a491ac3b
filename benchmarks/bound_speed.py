"""Time `specdec.optimal_acceptance` (α*) per vocabulary size, n and scheme, beside the primal LP.

The LP (scipy HiGHS over all draft tuples: V^n of them for with/without) is only solvable for tiny
V, so it is timed on V = 8 (n <= 3) and marked "—" elsewhere. Distributions are LLM-like:
Gaussian logits (std 3) with one token boosted by +8 (std 1, no boost for V < 100), target = draft logits + noise.

    python benchmarks/bound_speed.py                      # the full table
    python benchmarks/bound_speed.py --vocab_sizes 1000 --ns 2
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec import SCHEMES, optimal_acceptance
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


def time_ms(fn, repeats: int) -> tuple[float, float]:
    """(median wall ms, last result) over `repeats` calls."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab_sizes", default="8,1000,32000,151936,262144")
    parser.add_argument("--ns", default="2,4,8")
    parser.add_argument("--lp_vocab", type=int, default=8, help="largest V at which the LP is also timed")
    parser.add_argument("--lp_max_n", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
