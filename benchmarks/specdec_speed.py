"""Speed of lossless speculative decoding on the real Qwen pair, against transformers.

Target qwen2.5-coder-1.5b (fp32 or bf16), GSM8K and WMT22 de-en prompts through the chat template,
temperature 0 and 0.7 (top-k/top-p off, repetition penalty off), batch size 1, all in ONE process.
Methods (per prompt, every method runs back to back, so load changes on a shared machine hit them
alike):

  hf-plain        transformers `model.generate` (greedy / sampling)
  hf-assisted     transformers assisted generation with the 0.5B as assistant
  hf-assisted16 / hf-assisted8   the same with the assistant's linear layers in float16 / int8 (the
                  drafter our ours-model16 / ours-model8 use)
  hf-plain-packed / hf-assisted-packed   the same after `pack_linear_weights` (the kernels ours use)
  ours-plain      our engine without a drafter (the same loop, one token per forward)
  ours-model:S:N:K[:STOP]  our engine, 0.5B drafter, scheme S, N drafts per node, depth K, stop
                       expanding where the drafter's top probability < STOP (dynamic length)
  ours-lookup:N:K      our engine, prompt lookup, up to N continuations of up to K tokens
  ours-hybrid:S:N:K    lookup when it finds a >= 2-token continuation, else the 0.5B (S, N, K)
  ours-model8 / ours-hybrid8   the same with the drafter's linear layers (and LM head) in int8
  ours-model16 / ours-hybrid16 the same with the drafter's linear layers (and LM head) stored in float16
                       (float32 activations; `specdec.model_drafter.quantize_drafter`)

A --drafter with another tokenizer than the target's (e.g. smollm2-135m for a Qwen target) drafts
through text in our methods (`specdec.text_drafter.TextDrafter`, picked by the engine), and
hf-assisted becomes transformers' universal assisted generation with the same assistant and both
tokenizers.

Reported per (temperature, method): new tokens/s and its ratio to hf-plain and to hf-assisted,
block efficiency (tokens per target forward), mean acceptance, peak RSS sampled while the method ran,
and at temperature 0 the share of prompts whose text equals hf-plain's (greedy agreement).

Full spec:   python benchmarks/specdec_speed.py --prompts 16 --max_new_tokens 128 --output runs/speed.json
Reduced run: python benchmarks/specdec_speed.py --prompts 3 --max_new_tokens 64

With --output OUT.json each timed row is appended to OUT.jsonl as it finishes (first line: the
settings and the CPU), and a rerun of the same command resumes: rows already there are not run
again. A journal from other settings or another CPU is refused (exit 2): its times would not
compare with this machine's.

Measured here (2026-11-30, idle 2-core AVX2 AMD EPYC, fp32, 4 GSM8K + 4 WMT22 de-en prompts x up to 128
new tokens; docs/results/specdec/speed_fp32.md has the command and the table):

    | T | method | tok/s | x hf-plain | block eff. | greedy agree |
    |---|---|---|---|---|---|
    | 0 | hf-plain | 2.34 | 1.00 | - | 8/8 |
    | 0 | hf-assisted | 1.86 | 0.79 | - | 8/8 |
    | 0 | hf-plain-packed | 3.62 | 1.54 | - | 8/8 |
    | 0 | ours-plain | 3.44 | 1.47 | 1.00 | 8/8 |
    | 0 | ours-model:greedy:1:8:0.4 | 3.91 | 1.67 | 4.57 | 8/8 |
    | 0 | ours-lookup:1:8:2:2 | 3.75 | 1.60 | 1.21 | 8/8 |
    | 0 | ours-hybrid:greedy:1:8:0.4 | 3.96 | 1.69 | 3.93 | 8/8 |
    | 0.7 | hf-plain | 2.57 | 1.00 | - | - |
    | 0.7 | hf-assisted | 2.44 | 0.95 | - | - |
    | 0.7 | hf-plain-packed | 3.62 | 1.41 | - | - |
    | 0.7 | ours-plain | 3.75 | 1.46 | 1.00 | - |
    | 0.7 | ours-model:greedy:1:8:0.4 | 3.98 | 1.55 | 4.41 | - |
    | 0.7 | ours-lookup:1:8:2:2 | 4.09 | 1.59 | 1.18 | - |
    | 0.7 | ours-hybrid:greedy:1:8:0.4 | 3.59 | 1.40 | 3.65 | - |

What limits it: most of the gain is the packed weights (`runtime.packed_linear`): transformers' own
generate on the packed model is already 1.54x / 1.41x. Speculation adds 1.06-1.15x on top: a target
forward over 6-9 tokens costs only ~1.3-1.5x a one-token forward once packed, but each 0.5B drafter
forward costs ~0.32x a target forward (~107 ms vs ~335 ms), so a round drafting ~5.5 tokens for ~4.5
accepted costs ~3x a plain step. Wider trees (2 drafts per node) lose outright: 1.2-1.7 tok/s in a
2+2-prompt trial. Peak RSS counts the file-backed pages of the mmapped checkpoint touched while packing
(reclaimable page cache, not a second copy of the weights). bfloat16: see speed_bf16.md (this CPU
has no AVX512-BF16/AMX, so a bf16 forward over k tokens costs ~k one-token forwards; speculation
cannot pay there).
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import torch

DATA = Path(os.environ.get("ADAFUSE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
DEFAULT_METHODS = ["hf-plain", "hf-assisted", "ours-plain", "ours-model:greedy:1:3", "ours-model8:greedy:1:3",
                   "ours-lookup:1:8:2:2", "ours-hybrid8:greedy:1:3"]


def load_prompts(n: int) -> list[tuple[str, str]]:
    gsm = [json.loads(line)["question"] for line in (DATA / "gsm8k" / "test.jsonl").open()][:n]
    de = [line.strip() for line in (DATA / "wmt22" / "de-en.src").open()][:n]
    return ([("gsm8k", q) for q in gsm]
            + [("wmt22-de-en", f"Translate the following German text into English.\n\nGerman: {s}\nEnglish:")
               for s in de])


class PeakRSS:
    """Peak resident set size of this process while the block runs (sampled every 50 ms)."""

    def __enter__(self):
        import psutil

        self.proc = psutil.Process()
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def hf_generate(target, assistant, ids: list[int], max_new: int, temperature: float, seed: int):
    """(text, new tokens) with transformers' own generate; with an `assistant` of another tokenizer,
    its universal assisted generation (both tokenizers given; at T > 0 on a copy of the assistant,
    since transformers prunes the assistant's LM head in place there)."""
    torch.manual_seed(seed)
    x = torch.tensor([ids])
    kw = dict(max_new_tokens=max_new, attention_mask=torch.ones_like(x), repetition_penalty=1.0,
              eos_token_id=sorted(target.eos_token_ids), pad_token_id=sorted(target.eos_token_ids)[0])
    if temperature > 0:
        kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    if assistant is not None:
        kw.update(hf_assistant(target, assistant, temperature))
    out = target.model.generate(x, **kw)[0, len(ids):].tolist()
    cut = next((i for i, t in enumerate(out) if t in target.eos_token_ids), None)
    n = len(out)
    text = target.decode(out[:cut] if cut is not None else out)
    return text, n


_HF_COPY = {}


def hf_assistant(target, assistant, temperature: float) -> dict:
    """transformers' keywords for `assistant` (another tokenizer: both tokenizers too)."""
    from specdec.model_drafter import same_tokenizer

    if same_tokenizer(target, assistant):
        return dict(assistant_model=assistant.model)
    model = assistant.model
    if temperature > 0:
        import copy

        model = _HF_COPY.setdefault(id(assistant), copy.deepcopy(assistant.model))
    return dict(assistant_model=model, tokenizer=target.tokenizer, assistant_tokenizer=assistant.tokenizer)


_QUANTIZED = {}  # "8" / "16" -> the drafter quantized to int8 / fp16


def parse_method(spec: str, target, drafter_member):
    """ours-plain | ours-model[8|16]:S:N:K[:STOP] | ours-lookup:N:K[:NGRAM_MIN:MIN_LEN] | ours-hybrid[8|16]:S:N:K[:STOP]
    (a trailing 8 / 16: the drafter's linear layers in int8 / float16; STOP: the drafter's `stop_below`)."""
    from specdec.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter
    from specdec.engine import SpeculativeGenerator

    kind, *rest = spec.split(":")
    member = drafter_member
    bits = _quant_suffix(kind)
    if bits:
        member, kind = _QUANTIZED[bits], kind[:-len(bits)]
    if kind == "ours-plain":
        return SpeculativeGenerator(target, None)
    stop = float(rest[3]) if len(rest) > 3 else 0.0
    if kind == "ours-model":
        scheme, n, k = rest[:3]
        return SpeculativeGenerator(target, ModelDrafter(member, stop_below=stop), scheme=scheme, num_drafts=int(n),
                                    depth=int(k))
    if kind == "ours-lookup":
        n, k, *gate = rest
        ng_min, min_len = (int(gate[0]), int(gate[1])) if gate else (1, 1)
        look = PromptLookupDrafter(ngram_max=max(3, ng_min), ngram_min=ng_min, min_length=min_len)
        return SpeculativeGenerator(target, look, num_drafts=int(n), depth=int(k))
    if kind == "ours-hybrid":
        scheme, n, k = rest[:3]
        return SpeculativeGenerator(target, HybridDrafter(ModelDrafter(member, stop_below=stop)), scheme=scheme,
                                    num_drafts=int(n), depth=int(k))
    raise SystemExit(f"unknown method {spec!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--drafter", default="qwen2.5-coder-0.5b")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per dataset (GSM8K and WMT22 de-en)")
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"],
                    help="auto: the fast one on this CPU, measured (adafuse models dtype)")
    ap.add_argument("--drafter_dtype", default=None, help="default: --dtype")
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--no_pack", action="store_true", help="run ours on the unpacked (transformers) weights")
    ap.add_argument("--output", default=None, help="write per-prompt rows and the summary as JSON")
    args = ap.parse_args(argv)
    journal = Journal.open(Path(args.output).with_suffix(".jsonl"), journal_header(args)) if args.output else None
    if isinstance(journal, str):
        print(journal)
        return 2

    from runtime.loader import load as load_member

    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m for m in args.methods.split(",") if m]
    temps = [float(t) for t in args.temperatures.split(",")]
    need_drafter = any(m.startswith(("hf-assisted", "ours-model", "ours-hybrid")) for m in methods)
    # transformers' own generate runs on the models as transformers loads them; ours on the same
    # models after `pack_linear_weights` (float32 CPU only), so HF methods run first for every prompt.
    target = load_member(args.target, dtype=args.dtype, pack_weights=False)
    drafter = (load_member(args.drafter, dtype=args.drafter_dtype or args.dtype, pack_weights=False)
               if need_drafter else None)
    prompts = load_prompts(args.prompts)
    print(f"# target {args.target} {args.dtype}, drafter {args.drafter} {args.drafter_dtype or args.dtype}, "
          f"{len(prompts)} prompts x {args.max_new_tokens} tokens, T={temps}, threads={torch.get_num_threads()}",
          flush=True)
    hf_methods = [m for m in methods if m.startswith("hf-") and not m.endswith("-packed")]
    our_methods = [m for m in methods if m not in hf_methods]
    if drafter is not None and "hf-assisted" in hf_methods and any(t > 0 for t in temps):
        hf_assistant(target, drafter, 1.0)  # (a copy for transformers to prune, made before any timing)
    _QUANTIZED.update(quantize_if_needed(methods, drafter))
    rows = run_methods(hf_methods, target, drafter, prompts, temps, args, {}, journal)
    if not args.no_pack:
        from runtime.packed_linear import pack_linear_weights

        for m in (target, drafter):
            if m is not None:
                pack_linear_weights(m.model)
    gens = {m: parse_method(m, target, drafter) for m in our_methods if m.startswith("ours")}
    rows += run_methods(our_methods, target, drafter, prompts, temps, args, gens, journal)
    summary = summarize(rows, methods, temps)
    print(summary)
    if args.output:
        out = Path(args.output)
        out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
        cmd = "python benchmarks/specdec_speed.py " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
        out.with_suffix(".md").write_text(f"# {out.stem}\n\n    {cmd}\n{summary}\n")
    return 0


def _quant_suffix(kind: str) -> str:
    """'16' for ours-model16 / ours-hybrid16 / hf-assisted16, '8' for ...8, else ''."""
    return "16" if kind.endswith("16") else "8" if kind.endswith("8") else ""


def quantize_if_needed(methods, drafter) -> dict:
    """The quantized drafters the methods name, made from the unpacked float32 weights (before packing)."""
    from specdec.drafters import quantize_drafter

    wanted = {_quant_suffix(m.split(":")[0]) for m in methods} - {""}
    return {bits: quantize_drafter(drafter, {"8": "int8", "16": "fp16"}[bits]) for bits in sorted(wanted)}


JOURNAL_KEYS = ("target", "drafter", "prompts", "max_new_tokens", "dtype", "drafter_dtype", "seed", "threads", "no_pack")


def journal_header(args) -> dict:
    """What a resumed run must share with the journal it continues: the settings that change a
    row's text or time, and the CPU."""
    from runtime.dtype_choice import cpu_name

    return {"settings": {k: getattr(args, k) for k in JOURNAL_KEYS}, "cpu": cpu_name(),
            "omp_threads": os.environ.get("OMP_NUM_THREADS")}


class Journal:
    """Timed rows, one JSON line each, appended as they finish; `done` maps (temperature, task,
    prompt, method) to the rows of an earlier run of the same settings on the same CPU."""

    def __init__(self, path: Path, done: dict):
        from runtime.files import append_line

        self.path, self.done, self._append = path, done, append_line
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @classmethod
    def open(cls, path: Path, header: dict) -> "Journal | str":
        """The journal at `path` (created with `header` as its first line), or a one-line error
        when it holds another run's rows."""
        done = {}
        if path.exists() and path.stat().st_size:
            lines = path.read_text().splitlines()
            try:
                old = json.loads(lines[0])
            except ValueError:
                return f"error: {path} does not start with a journal header; pass another --output or delete it"
            if old != header:
                diff = sorted(k for k in set(old) | set(header) if old.get(k) != header.get(k))
                return (f"error: {path} holds a run with other {', '.join(diff)} ({old.get('cpu')}); "
                        "pass another --output or delete it")
            for line in lines[1:]:
                try:
                    row = json.loads(line)
                except ValueError:  # a torn last line from a kill: that row runs again
                    continue
                done[(row["temperature"], row["task"], row["prompt"], row["method"])] = row
            journal = cls(path, done)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            journal = cls(path, done)
            journal.write(header)
        if done:
            print(f"# resuming: {len(done)} rows from {path}", flush=True)
        return journal

    def write(self, row: dict) -> None:
        self._append(self.fd, json.dumps(row) + "\n", self.path)


def run_methods(methods, target, drafter, prompts, temps, args, gens, journal: Journal | None = None) -> list[dict]:
    rows = []
    for temp in temps:
        for i, (task, prompt) in enumerate(prompts):
            ids = target.encode_prompt(prompt)
            for m in methods:
                if journal is not None and (temp, task, i, m) in journal.done:
                    rows.append(journal.done[(temp, task, i, m)])
                    continue
                error = None
                with PeakRSS() as rss:
                    t0 = time.perf_counter()
                    stats = {}
                    if m.startswith("hf-assisted"):
                        try:  # transformers' universal assisted generation can crash on a prompt (a bug of its own)
                            assistant = _QUANTIZED.get(_quant_suffix(m.split(":")[0]), drafter)
                            text, n = hf_generate(target, assistant, ids, args.max_new_tokens, temp, args.seed + i)
                        except RuntimeError as e:
                            text, n, error = None, 0, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                    elif m.startswith("hf-"):
                        text, n = hf_generate(target, None, ids, args.max_new_tokens, temp, args.seed + i)
                    else:
                        out = gens[m].generate([prompt], max_new_tokens=args.max_new_tokens, temperature=temp,
                                               seed=args.seed + i)[0]
                        text, n, stats = out.text, out.num_tokens, out.stats
                    wall = time.perf_counter() - t0
                row = dict(temperature=temp, task=task, prompt=i, method=m, tokens=n, wall_s=wall,
                           tok_s=n / wall, peak_rss_gb=rss.peak / 2 ** 30, text=text,
                           block_efficiency=stats.get("block_efficiency"),
                           acceptance=stats.get("acceptance_by_depth"), target_forwards=stats.get("target_forwards"))
                if error:
                    row["error"] = error
                rows.append(row)
                if journal is not None:
                    journal.write(row)
                print(f"T={temp} {task}#{i} {m:26s} {n:4d} tok {wall:7.1f}s {n / wall:6.2f} tok/s"
                      + (f"  BE {row['block_efficiency']:.2f}" if row["block_efficiency"] else "")
                      + (f"  FAILED {error}" if error else ""), flush=True)
    return rows


def summarize(rows, methods, temps) -> str:
    """The per-(T, method) table. A prompt where transformers' assisted generation crashed (`error` in its
    row) counts for no method's tok/s in the x hf-assisted column: that ratio is over the prompts it
    completed, the same prompts for both sides; a footnote names the crashes."""
    assist_name = _assist_baseline(methods)
    lines = ["", f"| T | method | tokens | tok/s | x hf-plain | x {assist_name or 'hf-assisted'} | block eff. | accept d1 "
             "| peak RSS GB | greedy agree |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for temp in temps:
        at_t = [r for r in rows if r["temperature"] == temp]
        failed = {(r["task"], r["prompt"]) for r in at_t if r.get("error")}
        agg = {}
        for m in methods:
            rs = [r for r in at_t if r["method"] == m and not r.get("error")]
            both = [r for r in rs if (r["task"], r["prompt"]) not in failed]
            agg[m] = (rs, _tok_s(rs), _tok_s(both))
        base = agg.get("hf-plain", (None, None))[1]
        assist = agg.get(assist_name, (None, None, None))[2]
        plain_text = {(r["task"], r["prompt"]): r["text"] for r in agg.get("hf-plain", ([],))[0]}
        for m in methods:
            rs, tps, tps_both = agg[m]
            be = [r["block_efficiency"] for r in rs if r["block_efficiency"]]
            acc = [r["acceptance"][0] for r in rs if r["acceptance"]]
            agree = "-"
            if temp == 0 and plain_text:
                same = sum(plain_text.get((r["task"], r["prompt"])) == r["text"] for r in rs)
                agree = f"{same}/{len(rs)}"
            toks = sum(r["tokens"] for r in rs)
            lines.append(f"| {temp:g} | {m} | {toks} | {tps:.2f} | " + (f"{tps / base:.2f} | " if base else "- | "))
            lines[-1] += (f"{tps_both / assist:.2f} | " if assist else "- | ")
            lines[-1] += (f"{sum(be) / len(be):.2f} | " if be else "- | ")
            lines[-1] += (f"{sum(acc) / len(acc):.2f} | " if acc else "- | ")
            lines[-1] += f"{max((r['peak_rss_gb'] for r in rs), default=0):.1f} | {agree} |"
        for r in at_t:
            if r.get("error"):
                notes.append(f"- T = {temp:g}: {r['method']} crashed on {r['task']}#{r['prompt']} ({r['error']})")
    if notes:
        n_prompts = len({(r["task"], r["prompt"]) for r in rows})
        lines += ["", f"Crashes (transformers' own; of {n_prompts} prompts). The x hf-assisted column compares each "
                  "method with hf-assisted on the prompts hf-assisted completed:"] + notes
    return "\n".join(lines)


def _assist_baseline(methods) -> str | None:
    """The transformers assisted-generation run the x hf-assisted column divides by: `hf-assisted` when run,
    else its quantized-assistant variant (`hf-assisted16` / `hf-assisted8`: the same assistant ours drafts with)."""
    for name in ("hf-assisted", "hf-assisted16", "hf-assisted8"):
        if name in methods:
            return name
    return None


def _tok_s(rs) -> float:
    return sum(r["tokens"] for r in rs) / max(sum(r["wall_s"] for r in rs), 1e-9)


if __name__ == "__main__":
    raise SystemExit(main())
