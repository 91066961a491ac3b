#!/usr/bin/env bash
# The prepared GPU check (issue 47 item 8): run it FIRST whenever a GPU machine is lent, then fix
# what it names. Budget: <= 8 minutes. Writes $OUT/gpu_check/ (or ./gpu_check/ without $OUT):
#   tests.txt        pytest on CUDA (every tiny model on the GPU: ADAFUSE_TEST_DEVICE=cuda), with the
#                    failing tests BY NAME in failed.txt
#   views.txt        views of one model stacked into one forward on the GPU, equal to one after another
#   speed.txt        the speculative engine on a tiny model, timed and checked equal to plain greedy
# The registry models cannot travel to the device machine (a call carries 64 MiB and the machine
# reaches no package index), so the quickstart's real members cannot run there: the tiny models
# stand in for them (views stacked on the GPU, speculative decoding on the GPU).
#   summary.txt      one line per step: ok / FAILED (and how many tests failed)
# Usage (from the repository root, on the device machine):
#   bash benchmarks/gpu_check.sh                 # everything
#   STEPS=tests bash benchmarks/gpu_check.sh     # one step
set -u
cd "$(dirname "$0")/.."
out="${OUT:-.}/gpu_check"
mkdir -p "$out"
: > "$out/summary.txt"
steps="${STEPS:-tests views speed}"
# DEVICE=cpu runs the same checks on the CPU (to try the script itself where no GPU is lent)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ADAFUSE_TEST_DEVICE="${DEVICE:-cuda}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1 || true
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)" >> "$out/gpu.txt" 2>&1

say() { echo "$1" | tee -a "$out/summary.txt"; }

if [[ " $steps " == *" tests "* ]]; then
  # the device-independent unit tests (tiny models only: no registry model travels to the machine)
  timeout 300 python3 -m pytest -q -m "not slow" -p no:cacheprovider -o addopts="" -rf \
    tests/test_specdec_engine_lossless.py tests/test_specdec_engine.py tests/test_specdec_text_drafter.py \
    tests/test_member.py tests/test_kv_cache.py tests/test_text_state.py tests/test_numerical_guards.py \
    tests/test_baselines_token_union.py tests/test_baselines_sample_rerank.py tests/test_adafuse_*.py \
    tests/test_views.py tests/test_answer_level.py > "$out/tests.txt" 2>&1
  rc=$?
  grep -E "^FAILED " "$out/tests.txt" | sed 's/^FAILED //' > "$out/failed.txt"
  say "tests: $([ $rc -eq 0 ] && echo ok || echo "FAILED ($(wc -l < "$out/failed.txt") failing, names in failed.txt; rc $rc)")"
fi

if [[ " $steps " == *" views "* ]]; then
  timeout 120 python3 - > "$out/views.txt" 2>&1 <<'PY'
import torch
from adafuse.methods import get_method, run_method
from runtime.forward_group import one_after_another
from runtime.prompts import FewShotPrompt
from runtime.testing import bpe_tokenizer, tiny_member
from runtime.views import make_view, parse_view

base = tiny_member("qwen2", bpe_tokenizer(), seed=3)
import os
assert base.device.type == os.environ["ADAFUSE_TEST_DEVICE"].split(":")[0], base.device
views = [base, make_view(base, parse_view({"shots": "1:3"})), make_view(base, parse_view({"shots": [2, 0], "chat": False}))]
pool = [(f"Question: what is {i} plus {i}?\nAnswer:", f"The answer is {2 * i}.") for i in range(4)]
prompts = [FewShotPrompt(f"Question: what is {q}?\nAnswer:", pool, range(2)) for q in ("1 plus 5", "7 times 2")]
for method in ("adafuse", "token-union", "view-vote"):
    together = run_method(get_method(method), views, prompts, max_new_tokens=12, seed=0)
    with one_after_another():
        apart = run_method(get_method(method), views, prompts, max_new_tokens=12, seed=0)
    same = [a.text for a in together] == [b.text for b in apart]
    print(method, "same texts:", same, "forwards together/apart:", together[0].cost.forward_passes, apart[0].cost.forward_passes)
    assert same, method
print("ok")
PY
  say "views: $(tail -1 "$out/views.txt" | grep -q '^ok$' && echo ok || echo FAILED)"
fi

if [[ " $steps " == *" speed "* ]]; then
  timeout 120 python3 - > "$out/speed.txt" 2>&1 <<'PY'
import time, torch
from runtime.testing import bpe_tokenizer, tiny_member
from specdec import drafters as dr
from specdec.engine import SpeculativeGenerator

target = tiny_member("qwen2", bpe_tokenizer(), seed=3, hidden=256, layers=4)
prompts = ["The quick brown fox jumps over the lazy dog. " * 8] * 4
plain = SpeculativeGenerator(target, None)
spec = SpeculativeGenerator(target, dr.make_drafter("lookup"))
for name, g in (("plain", plain), ("lookup", spec)):
    g.generate(prompts, max_new_tokens=8)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync(); t0 = time.perf_counter()
    outs = g.generate(prompts, max_new_tokens=64)
    sync(); print(name, f"{time.perf_counter() - t0:.3f} s", [o.text[:20] for o in outs][:1])
a = plain.generate(prompts, max_new_tokens=64); b = spec.generate(prompts, max_new_tokens=64)
assert [x.text for x in a] == [y.text for y in b], "speculative != plain greedy on CUDA"
print("ok")
PY
  say "speed: $(tail -1 "$out/speed.txt" | grep -q '^ok$' && echo ok || echo FAILED)"
fi
cat "$out/summary.txt"
