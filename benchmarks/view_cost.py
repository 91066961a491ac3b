"""Cost of an ensemble of views of one model against the model alone, on GSM8K (issue 49).

In one process and on the same prompts (GSM8K test questions, the `gsm8k` task's k-shot prompt with
an exemplar pool for the views, its stop strings), three runs take turns question by question, so a
drift in the machine's speed hits them alike:

- `alone`: the model with its default prompt (plain greedy decoding, batch 1);
- `together`: the view ensemble, the views' forwards stacked into one (`runtime.forward_group`);
- `apart`: the same ensemble with the views' forwards one after another (`one_after_another`).

It prints seconds and forward passes per output word of each, the ratios to `alone` (the issue's
goal: `together` <= 1.5x), `apart` / `together`, and whether `together` and `apart` wrote the same
texts (they must: stacking changes how many model calls there are, not what is computed).
Words are `adafuse.words.count_words` units. The first `--warmup` questions are run and not counted
(prefix caches of the shared exemplars fill there, for every run alike).

    python benchmarks/view_cost.py --limit 12 --threads 2 --dtype bfloat16 \
        --views '[{}, {"shots": "4:8"}, {"shots": "8:12", "chat": false}]' --options '{"flush_guesses": 4}'
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (speed figures name their CPU)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def prompts(limit: int, offset: int, shots: int, pool: int):
    from eval.data import resolve_data_dir
    from eval.task import get_task

    task = get_task("gsm8k", num_fewshot=shots)
    docs, exemplars = task.load(resolve_data_dir(None), pool=pool)
    docs = docs[offset: offset + limit]
    return [task.prompt(d, exemplars) for d in docs], docs, task


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--views", default='[{}, {"shots": "4:8"}, {"shots": "8:12", "chat": false}]',
                   help="JSON list of view recipes ({} = the default prompt); the first leads")
    p.add_argument("--method", default="adafuse")
    p.add_argument("--options", default="{}", help="JSON method options, e.g. {\"flush_guesses\": 4}")
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--shots", type=int, default=4)
    p.add_argument("--max_new_tokens", type=int, default=200)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from adafuse import Ensemble
    from adafuse.words import count_words
    from runtime.forward_group import one_after_another
    from runtime.views import exemplars_needed, member_spec, parse_view

    members = [member_spec(args.model, parse_view(v)) for v in json.loads(args.views)]
    ps, docs, task = prompts(args.limit + args.warmup, args.offset, args.shots, exemplars_needed(members))
    alone = Ensemble([args.model], method="single", dtype=args.dtype)
    ens = Ensemble(members, method=args.method, dtype=args.dtype, **json.loads(args.options))
    kw = dict(max_new_tokens=args.max_new_tokens, stop=list(task.until))

    def apart(prompt):
        with one_after_another():
            return ens.generate([prompt], **kw)[0]

    runs = {"alone": lambda q: alone.generate([q], **kw)[0], "together": lambda q: ens.generate([q], **kw)[0],
            "apart": apart}
    totals = {name: {"s": 0.0, "words": 0, "forwards": 0.0, "texts": [], "right": 0.0} for name in runs}
    for i, (prompt, doc) in enumerate(zip(ps, docs)):
        for name, run in runs.items():
            t0 = time.perf_counter()
            out = run(prompt)
            dt = time.perf_counter() - t0
            if i < args.warmup:
                continue
            t = totals[name]
            t["s"] += dt
            t["words"] += count_words(out.text)
            t["forwards"] += sum(out.cost.forward_passes.values())
            t["texts"].append(out.text)
            t["right"] += task.score(task.extract(out.text), doc)[0][task.primary_metric]
        if i >= args.warmup:
            print(f"question {i - args.warmup + 1}/{args.limit}: " + ", ".join(
                f"{n} {totals[n]['s'] / max(totals[n]['words'], 1):.3f} s/word" for n in runs), file=sys.stderr)
    base = totals["alone"]["s"] / max(totals["alone"]["words"], 1)
    print(f"{args.model} ({args.dtype}), {len(members)} views {', '.join(members)}; method {args.method} "
          f"{args.options}; {args.limit} GSM8K test questions from {args.offset}, batch 1, {args.threads} thread(s); "
          f"{cpu_name()}")
    print("| run | s / word | forwards / word | x alone | exact match |")
    print("|---|--:|--:|--:|--:|")
    figures = {}
    for name, t in totals.items():
        per_word = t["s"] / max(t["words"], 1)
        figures[name] = {"s_per_word": per_word, "forwards_per_word": t["forwards"] / max(t["words"], 1),
                         "x_alone": per_word / base, "exact_match": t["right"] / args.limit, "words": t["words"]}
        print(f"| {name} | {per_word:.3f} | {figures[name]['forwards_per_word']:.2f} | {per_word / base:.2f}x | "
              f"{figures[name]['exact_match']:.2f} |")
    same = totals["together"]["texts"] == totals["apart"]["texts"]
    figures["same_texts"] = same
    figures["apart_over_together"] = figures["apart"]["x_alone"] / figures["together"]["x_alone"]
    print(f"\ntogether vs apart: {figures['apart_over_together']:.2f}x faster; same texts: {same} "
          f"({sum(a == b for a, b in zip(totals['together']['texts'], totals['apart']['texts']))}/{args.limit})")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_name(), "args": vars(args), "figures": figures}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
