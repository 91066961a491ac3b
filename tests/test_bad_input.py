"""Bad input, exhaustively: every CLI verb and every config key given invalid values. Each case must
end with exactly one line on stderr, starting `error: ` and naming the problem, exit status 2, no
traceback, and no registry model loaded (all checks run before any model loads; the few cases that
need a model get a tiny one saved in a folder). Run in-process (`eval.cli.main`), a few as real
processes. The valid bases every case mutates are checked to pass first."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from eval import methods
from eval.cli import main as adafuse_main
from eval.testing import error_text, make_data, register_fake

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Env:
    """Paths the cases use: a tiny data folder (and broken copies), a tiny model folder, a scratch folder."""

    root: Path
    data: Path
    tiny: Path
    counter: itertools.count

    def file(self, name: str, content: str | bytes) -> str:
        path = self.root / f"{next(self.counter)}-{name}"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(path)

    def cfg(self, **top) -> str:
        """An eval config (the fake method, 2 gsm8k rows) with `top` keys replaced."""
        base = {"tasks": ["gsm8k"], "limit": 2, "data_dir": str(self.data), "bootstrap": 20,
                "output_path": str(self.root / f"out-{next(self.counter)}"),
                "runs": [{"name": "f", "method": "fake", "members": ["m1"]}]}
        return self.file("c.yaml", yaml.safe_dump({**base, **top}))

    def run(self, **run) -> str:
        """An eval config whose only run is `run` (real methods: checked, never loaded)."""
        return self.cfg(runs=[run])

    def tune(self, top: dict | None = None, **tune) -> str:
        base = {"members": ["smollm2-135m", "gemma3-270m"], "dev_rows": 4, "methods": [{"method": "adafuse"}]}
        return self.file("t.yaml", yaml.safe_dump({"tasks": ["gsm8k"], "limit": 2, "data_dir": str(self.data),
                                                   "output_path": str(self.root / f"tune-{next(self.counter)}"),
                                                   "tune": {**base, **tune}, **(top or {})}))

    def broken_data(self, rel: str, content: bytes) -> str:
        """A copy of the data folder with file `rel` replaced by `content`."""
        folder = make_data(self.root / f"data-{next(self.counter)}", n=12)
        (folder / rel).write_bytes(content)
        return str(folder)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Env:
    from runtime.testing import char_tokenizer, tiny_model

    root = tmp_path_factory.mktemp("bad_input")
    tok = char_tokenizer()
    model = tiny_model("llama", vocab_size=len(tok))
    model.save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    (root / "a-file").write_text("x")
    (root / "empty-run" / "r").mkdir(parents=True)
    (root / "bad-metrics" / "r" / "t").mkdir(parents=True)
    (root / "bad-metrics" / "r" / "t" / "metrics.json").write_text("{not json")
    (root / "foreign-metrics" / "r" / "t").mkdir(parents=True)
    (root / "foreign-metrics" / "r" / "t" / "metrics.json").write_text('{"rows": []}')
    return Env(root, make_data(root / "data", n=12), root / "tiny", itertools.count())


@pytest.fixture(autouse=True)
def _no_real_models(monkeypatch: pytest.MonkeyPatch):
    """The fake method for eval bases; loading anything but a local folder fails the case."""
    from runtime import member as member_module

    monkeypatch.setitem(methods.METHODS, "fake", methods.METHODS.get("fake"))
    register_fake()
    real = member_module.load_member

    def guarded(spec, *args, **kwargs):
        if not Path(str(spec)).is_dir():
            pytest.fail(f"a bad-input case loaded the model {spec!r}: it must fail before loading")
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(member_module, "load_member", guarded)
    methods.clear_caches()
    yield
    methods.clear_caches()


Argv = Callable[[Env], list[str]]
ADA = ["smollm2-135m", "gemma3-270m"]


def ev(build: Callable[[Env], str], *flags: str) -> Argv:
    return lambda e: ["eval", build(e), *flags, "--no_progress"]


def gen(*flags: str) -> Argv:
    return lambda e: ["generate", *[str(e.tiny) if f == "TINY" else f for f in flags]]


def tune(*flags: str, top: dict | None = None, **keys) -> Argv:
    return lambda e: ["tune", e.tune(top, **keys), "--dry_run", *flags]


# (case id, argv, what the one line must say)
CASES: list[tuple[str, Argv, str]] = [
    # -- the dispatcher and argparse ---------------------------------------------------------
    ("no-verb", lambda e: [], "required: COMMAND"),
    ("unknown-verb", lambda e: ["evaluate"], "invalid choice: 'evaluate'"),
    ("eval-no-config", lambda e: ["eval"], "required: CONFIG"),
    ("eval-unknown-flag", ev(lambda e: e.cfg(), "--bogus"), "unrecognized arguments: --bogus"),
    ("eval-limit-not-int", ev(lambda e: e.cfg(), "--limit", "abc"), "argument --limit: invalid int value: 'abc'"),
    ("eval-seed-not-int", ev(lambda e: e.cfg(), "--seed", "x"), "argument --seed: invalid int value"),
    ("eval-batch-not-int", ev(lambda e: e.cfg(), "--batch_size", "1.5"), "argument --batch_size"),
    # -- eval flags ------------------------------------------------------------------------
    ("eval-limit-0", ev(lambda e: e.cfg(), "--limit", "0"), "--limit must be >= 1, got 0"),
    ("eval-limit-negative", ev(lambda e: e.cfg(), "--limit", "-3"), "--limit must be >= 1, got -3"),
    ("eval-batch-0", ev(lambda e: e.cfg(), "--batch_size", "0"), "--batch_size must be >= 1"),
    ("eval-shard-k-too-big", ev(lambda e: e.cfg(), "--shard", "2/2"), "--shard '2/2' is invalid"),
    ("eval-shard-not-numbers", ev(lambda e: e.cfg(), "--shard", "a/b"), "--shard 'a/b' is invalid"),
    ("eval-shard-no-slash", ev(lambda e: e.cfg(), "--shard", "1"), "--shard '1' is invalid"),
    ("eval-shard-negative", ev(lambda e: e.cfg(), "--shard", "-1/2"), "argument --shard"),
    ("eval-tasks-unknown", ev(lambda e: e.cfg(), "--tasks", "gsm9k"), "no task named gsm9k (has: gsm8k)"),
    ("eval-runs-unknown", ev(lambda e: e.cfg(), "--runs", "g"), "no run named g (has: f)"),
    ("eval-data-dir-missing", ev(lambda e: e.cfg(), "--data_dir", "/nonexistent/data"), "data folder not found"),
    ("eval-output-is-a-file", lambda e: ["eval", e.cfg(), "--output_path", str(e.root / "a-file")], "is a file, not a folder"),
    # -- the config file itself ----------------------------------------------------------------
    ("config-missing", lambda e: ["eval", str(e.root / "nope.yaml")], "config file not found"),
    ("config-is-a-folder", lambda e: ["eval", str(e.root)], "is a folder; give the path of a config YAML file"),
    ("config-empty", ev(lambda e: e.file("e.yaml", "")), "is empty; write it as UTF-8 YAML text"),
    ("config-whitespace", ev(lambda e: e.file("w.yaml", "\n  \n")), "is empty"),
    ("config-binary", ev(lambda e: e.file("b.yaml", bytes(range(256)) * 4)), "is a binary file, not a YAML config"),
    ("config-not-utf8", ev(lambda e: e.file("n.yaml", b"tasks: [gsm8k]\ndescription: caf\xe9\n")),
     "line 2 is not UTF-8 text (byte 0xe9)"),
    ("config-bad-yaml", ev(lambda e: e.file("y.yaml", "tasks: [gsm8k\n")), "invalid YAML"),
    ("config-key-twice", ev(lambda e: e.file("d.yaml", "tasks: [gsm8k]\noutput_path: a\noutput_path: b\n")),
     "key 'output_path' is given twice (line 3); keep one"),
    ("config-a-list", ev(lambda e: e.file("l.yaml", "- a\n- b\n")), "the file must be a mapping, got list"),
    # -- eval config keys ---------------------------------------------------------------------
    ("key-unknown", ev(lambda e: e.cfg(taks=["gsm8k"])), "unknown key 'taks' (did you mean 'tasks'?)"),
    ("key-tasks-type", ev(lambda e: e.cfg(tasks=5)), "key 'tasks' must be a list or a string, got int 5"),
    ("key-tasks-empty", ev(lambda e: e.cfg(tasks=[])), "'tasks' is empty"),
    ("key-task-unknown", ev(lambda e: e.cfg(tasks=["gsm9k"])), "unknown task 'gsm9k' (did you mean 'gsm8k'?)"),
    ("key-task-entry-type", ev(lambda e: e.cfg(tasks=[3])), "'tasks[0]' must be a task name or a mapping"),
    ("key-task-twice", ev(lambda e: e.cfg(tasks=["gsm8k", "gsm8k"])), "a task is listed twice"),
    ("key-num-fewshot-negative", ev(lambda e: e.cfg(tasks=[{"name": "gsm8k", "num_fewshot": -1}])),
     "'tasks[0].num_fewshot' must be >= 0"),
    ("key-num-fewshot-type", ev(lambda e: e.cfg(tasks=[{"name": "gsm8k", "num_fewshot": "two"}])),
     "'tasks[0].num_fewshot' must be an integer"),
    ("key-task-limit-0", ev(lambda e: e.cfg(tasks=[{"name": "gsm8k", "limit": 0}])), "'tasks[0].limit' must be >= 1"),
    ("key-until-type", ev(lambda e: e.cfg(tasks=[{"name": "gsm8k", "until": "\n"}])), "'tasks[0].until' must be a list"),
    ("key-split-unknown", ev(lambda e: e.cfg(tasks=[{"name": "gsm8k", "split": "train"}])),
     "'tasks[0].split' must be one of test, dev"),
    ("key-task-key-unknown", ev(lambda e: e.cfg(tasks=[{"name": "gsm8k", "fewshot": 2}])),
     "unknown key 'tasks[0].fewshot'"),
    ("key-max-new-tokens-0", ev(lambda e: e.cfg(tasks=[{"name": "gsm8k", "generation": {"max_new_tokens": 0}}])),
     "'tasks[0].generation.max_new_tokens' must be >= 1"),
    ("key-max-new-tokens-float", ev(lambda e: e.cfg(generation={"max_new_tokens": 1.5})),
     "'generation.max_new_tokens' must be an integer"),
    ("key-temperature-nan", ev(lambda e: e.cfg(generation={"temperature": float("nan")})),
     "'generation.temperature' must be a finite number >= 0 (0: greedy), got nan"),
    ("key-temperature-negative", ev(lambda e: e.cfg(generation={"temperature": -1.0})),
     "'generation.temperature' must be a finite number >= 0"),
    ("key-temperature-inf", ev(lambda e: e.cfg(generation={"temperature": float("inf")})), "got inf"),
    ("key-task-temperature-nan", ev(lambda e: e.cfg(tasks=[{"name": "gsm8k", "generation": {"temperature": float("nan")}}])),
     "'tasks[0].generation.temperature' must be a finite number"),
    ("key-temperature-type", ev(lambda e: e.cfg(generation={"temperature": "hot"})),
     "'generation.temperature' must be a number, got str"),
    ("key-generation-unknown", ev(lambda e: e.cfg(generation={"top_k": 5})), "unknown key 'generation.top_k'"),
    ("key-limit-0", ev(lambda e: e.cfg(limit=0)), "key 'limit' must be >= 1"),
    ("key-limit-type", ev(lambda e: e.cfg(limit="5")), "key 'limit' must be an integer or null, got str"),
    ("key-limit-reaches-dev", ev(lambda e: e.cfg(tasks=["nq_open"], limit=5000)), "limit 5000 would reach the dev rows"),
    ("key-seed-type", ev(lambda e: e.cfg(seed="x")), "key 'seed' must be an integer"),
    ("key-batch-size-0", ev(lambda e: e.cfg(batch_size=0)), "key 'batch_size' must be >= 1"),
    ("key-batch-size-bool", ev(lambda e: e.cfg(batch_size=True)), "key 'batch_size' must be an integer, got bool"),
    ("key-bootstrap-0", ev(lambda e: e.cfg(bootstrap=0)), "key 'bootstrap' must be >= 1"),
    ("key-bootstrap-negative", ev(lambda e: e.cfg(bootstrap=-1)), "key 'bootstrap' must be >= 1"),
    ("key-output-path-type", ev(lambda e: e.cfg(output_path=5)), "key 'output_path' must be a string"),
    ("key-data-dir-type", ev(lambda e: e.cfg(data_dir=["x"])), "key 'data_dir' must be a string or null"),
    ("key-runs-and-method", ev(lambda e: e.cfg(method="single")), "give either 'runs:' or a top-level"),
    ("key-runs-empty", ev(lambda e: e.cfg(runs=[])), "'runs' is empty"),
    ("key-runs-type", ev(lambda e: e.cfg(runs={"a": 1})), "key 'runs' must be a list"),
    ("key-run-unknown-key", ev(lambda e: e.run(method="single", membrs=["x"])), "unknown key 'runs[0].membrs'"),
    ("key-method-unknown", ev(lambda e: e.run(method="adafuze", members=ADA)), "unknown method 'adafuze' (did you mean"),
    ("key-method-missing", ev(lambda e: e.run(members=ADA)), "missing required key 'runs[0].method'"),
    ("key-members-empty", ev(lambda e: e.run(method="single", members=[])), "'runs[0].members' is empty"),
    ("key-members-type", ev(lambda e: e.run(method="single", members="smollm2-135m")), "'runs[0].members' must be a list"),
    ("key-member-unknown", ev(lambda e: e.run(method="single", members=["smollm3"])),
     "unknown model 'smollm3' (did you mean 'smollm2-135m'?)"),
    ("key-run-name-slash", ev(lambda e: e.run(name="a/b", method="fake", members=["m"])), "must not contain '/'"),
    ("key-run-names-twice", ev(lambda e: e.cfg(runs=[{"name": "a", "method": "fake", "members": ["m"]}] * 2)),
     "run name(s) a used twice"),
    ("key-options-type", ev(lambda e: e.run(method="adafuse", members=ADA, options=[1])), "'runs[0].options' must be a mapping"),
    ("option-unknown", ev(lambda e: e.run(method="adafuse", members=ADA, options={"thresold": 0.5})),
     "unknown option 'thresold' for method 'adafuse'"),
    ("option-out-of-range", ev(lambda e: e.run(method="adafuse", members=ADA, options={"threshold": -2})),
     "option threshold=-2 is invalid"),
    ("option-lead-out-of-range", ev(lambda e: e.run(method="adafuse", members=ADA, options={"lead": 5})),
     "lead=5 is invalid: a member index in 0..1"),
    ("option-weights-wrong", ev(lambda e: e.run(method="token-union", members=ADA, options={"weights": [1, -1]})),
     "weights=[1, -1] are invalid"),
    ("option-fusion-unknown", ev(lambda e: e.run(method="token-union", members=ADA, options={"fusion": "max"})),
     "fusion must be one of mean, contrastive, got 'max'"),
    ("option-beta-negative", ev(lambda e: e.run(method="token-union", members=ADA,
                                                options={"fusion": "contrastive", "beta": -1})),
     "beta must be a number >= 0, got -1"),
    ("option-dtype-unknown", ev(lambda e: e.run(method="adafuse", members=ADA, options={"dtype": "int4"})),
     "unknown dtype 'int4'"),
    ("option-drafters-length", ev(lambda e: e.run(method="adafuse", members=ADA, options={"drafters": ["lookup"]})),
     "drafters must list one entry (or null) per member"),
    ("option-member-drafting-lead", ev(lambda e: e.run(method="adafuse", members=ADA, options={"member_drafting": 0})),
     "member_drafting=0 is invalid: the index of a member other than the lead (0)"),
    ("option-member-drafting-unknown", ev(lambda e: e.run(method="adafuse", members=ADA,
                                                          options={"member_drafting": "gemma3"})),
     "member_drafting='gemma3' names no member other than the lead (smollm2-135m)"),
    ("option-member-drafting-type", ev(lambda e: e.run(method="adafuse", members=ADA, options={"member_drafting": [1]})),
     "member_drafting=[1] is invalid"),
    ("option-member-drafting-lead-drafter", ev(lambda e: e.run(
        method="adafuse", members=ADA, options={"member_drafting": "cheapest", "drafters": ["hybrid:smollm2-135m", None]})),
     "set the lead's drafter to null or 'lookup'"),
    ("option-drafter-bad-spec", ev(lambda e: e.run(method="adafuse", members=ADA, options={"drafters": ["foo:bar", None]})),
     "'foo:' is no drafter kind"),
    ("single-option-unknown", ev(lambda e: e.run(method="single", members=["smollm2-135m"], options={"foo": 1})),
     "method 'single' does not take option(s) foo"),
    ("single-speculative-unknown", ev(lambda e: e.run(method="single", members=["smollm2-135m"],
                                                      options={"drafter": "lookup", "dept": 3})),
     "unknown speculative option(s) dept"),
    ("single-speculative-range", ev(lambda e: e.run(method="single", members=["smollm2-135m"],
                                                    options={"drafter": "lookup", "depth": -1})),
     "depth an int >= 0, got 1, -1"),
    ("single-two-members", ev(lambda e: e.run(method="single", members=ADA)), "takes exactly one member, got 2"),
    ("single-dtype-unknown", ev(lambda e: e.run(method="single", members=["smollm2-135m"], options={"dtype": "int3"})),
     "unknown dtype 'int3'"),
    # -- benchmark data files -------------------------------------------------------------------
    ("data-line-not-utf8", ev(lambda e: e.cfg(data_dir=e.broken_data("gsm8k/test.jsonl", b'{"question": "caf\xe9"}\n'))),
     "test.jsonl: line 1 is not UTF-8 text (byte 0xe9)"),
    ("data-line-not-json", ev(lambda e: e.cfg(data_dir=e.broken_data("gsm8k/test.jsonl", b'{"question": 1}\n{oops\n'))),
     "test.jsonl: line 2 is not JSON"),
    ("data-row-lacks-field", ev(lambda e: e.cfg(data_dir=e.broken_data("gsm8k/test.jsonl", b'{"q": "x", "answer": "1"}\n'))),
     "test.jsonl: row 1 lacks field 'question'"),
    ("data-file-empty", ev(lambda e: e.cfg(data_dir=e.broken_data("gsm8k/test.jsonl", b""))), "test.jsonl is empty"),
    ("data-file-binary", ev(lambda e: e.cfg(data_dir=e.broken_data("gsm8k/test.jsonl", bytes(range(256))))),
     "test.jsonl is a binary file"),
    ("data-wmt-not-utf8", ev(lambda e: e.cfg(tasks=["wmt22_de_en"], data_dir=e.broken_data("wmt22/de-en.ref", b"ok\n\xff\n"))),
     "de-en.ref: line 2 is not UTF-8 text"),
    # -- generate ----------------------------------------------------------------------------
    ("generate-no-prompt", gen("--model", "TINY"), "required: --prompt"),
    ("generate-model-and-members", gen("--model", "TINY", "--members", "a,b", "--prompt", "x"), "exactly one of --model"),
    ("generate-no-model", gen("--prompt", "x"), "exactly one of --model"),
    ("generate-members-with-drafter", lambda e: ["generate", "--members", f"{e.tiny},{e.tiny}", "--drafter", "lookup",
                                                 "--prompt", "x"],
     "--drafter applies to one --model; an ensemble's members take --drafters"),
    ("generate-model-with-ensemble-flags", gen("--model", "TINY", "--method", "token-union", "--lead", "1", "--prompt", "x"),
     "--method, --lead apply to an ensemble"),
    ("generate-bad-view", lambda e: ["generate", "--members", f"{e.tiny},{e.tiny}[shot=0:2]", "--prompt", "x"],
     "did you mean 'shots'"),
    ("generate-model-unknown", gen("--model", "smollm3", "--prompt", "x"), "unknown model 'smollm3'"),
    ("generate-empty-prompt", gen("--model", "TINY", "--prompt", "", "--raw"), "--prompt #1 is empty"),
    ("generate-blank-second-prompt", gen("--model", "TINY", "--prompt", "hi", "--prompt", "  "), "--prompt #2 is empty"),
    ("generate-100k-token-prompt", gen("--model", "TINY", "--prompt", "a" * 100_000, "--raw"),
     "prompt #1 is 100000 tokens long, but member 'tiny' has a context of 512 tokens"),
    ("generate-prompt-plus-new-tokens-beyond-context",
     gen("--model", "TINY", "--prompt", "a" * 500, "--raw", "--max_new_tokens", "20"),
     "asks for up to 20 new tokens, but member 'tiny' has a context of 512 tokens; lower max_new_tokens"),
    ("generate-speculative-prompt-plus-new-tokens-beyond-context",
     gen("--model", "TINY", "--drafter", "lookup", "--prompt", "a" * 500, "--raw", "--max_new_tokens", "20"),
     "asks for up to 20 new tokens, but member 'tiny' has a context of 512 tokens; lower max_new_tokens"),
    ("generate-temperature-nan", gen("--model", "TINY", "--prompt", "x", "--temperature", "nan"), "--temperature nan is invalid"),
    ("generate-temperature-negative", gen("--model", "TINY", "--prompt", "x", "--temperature", "-1"),
     "--temperature -1.0 is invalid"),
    ("generate-top-p-0", gen("--model", "TINY", "--prompt", "x", "--temperature", "1", "--top_p", "0"), "--top_p 0.0 is invalid"),
    ("generate-top-k-negative", gen("--model", "TINY", "--prompt", "x", "--top_k", "-1"), "--top_k -1 is invalid"),
    ("generate-max-new-tokens-0", gen("--model", "TINY", "--prompt", "x", "--max_new_tokens", "0"), "--max_new_tokens must be >= 1"),
    ("generate-max-new-tokens-type", gen("--model", "TINY", "--prompt", "x", "--max_new_tokens", "ten"), "invalid int value: 'ten'"),
    ("generate-dtype-unknown", gen("--model", "TINY", "--prompt", "x", "--dtype", "int8"), "argument --dtype: invalid choice"),
    ("generate-drafter-bad-suffix", gen("--model", "TINY", "--drafter", "smollm2-135m@int4", "--prompt", "x"),
     "unknown suffix '@int4'"),
    ("generate-verifier-unknown", gen("--model", "TINY", "--drafter", "lookup", "--verifier", "nope", "--prompt", "x"),
     "unknown verifier 'nope'"),
    ("generate-depth-negative", gen("--model", "TINY", "--drafter", "lookup", "--depth", "-1", "--prompt", "x"),
     "depth an int >= 0"),
    ("generate-stop-below-range", gen("--model", "TINY", "--drafter", "lookup", "--stop_below", "1.5", "--prompt", "x"),
     "stop_below must be in [0, 1)"),
    ("generate-scheme-unknown", gen("--model", "TINY", "--scheme", "nope", "--prompt", "x"), "argument --scheme: invalid choice"),
    ("generate-members-unknown", gen("--members", "smollm2-135m,smollm3", "--prompt", "x"), "unknown model 'smollm3'"),
    ("generate-members-threshold", gen("--members", ",".join(ADA), "--threshold", "5", "--prompt", "x"),
     "option threshold=5.0 is invalid"),
    ("generate-members-weights", gen("--members", ",".join(ADA), "--weights", "1,x", "--prompt", "x"),
     "--weights must be comma-separated numbers"),
    ("generate-members-drafters", gen("--members", ",".join(ADA), "--drafters", "lookup", "--prompt", "x"),
     "--drafters needs one entry per member (2)"),
    ("generate-members-lead", gen("--members", ",".join(ADA), "--lead", "7", "--prompt", "x"), "lead=7 is invalid"),
    ("generate-members-method", gen("--members", ",".join(ADA), "--method", "vote", "--prompt", "x"),
     "argument --method: invalid choice: 'vote'"),
    # -- report ------------------------------------------------------------------------------
    ("report-no-folder", lambda e: ["report"], "required: DIR"),
    ("report-folder-missing", lambda e: ["report", str(e.root / "nothere")], "no such folder"),
    ("report-no-metrics", lambda e: ["report", str(e.root / "empty-run")], "no metrics.json found under"),
    ("report-metrics-corrupted", lambda e: ["report", str(e.root / "bad-metrics")], "metrics.json is corrupted (not JSON)"),
    ("report-metrics-foreign", lambda e: ["report", str(e.root / "foreign-metrics")],
     "is no metrics file of `adafuse eval` (no task, run, primary_metric, score)"),
    ("report-cost-unknown", lambda e: ["report", str(e.root), "--cost", "joules"], "argument --cost: invalid choice"),
    # -- bound -------------------------------------------------------------------------------
    ("bound-ns-type", lambda e: ["bound", "--source", "fake", "--ns", "x"], "argument --ns: invalid _ints value: 'x'"),
    ("bound-temperatures-type", lambda e: ["bound", "--source", "fake", "--temperatures", "hot"], "argument --temperatures"),
    ("bound-temperatures-nan", lambda e: ["bound", "--source", "fake", "--temperatures", "0.7,nan"], "finite numbers > 0"),
    ("bound-temperatures-zero", lambda e: ["bound", "--source", "fake", "--temperatures", "0"], "finite numbers > 0"),
    ("bound-verifier-unknown", lambda e: ["bound", "--source", "fake", "--methods", "nope"], "unknown or unsupported verifiers"),
    ("bound-num-prompts-0", lambda e: ["bound", "--source", "fake", "--num_prompts", "0"], "must be positive"),
    ("bound-source-unknown", lambda e: ["bound", "--source", "web"], "argument --source: invalid choice: 'web'"),
    ("bound-data-missing", lambda e: ["bound", "--data_dir", str(e.root / "nodata")], "no benchmark data at"),
    # -- models ------------------------------------------------------------------------------
    ("models-no-action", lambda e: ["models"], "required: ACTION"),
    ("models-action-unknown", lambda e: ["models", "delete"], "invalid choice: 'delete'"),
    ("models-fetch-nothing", lambda e: ["models", "fetch"], "required: NAME"),
    ("models-fetch-unknown", lambda e: ["models", "fetch", "smollm3"], "unknown model 'smollm3'"),
    ("models-path-unknown", lambda e: ["models", "path", "gemma3-27m"], "unknown model 'gemma3-27m' (did you mean 'gemma3-270m'?)"),
    # -- tune (flags and every tune key) ---------------------------------------------------------
    ("tune-config-missing", lambda e: ["tune", str(e.root / "none.yaml")], "tune config file not found"),
    ("tune-no-tune-block", lambda e: ["tune", e.cfg()], "missing required key 'tune'"),
    ("tune-with-runs", tune(top={"runs": [{"method": "single", "members": ["x"]}]}), "a tune config has no 'runs'/'method'"),
    ("tune-split-given", tune(top={"tasks": [{"name": "gsm8k", "split": "dev"}]}), "drop 'split' in a tune config"),
    ("tune-temperature-negative", tune(top={"generation": {"temperature": -0.5}}), "must be a finite number >= 0"),
    ("tune-key-unknown", tune(budget=3), "unknown key 'tune.budget'"),
    ("tune-members-one", tune(members=["smollm2-135m"]), "must list at least 2 distinct members"),
    ("tune-members-twice", tune(members=["smollm2-135m", "smollm2-135m"]), "at least 2 distinct members"),
    ("tune-member-unknown", tune(members=["smollm2-135m", "gemma3-27m"]), "unknown model 'gemma3-27m'"),
    ("tune-dev-rows-0", tune(dev_rows=0), "tune.dev_rows must be >= 1, got 0"),
    ("tune-dev-rows-type", tune(dev_rows="x"), "'tune.dev_rows' must be an integer"),
    ("tune-dev-rows-flag-0", tune("--dev_rows", "0"), "--dev_rows must be >= 1"),
    ("tune-min-rows-0", tune(min_rows=0), "'tune.min_rows' must be >= 1"),
    ("tune-eta-1", tune(eta=1), "'tune.eta' must be >= 2"),
    ("tune-prune-ratio-range", tune(prune_ratio=1.5), "'tune.prune_ratio' must be in [0, 1]"),
    ("tune-prune-ratio-nan", tune(prune_ratio=float("nan")), "'tune.prune_ratio' must be in [0, 1], got nan"),
    ("tune-subset-sizes-range", tune(subset_sizes=[5]), "'tune.subset_sizes' must list sizes in 2..2"),
    ("tune-weights-unknown", tune(weights=["bogus"]), "'tune.weights[0]' must be one of uniform, dev"),
    ("tune-weights-empty", tune(weights=[]), "'tune.weights' is empty"),
    ("tune-lead-unknown", tune(lead="worst"), "'tune.lead' must be one of best, all"),
    ("tune-min-gain-type", tune(min_gain="a"), "'tune.min_gain' must be a number"),
    ("tune-min-gain-nan", tune(min_gain=float("nan")), "'tune.min_gain' must be a finite number, got nan"),
    ("tune-max-candidates-0", tune(max_candidates=0), "'tune.max_candidates' must be >= 1"),
    ("tune-methods-empty", tune(methods=[]), "'tune.methods' is empty"),
    ("tune-method-single", tune(methods=[{"method": "single"}]), "every member alone is always scored"),
    ("tune-method-unknown", tune(methods=[{"method": "adafuze"}]), "unknown method 'adafuze'"),
    ("tune-grid-not-a-list", tune(methods=[{"method": "adafuse", "grid": {"threshold": 0.5}}]),
     "'tune.methods[0].grid.threshold' must be a non-empty list"),
    ("tune-option-searched", tune(methods=[{"method": "adafuse", "options": {"lead": 1}}]), "option 'lead' is what tune searches"),
    ("tune-option-per-member", tune(methods=[{"method": "adafuse", "options": {"drafters": [None, None]}}]),
     "option 'drafters' lists one entry per member"),
    ("tune-grid-option-unknown", tune(methods=[{"method": "adafuse", "grid": {"thresold": [0.5]}}]),
     "unknown option 'thresold' for method 'adafuse'"),
    ("tune-grid-value-range", tune(methods=[{"method": "adafuse", "grid": {"threshold": [0.5, 3]}}]),
     "option threshold=3 is invalid"),
]


def _one_error_line(argv: list[str], capsys) -> str:
    try:
        rc = adafuse_main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    lines = [line for line in error_text(capsys.readouterr().err).splitlines() if line.strip()]  # (no load lines)
    assert rc == 2, f"exit status {rc}, stderr: {lines}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr: {lines}"
    assert lines[0].startswith("error: ") and "Traceback" not in lines[0]
    return lines[0]


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(case, env: Env, capsys) -> None:
    name, argv, expected = case
    line = _one_error_line(argv(env), capsys)
    assert expected in line, line


def test_the_valid_bases_pass(env: Env, capsys) -> None:
    """What the cases mutate is valid: the same configs and flags without the mistake succeed."""
    out = env.root / "valid-out"
    assert adafuse_main(["eval", env.cfg(output_path=str(out)), "--no_progress"]) == 0
    assert adafuse_main(["tune", env.tune(), "--dry_run"]) == 0
    assert adafuse_main(["generate", "--model", str(env.tiny), "--prompt", "abc", "--max_new_tokens", "2"]) == 0
    assert adafuse_main(["report", str(out)]) == 0
    assert adafuse_main(["bound", "--source", "fake", "--num_prompts", "1", "--positions", "2", "--ns", "2",
                         "--temperatures", "1", "--methods", "rrs", "--output_dir", str(env.root / "bound")]) == 0


@pytest.mark.parametrize("argv, expected", [
    (["evaluate"], "invalid choice: 'evaluate'"),
    (["eval", "CONFIG"], "is a binary file, not a YAML config"),
])
def test_real_processes_print_one_line(env: Env, argv: list[str], expected: str) -> None:
    """The console path (`python -m eval.cli`): one line on stderr, exit 2, no traceback."""
    argv = [env.file("bin.yaml", bytes(range(256))) if a == "CONFIG" else a for a in argv]
    environ = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "eval.cli", *argv], capture_output=True, text=True, env=environ,
                          timeout=120, cwd=env.root)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and expected in err[0], proc.stderr
