"""Program views' answers (`runtime.program_answers`): an output that is a program is run in the
sandbox and its answer is what it printed, in single runs and in the records the harness writes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval import methods
from eval.config import parse_config
from eval.runner import evaluate
from runtime.outputs import Cost, GenerationOutput
from runtime.program_answers import ProgramGenerator, answer_text, attach_programs, run_output

pytestmark = pytest.mark.usefixtures("fake_backend")   # conftest: the fake backend; `data` too


def _out(text: str) -> GenerationOutput:
    return GenerationOutput(text, 3, "eos", Cost())


def test_an_outputs_program_runs_and_its_answer_is_what_it_printed():
    text = "Here is the program:\n```python\nx = 6 * 7\nprint(x)\n```\nIt prints 41."
    result = run_output(text)
    assert result.stdout == "42\n" and result.error is None
    (out,) = attach_programs([_out(text)])
    assert out.program["stdout"] == "42\n" and out.program["error"] is None and "guards" in out.program
    assert answer_text(out.text, out.program) == "42\n"       # the filter reads the program's output
    assert answer_text("The answer is 41.", None) == "The answer is 41."


def test_a_bad_program_is_recorded_and_has_no_answer():
    (out,) = attach_programs([_out("```python\nimport os\nos.system('echo hi')\n```")])
    assert out.program["error"].startswith("forbidden") and out.program["stdout"] == ""
    (out,) = attach_programs([_out("```python\nx = 1\n```")])
    assert out.program["error"] == "no output"


class _Programs:
    """A generator whose every output is a program printing twice the question's number."""

    def generate(self, prompts, *, max_new_tokens, stop, temperature=0.0, seed=None):
        outs = []
        for p in prompts:
            n = int("".join(ch for ch in p.rsplit("Question:", 1)[-1] if ch.isdigit()) or 0)
            outs.append(_out(f"```python\nprint({n} * 2)\n```"))
        return outs


def test_a_single_run_of_a_program_view_records_the_program_and_scores_what_it_printed(data: Path, tmp_path: Path,
                                                                                       monkeypatch):
    monkeypatch.setitem(methods.METHODS, "programs", lambda members, **o: ProgramGenerator(_Programs()))
    cfg = parse_config({"tasks": ["gsm8k"], "limit": 3, "output_path": str(tmp_path / "out"), "data_dir": str(data),
                        "bootstrap": 50, "runs": [{"name": "p", "method": "programs", "members": ["m"]}]}, "x.yaml")
    (metrics,) = evaluate(cfg, progress=False, log=None)
    recs = [json.loads(line) for line in (tmp_path / "out" / "p" / "gsm8k" / "predictions.jsonl").read_text().splitlines()]
    assert metrics["score"] == 1.0                  # the fake data's gold is twice the question's number
    for r in recs:
        assert r["output"].startswith("```python") and r["program"]["error"] is None
        assert r["extracted"] == r["program"]["stdout"].strip() == r["gold"]
