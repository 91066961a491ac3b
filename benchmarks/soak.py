"""Soak: a long `adafuse eval` of an ensemble with speculative members, memory and speed sampled each minute.

The eval runs in this process through the CLI's own entry (`eval.cli.main`), on a config of the
ensemble the tables use (`experiments/table_wmt/table_wmt.yaml`'s `adafuse-speculative`: smollm2-135m, gemma3-270m,
qwen2.5-coder-0.5b, each with a prompt-lookup drafter, qwen leading) over WMT22 de-en lines in order.
A sampler thread writes one JSON line per `--every_s` to `soak.jsonl`:

- `rss_mib`: resident memory of this process (what grows if caches leak); `anon_mib`: the part not
  backed by files (RSS less the mmapped checkpoint pages: the tensors, caches and Python objects);
- `rows`, `tokens`: completed predictions and their output tokens so far (read from predictions.jsonl);
- `cpu_s`: this process's CPU seconds so far (user + system), so throughput per CPU second stays
  comparable when other jobs share the machine; `loadavg1`: the machine's 1-minute load;
- `prefix_chunks`: entries held by every member's prompt-prefix LRU (`runtime.prefix_cache`).

After `--minutes` the eval is interrupted (the CLI's KeyboardInterrupt path: records stay valid,
a rerun resumes) and `soak.png` plots RSS, output tokens per wall minute and per CPU second, and load.

    OMP_NUM_THREADS=1 python benchmarks/soak.py --minutes 65 --out docs/results/soak
    python benchmarks/soak.py --plot_only --out docs/results/soak      # redraw from soak.jsonl
    OMP_NUM_THREADS=1 python benchmarks/soak.py --minutes 25 --trim --out docs/results/soak_trim --eval_out runs/soak_trim

`--trim` calls glibc's `malloc_trim(0)` before each sample: memory that stays resident only because
the heap is fragmented is handed back, so what still grows is held by live objects.
"""
from __future__ import annotations

import _thread
import argparse
import json
import os
import sys
import threading
import time
import weakref
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runtime.heap import release_free_heap  # noqa: E402

CONFIG = """\
description: soak - the speculative adafuse ensemble over WMT22 de-en lines, sampled each minute
output_path: {out}
seed: 0
batch_size: 1
tasks:
  - name: wmt22_de_en
    num_fewshot: 1
    limit: {limit}
    generation: {{max_new_tokens: 64}}
generation:
  temperature: 0.0
runs:
  - name: adafuse-speculative
    method: adafuse
    members: [smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b]
    options: {{lead: 2, drafters: [lookup, lookup, lookup]}}
"""


def _prefix_caches() -> "weakref.WeakSet":
    """Every `PrefixCache` made from now on (members build theirs when they load)."""
    from runtime import prefix_cache

    caches: weakref.WeakSet = weakref.WeakSet()
    init = prefix_cache.PrefixCache.__init__

    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        caches.add(self)

    prefix_cache.PrefixCache.__init__ = tracked
    return caches


def _done(run_dir: Path) -> tuple[int, int]:
    """(rows, output tokens) of the complete lines of every predictions.jsonl under `run_dir`."""
    rows = tokens = 0
    for path in run_dir.rglob("predictions.jsonl"):
        with open(path, "rb") as fh:
            for line in fh:
                if line.endswith(b"\n"):
                    try:
                        tokens += int(json.loads(line).get("num_tokens", 0))
                        rows += 1
                    except ValueError:
                        pass
    return rows, tokens


def sample_loop(out: Path, eval_dir: Path, deadline: float, every_s: float, caches, stop: threading.Event,
                trim: bool = False) -> None:
    import psutil

    proc = psutil.Process()
    t0 = time.time()
    with open(out / "soak.jsonl", "a") as fh:
        while not stop.is_set():
            rows, tokens = _done(eval_dir)
            if trim:
                release_free_heap()
            cpu, mem = proc.cpu_times(), proc.memory_info()
            row = {"t_s": round(time.time() - t0, 1), "rss_mib": round(mem.rss / 2**20, 1),
                   "anon_mib": round((mem.rss - mem.shared) / 2**20, 1),
                   "rows": rows, "tokens": tokens, "cpu_s": round(cpu.user + cpu.system, 1),
                   "loadavg1": os.getloadavg()[0], "prefix_chunks": sum(len(c) for c in list(caches))}
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            if time.time() >= deadline:
                _thread.interrupt_main()  # the CLI's KeyboardInterrupt path: records stay valid
                return
            stop.wait(every_s)


def plot(out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(out / "soak.jsonl")]
    minutes = [r["t_s"] / 60 for r in rows]
    per_min, per_cpu, mids = [], [], []
    for a, b in zip(rows, rows[1:]):
        dt, dcpu, dtok = b["t_s"] - a["t_s"], b["cpu_s"] - a["cpu_s"], b["tokens"] - a["tokens"]
        if dt > 0 and a["rows"] > 0:  # from the first finished row on (model loading excluded)
            mids.append((a["t_s"] + b["t_s"]) / 120)
            per_min.append(dtok * 60 / dt)
            per_cpu.append(dtok / dcpu if dcpu > 0 else 0.0)
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    axes[0].plot(minutes, [r["rss_mib"] for r in rows], color="tab:blue", label="RSS")
    axes[0].plot(minutes, [r["anon_mib"] for r in rows], color="tab:purple", label="RSS not file-backed")
    axes[0].set_ylabel("MiB")
    axes[0].legend(loc="lower right", fontsize=8)
    chunks = axes[0].twinx()
    chunks.plot(minutes, [r["prefix_chunks"] for r in rows], color="tab:gray", linestyle="--", label="prefix-cache chunks")
    chunks.set_ylabel("prefix-cache chunks (LRU)")
    chunks.set_ylim(bottom=0)
    chunks.legend(loc="center right", fontsize=8)
    axes[0].set_ylim(bottom=0)
    axes[1].plot(mids, per_min, color="tab:green", label="output tokens / wall minute")
    axes[1].set_ylabel("tokens / min")
    ax = axes[1].twinx()
    ax.plot(mids, per_cpu, color="tab:orange", label="output tokens / CPU second")
    ax.set_ylabel("tokens / CPU s")
    axes[1].legend(loc="upper left", fontsize=8)
    ax.legend(loc="upper right", fontsize=8)
    axes[2].plot(minutes, [r["loadavg1"] for r in rows], color="tab:gray")
    axes[2].set_ylabel("load (1 min)")
    axes[2].set_xlabel("minutes")
    fig.suptitle("soak: speculative adafuse ensemble, WMT22 de-en, one row per minute")
    fig.tight_layout()
    path = out / "soak.png"
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=65.0)
    ap.add_argument("--every_s", type=float, default=60.0)
    ap.add_argument("--limit", type=int, default=992, help="WMT22 de-en test lines at most (all 992 by default)")
    ap.add_argument("--out", default="docs/results/soak", help="soak.jsonl, soak.yaml and soak.png go here")
    ap.add_argument("--eval_out", default="runs/soak", help="the eval's own output folder (predictions, metrics)")
    ap.add_argument("--plot_only", action="store_true")
    ap.add_argument("--trim", action="store_true",
                    help="call glibc's malloc_trim(0) before each sample (tells allocator fragmentation from a leak)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        print(plot(out))
        return 0
    import signal

    import torch

    # a process started in the background by a non-interactive shell ignores SIGINT, and then
    # `interrupt_main` (how the soak stops the eval) does nothing: restore Python's handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    config = out / "soak.yaml"
    config.write_text(CONFIG.format(out=args.eval_out, limit=args.limit))
    caches = _prefix_caches()
    stop = threading.Event()
    sampler = threading.Thread(target=sample_loop, daemon=True,
                               args=(out, Path(args.eval_out), time.time() + args.minutes * 60, args.every_s, caches, stop,
                                     args.trim))
    sampler.start()
    from eval.cli import main as cli_main

    try:
        rc = cli_main(["eval", str(config), "--no_progress"])
    except KeyboardInterrupt:
        rc = 130
    early = sampler.is_alive()
    stop.set()
    sampler.join(timeout=5)
    if early and rc != 0:
        print(f"the eval stopped before the soak's end (exit {rc}): see its error above", file=sys.stderr)
        return rc
    print(f"eval exited {rc}; samples in {out / 'soak.jsonl'}; plot {plot(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
