"""`adafuse tune` with a scripted, model-free generator: dev rows disjoint from the evaluated rows,
eval configs reaching the dev rows refused, successive halving on a scripted score table, the choice
never worse on dev than the best single, resume without computing a row twice, `tuned.yaml` as an
eval config, and one-line errors for bad tune configs."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from eval import methods
from eval.cli import main as adafuse_main
from eval.config import load_config, parse_config
from eval.data import DEV_START, resolve_data_dir
from eval.runner import evaluate, read_predictions
from eval.task import get_task
from eval.testing import make_data
from eval.tune import Tuner, build_candidates, dev_weights, halving_schedule, successive_halving
from eval.tune_config import load_tune, parse_tune
from runtime.errors import ConfigError
from runtime.outputs import Cost, GenerationOutput

REPO = Path(__file__).resolve().parents[1]
SINGLE_P = {"a": 0.3, "b": 0.6, "c": 0.05}   # P(right answer) of each scripted member alone
CALLS: Counter = Counter()                     # (method, members, options, row) -> generations
STATE: dict = {"fail_after": None, "generations": 0}


def _u(row: int) -> float:
    """A fixed pseudo-random number per row: a system with P = p answers row right iff u < p, so on
    any rows a higher p never scores lower (a scripted, consistent score table)."""
    return ((row * 7919) % 1000) / 1000


def ensemble_p(members: list[str], options: dict) -> float:
    """Scripted ensembles: threshold 0.5 is the good setting, dev weights help a little."""
    base = sum(SINGLE_P[m] for m in members) / len(members)
    return base + (0.35 if options.get("threshold") == 0.5 else 0.0) + (0.05 if options.get("weights") else 0.0)


class Scripted:
    """Answers NQ-open row i right iff u(i) < p; counts every (system, row) it generates."""

    def __init__(self, method: str, members: list[str], options: dict, p: float) -> None:
        self.key = (method, tuple(members), json.dumps(options, sort_keys=True))
        self.members, self.p = members, p

    def generate(self, prompts, *, max_new_tokens, stop, temperature=0.0, seed=None):
        if STATE["fail_after"] is not None and STATE["generations"] >= STATE["fail_after"]:
            raise KeyboardInterrupt
        STATE["generations"] += 1
        outs = []
        for prompt in prompts:
            row = int(re.findall(r"capital number (\d+)", prompt)[-1])
            CALLS[(*self.key, row)] += 1
            cost = Cost()
            for m in self.members:
                cost.add(m, 2, 10)
            text = f" Capital Number {row}" if _u(row) < self.p else " wrong"
            outs.append(GenerationOutput(text=text, num_tokens=3, finish_reason="eos", cost=cost))
        return outs


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch):
    """`single`, `adafuse` and `token-union` answer from the scripted table."""
    CALLS.clear()
    STATE.update(fail_after=None, generations=0)

    def builder(method: str, p_of):
        return lambda members, **options: Scripted(method, members, options, p_of(members, options))

    monkeypatch.setitem(methods.METHODS, "single", builder("single", lambda ms, o: SINGLE_P[ms[0]]))
    monkeypatch.setitem(methods.METHODS, "adafuse", builder("adafuse", ensemble_p))
    monkeypatch.setitem(methods.METHODS, "token-union", builder("token-union", lambda ms, o: ensemble_p(ms, o) - 0.5))
    methods.clear_caches()
    yield
    methods.clear_caches()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("data"), n=2100)  # long enough for every dev start


def _tune_cfg(data: Path, out: Path, **tune) -> dict:
    spec = {"members": ["a", "b", "c"], "dev_rows": 32, "min_rows": 8, "eta": 2, "prune_ratio": 0.25,
            "weights": ["uniform", "dev"],
            "methods": [{"method": "adafuse", "grid": {"threshold": [0.5, 0.9]}}, {"method": "token-union"}], **tune}
    return {"tasks": [{"name": "nq_open", "num_fewshot": 2}], "limit": 5, "output_path": str(out),
            "data_dir": str(data), "bootstrap": 200, "tune": spec}


def _tune(data: Path, out: Path, **tune):
    return Tuner(parse_tune(_tune_cfg(data, out, **tune), "t.yaml"), log=None).run()[0]


# ---------------------------------------------------------------------------------------------
# the dev split


@pytest.mark.parametrize("task", ["gsm8k", "nq_open", "wmt22_de_en", "wmt22_en_zh"])
def test_dev_rows_are_disjoint_from_evaluated_rows(data: Path, task: str) -> None:
    t = get_task(task, num_fewshot=3)
    test, shots = t.load(data)
    dev, dev_shots = t.with_overrides(split="dev").load(data)
    assert dev and test and shots == dev_shots
    start = DEV_START[t.dataset]
    assert [d["id"] for d in dev] == list(range(start, 2100))           # ids stay file row indices
    if t.dataset != "gsm8k":                                            # same file: test stops before dev
        assert max(d["id"] for d in test) == start - 1
        assert not {d["id"] for d in test} & {d["id"] for d in dev}
        assert not {d["id"] for d in shots} & ({d["id"] for d in test} | {d["id"] for d in dev})
    else:            # test.jsonl vs train.jsonl rows; dev and exemplars are both train rows, never the same
        assert test[0]["question"] == "What is twice 1?" and dev[0]["question"] == f"What is twice {1000 + start + 1}?"
        assert max(d["id"] for d in shots) < start
    assert t.with_overrides(split="dev").fingerprint()["split"] == "dev" and "split" not in t.fingerprint()


def test_real_data_dev_rows_disjoint() -> None:
    root = resolve_data_dir(None)  # ../shared/data is where the data lives here and in CI: missing, it fails
    for name in ("gsm8k", "nq_open", "wmt22_de_en"):
        t = get_task(name)
        test, shots = t.load(root)
        dev, _ = t.with_overrides(split="dev").load(root)
        key = "question" if "question" in dev[0] else "src"
        assert not {d[key] for d in dev} & {d[key] for d in test + shots}, name


def test_gsm8k_heldout_rows_are_train_rows_3000_to_3399_and_no_dev_run_reaches_them() -> None:
    root = resolve_data_dir(None)
    t = get_task("gsm8k_chat")
    held, shots = t.with_overrides(split="heldout").load(root)
    dev, _ = t.with_overrides(split="dev").load(root)
    assert [d["id"] for d in held] == list(range(3000, 3400)) and not shots   # zero-shot: no exemplars
    assert [d["id"] for d in dev] == list(range(1000, 3000))                   # dev stops where heldout starts
    assert not {d["question"] for d in held} & {d["question"] for d in dev + t.load(root)[0]}
    with pytest.raises(ConfigError, match="nq_open has no heldout split"):
        get_task("nq_open", split="heldout").load(root)


def test_eval_config_reaching_dev_rows_is_refused() -> None:
    def cfg(task: str, **entry) -> dict:
        return {"tasks": [{"name": task, **entry}], "runs": [{"method": "single", "members": ["m"]}]}

    assert parse_config(cfg("nq_open", limit=1992), "x.yaml").tasks[0].limit == 1992   # rows 8..1999
    for task, limit in (("nq_open", 1993), ("wmt22_de_en", 993)):
        with pytest.raises(ConfigError) as info:
            parse_config(cfg(task, limit=limit), "x.yaml")
        assert "would reach the dev rows" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="x.yaml: tasks.0.: nq_open: limit 5000 would reach"):
        parse_config(cfg("nq_open"), "x.yaml", limit=5000)                                 # --limit too
    with pytest.raises(ConfigError, match="exemplar rows would reach the dev rows"):
        parse_config(cfg("gsm8k", num_fewshot=1001), "x.yaml")
    assert parse_config(cfg("nq_open", limit=5000, split="dev"), "x.yaml").tasks[0].task.split == "dev"


# ---------------------------------------------------------------------------------------------
# the search, without the runner


def test_successive_halving_on_a_scripted_table() -> None:
    table = {"a": {4: 0.50, 8: 0.60, 16: 0.62}, "b": {4: 0.25, 8: 0.40},
             "c": {4: 0.75, 8: 0.55, 16: 0.58}, "d": {4: 0.00}, "e": {4: 0.50, 8: 0.10}}
    asked: list[tuple[str, int]] = []

    def score(name: str, rows: int) -> float:
        asked.append((name, rows))
        return table[name][rows]

    rounds = successive_halving(list(table), score, min_rows=4, eta=2, max_rows=16)
    assert [(r.rows, r.ranked, r.kept) for r in rounds] == [
        (4, ["c", "a", "e", "b", "d"], ["c", "a", "e"]),    # ceil(5/2) = 3 kept; a ties e: by name
        (8, ["a", "c", "e"], ["a", "c"]),
        (16, ["a", "c"], ["a", "c"])]                        # the budget: finalists, all kept
    assert halving_schedule(5, 4, 2, 16) == [(len(r.ranked), r.rows) for r in rounds]
    assert len(asked) == len(set(asked)) == 10               # once per name and round, rows growing
    assert halving_schedule(3, 2, 3, 50) == [(3, 2), (1, 50)]  # one left: straight to the budget
    tie = successive_halving(["x", "y"], lambda n, r: 0.5, min_rows=2, eta=2, max_rows=4,
                             tiebreak=lambda n: (n == "x",))
    assert tie[0].kept == ["y"]                              # ties: the tiebreak (cheaper) first
    assert successive_halving([], score, min_rows=4, eta=2, max_rows=16) == []
    assert halving_schedule(3, 50, 3, 20) == [(3, 20)]       # min_rows above the budget: one full round


def test_candidates_prior_pruning_and_weights() -> None:
    spec = parse_tune(_tune_cfg(Path("."), Path("o"), prune_ratio=0.2), "t.yaml").tune
    cands, kept = build_candidates(spec, {"a": 0.3, "b": 0.6, "c": 0.05})
    assert kept == ["a", "b"]                                # c < 0.2 x 0.6
    # one subset x {uniform, dev} x (2 adafuse thresholds + token-union)
    assert len(cands) == 6 and all(c.members == ["a", "b"] and c.options["lead"] == 1 for c in cands)
    assert {tuple(c.options.get("weights", ())) for c in cands} == {(), (0.3, 0.7)}
    assert dev_weights([0.4, 0.4]) is None and dev_weights([0.0, 0.0]) is None and dev_weights([0.0, 1.0]) == [0.1, 0.9]
    all_cands, _ = build_candidates(spec, {"a": 1.0, "b": 1.0, "c": 1.0})   # equal scores: dev = uniform, deduped
    assert len(all_cands) == 4 * 3 and len({c.name for c in all_cands}) == 12
    lead_all = parse_tune(_tune_cfg(Path("."), Path("o"), lead="all", weights=["uniform"]), "t.yaml").tune
    assert len(build_candidates(lead_all, {"a": 1, "b": 1, "c": 1})[0]) == (2 + 2 + 2 + 3) * 3
    by_f1 = build_candidates(spec, {"a": 0.5, "b": 0.5, "c": 0.0}, rank={"a": (0.5, 0.2), "b": (0.5, 0.3)})[0]
    assert {c.options["lead"] for c in by_f1} == {1}          # a tie on the primary metric: the next one decides
    capped = parse_tune(_tune_cfg(Path("."), Path("o"), max_candidates=3), "t.yaml").tune
    top = build_candidates(capped, {"a": 0.3, "b": 0.6, "c": 0.5})[0]
    assert len(top) == 3 and all(c.members == ["b", "c"] for c in top)    # the highest prior first


# ---------------------------------------------------------------------------------------------
# the search through the runner


def test_tune_chooses_the_best_on_dev_and_writes_a_tuned_config(tmp_path: Path, data: Path, scripted) -> None:
    out = tmp_path / "tune"
    result = _tune(data, out)
    best = max(result.scored.values(), key=lambda s: s.score if s.rows == 32 else -1)
    assert result.chosen.cand.method == "adafuse" and result.chosen.cand.options["threshold"] == 0.5
    assert result.chosen is best and result.chosen.rows == 32 and result.best_single.cand.name == "b"
    assert result.chosen.score > result.best_single.score
    assert result.kept == ["a", "b"]                             # c (0.05) < 0.25 x b alone
    assert result.paired["n"] == 32 and result.paired["diffs"][0]["diff"] == pytest.approx(
        result.chosen.score - result.best_single.score)
    assert [r.rows for r in result.rounds] == [8, 16, 32]
    # every scored row is a dev row (ids from 2000), each computed once
    assert CALLS and all(row >= DEV_START["nq_open"] for *_, row in CALLS) and set(CALLS.values()) == {1}
    cfg = load_config(out / "tuned.yaml")                       # an ordinary eval config, on test rows
    assert [r.name for r in cfg.runs] == ["a", "b", "c", "tuned"]
    tuned = cfg.runs[-1]
    assert (tuned.method, tuned.members, tuned.options) == ("adafuse", result.chosen.cand.members, result.chosen.cand.options)
    assert cfg.tasks[0].task.split == "test" and cfg.tasks[0].limit == 5 and cfg.tasks[0].task.num_fewshot == 2
    CALLS.clear()
    test_results = evaluate(cfg, progress=False, log=None)        # `adafuse eval tuned.yaml`: test rows only
    assert [m["run"] for m in test_results] == ["a", "b", "c", "tuned"] and all(m["n"] == 5 for m in test_results)
    assert {row for *_, row in CALLS} == set(range(8, 13))
    table = (out / "dev_table.md").read_text()
    assert "**chosen**" in table and "dropped at round 0" in table and "pruned from ensembles" in table
    assert "paired diff" in table and "win/tie/loss" in table
    events = [json.loads(line)["event"] for line in (out / "tune.jsonl").read_text().splitlines()]
    assert events[0] == "start" and events[-1] == "done" and "chosen" in events and events.count("round") == 3
    pred = out / "candidates" / result.chosen.cand.name / "nq_open" / "predictions.jsonl"
    assert len(read_predictions(pred)) == 32


def test_never_worse_than_the_best_single_and_ties_go_to_the_single(tmp_path: Path, data: Path, scripted,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SINGLE_P, "b", 0.95)                    # no scripted ensemble reaches b alone
    monkeypatch.setitem(methods.METHODS, "adafuse",
                        lambda members, **o: Scripted("adafuse", members, o, min(0.9, ensemble_p(members, o))))
    result = _tune(data, tmp_path / "worse")
    assert result.chosen.cand.name == "b" and result.chosen is result.best_single
    assert all(result.chosen.score >= s.score for s in result.scored.values() if s.rows == 32)
    assert [r.name for r in load_config(tmp_path / "worse" / "tuned.yaml").runs] == ["a", "b", "c"]
    assert "(the best single itself)" in (tmp_path / "worse" / "dev_table.md").read_text()
    # an ensemble that answers exactly like b: the same dev score, so the cheaper single wins
    monkeypatch.setitem(methods.METHODS, "adafuse", lambda members, **o: Scripted("adafuse", members, o, SINGLE_P["b"]))
    methods.clear_caches()
    tie = _tune(data, tmp_path / "tie", methods=[{"method": "adafuse", "grid": {"threshold": [0.5]}}])
    finalist = tie.scored[tie.rounds[-1].kept[0]]
    assert finalist.score == tie.best_single.score and tie.chosen.cand.name == "b"


def test_tune_chooses_on_the_metric_it_is_told(tmp_path: Path, data: Path, scripted) -> None:
    """`tune.metric: f1` ranks, prunes and chooses on F1 (finer than exact match on few rows)."""
    result = _tune(data, tmp_path / "f1", metric="f1")
    for s in result.scored.values():
        assert s.metrics["primary_metric"] == "f1" and s.score == s.metrics["metrics"]["f1"]["value"]
    assert result.chosen.cand.method == "adafuse" and result.chosen.score > result.best_single.score
    assert "dev f1" in (tmp_path / "f1" / "dev_table.md").read_text()
    on_disk = json.loads((tmp_path / "f1" / "candidates" / "b" / "nq_open" / "metrics.json").read_text())
    assert on_disk["primary_metric"] == "exact_match"           # the run's own metrics are not rewritten


def test_exact_tie_goes_to_the_cheaper_single() -> None:
    from eval.tune import Scored, choose, ensemble, single

    s = Scored(single("b"), 32, {"score": 0.5, "forward_passes_per_example": 3.0})
    e = Scored(ensemble("adafuse", ["a", "b"], {"lead": 1}, "", 0.4), 32, {"score": 0.5, "forward_passes_per_example": 9.0})
    assert choose([s], [e])[0] is s
    better = Scored(e.cand, 32, {"score": 0.52, "forward_passes_per_example": 9.0})
    assert choose([s], [better])[0] is better and choose([s], [better], min_gain=0.05)[0] is s


def test_resume_after_interrupt_computes_no_row_twice(tmp_path: Path, data: Path, scripted) -> None:
    fresh = _tune(data, tmp_path / "fresh")                     # an uninterrupted tune, for reference
    total = sum(CALLS.values())
    CALLS.clear()
    methods.clear_caches()
    out = tmp_path / "tune"
    STATE.update(fail_after=150, generations=0)                 # killed mid-way through the halving rounds
    with pytest.raises(KeyboardInterrupt):
        _tune(data, out)
    assert sum(CALLS.values()) == 150 and not (out / "tuned.yaml").exists()
    STATE["fail_after"] = None
    methods.clear_caches()
    resumed = _tune(data, out)
    assert set(CALLS.values()) == {1} and sum(CALLS.values()) == total   # each (system, row) once overall
    assert resumed.chosen.cand.name == fresh.chosen.cand.name
    assert {n: (s.rows, s.score) for n, s in resumed.scored.items()} == {n: (s.rows, s.score) for n, s in fresh.scored.items()}
    methods.clear_caches()
    _tune(data, out)                                            # a finished tune computes nothing
    assert sum(CALLS.values()) == total
    before = set(CALLS)
    _tune(data, out, dev_rows=40)                               # a bigger budget: only new rows of known systems
    assert set(CALLS.values()) == {1}
    new_singles = {row for (method, _, _, row) in set(CALLS) - before if method == "single"}
    assert new_singles == set(range(2032, 2040))


def test_cli_tune_dry_run_and_exit_codes(tmp_path: Path, data: Path, scripted, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(_tune_cfg(data, tmp_path / "out")))
    assert adafuse_main(["tune", str(path), "--dry_run"]) == 0
    plan = capsys.readouterr().out
    assert "rounds (candidates x rows): 24x8, 12x16, 6x32" in plan
    assert "rows to compute per task: 96 single + at most 384 ensemble" in plan
    assert adafuse_main(["tune", str(path), "--no_progress", "--dev_rows", "16"]) == 0
    captured = capsys.readouterr()
    assert "nq_open: chosen adafuse-" in captured.out and "[nq_open] stage 0: b (alone)" in captured.err
    assert (tmp_path / "out" / "tuned.yaml").exists()
    path.write_text(yaml.safe_dump({**_tune_cfg(data, tmp_path / "out"), "tune": {"members": ["a", "b"]}}))
    assert adafuse_main(["tune", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "missing required key 'tune.dev_rows'" in err
    assert adafuse_main(["tune", str(path), "--dev_rows", "0"]) == 2
    assert adafuse_main(["tune", str(path) + ".nope"]) == 2


def test_dev_budget_beyond_the_dev_rows(tmp_path: Path, data: Path, scripted) -> None:
    with pytest.raises(ConfigError, match=r"tune.dev_rows=500 but nq_open has 100 dev rows"):
        _tune(data, tmp_path / "o", dev_rows=500)


# ---------------------------------------------------------------------------------------------
# tune config validation


def _err(**change) -> str:
    data = _tune_cfg(Path("."), Path("o"))
    for key, value in change.items():
        if key.startswith("tune_"):
            data["tune"][key[5:]] = value
        else:
            data[key] = value
    with pytest.raises(ConfigError) as info:
        parse_tune(data, "configs/t.yaml")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("configs/t.yaml")
    return msg


def test_bad_tune_configs_are_one_line_errors() -> None:
    assert "did you mean 'dev_rows'" in _err(tune_devrows=3)
    assert "key 'tune.eta' must be >= 2" in _err(tune_eta=1)
    assert "'tune.prune_ratio' must be in [0, 1]" in _err(tune_prune_ratio=1.5)
    assert "tune.subset_sizes" in _err(tune_subset_sizes=[1])
    assert "at least 2 distinct members" in _err(tune_members=["a", "a"])
    assert "tune.lead' must be one of best, all" in _err(tune_lead="first")
    assert "tune.weights[0]' must be one of uniform, dev" in _err(tune_weights=["scores"])
    assert "did you mean 'adafuse'" in _err(tune_methods=[{"method": "adafuze"}])
    assert "every member alone is always scored" in _err(tune_methods=[{"method": "single"}])
    assert "'tune.methods' is empty" in _err(tune_methods=[])
    assert "grid.threshold' must be a non-empty list" in _err(tune_methods=[{"method": "adafuse", "grid": {"threshold": 0.5}}])
    assert "set tune.lead instead" in _err(tune_methods=[{"method": "adafuse", "grid": {"lead": [0, 1]}}])
    assert "one entry per member" in _err(tune_methods=[{"method": "adafuse", "options": {"drafters": ["lookup"]}}])
    # real methods check every grid combination with their own option parser, before any model loads
    assert "threshold=2.0 is invalid" in _err(tune_methods=[{"method": "adafuse", "grid": {"threshold": [0.5, 2.0]}}])
    assert "unknown option 'thresh'" in _err(tune_methods=[{"method": "word-fixed", "grid": {"thresh": [0.5]}}])
    assert "task nq_open has no metric 'bleu'; use one of ['exact_match', 'f1']" in _err(tune_metric="bleu")
    assert "has no 'runs'" in _err(runs=[{"method": "single", "members": ["a"]}])
    assert "drop 'split'" in _err(tasks=[{"name": "nq_open", "split": "dev"}])
    assert "limit 2000 would reach the dev rows" in _err(limit=2000)
    with pytest.raises(ConfigError, match="missing required key 'tune'"):
        parse_tune({"tasks": ["nq_open"]}, "t.yaml")
    with pytest.raises(ConfigError, match="--dev_rows must be >= 1"):
        parse_tune(_tune_cfg(Path("."), Path("o")), "t.yaml", dev_rows=0)


def test_any_method_option_grid_plugs_in() -> None:
    """Grids are generic: any option of the method (here the word-level fusion knobs) is a grid key,
    checked by the method's own parser; a method listed twice gives a conditional grid."""
    grid = [{"method": "adafuse", "grid": {"fusion": ["mean", "confidence"], "threshold": [0.5, 0.8]}},
            {"method": "adafuse", "options": {"fusion": "lead-keeps"}, "grid": {"keep_margin": [0.5, 2.0]}}]
    spec = parse_tune({**_tune_cfg(Path("."), Path("o")), "tune": {"members": ["a", "b"], "dev_rows": 8, "methods": grid}},
                      "t.yaml").tune
    cands, _ = build_candidates(spec, {"a": 0.5, "b": 0.4})
    assert [(c.options.get("fusion"), c.options.get("threshold"), c.options.get("keep_margin")) for c in cands] == [
        ("mean", 0.5, None), ("mean", 0.8, None), ("confidence", 0.5, None), ("confidence", 0.8, None),
        ("lead-keeps", None, 0.5), ("lead-keeps", None, 2.0)]
    assert all(c.options["lead"] == 0 for c in cands)
    assert "fusion='avg' is invalid" in _err(tune_methods=[{"method": "adafuse", "grid": {"fusion": ["mean", "avg"]}}])


def test_shipped_tune_configs_are_valid() -> None:
    paths = sorted([*(REPO / "configs").glob("tune_*.yaml"), *(REPO / "experiments").glob("tune_*/tune_*.yaml")])
    assert {p.name for p in paths} >= {"tune_wmt.yaml", "tune_nq.yaml", "tune_gsm8k.yaml"}
    for path in paths:
        cfg = load_tune(path)
        assert len(cfg.tune.members) >= 2 and cfg.tune.methods   # an ensemble needs two members
        cands, _ = build_candidates(cfg.tune, {m: 1.0 for m in cfg.tune.members})
        assert 1 <= len(cands) <= 40, path.name                  # affordable on 2 cores
        as_eval = load_config(path)                              # read by `adafuse eval`: the members alone
        assert [r.members for r in as_eval.runs] == [[m] for m in cfg.tune.members]
