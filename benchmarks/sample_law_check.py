"""Does each method of a `specdec_speed.py` run sample from the target's own law? A check on its journal.

For every row at temperature T > 0 the text is scored under the target at T: the mean per-token
negative log-likelihood -log p_T(token | prompt, earlier tokens). Every lossless sampler has the same
expected value (the tempered law's mean entropy along its own samples), so a method whose texts score
far above plain `generate` on the same prompts is not sampling the target's law. It also counts the
texts equal to hf-plain's (same seed): ours reproduces transformers' sampling stream token for token.

    python benchmarks/sample_law_check.py docs/results/specdec/full_15b_smollm2_t07.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from specdec_speed import load_prompts  # noqa: E402


def text_nll(target, prompt_ids: list[int], text: str, temperature: float) -> tuple[float, int]:
    """(summed NLL of `text`'s tokens after `prompt_ids` under the target at `temperature`, token count)."""
    cont = target.tokenizer.encode(text, add_special_tokens=False)
    if not cont:
        return 0.0, 0
    ids = torch.tensor([prompt_ids + cont])
    with torch.inference_mode():
        logits = target.model(ids).logits[0, len(prompt_ids) - 1:-1].float() / temperature
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(cont)[:, None])
    return float(-lp.sum()), len(cont)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("journal", help="a specdec_speed.py journal (.jsonl)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    lines = [json.loads(x) for x in Path(args.journal).open()]
    header, rows = lines[0], [r for r in lines[1:] if r.get("temperature", 0) > 0 and r.get("text")]
    if not rows:
        print(f"{args.journal}: no rows at T > 0 with text; run specdec_speed.py with --temperatures 0.7")
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    from runtime.loader import load as load_member

    target = load_member(header["settings"]["target"], dtype="float32", pack_weights=False)
    prompts = load_prompts(header["settings"]["prompts"])
    index = {(task, i): p for i, (task, p) in enumerate(prompts)}  # the journal's prompt = this index
    plain = {(r["temperature"], r["task"], r["prompt"]): r["text"] for r in rows if r["method"] == "hf-plain"}
    sums: dict[tuple[float, str], list[float]] = {}
    for r in rows:
        ids = target.encode_prompt(index[(r["task"], r["prompt"])])
        nll, n = text_nll(target, ids, r["text"], r["temperature"])
        s = sums.setdefault((r["temperature"], r["method"]), [0.0, 0, 0, 0])
        s[0] += nll
        s[1] += n
        s[2] += 1
        s[3] += r["text"] == plain.get((r["temperature"], r["task"], r["prompt"]))
    print(f"# {args.journal} (target {header['settings']['target']}, {header.get('cpu', '?')})\n")
    print("| T | method | texts | tokens | NLL/token under the target at T | texts equal to hf-plain's |")
    print("|---|---|---|---|---|---|")
    for (t, m), (nll, n, k, same) in sums.items():
        print(f"| {t:g} | {m} | {k} | {n} | {nll / max(n, 1):.3f} | {same}/{k} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
