"""Rollout cost: decisions per second of the one-forward decision model (`DecisionModel.laws`) vs the
same model generating and parsing the action (`TokenPolicy.act`), in one process, taking turns.

    python benchmarks/rlid_decision_speed.py [--model tiny|<registry name or folder>] [--batch 8]
        [--rounds 6] [--max_new_tokens 16] [--tiny_hidden 32] [--tiny_layers 2] [--threads 1]
        [--states builtin|twc] [--twc_rooms 1] [--twc_items 2] [--answer label|text]

`--answer text`: the decision model answering with the action's own text (`rlid.text_law`: the
prompt's forward plus one tree-attention forward over the menu's texts) instead of its label.
`--states twc`: real TextWorld Commonsense states instead of the four built-in ones — the states met
along the gold paths of dev-fold games 10000.. (compiled memory of the last 3 moves), the first
`batch` of them (needs Java, as `rlid.envs.twc` does).

Both policies decide the same batch of states (menus of 3-6 actions, prompts of different lengths)
under no_grad; rounds alternate DM, token, DM, token... so a busy machine slows both alike. Prints
one JSON line: decisions/s of each (median over rounds), their ratio, forwards per decision, the
token policy's mean generated tokens and its share of parsed (valid) answers. A random tiny model
rarely writes a newline or EOS, so its token policy runs to `max_new_tokens`; a real model stops
after its few answer tokens, so repeat this on real models for the figure that matters.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from rlid.decision_model import DecisionModel
from rlid.token_policy import TokenPolicy
from rlid.types import DecisionState

STATES = [
    DecisionState("Numbers left: 3 4 7 25. Target: 46.", ("3 + 4 = 7", "25 - 7 = 18", "7 * 3 = 21", "25 + 4 = 29"),
                  instruction="Combine the numbers to reach the target."),
    DecisionState("#######\n#  @  #\n# $ . #\n#######", ("up", "down", "left", "right"),
                  memory="moved left, moved down", instruction="Push every box onto a goal."),
    DecisionState("Input: 0 0 3 3 3 0 0 0\nOutput so far: 0 0 0", ("0", "3", "4", "5", "6", "7"),
                  instruction="Continue the output row of the 1-D puzzle."),
    DecisionState("Numbers left: 18 29. Target: 47.", ("18 + 29 = 47", "29 - 18 = 11", "18 * 29 = 522"),
                  instruction="Combine the numbers to reach the target."),
]


def twc_states(n: int, rooms: int, items: int) -> list[DecisionState]:
    """The first `n` states met along the gold paths of TWC dev games 10000, 10001, ... (`rlid.gold`)."""
    from rlid.envs.textworld import shutdown_java
    from rlid.envs.twc import TWCEnv, TWCOptions
    from rlid.gold import gold_moves

    def make():
        return TWCEnv(TWCOptions(num_locations=rooms, num_items_to_put_away=items, compiled_memory=True, max_steps=50))

    try:
        return [state for state, _ in gold_moves(make, range(10000, 10000 + n), memory_k=3)][:n]   # >= 1 move a game
    finally:
        shutdown_java()


def load(args):
    if args.model == "tiny":
        from runtime.testing import bpe_tokenizer, tiny_member

        return tiny_member("llama", bpe_tokenizer(), seed=0, hidden=args.tiny_hidden, layers=args.tiny_layers)
    from runtime.member import load_member

    return load_member(args.model, dtype=args.dtype)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max_new_tokens", type=int, default=16)
    ap.add_argument("--tiny_hidden", type=int, default=32)
    ap.add_argument("--tiny_layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--states", choices=("builtin", "twc"), default="builtin")
    ap.add_argument("--twc_rooms", type=int, default=1)
    ap.add_argument("--twc_items", type=int, default=2)
    ap.add_argument("--answer", choices=("label", "text"), default="label")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    member = load(args)
    dm, tp = DecisionModel(member, answer=args.answer), TokenPolicy(member, max_new_tokens=args.max_new_tokens)
    states = (twc_states(args.batch, args.twc_rooms, args.twc_items) if args.states == "twc" else
              [STATES[i % len(STATES)] for i in range(args.batch)])
    gen = torch.Generator().manual_seed(0)
    dm_rates, tp_rates, out_tokens, valid = [], [], [], []
    with torch.no_grad():
        dm.choose(states[:2], generator=gen)  # warm-up
        tp.act(states[:2], generator=gen)
        dm.counters.__init__()
        tp.counters.__init__()
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            dm.choose(states, generator=gen)
            dm_rates.append(len(states) / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            acts = tp.act(states, generator=gen)
            tp_rates.append(len(states) / (time.perf_counter() - t0))
            out_tokens += [len(a.output_ids) for a in acts]
            valid += [a.index is not None for a in acts]
    dm_s, tp_s = statistics.median(dm_rates), statistics.median(tp_rates)
    print(json.dumps({
        "model": member.name, "states": args.states, "answer": args.answer, "batch": args.batch, "rounds": args.rounds, "threads": args.threads,
        "max_new_tokens": args.max_new_tokens, "dm_decisions_per_s": round(dm_s, 2),
        "token_decisions_per_s": round(tp_s, 2), "ratio_dm_over_token": round(dm_s / tp_s, 2),
        "dm_forwards_per_decision": round(dm.counters.forwards_per_decision, 3),
        "token_forwards_per_decision": round(tp.counters.forwards_per_decision, 3),
        "token_mean_output_tokens": round(statistics.mean(out_tokens), 2),
        "token_valid_share": round(sum(valid) / len(valid), 3),
    }))


if __name__ == "__main__":
    main()
