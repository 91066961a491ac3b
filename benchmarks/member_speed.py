"""Load time and decoding speed of each registry model, fp32 and bf16, through the member runtime
beside plain `model.generate` in the same process (greedy, same prompt, same token count).

    python benchmarks/member_speed.py [--models a,b] [--dtypes float32,bfloat16] [--new_tokens 48]

Prints a markdown table: load seconds, tokens/s of `Member.generate`, tokens/s of `model.generate`,
their ratio, resident memory after loading, and whether the two greedy outputs agree.
"""
from __future__ import annotations

import argparse
import gc
import json
import time

import psutil
import torch

from runtime.loader import load as load_member

QUESTION = ("Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
            "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
            "per fresh duck egg. How much in dollars does she make every day at the farmers' market?")


def bench(name: str, dtype: str, new_tokens: int) -> dict:
    gc.collect()
    t0 = time.perf_counter()
    member = load_member(name, dtype=dtype)
    load_s = time.perf_counter() - t0
    rss = psutil.Process().memory_info().rss / 2**30
    prompt = QUESTION if member.use_chat_template else f"Question: {QUESTION}\nAnswer: Let's think step by step."
    ids = torch.tensor([member.encode_prompt(prompt)])
    member.generate([prompt], max_new_tokens=4)  # warm-up
    t0 = time.perf_counter()
    ref = member.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False)
    hf_s = time.perf_counter() - t0
    hf_tokens = ref.shape[1] - ids.shape[1]
    # ours: force the same length by ignoring EOS
    eos = member.eos_token_ids
    member.eos_token_ids = set()
    t0 = time.perf_counter()
    out = member.generate([prompt], max_new_tokens=new_tokens)[0]
    ours_s = time.perf_counter() - t0
    member.eos_token_ids = eos
    agree = member.encode(out.text)[:8] == ref[0, ids.shape[1]:ids.shape[1] + 8].tolist() or \
        out.text == member.decode(ref[0, ids.shape[1]:].tolist())
    row = {"model": name, "dtype": dtype, "load_s": round(load_s, 2), "rss_gib": round(rss, 2),
           "ours_tok_s": round(out.num_tokens / ours_s, 2), "hf_tok_s": round(hf_tokens / hf_s, 2),
           "ratio": round((out.num_tokens / ours_s) / (hf_tokens / hf_s), 3), "greedy_agree": bool(agree),
           "sample": out.text[:80]}
    del member
    gc.collect()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--new_tokens", type=int, default=48)
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()
    rows = []
    print("| model | dtype | load s | RSS GiB | member tok/s | generate tok/s | ratio | greedy agree |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for dtype in args.dtypes.split(","):
            r = bench(name, dtype, args.new_tokens)
            rows.append(r)
            print(f"| {r['model']} | {r['dtype']} | {r['load_s']} | {r['rss_gib']} | {r['ours_tok_s']} | "
                  f"{r['hf_tok_s']} | {r['ratio']} | {r['greedy_agree']} |", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
