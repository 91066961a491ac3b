"""Probe (dev games, no training): does a compiled-memory line for the puts that failed help a trained LDM?

The replay of every evaluated game (`twc1_gold_text_rllr/failures.py`) says both planes fail by putting objects
where they do not belong, and the LDM mostly repeats the same wrong put: the compiled memory lists what is
placed where it belongs, not what was tried and failed. Here the trained text LDM of
experiments/rlid/rlid_twc1_gold_text_rllr.yaml (trained WITHOUT the line) plays TWC dev games 10200-10299 twice, greedy,
in blocks of 25 (the same batching): with the compiled memory it was trained on, and with `failed_puts: true`
("Tried, not where they belong: <object> in the <container>; ..."). Success and mean score, paired over games.
A dev probe for the next training config, not a test-set result. Run from the repository root (one thread):
    OMP_NUM_THREADS=1 python experiments/rlid/twc1_failed_puts_probe/probe.py
"""
import json
import time
from pathlib import Path

import torch

from rlid.cli import _decision_model, _member, _newest_adapter
from rlid.config import load_rlid
from rlid.envs import make_env
from rlid.evaluate import evaluate_policy, paired_difference

SEEDS = list(range(10200, 10300))
OUT = Path(__file__).parent


def main() -> None:
    torch.set_num_threads(1)
    cfg = load_rlid("experiments/rlid/rlid_twc1_gold_text_rllr.yaml")
    adapter = _newest_adapter(cfg.output_path / "decision")
    model = _decision_model(cfg, _member(cfg, None, adapter)[0])
    results = {}
    for name, extra in (("compiled memory", {}), ("+ failed puts", {"failed_puts": True})):
        options = {**cfg.env_options, **extra}
        start, episodes = time.time(), []
        for i in range(0, len(SEEDS), 25):
            res = evaluate_policy(model, lambda: make_env(cfg.env_name, **options), SEEDS[i: i + 25],
                                  greedy=True, memory_k=cfg.memory_k)
            episodes += res.episodes
        results[name] = {"success": [float(e.success) for e in episodes],
                         "score": [float(e.total_reward) for e in episodes], "wall_s": round(time.time() - start, 1)}
        print(name, f"{100 * sum(results[name]['success']) / len(SEEDS):.1f} % solved,",
              f"mean score {sum(results[name]['score']) / len(SEEDS):.3f}", flush=True)
    a, b = results["+ failed puts"], results["compiled memory"]
    for key, scale in (("success", 100), ("score", 1)):
        print(f"failed puts - without, {key} [95 % paired bootstrap]:",
              [round(scale * x, 3) for x in paired_difference(a[key], b[key])])
    (OUT / "probe.json").write_text(json.dumps({"adapter": str(adapter), "seeds": [SEEDS[0], SEEDS[-1] + 1], **results}))


if __name__ == "__main__":
    main()
