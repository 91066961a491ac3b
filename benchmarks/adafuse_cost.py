"""Cost of word-level ensembling (AdaFuse) against its members decoding alone, on GSM8K.

Runs, in one process and on the same prompts (GSM8K test questions, k-shot chain-of-thought prompt
built by the `gsm8k` eval task, its stop strings), each member alone (greedy, its own KV cache) and
the ensemble, taking turns batch by batch (so that a drift in the machine's speed hits every run
alike), and prints:

- share of rounds that ensembled, words per round;
- forward passes per output word, per member;
- wall time per output word, ensemble / slowest member alone (the goal is <= 2x), also without the
  time spent in prompt prefill (`Member.start`; each run starts with empty prefix caches);
- where an ensemble's decoding time goes, in units of the slowest member alone's (its "x without
  prefill" split): the time inside each model's forwards, and the rest (Python, tokenisation, fusion);
- at batch 1, the floor a perfect, free drafter for the lead's confident runs would leave (the time
  inside those runs replaced by one lead forward per run; see `add_ratios`);
- accuracy (exact match on the final number) of each run, for orientation only (few questions).

Words are `adafuse.words.count_words` units of the output text. With `--normalisation` it instead
measures, teacher-forced on the gold chain-of-thought answers, how often each score normalisation /
calibration picks the gold next word among the union of the members' candidates (+ the gold word).

    python benchmarks/adafuse_cost.py --limit 20 --max_new_tokens 200 --batch_size 4 \
        --ensembles '[{"lead": 2}, {"lead": 2, "drafters": ["lookup", "lookup", "lookup"]}, {"lead": 0}]' \
        --markdown docs/results/adafuse_cost/gsm8k_20.md
    python benchmarks/adafuse_cost.py --normalisation --limit 8
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_MEMBERS = "smollm2-135m,gemma3-270m,qwen2.5-coder-0.5b"


def gsm8k_prompts(limit: int, shots: int, offset: int = 0):
    """(prompts, docs, task) for the first `limit` test questions after `offset`."""
    from eval.data import resolve_data_dir
    from eval.task import get_task

    task = get_task("gsm8k", num_fewshot=shots)
    docs, fewshot = task.load(resolve_data_dir(None))
    docs = docs[offset: offset + limit]
    return [task.prompt(d, fewshot) for d in docs], docs, task


def accuracy(task, docs, texts) -> float:
    good = 0.0
    for d, t in zip(docs, texts):
        scores, _ = task.score(task.extract(t), d)
        good += scores[task.primary_metric]
    return good / max(len(docs), 1)


def batches(prompts, batch_size):
    return [prompts[i: i + batch_size] for i in range(0, len(prompts), batch_size)]


PREFILL_S = [0.0]  # seconds spent in Member.start (prompt prefill), see `time_prefill`
FORWARD_S: dict[str, float] = {}  # per model name, seconds inside its decoding forwards (prefill excluded)
CONFIDENT_S = [0.0]  # seconds inside the lead's confident runs (`LeadDecoder.advance`), see `time_prefill`


def time_prefill() -> None:
    """Accumulate the wall time of every `Member.start` into PREFILL_S (to report decoding alone), and
    of every model call on a KV state outside prefill into FORWARD_S[model name] (where the time goes),
    and of the lead's confident runs (every forward and line of Python in them) into CONFIDENT_S."""
    from adafuse.methods.word_level import LeadDecoder
    from runtime.kv_state import KVState
    from runtime.member import Member

    start, run_model, advance = Member.start, KVState._run_model, LeadDecoder.advance
    in_prefill = [False]

    def timed(self, prompts_ids, *args, **kwargs):
        t0 = time.perf_counter()
        in_prefill[0] = True
        try:
            return start(self, prompts_ids, *args, **kwargs)
        finally:
            in_prefill[0] = False
            PREFILL_S[0] += time.perf_counter() - t0

    def timed_forward(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return run_model(self, *args, **kwargs)
        finally:
            if not in_prefill[0]:
                name = self.member.name
                FORWARD_S[name] = FORWARD_S.get(name, 0.0) + time.perf_counter() - t0

    def timed_advance(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return advance(self, *args, **kwargs)
        finally:
            CONFIDENT_S[0] += time.perf_counter() - t0

    Member.start = timed
    KVState._run_model = timed_forward
    LeadDecoder.advance = timed_advance


def summarise(name, outs, members, task, docs, wall, prefill=0.0, forward_s=None, confident_s=None):
    from adafuse.words import count_words

    words = sum(count_words(o.text) for o in outs)
    names = [m.name for m in members]  # then any drafter models the runs used
    names += sorted({k for o in outs for k in o.cost.forward_passes} - set(names))
    fwd = {k: sum(o.cost.forward_passes.get(k, 0) for o in outs) for k in names}
    row = {"run": name, "words": words, "wall_s": round(wall, 2), "s_per_word": wall / max(words, 1),
           "prefill_s": round(prefill, 2), "decode_s_per_word": (wall - prefill) / max(words, 1),
           "fwd_per_word": {k: round(v / max(words, 1), 3) for k, v in fwd.items() if v},
           "accuracy": accuracy(task, docs, [o.text for o in outs])}
    if forward_s is not None:  # decoding time inside each model's forwards, and the rest (Python, sampling, ...)
        row["forward_s_per_word"] = {k: round(v / max(words, 1), 4) for k, v in forward_s.items() if v}
        row["other_s_per_word"] = round((wall - prefill - sum(forward_s.values())) / max(words, 1), 4)
    stats = [o.stats for o in outs if o.stats and "rounds" in o.stats]
    if stats:
        rounds = sum(s["rounds"] for s in stats)
        row["ensemble_share"] = round(sum(s["ensemble_rounds"] for s in stats) / max(rounds, 1), 3)
        row["words_per_round"] = round(sum(s["units"] for s in stats) / max(rounds, 1), 3)
        row["rounds"] = rounds
        decisions: dict[str, int] = {}
        for o in outs:
            for r in o.trace or []:
                for g in r.gate:
                    decisions[g["decision"]] = decisions.get(g["decision"], 0) + 1
        row["gate_decisions"] = decisions  # confident / uncertain / forced (after `span` confident words)
        row["confident_runs"] = rounds - sum(s["ensemble_rounds"] for s in stats)  # a round: a run or an ensembled word
        if confident_s is not None:
            row["confident_s"] = round(confident_s, 2)
    return row


def cost_main(args) -> None:
    """Every run (each member alone, then each ensemble variant) decodes the same batches; the runs
    take turns batch by batch, so a slow drift of the machine's speed (other tenants) hits all of
    them alike and the ratios stay comparable. Each run keeps its own prompt-prefix caches, as if it
    ran alone from a cold start."""
    import torch

    from adafuse.ensemble import Ensemble
    from runtime.loader import load as load_member
    from runtime.prefix_cache import PrefixCache

    torch.set_num_threads(args.threads)
    time_prefill()
    prompts, docs, task = gsm8k_prompts(args.limit, args.shots, args.offset)
    stop = list(task.until)
    members = [load_member(n, dtype=args.dtype) for n in args.members.split(",")]
    runs = []  # (name, generate(prompts) -> outputs)
    lead_of: dict[str, str] = {}  # run name -> its lead (a member alone: itself), for the floor
    if not args.skip_alone:
        for m in members:
            runs.append((m.name, lambda ps, m=m: m.generate(ps, max_new_tokens=args.max_new_tokens, stop=stop)))
            lead_of[m.name] = m.name
    knobs = json.loads(args.options) if args.options else {}
    variants = json.loads(args.ensembles) if args.ensembles else [{}]
    base_drafters = [None if d in ("", "none") else d for d in args.drafters.split(",")] if args.drafters else None
    for variant in variants:
        variant = dict(variant)
        lead = variant.pop("lead", args.lead)
        drafters = variant.pop("drafters", base_drafters)
        method = variant.pop("method", args.method)
        name = variant.pop("name", None) or f"{method} lead={members[lead].name}" + (" +drafters" if drafters else "")
        ens = Ensemble(members, method=method, drafters=drafters, lead=lead,
                       **({} if method == "single" else {**knobs, **variant}))
        print(f"== {ens!r}", file=sys.stderr, flush=True)
        runs.append((name, lambda ps, ens=ens: ens.generate(ps, max_new_tokens=args.max_new_tokens, stop=stop)))
        lead_of[name] = members[lead].name
    caches = {name: {m.name: PrefixCache() for m in members} for name, _ in runs}
    outs = {name: [] for name, _ in runs}
    wall = {name: 0.0 for name, _ in runs}
    prefill = {name: 0.0 for name, _ in runs}
    confident = {name: 0.0 for name, _ in runs}
    forward_s: dict[str, dict[str, float]] = {name: {} for name, _ in runs}
    for batch in batches(prompts, args.batch_size):
        for name, generate in runs:
            for m in members:
                m.prefix_cache = caches[name][m.name]
            t0, p0, c0 = time.perf_counter(), PREFILL_S[0], CONFIDENT_S[0]
            FORWARD_S.clear()
            outs[name].extend(generate(batch))
            wall[name] += time.perf_counter() - t0
            prefill[name] += PREFILL_S[0] - p0
            confident[name] += CONFIDENT_S[0] - c0
            for k, v in FORWARD_S.items():
                forward_s[name][k] = forward_s[name].get(k, 0.0) + v
        print(f"    {len(outs[runs[0][0]])}/{len(prompts)} " +
              " ".join(f"{name} {wall[name]:.0f}s" for name, _ in runs), file=sys.stderr, flush=True)
    results = [{**summarise(name, outs[name], members, task, docs, wall[name], prefill[name], forward_s[name],
                            confident[name]), "lead": lead_of[name]} for name, _ in runs]
    for r in results:
        print(json.dumps(r), flush=True)
    if args.save:
        for k, (name, _) in enumerate(runs):
            if k < len(runs) - len(variants):  # a member alone
                continue
            with open(f"{args.save}.{k + 1}.jsonl", "w") as f:
                for d, o in zip(docs, outs[name]):
                    f.write(json.dumps({"id": d["id"], "text": o.text, "stats": o.stats,
                                        "trace": [r.to_dict() for r in o.trace or []]}) + "\n")
    add_ratios(results, {m.name for m in members}, floor=args.batch_size == 1)
    print(json.dumps({"config": vars(args), "results": results}))
    if args.markdown:
        Path(args.markdown).write_text(cost_markdown(results, args))


def add_ratios(results, alone_names, floor: bool = False) -> None:
    """Add to each ensemble row its ratios to the slowest member alone (wall and decode time per word)
    and the decode ratio split by model (`decode_shares`), and print them. With `floor` (batch 1) also
    `floor_ratio`: the decode ratio a perfect, free drafter for the lead's confident runs would leave —
    the time inside those runs replaced by one lead forward per run (the least a lossless lead can
    do: it must see the run's tokens once to check them and to gate the next word; the forward's cost
    is the lead's mean decode forward alone). Everything else (ensembled words, the other members,
    Python) stays as measured."""
    alone = [r for r in results if r["run"] in alone_names]
    if not alone:
        return
    slowest = max(alone, key=lambda r: r["s_per_word"])
    for r in results:
        if r not in alone:
            r["ratio_to_slowest_alone"] = round(r["s_per_word"] / slowest["s_per_word"], 3)
            r["decode_ratio_to_slowest_alone"] = round(r["decode_s_per_word"] / slowest["decode_s_per_word"], 3)
            lead_alone = next((a for a in alone if a["run"] == r.get("lead")), None)
            if floor and "confident_s" in r and lead_alone and lead_alone.get("forward_s_per_word"):
                one_forward = (lead_alone["forward_s_per_word"][r["lead"]] / lead_alone["fwd_per_word"][r["lead"]])
                kept = r["decode_s_per_word"] * r["words"] - r["confident_s"] + r["confident_runs"] * one_forward
                r["floor_ratio"] = round(kept / r["words"] / slowest["decode_s_per_word"], 3)
            if "forward_s_per_word" in r:  # the decode ratio split: each model's forwards, then the rest
                base = max(slowest["decode_s_per_word"], 1e-9)
                r["decode_shares"] = {**{k: round(v / base, 3) for k, v in r["forward_s_per_word"].items()},
                                      "other": round(r["other_s_per_word"] / base, 3)}
            print(f"\n{r['run']}: wall time per output word {r['s_per_word']:.3f} s, slowest alone "
                  f"({slowest['run']}) {slowest['s_per_word']:.3f} s -> ratio {r['ratio_to_slowest_alone']:.2f}x "
                  f"(without prompt prefill: {r['decode_s_per_word']:.3f} vs {slowest['decode_s_per_word']:.3f} s "
                  f"-> {r['decode_ratio_to_slowest_alone']:.2f}x)" +
                  (f"; with a perfect free drafter on the lead's confident runs >= {r['floor_ratio']:.2f}x"
                   if "floor_ratio" in r else ""))


def cost_markdown(results, args) -> str:
    cmd = "python benchmarks/adafuse_cost.py " + " ".join(sys.argv[1:])
    lines = [f"# AdaFuse cost on GSM8K ({args.limit} questions, {args.max_new_tokens} new tokens, batch {args.batch_size})",
             "", f"    {cmd}", "",
             "| run | words | wall s | prefill s | s / word | x slowest alone | x without prefill | ensembled rounds "
             "| words / round | gate decisions | forward passes / word | x without prefill, by model "
             "| floor: perfect lead drafter | accuracy |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|---|--:|--:|"]
    for r in results:
        lines.append(f"| {r['run']} | {r['words']} | {r['wall_s']:.0f} | {r['prefill_s']:.0f} | {r['s_per_word']:.3f} | "
                     f"{r.get('ratio_to_slowest_alone', '-')} | {r.get('decode_ratio_to_slowest_alone', '-')} | "
                     f"{r.get('ensemble_share', '-')} | "
                     f"{r.get('words_per_round', '-')} | {r.get('gate_decisions', '-')} | "
                     f"{', '.join(f'{k} {v}' for k, v in r['fwd_per_word'].items())} | "
                     f"{', '.join(f'{k} {v}' for k, v in r.get('decode_shares', {}).items()) or '-'} | "
                     f"{r.get('floor_ratio', '-')} | {r['accuracy']:.2f} |")
    return "\n".join(lines) + "\n"


def normalisation_main(args) -> None:
    """Teacher-forced on gold answers: at each word of the gold CoT, which normalisation/calibration
    ranks the gold word first among the members' candidates plus the gold word?"""
    import torch

    from adafuse.gate import top2_margin
    from runtime.loader import load as load_member
    from adafuse.methods.word_level import Candidate, WordConfig, WordFusion
    from adafuse.scoring import CALIBRATIONS, NORMALISATIONS, fuse_scores, normalised_score
    from adafuse.words import split_words
    from eval.data import gsm8k_cot

    torch.set_num_threads(args.threads)
    prompts, docs, _ = gsm8k_prompts(args.limit, args.shots, args.offset)
    golds = [split_words(" " + gsm8k_cot(d["answer"]) if "answer" in d else " " + d["target"])[: args.max_words]
             for d in docs]
    members = [load_member(n, dtype=args.dtype) for n in args.members.split(",")]
    fusion = WordFusion(members, prompts, WordConfig(), weights=[1.0] * len(members), lead=args.lead, chat=None,
                        max_new_tokens=10 ** 6, stop=[], temperature=0.0, seed=None)
    modes = [(n, c) for n in NORMALISATIONS for c in CALIBRATIONS]
    hits = {f"{n}/{c}": [0, 0] for n, c in modes}       # all positions: [correct, total]
    hits_u = {f"{n}/{c}": [0, 0] for n, c in modes}     # positions where the gate is uncertain
    lead_hits = [0, 0]
    t0 = time.perf_counter()
    for pos in range(max(len(g) for g in golds)):
        rows = [b for b, g in enumerate(golds) if pos < len(g)]
        for m in range(len(members)):
            fusion.flush(m, rows)
        margins = top2_margin(fusion.views[args.lead].state.next_probs(1.0)).tolist()
        proposal = fusion.ensembled_word.propose(rows)
        cands = proposal.cands
        for b in rows:
            if golds[b][pos] not in {c.text for c in cands[b]}:
                cands[b].append(Candidate(golds[b][pos], ["gold"]))
        lps = fusion.ensembled_word.score(proposal).logprobs
        for b in rows:
            gold = golds[b][pos]
            lead_name = members[args.lead].name
            lead_first = next((c.text for c in cands[b] if lead_name in c.proposed_by and not c.eos), None)
            lead_hits[0] += int(lead_first == gold)
            lead_hits[1] += 1
            for n, c in modes:
                scores = torch.tensor([[normalised_score(lps[m][b][j], cd.text or "x", n)
                                        for j, cd in enumerate(cands[b])] for m in range(len(members))])
                pick = cands[b][int(fuse_scores(scores, None, c).argmax())].text
                for table, cond in ((hits, True), (hits_u, margins[b] < 0.7)):
                    if cond:
                        table[f"{n}/{c}"][0] += int(pick == gold)
                        table[f"{n}/{c}"][1] += 1
            fusion.batch.commit(b, gold, held_by=())
        fusion.flush(args.lead, rows)
        print(f"  word {pos}: {len(rows)} rows, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        print(json.dumps(_norm_report(hits, hits_u, lead_hits, args)), flush=True)


def _norm_report(hits, hits_u, lead_hits, args) -> dict:
    return {"positions": lead_hits[1], "lead_top1_is_gold": round(lead_hits[0] / max(lead_hits[1], 1), 4),
              "gold_picked_all": {k: round(v[0] / max(v[1], 1), 4) for k, v in hits.items()},
              "gold_picked_uncertain": {k: round(v[0] / max(v[1], 1), 4) for k, v in hits_u.items()},
              "uncertain_positions": next(iter(hits_u.values()))[1], "config": vars(args)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--members", default=DEFAULT_MEMBERS)
    p.add_argument("--method", default="adafuse")
    p.add_argument("--options", help='JSON of method options, e.g. \'{"threshold": 0.7, "normalise": "byte"}\'')
    p.add_argument("--drafters", help="comma-separated drafter per member (lookup / model name / none)")
    p.add_argument("--lead", type=int, default=0)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--shots", type=int, default=4)
    p.add_argument("--max_new_tokens", type=int, default=200)
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip_alone", action="store_true", help="only run the ensemble")
    p.add_argument("--ensembles", help='JSON list of ensemble variants run one after another, e.g. '
                   '\'[{"lead": 2}, {"lead": 2, "drafters": ["lookup", "lookup", "lookup"]}]\' (default: one, from the flags); '
                   '"method" and "name" per variant too (e.g. {"method": "single", "lead": 2, "drafters": ...}: '
                   'the lead alone through its speculative generator)')
    p.add_argument("--save", help="write each ensemble's texts and traces to SAVE.N.jsonl")
    p.add_argument("--markdown", help="write the results table here")
    p.add_argument("--normalisation", action="store_true", help="teacher-forced normalisation measurement")
    p.add_argument("--max_words", type=int, default=40, help="gold words per question (--normalisation)")
    args = p.parse_args(argv)
    (normalisation_main if args.normalisation else cost_main)(args)


if __name__ == "__main__":
    main()
