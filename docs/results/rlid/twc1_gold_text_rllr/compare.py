"""Text LDM vs token level of configs/rlid_twc1_gold_text_rllr.yaml, paired over games: on test games
20400-20599 (the declared set), 20600-20799 (the second set, declared before it ran) and all 400 pooled.

Reads the episode records the evals wrote under runs/ (run from the repository root):
    runs/rlid_twc1_gold_text_rllr/eval/{decision,token}.episodes.jsonl             (games 20400-20599)
    runs/rlid_twc1_gold_text_rllr/eval_20600_n200/{decision,token}.episodes.jsonl  (games 20600-20799)
Prints success % and mean score of each, the paired bootstrap difference (LDM - token) with its 95 %
interval, Wilson intervals, the games each solves alone, invalid and total moves.
"""
import json

from rlid.evaluate import paired_difference, wilson_interval

RUN = "runs/rlid_twc1_gold_text_rllr"


def load(path: str) -> dict[int, dict]:
    with open(path) as f:
        return {r["seed"]: r for r in map(json.loads, f)}


def main() -> None:
    sets = {name: (load(f"{RUN}/{folder}/decision.episodes.jsonl"), load(f"{RUN}/{folder}/token.episodes.jsonl"))
            for name, folder in (("20400-20599", "eval"), ("20600-20799", "eval_20600_n200"))}
    sets["pooled 400"] = tuple({**a, **b} for a, b in zip(*sets.values()))
    for name, (d, t) in sets.items():
        seeds = sorted(d)
        assert seeds == sorted(t), name
        for key, scale, digits in (("success", 100, 1), ("reward", 1, 3)):
            a = [float(d[s][key]) for s in seeds]
            b = [float(t[s][key]) for s in seeds]
            diff = [round(x * scale, digits) for x in paired_difference(a, b)]
            print(name, key, "LDM", round(scale * sum(a) / len(a), digits), "token", round(scale * sum(b) / len(b), digits),
                  "LDM - token [95 %]", diff)
        print("  solved by both", sum(d[s]["success"] and t[s]["success"] for s in seeds),
              "only the LDM", sum(d[s]["success"] and not t[s]["success"] for s in seeds),
              "only the token level", sum(t[s]["success"] and not d[s]["success"] for s in seeds))
        for policy, eps in (("LDM", d), ("token", t)):
            k = sum(eps[s]["success"] for s in seeds)
            lo, hi = wilson_interval(k, len(seeds))
            print(" ", policy, k, "/", len(seeds), f"[{100 * lo:.1f}, {100 * hi:.1f}]",
                  "invalid", sum(eps[s]["invalid"] for s in seeds), "moves", sum(eps[s]["steps"] for s in seeds))


if __name__ == "__main__":
    main()
