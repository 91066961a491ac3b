"""`--model adafuse` for lm-evaluation-harness (eval/lm_eval_model.py, eval/lm_eval_scoring.py, the
tasks in eval/lm_eval_tasks/): a single member's log-likelihoods equal lm-eval's own `hf` model on
the same requests; the ensemble fusion is the weighted mixture; our lm-eval tasks build our
harness's prompts and an lm-eval run gives our harness's outputs and scores (tiny random models
saved with save_pretrained; no downloads)."""
from __future__ import annotations

import copy
import functools
import json
import math
import sys
from pathlib import Path

import pytest

# lm-eval is an optional dependency of the package (pip install 'adafuse[lm-eval]') and part of the
# test extra, so these tests run wherever the tests do (no skip).
from lm_eval.api.instance import Instance  # noqa: E402

from eval import lm_eval_cli  # noqa: E402
from eval.config import parse_config  # noqa: E402
from eval.lm_eval_model import AdafuseLM, GenSettings, LMArgs, harness_turns, plain_text, split_list  # noqa: E402
from eval.lm_eval_scoring import mixture_loglikelihood  # noqa: E402
from eval.methods import clear_caches  # noqa: E402
from eval.runner import evaluate  # noqa: E402
from eval.task import get_task  # noqa: E402
from eval.testing import make_data  # noqa: E402
from runtime.errors import ConfigError  # noqa: E402

CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}|{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")
LL_REQUESTS = [("Question: what is 2+2?\nAnswer:", " 4"), ("The quick brown", " fox jumps"), ("", "hello world"),
               ("Natalia sold clips ", "to 48 of her friends"), ("x" * 40, " y y y")]
ROLLING = ["The quick brown fox jumps over the lazy dog. " * 3, "short"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """Tiny random llamas saved as local folders: a byte-level BPE one (no BOS), a character-level
    one whose tokenizer adds BOS, and that one again with a chat template."""
    from tokenizers import processors

    from runtime.testing import bpe_tokenizer, char_tokenizer, tiny_model

    root = tmp_path_factory.mktemp("lm_eval_models")
    out = {}
    for name, seed in (("bpe", 0), ("bos", 1), ("chat", 1)):
        tok = copy.deepcopy(bpe_tokenizer() if name == "bpe" else char_tokenizer())
        if name != "bpe":
            tok._tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        if name == "chat":
            tok.chat_template = CHAT_TEMPLATE
        model = tiny_model("llama", vocab_size=len(tok), seed=seed)
        model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
        model.config.bos_token_id = model.generation_config.bos_token_id = tok.bos_token_id
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        out[name] = str(root / name)
    yield out
    clear_caches()


def _hf(path: str, **kwargs):
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=path, device="cpu", dtype="float32", **kwargs)


def _ll(pairs) -> list[Instance]:
    return [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]


def _gen(contexts, **gen_kwargs) -> list[Instance]:
    kw = {"until": ["\n"], "max_gen_toks": 6, "do_sample": False, **gen_kwargs}
    return [Instance("generate_until", {}, (c, dict(kw)), i) for i, c in enumerate(contexts)]


@pytest.mark.parametrize("name", ["bpe", "bos"])
@pytest.mark.parametrize("batch_size,max_length", [(1, None), (3, 24)])
def test_loglikelihood_equals_lm_eval_hf(folders, one_thread, name, batch_size, max_length):
    """Same (log-prob, greedy) as lm-eval's HFLM: tokenisation (trailing spaces, empty context, BOS),
    left truncation to max_length, batches; greedy continuations included so the flag is exercised."""
    hf, ours = _hf(folders[name], batch_size=batch_size, max_length=max_length), \
        AdafuseLM(members=folders[name], batch_size=batch_size, max_length=max_length)
    greedy = ours.generate_until(_gen([c for c, _ in LL_REQUESTS if c]), disable_tqdm=True)
    pairs = LL_REQUESTS + [(c, g) for (c, _), g in zip([r for r in LL_REQUESTS if r[0]], greedy) if g]
    expected, got = hf.loglikelihood(_ll(pairs), disable_tqdm=True), ours.loglikelihood(_ll(pairs))
    assert [g for _, g in got] == [g for _, g in expected]
    assert not all(g for _, g in got)
    assert name == "bpe" or any(g for _, g in got)  # random byte-level text need not re-tokenise the same
    assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in expected], abs=1e-4)
    rolling = [Instance("loglikelihood_rolling", {}, (s,), i) for i, s in enumerate(ROLLING)]
    assert ours.loglikelihood_rolling(rolling) == pytest.approx(hf.loglikelihood_rolling(rolling, disable_tqdm=True),
                                                                abs=1e-3)


def test_generate_until_equals_lm_eval_hf_and_member(folders, one_thread):
    """Greedy texts with stop strings: lm-eval's HFLM, our LM (batched) and the member itself agree
    (special tokens other than EOS stay in our texts, as in our harness; hf drops them)."""
    from runtime.loader import load

    contexts = [c for c, _ in LL_REQUESTS if c]
    ours = AdafuseLM(members=folders["bos"], batch_size=2)
    got = ours.generate_until(_gen(contexts, until=["o", "\n"]), disable_tqdm=True)
    member = load(folders["bos"])
    specials = member.tokenizer.all_special_tokens
    assert [functools.reduce(lambda t, s: t.replace(s, ""), specials, text) for text in got] == \
        _hf(folders["bos"]).generate_until(_gen(contexts, until=["o", "\n"]), disable_tqdm=True)
    assert got == [o.text for o in member.generate(contexts, max_new_tokens=6, stop=["o", "\n"], chat=False)]
    speculative = AdafuseLM(members=folders["bos"], drafter="lookup", batch_size=2)  # lossless: same greedy text
    assert speculative.generate_until(_gen(contexts, until=["o", "\n"]), disable_tqdm=True) == got


def test_ensemble_loglikelihood_is_the_weighted_mixture(folders, one_thread):
    pairs = LL_REQUESTS[:4]
    singles = [AdafuseLM(members=folders[n]).loglikelihood(_ll(pairs)) for n in ("bpe", "bos")]
    ens = AdafuseLM(members=f"{folders['bpe']}+{folders['bos']}", method="adafuse", weights="1+3")
    fused = ens.loglikelihood(_ll(pairs))
    for i, (ll, greedy) in enumerate(fused):
        a, b = singles[0][i][0], singles[1][i][0]
        assert ll == pytest.approx(math.log((math.exp(a) + 3 * math.exp(b)) / 4), abs=1e-6)
        assert greedy == (singles[0][i][1] and singles[1][i][1])
    texts = ens.generate_until(_gen([c for c, _ in pairs if c], max_gen_toks=3), disable_tqdm=True)
    from adafuse import Ensemble

    direct = Ensemble([folders["bpe"], folders["bos"]], method="adafuse", weights=[1.0, 3.0], chat=False)
    assert texts == [o.text for o in direct.generate([c for c, _ in pairs if c], max_new_tokens=3, stop=["\n"])]


def test_mixture_loglikelihood_math():
    assert mixture_loglikelihood([-2.0, -2.0], [1, 3]) == pytest.approx(-2.0)
    assert mixture_loglikelihood([-1.0, -3.0], [1, 1]) == pytest.approx(math.log((math.exp(-1) + math.exp(-3)) / 2))
    assert mixture_loglikelihood([-1000.0, -1001.0], [1, 0]) == pytest.approx(-1000.0)
    assert mixture_loglikelihood([-math.inf, -5.0], [1, 1]) == pytest.approx(-5.0 - math.log(2))
    with pytest.raises(ValueError):
        mixture_loglikelihood([-1.0], [1, 1])


def test_model_args_and_generation_kwargs():
    spec = LMArgs.parse(members="a+b+c", lead=2, drafters="lookup+none+lookup", weights="1+1+2", threshold=0.7,
                        batch_size="auto", device="cuda:0")
    assert (spec.method, spec.members, spec.drafters, spec.weights) == ("adafuse", ["a", "b", "c"],
                                                                         ["lookup", None, "lookup"], [1.0, 1.0, 2.0])
    assert spec.generator_options(False) == {"lead": 2, "dtype": "float32", "chat": False, "weights": [1.0, 1.0, 2.0],
                                             "drafters": ["lookup", None, "lookup"], "threshold": 0.7}
    single = LMArgs.parse(members="qwen", drafter="lookup", batch_size=4)
    assert (single.method, single.batch_size, single.generator_options(None)) == ("single", 4,
                                                                                   {"dtype": "float32", "drafter": "lookup"})
    assert split_list(["x", "None"]) == ["x", None]
    for bad in ({}, {"members": "a+b", "drafter": "lookup"}, {"members": "a", "weights": "1+x"},
                {"members": "a", "batch_size": "big"}):
        with pytest.raises(ConfigError):
            LMArgs.parse(**bad)
    s = GenSettings.from_kwargs({"until": "\n\n", "max_gen_toks": 9, "do_sample": False, "temperature": 0.5, "top_p": 1.0})
    assert s == GenSettings(("\n\n",), 9, 0.0)
    assert GenSettings.from_kwargs({"do_sample": True, "temperature": 0.7}) == GenSettings((), 256, 0.7)
    with pytest.raises(ConfigError, match="top_p"):
        GenSettings.from_kwargs({"top_p": 0.9})


def test_chat_turns_and_plain_text():
    msgs = [{"role": "system", "content": "Answer briefly.\n\n"}, {"role": "user", "content": "Q: a?\nA:"},
            {"role": "assistant", "content": "x"}, {"role": "user", "content": "Q: b?\nA:"}]
    assert plain_text(msgs) == "Answer briefly.\n\nQ: a?\nA: x\n\nQ: b?\nA:"
    assert plain_text(msgs[1:]) == "Q: a?\nA: x\n\nQ: b?\nA:"
    assert harness_turns(msgs)[0] == {"role": "system", "content": "Answer briefly."}
    assert harness_turns([{"role": "system", "content": " "}] + msgs[1:]) == msgs[1:]


@pytest.fixture(scope="module")
def lm_eval_tasks(tmp_path_factory):
    """Our two lm-eval tasks over a tiny data folder (lm-eval's built-in tasks not indexed)."""
    from lm_eval.tasks import TaskManager

    data = make_data(tmp_path_factory.mktemp("lm_eval_data"), n=16)
    tm = TaskManager(include_path=str(lm_eval_cli.TASK_DIR), include_defaults=False, metadata={"data_dir": str(data)})
    return data, tm


def _captured_turns(task, doc):
    seen = []

    def template(messages, add_generation_prompt=True):
        seen.append(messages)
        return plain_text(messages)

    task.fewshot_context(doc, task.config.num_fewshot, apply_chat_template=True, fewshot_as_multiturn=True,
                         chat_template=template)
    return seen[0]


@pytest.mark.parametrize("name", ["gsm8k", "nq_open"])
def test_lm_eval_tasks_ask_what_our_tasks_ask(lm_eval_tasks, name):
    """Same rows (ids), gold answers, plain few-shot prompts and chat turns as eval/tasks/NAME.yaml."""
    data, tm = lm_eval_tasks
    task = tm.load([f"adafuse_{name}"])["tasks"][f"adafuse_{name}"]
    ours = get_task(name)
    docs, shots = ours.load(data)
    task.build_all_requests(limit=5, rank=0, world_size=1)
    assert [i.doc["id"] for i in task.instances] == [d["id"] for d in docs[:5]]
    for inst, doc in zip(task.instances, docs):
        prompt = ours.prompt(doc, shots)
        assert inst.args[0] == str(prompt)
        assert inst.doc["gold"] == doc["gold"]
        assert inst.args[1]["until"] == ours.until
        assert inst.args[1]["max_gen_toks"] == ours.generation_kwargs["max_new_tokens"]
        turns = _captured_turns(task, inst.doc)
        assert harness_turns(turns) == prompt.messages and plain_text(turns) == str(prompt)


@pytest.mark.parametrize("member", ["bos", "chat"])
def test_lm_eval_run_equals_our_harness(folders, lm_eval_tasks, tmp_path, one_thread, member):
    """`simple_evaluate(model="adafuse")` on our two tasks gives our harness's outputs and scores on the
    same rows: plain text for a base member, chat turns (--apply_chat_template) for a chat member."""
    import lm_eval

    data, tm = lm_eval_tasks
    chat = member == "chat"
    res = lm_eval.simple_evaluate(model="adafuse", model_args=f"members={folders[member]}",
                                  tasks=["adafuse_gsm8k", "adafuse_nq_open"], task_manager=tm, limit=3,
                                  gen_kwargs={"max_gen_toks": 5}, log_samples=True, apply_chat_template=chat,
                                  fewshot_as_multiturn=chat, batch_size=2)
    cfg = parse_config({"tasks": [{"name": n, "generation": {"max_new_tokens": 5}} for n in ("gsm8k", "nq_open")],
                        "limit": 3, "batch_size": 2, "output_path": str(tmp_path / "out"), "data_dir": str(data),
                        "runs": [{"name": "m", "method": "single", "members": [folders[member]]}]}, "lm.yaml")
    metrics = {m["task"]: m for m in evaluate(cfg, progress=False, log=None)}
    for name, metric_names in (("gsm8k", ["exact_match_number"]), ("nq_open", ["exact_match", "f1"])):
        preds = [json.loads(line) for line in (tmp_path / "out" / "m" / name / "predictions.jsonl").read_text().splitlines()]
        samples = sorted(res["samples"][f"adafuse_{name}"], key=lambda s: s["doc"]["id"])
        assert [s["doc"]["id"] for s in samples] == [p["id"] for p in preds]
        assert [s["resps"][0][0] for s in samples] == [p["output"] for p in preds]
        assert any(p["output"] for p in preds)
        for metric in metric_names:
            ours = metrics[name]["metrics"][metric]["value"]
            assert res["results"][f"adafuse_{name}"][f"{metric},none"] == pytest.approx(ours)


def test_cli_puts_our_tasks_on_the_task_path(monkeypatch, capsys):
    d = str(lm_eval_cli.TASK_DIR)
    assert lm_eval_cli.with_task_path(["--model", "adafuse"]) == ["--model", "adafuse", "--include_path", d]
    assert lm_eval_cli.with_task_path(["--include_path", "/x"]) == ["--include_path", f"/x:{d}"]
    assert lm_eval_cli.with_task_path(["--include_path=/x"]) == [f"--include_path=/x:{d}"]
    assert lm_eval_cli.with_task_path(["--help"]) == ["--help"]
    with pytest.raises(ConfigError, match="did you mean 'gemma3-270m'"):  # checked before lm-eval indexes tasks
        lm_eval_cli.check_model_args({"members": "smollm2-135m+gema3-270m", "method": "adafuse"})
    with pytest.raises(ConfigError, match="gema3-270m"):  # a single member's drafter
        lm_eval_cli.check_model_args({"members": "smollm2-135m", "drafter": "hybrid:gema3-270m"})
    lm_eval_cli.check_model_args({"members": "smollm2-135m+gemma3-270m", "drafters": "lookup+none"})
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "eval.lm_eval_model")
    assert lm_eval_cli.main(["--model", "adafuse"]) == 2
    assert "pip install 'adafuse[lm-eval]'" in capsys.readouterr().err


def test_importing_our_packages_does_not_need_lm_eval():
    import subprocess

    code = ("import sys; sys.modules['lm_eval'] = None; import eval, eval.cli, eval.methods, eval.runner, adafuse; "
            "assert 'eval.lm_eval_model' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
