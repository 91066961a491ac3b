"""Text LDM vs token level of experiments/rlid/rlid_twc1_gold_text_rllr.yaml, paired over games: on test games
20400-20599 (the declared set), 20600-20799 (the second set, declared before it ran) and all 400 pooled.

Reads the episode records the evals wrote under runs/ (run from the repository root):
    runs/rlid_twc1_gold_text_rllr/eval/{decision,token}.episodes.jsonl             (games 20400-20599)
    runs/rlid_twc1_gold_text_rllr/eval_20600_n200/{decision,token}.episodes.jsonl  (games 20600-20799)
Prints success % and mean score of each, the paired bootstrap difference (LDM - token) with its 95 %
interval, Wilson intervals, the games each solves alone, invalid and total moves.
"""
import importlib.util
from pathlib import Path

RUN = "runs/rlid_twc1_gold_text_rllr"
_spec = importlib.util.spec_from_file_location(   # the fifth session's record script: the same comparison
    "compare_20200", Path(__file__).parent.parent / "twc1_gold_text" / "test_20200_n200" / "compare.py")
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
load, print_comparison = _shared.load, _shared.print_comparison


def main() -> None:
    sets = {name: (load(f"{RUN}/{folder}/decision.episodes.jsonl"), load(f"{RUN}/{folder}/token.episodes.jsonl"))
            for name, folder in (("20400-20599", "eval"), ("20600-20799", "eval_20600_n200"))}
    sets["pooled 400"] = tuple({**a, **b} for a, b in zip(*sets.values()))
    for name, (d, t) in sets.items():
        seeds = sorted(d)
        assert seeds == sorted(t), name
        print_comparison(name, d, t)
        print("  solved by both", sum(d[s]["success"] and t[s]["success"] for s in seeds),
              "only the LDM", sum(d[s]["success"] and not t[s]["success"] for s in seeds),
              "only the token level", sum(t[s]["success"] and not d[s]["success"] for s in seeds))

if __name__ == "__main__":
    main()
