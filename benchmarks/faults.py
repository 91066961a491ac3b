"""SIGKILL fault injection for `adafuse eval`, `adafuse tune`, `adafuse bound` and `adafuse rlid train`
(no real models: fakes, synthetic logits, a tiny random LM saved to a folder).

Each command runs as a real CLI subprocess (`python -c` registering the model-free fakes of
`eval.testing`). It is killed K times in a row, each after a random delay (seeded), then rerun until
it completes; the result is compared with an uninterrupted run in another folder:

- rows lost: records that were complete on disk right after a kill but are missing from the final
  file (should be 0); rows redone: prompts generated beyond the uninterrupted run's count (the
  batches in flight: at most kills x batch size);
- duplicates: ids written twice in one predictions.jsonl (bound: measure.jsonl, its measured positions);
- outputs equal: per records file, {id: output} equal to the uninterrupted run's (greedy and,
  in `eval`, a seeded T > 0 task);
- metrics equal: every metrics.json (tune: also tuned.yaml; bound: bound.json rows) equal, apart
  from wall-time fields.

    python benchmarks/faults.py --kills 5 --seed 0
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eval.testing import make_data  # noqa: E402

# wall-time fields, and how many processes wrote the records (a killed run is resumed by another)
WALL_KEYS = {"wall_time_s", "wall_s_per_example", "tokens_per_s", "collect_s", "measure_s", "processes"}
PRELUDE = ("import sys; from eval import testing; {register};"
           "from eval.cli import main; sys.exit(main(sys.argv[1:]))")


@dataclass
class Scenario:
    """One command: `argv(out, log)` runs it into folder `out`, fakes logging prompts to `log`."""

    name: str
    command: str
    register: Callable[[str], str]
    argv: Callable[[Path], list[str]]
    batch_size: int = 1
    resumable: bool = True
    log: bool = True  # whether its fakes log the prompts they generate


@dataclass
class Outcome:
    scenario: Scenario
    kills: int = 0
    attempts: int = 0
    lost: int = 0
    redone: int = 0
    duplicates: int = 0
    outputs_equal: bool = False
    metrics_equal: bool = False
    notes: list[str] = field(default_factory=list)
    after_kill: list[dict[str, list[Any]]] = field(default_factory=list)  # snapshot() right after each kill


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _start(sc: Scenario, out: Path, log: Path, cwd: Path) -> subprocess.Popen:
    script = PRELUDE.format(register=sc.register(str(log)))
    return subprocess.Popen([sys.executable, "-c", script, *sc.argv(out)], cwd=cwd, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


# eval/tune predictions; bound's measured positions; RL training's log (one line per step)
RECORD_FILES = ("predictions.jsonl", "measure.jsonl", "log.jsonl")
RL_TIME_FIELDS = ("wall_s", "rollout_s", "update_s", "decisions_per_s")  # rlid.train_loop.TIME_FIELDS


def raw_records(path: Path) -> list[dict]:
    """Every complete line of a records file, duplicates kept, read only (`read_predictions`
    would cut a torn last line off, doing the runner's repair for it). Records get an `id` and an
    `output`: a measured position of `adafuse bound` is identified by (temperature, position) and
    its output is its values; the journal's settings line is no record."""
    records = []
    for line in path.read_bytes().split(b"\n")[:-1]:  # the part after the last newline is in flight
        try:
            rec = json.loads(line)
        except ValueError:
            rec = {"id": None, "output": None}  # a bad line: counts as a foreign record
        if "settings" in rec:
            continue
        if "step" in rec and "id" not in rec:  # an RL training step: its log line without timings
            rec = {"id": rec["step"], "output": json.dumps({k: v for k, v in rec.items() if k not in RL_TIME_FIELDS},
                                                           sort_keys=True)}
        elif "id" not in rec:
            rec = {"id": (rec.get("t"), rec.get("j")), "output": json.dumps([rec.get("alpha"), rec.get("est")])}
        records.append(rec)
    return records


def record_files(out: Path) -> list[Path]:
    return sorted(p for name in RECORD_FILES for p in out.rglob(name))


def snapshot(out: Path) -> dict[str, list[Any]]:
    """{records file path relative to `out`: ids of its complete lines, in file order}."""
    return {str(p.relative_to(out)): [r["id"] for r in raw_records(p)] for p in record_files(out)}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in WALL_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def outputs_of(out: Path) -> dict[str, dict[Any, str]]:
    """{predictions.jsonl path: [(id, output)] sorted by id}, duplicates kept."""
    return {str(p.relative_to(out)): sorted(((r["id"], r["output"]) for r in raw_records(p)), key=repr)
            for p in record_files(out)}


def metrics_of(out: Path) -> dict[str, Any]:
    """Every metrics.json / bound.json (rows) / tuned*.yaml under `out`, wall-time fields dropped."""
    found: dict[str, Any] = {}
    for p in sorted(out.rglob("metrics.json")):
        found[str(p.relative_to(out))] = _strip(json.loads(p.read_text()))
    for p in sorted(out.rglob("bound.json")):
        found[str(p.relative_to(out))] = _strip(json.loads(p.read_text()))
    for p in sorted(out.rglob("latest.json")):  # RL training: the newest checkpoint
        found[str(p.relative_to(out))] = checkpoint_of(p.parent / json.loads(p.read_text())["path"])
    for p in sorted(out.glob("tuned*.yaml")):
        found[p.name] = p.read_text().replace(str(out), "OUT")  # the comment and output_path name the folder
    return found


def checkpoint_of(folder: Path) -> dict[str, Any]:
    """What an RL checkpoint's run continues from: the adapter weights and the optimizer state (bytes)
    and the run's own generator (the one its sampling draws from). Left out: the adapter config (peft
    lists target modules in set order, which varies between processes), torch's and Python's global
    generators (the run draws from neither) and the wall-time counters."""
    import torch

    rng = torch.load(folder / "rng.pt", weights_only=False)
    return {"adapter": hashlib.sha256((folder / "adapter" / "adapter_model.safetensors").read_bytes()).hexdigest(),
            "optimizer": hashlib.sha256((folder / "optimizer.pt").read_bytes()).hexdigest(),
            "generator": hashlib.sha256(rng["generator"].numpy().tobytes()).hexdigest()}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def reference(sc: Scenario, root: Path) -> tuple[Path, int, float, float]:
    """An uninterrupted run: (folder, prompts generated, seconds from its first to its last logged
    prompt (the generation), total seconds)."""
    out, log = root / f"{sc.name}_ref", root / f"{sc.name}_ref.log"
    t0 = time.perf_counter()
    proc = _start(sc, out, log, root)
    first = last = None
    seen = 0
    while proc.poll() is None:
        n = _lines(log)
        if n > seen:
            seen, last = n, time.perf_counter() - t0
            first = last if first is None else first
        time.sleep(0.02)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{sc.name}: the uninterrupted run failed: {proc.stderr.read().decode()[-2000:]}")
    return out, _lines(log), (last - first) if first is not None else total, total


def _kill_delay(sc: Scenario, proc: subprocess.Popen, out: Path, log: Path, rng: random.Random, total: float, work: float,
                total_rows: int) -> float:
    """Seconds from now to the kill: logging commands first wait for this start's first prompt (so
    the kill lands in the work, not the imports), then a uniform share of the work left (by the
    records on disk: one per prompt of the uninterrupted run)."""
    if not sc.log:
        return rng.uniform(0.3, 0.9) * total
    before, done = _lines(log), sum(map(len, snapshot(out).values())) if out.exists() else 0
    while proc.poll() is None and _lines(log) == before:
        time.sleep(0.01)
    left = max(0.05, 1 - done / max(total_rows, 1))
    return rng.uniform(0.0, work * left)


def inject(sc: Scenario, root: Path, kills: int, rng: random.Random, total: float, work: float,
           total_rows: int) -> Outcome:
    """Kill `kills` times, each after a random delay; rerun to completion; count what was lost."""
    res = Outcome(sc)
    out, log = root / f"{sc.name}_killed", root / f"{sc.name}_killed.log"
    while True:
        proc = _start(sc, out, log, root)
        res.attempts += 1
        if res.kills < kills:
            try:
                proc.wait(timeout=_kill_delay(sc, proc, out, log, rng, total, work, total_rows))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                res.kills += 1
                res.after_kill.append(snapshot(out) if out.exists() else {})
                continue
        else:
            proc.wait()
        if proc.returncode != 0:
            res.notes.append(f"attempt {res.attempts} exited {proc.returncode}: "
                             f"{proc.stderr.read().decode().strip().splitlines()[-1:]}")
            if res.attempts > kills + 3:
                return res
            continue
        return res


def judge(res: Outcome, ref_out: Path, ref_rows: int, root: Path) -> Outcome:
    """Fill in lost / redone / duplicates / equality against the uninterrupted run in `ref_out`."""
    out, log = root / f"{res.scenario.name}_killed", root / f"{res.scenario.name}_killed.log"
    final = snapshot(out)
    res.duplicates = sum(len(ids) - len(set(ids)) for ids in final.values())
    res.redone = _lines(log) - ref_rows
    res.outputs_equal = outputs_of(out) == outputs_of(ref_out)
    res.metrics_equal = metrics_of(out) == metrics_of(ref_out) and bool(metrics_of(ref_out))
    for snap in res.after_kill:
        res.lost += sum(len(set(ids) - set(final.get(path, []))) for path, ids in snap.items())
    return res


def run_scenario(sc: Scenario, root: Path, kills: int, rng: random.Random) -> Outcome:
    ref_out, ref_rows, generation, total = reference(sc, root)
    res = inject(sc, root, kills, rng, total, max(generation, 0.2), ref_rows)
    return judge(res, ref_out, ref_rows, root)


def eval_scenario(root: Path, data: Path) -> Scenario:
    """Two runs x two tasks, batches of 2: gsm8k at T = 0, nq_open at T = 0.8 with seed 7."""
    import yaml

    cfg = {"tasks": ["gsm8k", {"name": "nq_open", "generation": {"temperature": 0.8}}], "limit": 8,
           "data_dir": str(data), "bootstrap": 200, "seed": 7, "batch_size": 2,
           "runs": [{"name": "greedy", "method": "fake", "members": ["m1"], "options": {"delay": 0.2}},
                    {"name": "sampled", "method": "fake", "members": ["m1", "m2"],
                     "options": {"delay": 0.2, "mode": "sample"}}]}
    path = root / "eval.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return Scenario("eval", "adafuse eval eval.yaml (fake, 2 runs x 2 tasks x 8 rows, batch 2, T=0 and T=0.8 seed 7)",
                    lambda log: f"testing.register_fake(log_path={log!r})",
                    lambda out: ["eval", str(path), "--output_path", str(out), "--no_progress"], batch_size=2)


def tune_scenario(root: Path, data: Path) -> Scenario:
    """The scripted tune of tests/test_eval_tune.py: 3 members, adafuse threshold grid + token-union."""
    import yaml

    spec = {"members": ["a", "b", "c"], "dev_rows": 32, "min_rows": 8, "eta": 2, "prune_ratio": 0.25,
            "weights": ["uniform", "dev"],
            "methods": [{"method": "adafuse", "grid": {"threshold": [0.5, 0.9]}}, {"method": "token-union"}]}
    cfg = {"tasks": [{"name": "nq_open", "num_fewshot": 2}], "limit": 5, "data_dir": str(data),
           "bootstrap": 200, "batch_size": 4, "tune": spec}
    path = root / "tune.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return Scenario("tune", "adafuse tune tune.yaml (scripted fakes, 3 members, 32 dev rows, batch 4)",
                    lambda log: f"testing.register_scripted(delay=0.02, log_path={log!r})",
                    lambda out: ["tune", str(path), "--output_path", str(out), "--no_progress"], batch_size=4)


# bound: each measured position is logged when it starts (as the fakes log each prompt)
BOUND_LOG = ("from specdec import bound_cli as _b; _m = _b.measure_position; "
             "_b.measure_position = lambda *a, **k: (open({log!r}, 'a').write('x\\n'), _m(*a, **k))[1]")


def bound_scenario() -> Scenario:
    return Scenario("bound", "adafuse bound --source fake (6 prompts x 4 positions x 2 temperatures, V=4096)",
                    lambda log: BOUND_LOG.format(log=log),
                    lambda out: ["bound", "--source", "fake", "--num_prompts", "6", "--positions", "4",
                                 "--fake_vocab", "4096", "--ns", "2,4", "--temperatures", "0.7,1.0",
                                 "--num_samples", "128", "--output_dir", str(out)])


# RL training: each step is logged when it starts (as the fakes log each prompt)
RLID_LOG = ("from rlid import train_loop as _t; _s = _t.TrainerBase.train_step; "
            "_t.TrainerBase.train_step = lambda self: (open({log!r}, 'a').write('x\\n'), _s(self))[1]")


def rlid_scenario(root: Path) -> Scenario:
    """Decision-plane RL training of a tiny random model saved to a folder (ARC-1D, 10 steps of
    2 seeds x 2 rollouts, a checkpoint after every step)."""
    import yaml

    from runtime.testing import char_tokenizer, tiny_model

    folder = root / "tiny_lm"
    tok = char_tokenizer()
    model = tiny_model("llama", vocab_size=len(tok), hidden=32, layers=1)
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)

    def argv(out: Path) -> list[str]:
        cfg = {"output_path": str(out), "model": str(folder), "seed": 0, "env": {"name": "arc_1d"},
               "train": {"seeds": {"start": 0, "count": 8}, "seeds_per_step": 2, "group_size": 2, "max_steps": 10,
                         "checkpoint_every": 1, "lr": 1e-3, "lora": {"r": 2, "alpha": 4}},
               "eval": {"seeds": {"start": 1000, "count": 4}}}
        path = out.parent / f"{out.name}.rlid.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return ["rlid", "train", str(path), "--plane", "decision", "--no_progress"]

    return Scenario("rlid", "adafuse rlid train --plane decision (tiny LM folder, ARC-1D, 10 steps, checkpoint each step)",
                    lambda log: RLID_LOG.format(log=log), argv)


def table(outcomes: list[Outcome]) -> str:
    """The markdown fault table."""
    lines = ["| fault | command | times injected | records on disk at each kill | rows lost | rows redone (in flight, bound) | duplicates "
             "| outputs equal | metrics equal |", "|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        sc = o.scenario
        redone = (f"{o.redone} (<= {o.kills * sc.batch_size})" if sc.resumable
                  else "all: not resumable, each rerun starts over")
        lost = str(o.lost) if sc.resumable else "n/a (no partial output)"
        yes = {True: "yes", False: "**no**"}
        at_kill = ", ".join(str(sum(map(len, snap.values()))) for snap in o.after_kill) if sc.resumable else "-"
        lines.append(f"| SIGKILL x{o.kills} in a row, random delays | `{sc.command}` | {o.kills} "
                     f"(of {o.attempts} starts) | {at_kill} | {lost} | {redone} | {o.duplicates} | {yes[o.outputs_equal]} "
                     f"| {yes[o.metrics_equal]} |")
    for o in outcomes:
        lines += [f"\n{o.scenario.name}: {note}" for note in o.notes]
    return "\n".join(lines)


def run_all(kills: dict[str, int], seed: int, root: Path) -> list[Outcome]:
    """Each scenario named in `kills` (name -> K), killed K times with one seeded RNG."""
    rng = random.Random(seed)
    small, dev = make_data(root / "data", n=16), make_data(root / "data_dev", n=2100)
    makers = {"eval": lambda: eval_scenario(root, small), "tune": lambda: tune_scenario(root, dev),
              "bound": bound_scenario, "rlid": lambda: rlid_scenario(root)}
    return [run_scenario(makers[name](), root, k, rng) for name, k in kills.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5, help="SIGKILLs in a row per command")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill delays")
    ap.add_argument("--commands", default="eval,tune,bound,rlid", help="comma-separated subset of eval,tune,bound,rlid")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="faults_") as tmp:
        outcomes = run_all({c: args.kills for c in args.commands.split(",") if c}, args.seed, Path(tmp))
    print(table(outcomes))
    print(f"\n{time.perf_counter() - t0:.0f} s in all (--kills {args.kills} --seed {args.seed})")
    ok = all(o.lost == 0 and o.duplicates == 0 and o.outputs_equal and o.metrics_equal for o in outcomes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
