"""Text LDM vs token level, paired over games: on test games 20200-20399 and on all 400 (20000-20399).

Reads the episode records the evals wrote under runs/ (run from the repository root):
    runs/rlid_twc1_gold_text/eval/{decision,token}.episodes.jsonl              (games 20000-20199)
    runs/rlid_twc1_gold_text/eval_20200_n200/decision.episodes.jsonl          (games 20200-20399)
    runs/rlid_twc1_gold/eval_20200_n100/, eval_20300_n100/ token.episodes.jsonl (the token policy, two halves)
Prints success % and mean score of each, the paired bootstrap difference (LDM - token) with its 95 %
interval, Wilson intervals, invalid and total moves.
"""
import json

from rlid.evaluate import paired_difference, wilson_interval


def load(path: str) -> dict[int, dict]:
    with open(path) as f:
        return {r["seed"]: r for r in map(json.loads, f)}


def main() -> None:
    base = "runs/rlid_twc1_gold_text"
    d1, t1 = load(f"{base}/eval/decision.episodes.jsonl"), load(f"{base}/eval/token.episodes.jsonl")
    d2 = load(f"{base}/eval_20200_n200/decision.episodes.jsonl")
    t2 = {**load("runs/rlid_twc1_gold/eval_20200_n100/token.episodes.jsonl"),
          **load("runs/rlid_twc1_gold/eval_20300_n100/token.episodes.jsonl")}
    assert sorted(t2) == sorted(d2) == list(range(20200, 20400)), (len(t2), len(d2))
    for name, (d, t) in (("set 2 (20200-20399)", (d2, t2)), ("pooled 400", ({**d1, **d2}, {**t1, **t2}))):
        print_comparison(name, d, t)


def print_comparison(name: str, d: dict[int, dict], t: dict[int, dict]) -> None:
    """Success and mean score of the LDM's records `d` and the token level's `t` (by seed), their paired
    bootstrap difference, Wilson intervals, invalid and total moves (also used by twc1_gold_text_rllr/compare.py)."""
    seeds = sorted(d)
    for key, scale, digits in (("success", 100, 1), ("reward", 1, 3)):
        a = [float(d[s][key]) for s in seeds]
        b = [float(t[s][key]) for s in seeds]
        diff = [round(x * scale, digits) for x in paired_difference(a, b)]
        print(name, key, "LDM", round(scale * sum(a) / len(a), digits), "token", round(scale * sum(b) / len(b), digits),
              "LDM - token [95 %]", diff)
    for policy, eps in (("LDM", d), ("token", t)):
        k = sum(eps[s]["success"] for s in seeds)
        lo, hi = wilson_interval(k, len(seeds))
        print(" ", policy, k, "/", len(seeds), f"[{100 * lo:.1f}, {100 * hi:.1f}]",
              "invalid", sum(eps[s]["invalid"] for s in seeds), "moves", sum(eps[s]["steps"] for s in seeds))


if __name__ == "__main__":
    main()
