"""What packing the frozen layers buys RL training (`LoraAdapter.pack_frozen`, on in `adafuse rlid
train` and `distill`): decisions/s of the decision model's rollout forward (no grad) and of its update
(forward with grad + backward into the LoRA parameters, in chunks of `--rescore_batch`), with the
frozen layers plain (how the first seven tries trained) vs packed.

Two copies of the model in one process with the same random adapter, taking turns round by round on
the same batch of real decision states (initial states of Countdown and Sokoban train seeds, the
prompts training sees); prints one JSON line with medians, ratios, the largest |Δ log π| and the
largest relative difference of the LoRA gradients between the two.

    OMP_NUM_THREADS=1 python benchmarks/rlid_train_speed.py --model qwen2.5-coder-0.5b --dtype bfloat16
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def real_states(count: int):
    """Initial decision states of Countdown and Sokoban seeds 0.., alternating."""
    from rlid.envs.countdown import CountdownEnv
    from rlid.envs.sokoban import SokobanEnv
    from rlid.rollout import decision_state

    out = []
    for i in range(count):
        env = CountdownEnv() if i % 2 == 0 else SokobanEnv()
        env.reset(i)
        out.append(decision_state(env, 0))
    return out


def update(dm, adapter, states, chunk: int) -> list[torch.Tensor]:
    """Backpropagate −Σ_a π(a) v(a) (v fixed: option index / menu size) chunk by chunk; the LoRA grads."""
    adapter.peft_model.zero_grad(set_to_none=True)
    for i in range(0, len(states), chunk):
        laws = dm.laws(states[i:i + chunk])
        loss = -sum((law.log_probs.exp() * torch.arange(len(law.log_probs)) / len(law.log_probs)).sum() for law in laws)
        loss.backward()
    return [p.grad.detach().clone() for p in adapter.parameters()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--dtype", default=None, help="as `adafuse` takes it (default: the registry's choice)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rescore_batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--r", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from rlid.decision_model import DecisionModel
    from rlid.lora import LoraSpec, add_lora
    from runtime.dtype_choice import cpu_name
    from runtime.member import load_member

    copies, adapters = {}, {}
    for name in ("plain", "frozen packed"):
        member = load_member(args.model, dtype=args.dtype, pack_weights=False)
        adapters[name] = add_lora(member, LoraSpec(r=args.r, alpha=2 * args.r), seed=0)
        with torch.no_grad():
            for i, p in enumerate(adapters[name].parameters()):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.02)
        copies[name] = DecisionModel(member)
    packed = adapters["frozen packed"].pack_frozen()
    states = real_states(args.batch)
    rollout = {k: [] for k in copies}
    train = {k: [] for k in copies}
    with torch.no_grad():
        laws = {k: dm.laws(states) for k, dm in copies.items()}   # warm-up, and the laws compared
    grads = {k: update(dm, adapters[k], states, args.rescore_batch) for k, dm in copies.items()}
    for _ in range(args.rounds):
        for name, dm in copies.items():
            t0 = time.perf_counter()
            with torch.no_grad():
                dm.laws(states)
            rollout[name].append(len(states) / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            update(dm, adapters[name], states, args.rescore_batch)
            train[name].append(len(states) / (time.perf_counter() - t0))
    gap = max(float((a.log_probs - b.log_probs).abs().max()) for a, b in zip(laws["plain"], laws["frozen packed"]))
    grad_rel = max(float((a - b).norm() / a.norm().clamp_min(1e-12)) for a, b in zip(grads["plain"], grads["frozen packed"]))
    med = lambda d: {k: round(statistics.median(v), 3) for k, v in d.items()}  # noqa: E731
    r, t = med(rollout), med(train)
    print(json.dumps({"model": args.model, "dtype": args.dtype, "batch": args.batch, "rescore_batch": args.rescore_batch,
                      "rounds": args.rounds, "threads": args.threads, "cpu": cpu_name(), "layers_packed": packed,
                      "prompt_tokens": [len(copies["plain"].prompt_ids(s)) for s in states],
                      "rollout_decisions_per_s": r, "update_decisions_per_s": t,
                      "rollout_ratio": round(r["frozen packed"] / r["plain"], 2),
                      "update_ratio": round(t["frozen packed"] / t["plain"], 2),
                      "max_abs_dlogpi": gap, "max_rel_grad_diff": grad_rel}))


if __name__ == "__main__":
    main()
