"""experiments/rlid/rlid_twc1_gold_text_immediate.yaml on test games 20800-20999, paired over games: the text LDM trained
with the immediate-reward term vs the token level of rlid_twc1_gold_text_rllr (primary, declared), and vs the
same run without the term (rlid_twc1_gold_text_rllr's LDM; secondary, declared).

Reads (run from the repository root):
    runs/rlid_twc1_gold_text_immediate/eval/decision.episodes.jsonl
    runs/rlid_twc1_gold_text_rllr/eval_20800_n200/{decision,token}.episodes.jsonl
Prints success % and mean score of each, the paired bootstrap difference with its 95 % interval, Wilson
intervals, invalid and total moves (the fifth session's `print_comparison`).
"""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "compare_20200", Path(__file__).parent.parent / "twc1_gold_text" / "test_20200_n200" / "compare.py")
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
load, print_comparison = _shared.load, _shared.print_comparison


def main() -> None:
    ldm = load("runs/rlid_twc1_gold_text_immediate/eval/decision.episodes.jsonl")
    token = load("runs/rlid_twc1_gold_text_rllr/eval_20800_n200/token.episodes.jsonl")
    without = load("runs/rlid_twc1_gold_text_rllr/eval_20800_n200/decision.episodes.jsonl")
    assert sorted(ldm) == sorted(token) == sorted(without) == list(range(20800, 21000))
    print_comparison("with the term vs token level (LDM = with the term)", ldm, token)
    print_comparison("with vs without the term (token = the rllr LDM)", ldm, without)
    print_comparison("without the term vs token level (LDM = the rllr LDM)", without, token)


if __name__ == "__main__":
    main()
