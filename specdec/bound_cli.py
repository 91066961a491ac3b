"""`adafuse bound`: verifiers against the optimal acceptance rate α* on real (target, draft) pairs.

1. Collect: for prompts from GSM8K, NQ-open and WMT22 de-en, the target continues each prompt
   greedily for `--positions` tokens; then target and draft each score prompt + continuation in one
   forward. The next-token logits at every continuation position are cached per prompt under
   `--cache_dir` (shifted so the max logit is 0, stored as fp16 by default), so re-reporting with other
   n / temperatures / verifiers is instant.
2. Measure: for every n and temperature, average over positions α* per scheme (with / without /
   greedy) and each verifier's expected acceptance (exact except rrs-without: Monte Carlo, with a
   standard error), computed on the cached distributions in float64.
3. Report: a markdown table (printed), `bound.json` and `bound.png` in `--output_dir`.

Cost on a 2-core CPU at V = 151,936: collection is model-bound (the 1.5B target ~2 min per prompt of
16 positions); measuring took ~1-10 s per position and temperature, dominated by α*(without), so
the defaults (64 × 32 positions, 3 temperatures) took hours and `--num_prompts 8 --positions 16`
~30 min in all. α*(without) is now ~10× faster (docs/results/bound_speed.md); the verifiers'
expected acceptances were not re-timed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from runtime.errors import ConfigError, TokenizerMismatchError
from runtime.files import write_text_atomic
from specdec.acceptance import expected_acceptance
from specdec.bound import optimal_acceptance
from specdec.bound_journal import MeasureJournal, load_record, save_record, settings_key
from specdec.drafts import SCHEMES
from specdec.verifiers import METHOD_SCHEMES

DEFAULT_METHODS = ("rrs", "k-seq", "rrs-without", "spechub", "greedy")
DATASETS = ("gsm8k", "nq_open", "wmt22")


# ---- arguments ---------------------------------------------------------------------------------
def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _temperatures(text: str) -> list[float]:
    """Comma-separated temperatures, each a finite number > 0 (argparse turns the error into one line)."""
    try:
        values = _floats(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers, e.g. 0.5,0.7,1.0") from None
    bad = [v for v in values if not (math.isfinite(v) and v > 0)]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"temperatures must be finite numbers > 0, got {text!r} (e.g. 0.5,0.7,1.0)")
    return values


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `adafuse bound` flags."""
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="target model (registry name, folder or hub id)")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model sharing the target's tokenizer")
    parser.add_argument("--dtype", default="float32", help="model dtype for collection (float32 | bfloat16)")
    parser.add_argument("--num_prompts", type=int, default=64, help="prompts in total, split over the three datasets")
    parser.add_argument("--positions", type=int, default=32, help="continuation positions per prompt")
    parser.add_argument("--data_dir", default=None, help="folder with gsm8k/, nq_open/, wmt22/ (default $ADAFUSE_DATA or ../shared/data)")
    parser.add_argument("--output_dir", default="runs/bound", help="where bound.md, bound.json and bound.png go")
    parser.add_argument("--cache_dir", default=None, help="logit cache (default OUTPUT_DIR/cache)")
    parser.add_argument("--cache_dtype", default="float16", choices=["float16", "float32"], help="stored logit precision")
    parser.add_argument("--ns", type=_ints, default=[2, 3, 4, 8], help="comma-separated numbers of drafts")
    parser.add_argument("--temperatures", type=_temperatures, default=[0.5, 0.7, 1.0], help="comma-separated temperatures")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="comma-separated verifiers")
    parser.add_argument("--num_samples", type=int, default=1024, help="Monte Carlo draft tuples per position (rrs-without)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads while measuring (many small ops: 1 avoids oversubscription)")
    parser.add_argument("--source", default="models", choices=["models", "fake"],
                        help="'fake': synthetic logit pairs (no models), for smoke tests")
    parser.add_argument("--fake_vocab", type=int, default=4096, help="vocabulary of --source fake")


# ---- data --------------------------------------------------------------------------------------
def data_dir(arg: str | None) -> Path:
    """--data_dir, else $ADAFUSE_DATA, else ../shared/data relative to the current directory."""
    path = Path(arg or os.environ.get("ADAFUSE_DATA") or "../shared/data")
    if not (path / "gsm8k").is_dir():
        raise ConfigError(f"no benchmark data at {path}: pass --data_dir DIR (or set ADAFUSE_DATA) to the folder holding gsm8k/, nq_open/, wmt22/")
    return path


def load_prompts(root: Path, total: int) -> list[tuple[str, str]]:
    """(dataset, prompt text) pairs: the first prompts of each dataset, split as evenly as possible."""
    per = [total // 3 + (1 if i < total % 3 else 0) for i in range(3)]
    out: list[tuple[str, str]] = []
    with open(root / "gsm8k" / "test.jsonl") as f:
        for line, _ in zip(f, range(per[0])):
            q = json.loads(line)["question"]
            out.append(("gsm8k", f"Solve the problem step by step. End with 'The answer is N'.\n\n{q}"))
    with open(root / "nq_open" / "dev.jsonl") as f:
        for line, _ in zip(f, range(per[1])):
            q = json.loads(line)["question"]
            out.append(("nq_open", f"Answer the question with a short answer.\nQuestion: {q}?"))
    with open(root / "wmt22" / "de-en.src") as f:
        for line, _ in zip(f, range(per[2])):
            out.append(("wmt22", f"Translate the following German text into English.\n\n{line.strip()}"))
    return out


@dataclass
class PromptLogits:
    """Next-token logits of target and draft at each continuation position of one prompt."""

    dataset: str
    target_logits: torch.Tensor  # [L, V], max-shifted
    draft_logits: torch.Tensor  # [L, V], max-shifted

    def __repr__(self) -> str:
        return f"PromptLogits({self.dataset}, target={tuple(self.target_logits.shape)}, draft={tuple(self.draft_logits.shape)})"


def _shift(logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    logits = logits.float()
    return (logits - logits.max(-1, keepdim=True).values).to(dtype)


def _cache_key(args, dataset: str, text: str) -> str:
    raw = json.dumps([args.target, args.draft, args.dtype, args.positions, args.cache_dtype, dataset, text])
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def _score(member, prompt_ids: list[int], continuation: list[int]) -> torch.Tensor:
    """Next-token logits [L, V] at each continuation position: one prefill + one forward."""
    state = member.start([prompt_ids])
    first = state.last_logits[0:1].float().clone()  # append() updates last_logits in place
    if len(continuation) > 1:
        rest = state.append([continuation[:-1]])[0, : len(continuation) - 1].float()
        return torch.cat([first, rest])
    return first


@torch.no_grad()
def collect(args, prompts: list[tuple[str, str]], cache: Path) -> list[PromptLogits]:
    """Load cached prompts; for the missing ones run target (generate + score), then draft (score).

    Models are loaded one at a time (target first) and only when something is missing. Each prompt's
    target half is saved as it finishes (`KEY.target.pt`), the whole record when the draft has scored
    it (`KEY.pt`), both atomically: a killed collection resumes at the prompt in flight, and an
    unreadable cache file is computed again (`specdec.bound_journal`)."""
    from tqdm import tqdm

    cache.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.cache_dtype)
    keys = [_cache_key(args, d, t) for d, t in prompts]
    records: dict[int, dict] = {}
    for i, key in enumerate(keys):
        if (cache / f"{key}.pt").exists() and (rec := load_record(cache / f"{key}.pt")) is not None:
            records[i] = rec
    halves: dict[int, dict] = {}
    for i, key in enumerate(keys):
        if i not in records and (cache / f"{key}.target.pt").exists():
            if (rec := load_record(cache / f"{key}.target.pt", needs_draft=False)) is not None:
                halves[i] = rec
    todo = [i for i in range(len(keys)) if i not in records and i not in halves]
    if todo:
        from runtime.loader import load as load_member

        target = load_member(args.target, dtype=args.dtype)
        for i in tqdm(todo, desc=f"target {args.target}", unit="prompt", file=sys.stderr):
            dataset, text = prompts[i]
            ids = target.encode_prompt(text)
            state = target.start([ids])
            cont: list[int] = []
            for _ in range(args.positions):
                tok = int(state.last_logits[0].argmax())
                cont.append(tok)
                if tok in target.eos_token_ids:
                    break
                state.append([[tok]], return_logits=False)
            del state
            halves[i] = {"dataset": dataset, "text": text, "prompt_ids": ids, "continuation": cont,
                         "target_logits": _shift(_score(target, ids, cont), dtype), "vocab": target.vocab_size}
            save_record(cache / f"{keys[i]}.target.pt", halves[i])
        del target
    if halves:
        from runtime.loader import load as load_member

        draft = load_member(args.draft, dtype=args.dtype)
        vocab = next(iter(halves.values())).get("vocab", draft.vocab_size)
        if draft.vocab_size != vocab:
            raise TokenizerMismatchError(f"draft vocab {draft.vocab_size} != target vocab {vocab}: they must share a tokenizer")
        for i in tqdm(sorted(halves), desc=f"draft {args.draft}", unit="prompt", file=sys.stderr):
            rec = halves[i]
            rec["draft_logits"] = _shift(_score(draft, rec["prompt_ids"], rec["continuation"]), dtype)
            save_record(cache / f"{keys[i]}.pt", rec)
            (cache / f"{keys[i]}.target.pt").unlink(missing_ok=True)
            records[i] = rec
        del draft
    return [PromptLogits(records[i]["dataset"], records[i]["target_logits"], records[i]["draft_logits"])
            for i in range(len(keys))]


def fake_pairs(num_prompts: int, positions: int, vocab: int, seed: int) -> list[PromptLogits]:
    """Synthetic LLM-like logit pairs: a shared Gaussian base plus noise, a few peaked positions."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num_prompts):
        base = torch.randn(positions, vocab, generator=g) * 3.0
        peak = torch.randint(0, vocab, (positions,), generator=g)
        base[torch.arange(positions), peak] += torch.rand(positions, generator=g) * 12
        target = base + torch.randn(positions, vocab, generator=g) * 0.8
        draft = base + torch.randn(positions, vocab, generator=g) * 0.8
        out.append(PromptLogits(DATASETS[i % 3], _shift(target, torch.float32), _shift(draft, torch.float32)))
    return out


def positions_of(prompts: Iterable[PromptLogits]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(target logits [V], draft logits [V]) at every cached position, prompt by prompt."""
    for rec in prompts:
        for j in range(rec.target_logits.shape[0]):
            yield rec.target_logits[j], rec.draft_logits[j]


# ---- measurement -------------------------------------------------------------------------------
def probs_at(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float64 (the distributions α* and the acceptances are measured on)."""
    return torch.softmax(logits.to(torch.float64) / temperature, dim=-1)


def measure_position(p: torch.Tensor, q: torch.Tensor, ns: list[int], methods: list[str], num_samples: int,
                     generator: torch.Generator) -> tuple[dict[str, float], dict[str, list[float]]]:
    """At one position: α* per "n|scheme", and [estimate, variance] per "n|method" (n up to q's support)."""
    support = int((q > 0).sum())
    alpha: dict[str, float] = {}
    est: dict[str, list[float]] = {}
    for n in ns:
        if n > support:
            continue
        for scheme in SCHEMES:
            alpha[f"{n}|{scheme}"] = optimal_acceptance(p, q, n, scheme)
        for method in methods:
            if method == "spechub" and n != 2:
                continue
            e = expected_acceptance(p, q, n, METHOD_SCHEMES[method][0], method, num_samples=num_samples,
                                    generator=generator)
            est[f"{n}|{method}"] = [e.value, e.stderr ** 2]
    return alpha, est


def measure(pairs: list[tuple[torch.Tensor, torch.Tensor]], ns: list[int], temperatures: list[float],
            methods: list[str], num_samples: int = 1024, seed: int = 0, progress: bool = True,
            journal: MeasureJournal | None = None) -> list[dict]:
    """Mean α* per scheme and mean expected acceptance per verifier, for every (T, n). Position j at
    temperature index t draws its Monte Carlo samples from its own generator (seeded by seed, t, j),
    so a run resumed from `journal` (positions already measured are read back, new ones appended)
    gives the same rows as an uninterrupted one.

    Returns rows {temperature, n, method, scheme, acceptance, stderr, alpha_star, gap, gap_pct,
    positions}; method "alpha*" rows carry the bound alone."""
    from tqdm import tqdm

    sums: dict[tuple, list[float]] = {}
    total = len(pairs) * len(temperatures)
    done = journal.done if journal is not None else {}
    bar = tqdm(total=total, initial=len(done), desc="measure", unit="pos", file=sys.stderr, disable=not progress)
    for t, temperature in enumerate(temperatures):
        for j, (t_logits, d_logits) in enumerate(pairs):
            entry = done.get((t, j))
            if entry is None:
                gen = torch.Generator().manual_seed((seed * 1_000_003 + t) * 1_000_003 + j)
                alpha, est = measure_position(probs_at(t_logits, temperature), probs_at(d_logits, temperature),
                                              ns, methods, num_samples, gen)
                if journal is not None:
                    journal.add(t, j, alpha, est)
                bar.update(1)
            else:
                alpha, est = entry["alpha"], entry["est"]
            for key, a in alpha.items():
                n, scheme = key.split("|")
                sums.setdefault((temperature, int(n), "alpha*", scheme), []).append(a)
            for key, (value, var) in est.items():
                n, method = key.split("|")
                scheme = METHOD_SCHEMES[method][0]
                sums.setdefault((temperature, int(n), method, scheme), []).append(value)
                sums.setdefault((temperature, int(n), method, scheme, "var"), []).append(var)
    bar.close()
    rows = []
    for key, values in sums.items():
        if len(key) == 5:
            continue
        temperature, n, method, scheme = key
        mean = sum(values) / len(values)
        bound = sum(sums[(temperature, n, "alpha*", scheme)]) / len(values)
        var = sums.get(key + ("var",))
        # standard error of the mean over positions, plus the Monte Carlo error when present
        spread = torch.tensor(values, dtype=torch.float64)
        se = float(spread.std(unbiased=True) / math.sqrt(len(values))) if len(values) > 1 else 0.0
        mc = math.sqrt(sum(var)) / len(values) if var else 0.0
        rows.append({
            "temperature": temperature, "n": n, "method": method, "scheme": scheme, "positions": len(values),
            "acceptance": mean, "stderr_mc": mc, "stderr_positions": se, "alpha_star": bound,
            "gap": bound - mean, "gap_pct": 100.0 * (bound - mean) / bound if bound > 0 else 0.0,
        })
    rows.sort(key=lambda r: (r["temperature"], r["n"], r["method"] != "alpha*", r["scheme"], r["method"]))
    return rows


# ---- report ------------------------------------------------------------------------------------
def format_table(rows: list[dict], temperature: float | None = None) -> str:
    """Markdown table: one line per (T, n, verifier) with its scheme's α* and the gap."""
    lines = ["| T | n | verifier | scheme | acceptance | α*(scheme) | gap | gap % |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if temperature is not None and r["temperature"] != temperature:
            continue
        if r["method"] == "alpha*":
            lines.append(f"| {r['temperature']:g} | {r['n']} | **α\\*** | {r['scheme']} | | {r['alpha_star']:.4f} | | |")
            continue
        acc = f"{r['acceptance']:.4f}"
        if r["stderr_mc"] > 0:
            acc += f" ± {r['stderr_mc']:.4f} (MC)"
        lines.append(f"| {r['temperature']:g} | {r['n']} | {r['method']} | {r['scheme']} | {acc} | "
                     f"{r['alpha_star']:.4f} | {r['gap']:.4f} | {r['gap_pct']:.2f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Acceptance vs n, one panel per temperature, one line per verifier, α* per scheme dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(5 * len(temps), 4), squeeze=False)
    colors = {"with": "tab:blue", "without": "tab:green", "greedy": "tab:red"}
    for ax, temp in zip(axes[0], temps):
        sub = [r for r in rows if r["temperature"] == temp]
        for scheme in SCHEMES:
            pts = sorted((r["n"], r["alpha_star"]) for r in sub if r["method"] == "alpha*" and r["scheme"] == scheme)
            if pts:
                ax.plot(*zip(*pts), linestyle="--", color=colors[scheme], label=f"α* {scheme}")
        for method in sorted({r["method"] for r in sub} - {"alpha*"}):
            pts = sorted((r["n"], r["acceptance"]) for r in sub if r["method"] == method)
            scheme = METHOD_SCHEMES[method][0]
            ax.plot(*zip(*pts), marker="o", color=colors[scheme], alpha=0.8,
                    linestyle={"rrs": "-", "k-seq": ":", "rrs-without": "-", "spechub": "-.", "greedy": "-"}.get(method, "-"),
                    label=method)
        ax.set_title(f"T = {temp:g}")
        ax.set_xlabel("n drafts")
        ax.set_ylabel("acceptance")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> int:
    """Collect (or load), measure and report; ConfigError on bad flags or a missing data folder."""
    methods = [m.strip().replace("_", "-") for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHOD_SCHEMES or m == "lp-optimal"]
    if unknown:
        raise ConfigError(f"unknown or unsupported verifiers {unknown}; choose from {DEFAULT_METHODS}")
    if args.num_prompts < 1 or args.positions < 1:
        raise ConfigError("--num_prompts and --positions must be positive")
    out_dir = Path(args.output_dir)  # (made once there is something to write: bad input leaves no folder)
    t0 = time.perf_counter()
    if args.source == "fake":
        prompts = fake_pairs(args.num_prompts, args.positions, args.fake_vocab, args.seed)
    else:
        root = data_dir(args.data_dir)
        cache = Path(args.cache_dir) if args.cache_dir else out_dir / "cache"
        prompts = collect(args, load_prompts(root, args.num_prompts), cache)
    pairs = list(positions_of(prompts))
    out_dir.mkdir(parents=True, exist_ok=True)
    t1 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, args.threads))
    settings = {k: getattr(args, k) for k in ("source", "data_dir", "target", "draft", "dtype", "num_prompts", "positions",
                                              "cache_dtype", "fake_vocab", "ns", "temperatures", "num_samples", "seed")}
    journal = MeasureJournal(out_dir / "measure.jsonl", settings_key({**settings, "methods": methods,
                                                                       "num_positions": len(pairs)}))
    try:
        rows = measure(pairs, args.ns, args.temperatures, methods, args.num_samples, args.seed, journal=journal)
    finally:
        journal.close()
        torch.set_num_threads(threads)
    t2 = time.perf_counter()
    table = format_table(rows)
    print(table)
    write_text_atomic(out_dir / "bound.md", table + "\n")
    meta = {"target": args.target, "draft": args.draft, "source": args.source, "num_prompts": len(prompts),
            "positions": len(pairs), "ns": args.ns, "temperatures": args.temperatures, "methods": methods,
            "num_samples": args.num_samples, "seed": args.seed, "cache_dtype": args.cache_dtype,
            "collect_s": round(t1 - t0, 2), "measure_s": round(t2 - t1, 2),
            "exactness": "alpha* exact (without: quadrature, |err| ~1e-9); rrs, k-seq, spechub, greedy exact "
                         "closed forms; rrs-without Monte Carlo (stderr_mc)"}
    write_text_atomic(out_dir / "bound.json", json.dumps({"meta": meta, "rows": rows}, indent=1))
    plot(rows, out_dir / "bound.png")
    print(f"\n{len(pairs)} positions; wrote {out_dir / 'bound.md'}, bound.json, bound.png "
          f"(collect {t1 - t0:.1f}s, measure {t2 - t1:.1f}s)", file=sys.stderr)
    return 0
