"""What a trained LoRA adapter costs at evaluation: decisions/s of the decision model with the adapter
unmerged (plain Linear layers + LoRA matmuls, how it trains) vs merged into packed weights
(`LoraAdapter.merge_for_inference`, what `adafuse rlid eval` now does), and the base model alone.

Three copies of the model in one process (the adapter is random: its cost does not depend on its
values), taking turns round by round on the same batch of states; prints one JSON line with the
medians, the ratios and the largest |Δ log π| between merged and unmerged.

    OMP_NUM_THREADS=1 python benchmarks/rlid_adapter_speed.py --model smollm2-135m --batch 8 --rounds 6
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from rlid_decision_speed import STATES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--r", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from rlid.decision_model import DecisionModel
    from rlid.lora import LoraSpec, add_lora
    from runtime.member import load_member

    base = load_member(args.model)
    unmerged = load_member(args.model, pack_weights=False)
    adapter = add_lora(unmerged, LoraSpec(r=args.r, alpha=2 * args.r), seed=0)
    merged = load_member(args.model, pack_weights=False)
    other = add_lora(merged, LoraSpec(r=args.r, alpha=2 * args.r), seed=0)
    with torch.no_grad():
        for p, q in zip(adapter.parameters(), other.parameters()):
            p.normal_(0, 0.02)
            q.copy_(p)
    other.merge_for_inference()
    models = {"base (packed, no adapter)": DecisionModel(base), "adapter unmerged": DecisionModel(unmerged),
              "adapter merged + packed": DecisionModel(merged)}
    states = [STATES[i % len(STATES)] for i in range(args.batch)]
    rates: dict[str, list[float]] = {k: [] for k in models}
    with torch.no_grad():
        laws = {k: dm.laws(states) for k, dm in models.items()}  # warm-up, and the laws compared
        for _ in range(args.rounds):
            for name, dm in models.items():
                t0 = time.perf_counter()
                dm.laws(states)
                rates[name].append(len(states) / (time.perf_counter() - t0))
    gap = max(float((a.probs.log() - b.probs.log()).abs().max())
              for a, b in zip(laws["adapter unmerged"], laws["adapter merged + packed"]))
    med = {k: round(statistics.median(v), 2) for k, v in rates.items()}
    from runtime.dtype_choice import cpu_name

    cpu = cpu_name()
    print(json.dumps({"model": args.model, "batch": args.batch, "rounds": args.rounds, "threads": args.threads,
                      "cpu": cpu, "decisions_per_s": med,
                      "merged_over_unmerged": round(med["adapter merged + packed"] / med["adapter unmerged"], 2),
                      "merged_over_base": round(med["adapter merged + packed"] / med["base (packed, no adapter)"], 2),
                      "max_abs_dlogpi_merged_vs_unmerged": gap}))


if __name__ == "__main__":
    main()
