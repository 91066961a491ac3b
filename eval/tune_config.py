"""Tune configs (`adafuse tune CONFIG`, the search itself is `eval.tune`), validated up front: every
mistake is one `ConfigError` line naming the file and the key.

A tune config is an eval config (`eval.config`: tasks, generation, `limit` = the *test* rows the tuned
config will evaluate, seed, batch_size, data_dir, bootstrap, output_path) plus a `tune:` block:

    tune:
      members: [smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b]
      dev_rows: 24            # dev budget: every member alone and every finalist is scored on these
      min_rows: 6             # rows of the first halving round (default: dev_rows // 4, at least 1)
      eta: 2                  # each round keeps the best 1/eta and grows the rows by eta
      prune_ratio: 0.5        # a member whose dev score alone is < ratio x the best stays out of ensembles
      subset_sizes: [2, 3]    # ensemble sizes (default: 2 .. every kept member)
      lead: best              # best: the subset's best member alone leads | all: each member in turn
      weights: [uniform, dev] # uniform, and/or proportional to the members' dev scores
      min_gain: 0.0           # an ensemble is chosen only if it beats the best single by more than this
      metric: f1              # the task metric to choose on (default: the task's first, e.g. exact_match)
      max_candidates: null    # at most this many ensembles, the highest prior (mean member score) first
      methods:                # any method and any option grid (every combination is a candidate)
        - {method: adafuse, options: {span: 3}, grid: {threshold: [0.5, 0.7], candidates: [2, 4]}}
        - {method: adafuse, options: {fusion: lead-keeps}, grid: {keep_margin: [0.5, 2.0]}}
        - {method: token-union}

A method may be listed more than once (a grid that only makes sense with another option's value).
Options are checked up front by the method's own parser (`adafuse.methods`), every combination.

Read as an eval config (`eval.config.load_config`), a tune config's runs are each member alone.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.errors import ConfigError
from eval import methods as eval_methods
from eval.config import EvalConfig, _check_method, _member_names, parse_config, read_yaml
from runtime.views import model_of
from runtime.schema import Field, validate

LEADS = ("best", "all")
WEIGHTS = ("uniform", "dev")
SEARCHED = ("lead", "weights")           # options the tune sets itself
PER_MEMBER = ("drafters", "devices")               # per-member lists do not follow a subset
ENSEMBLE_KWARGS = ("dtype", "chat")      # `adafuse.Ensemble` arguments that are not method options
METHOD_ENTRY = {"method": Field((str,), required=True), "options": Field((dict,)), "grid": Field((dict,)),
                "lead": Field((str,), choices=LEADS), "weights": Field((list,), item=Field((str,), choices=WEIGHTS))}
TUNE_SCHEMA: dict[str, Field] = {
    "members": Field((list,), required=True, item=Field((str, dict))),
    "dev_rows": Field((int,), required=True),
    "min_rows": Field((int,)),
    "eta": Field((int,)),
    "prune_ratio": Field((float,)),
    "subset_sizes": Field((list,), item=Field((int,))),
    "lead": Field((str,), choices=LEADS),
    "weights": Field((list,), item=Field((str,), choices=WEIGHTS)),
    "min_gain": Field((float,)),
    "max_candidates": Field((int, type(None))),
    "metric": Field((str,)),
    "methods": Field((list,), required=True, item=Field((dict,), fields=METHOD_ENTRY)),
}


@dataclass
class MethodGrid:
    """One `tune.methods` entry: a method, its fixed options, an option grid, lead/weights overrides."""

    method: str
    options: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list] = field(default_factory=dict)
    lead: str | None = None
    weights: list[str] | None = None

    def combos(self) -> list[dict[str, Any]]:
        """Every combination of the grid, each merged over the fixed options (keys in grid order)."""
        keys = list(self.grid)
        return [{**self.options, **dict(zip(keys, values))} for values in itertools.product(*self.grid.values())]


@dataclass
class TuneSpec:
    """The validated `tune:` block (see the module docstring for each key)."""

    members: list[str]
    dev_rows: int
    min_rows: int
    methods: list[MethodGrid]
    eta: int = 2
    prune_ratio: float = 0.5
    subset_sizes: list[int] | None = None
    lead: str = "best"
    weights: list[str] = field(default_factory=lambda: ["uniform"])
    min_gain: float = 0.0
    max_candidates: int | None = None
    metric: str | None = None


@dataclass
class TuneConfig:
    """A tune config: the eval side (tasks, test `limit`, runs = each member alone) and the search."""

    source: str
    eval: EvalConfig
    tune: TuneSpec


def _fail(source: str, message: str) -> ConfigError:
    return ConfigError(f"{source}: {message}")


def _parse_methods(raw: list[dict], source: str) -> list[MethodGrid]:
    grids = []
    for i, entry in enumerate(raw):
        where = f"tune.methods[{i}]"
        _check_method(entry["method"], f"{where}.", source)
        if entry["method"] == "single":
            raise _fail(source, f"{where}.method: every member alone is always scored; list ensemble methods here")
        options, grid = dict(entry.get("options") or {}), dict(entry.get("grid") or {})
        for key in [*options, *grid]:
            if key in SEARCHED:
                raise _fail(source, f"{where}: option '{key}' is what tune searches; set tune.{key} instead")
            if key in PER_MEMBER:
                raise _fail(source, f"{where}: option '{key}' lists one entry per member, which a member subset breaks")
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise _fail(source, f"key '{where}.grid.{key}' must be a non-empty list of values")
        mg = MethodGrid(entry["method"], options, grid, entry.get("lead"), entry.get("weights"))
        _check_options(mg, where, source)
        grids.append(mg)
    if not grids:
        raise _fail(source, "key 'tune.methods' is empty; list at least one ensemble method")
    return grids


def _check_options(mg: MethodGrid, where: str, source: str) -> None:
    """Every grid combination through the method's own option parser (real `adafuse` methods only;
    backends registered in `eval.methods.METHODS`, e.g. test fakes, check their options when built)."""
    if mg.method in eval_methods.METHODS:
        return
    from adafuse.methods import METHODS as ADAFUSE_METHODS

    if mg.method not in ADAFUSE_METHODS:
        return
    method = ADAFUSE_METHODS[mg.method]()
    for combo in mg.combos():
        try:
            method.parse_options({k: v for k, v in combo.items() if k not in ENSEMBLE_KWARGS})
        except (ConfigError, TypeError) as exc:
            raise _fail(source, f"{where}: {' '.join(str(exc).split())}") from None


def parse_tune(data: Any, source: str, *, dev_rows: int | None = None, **overrides: Any) -> TuneConfig:
    """Validate a tune config mapping (one-line `ConfigError`s naming the key); `dev_rows` and the
    `eval.config.parse_config` keyword overrides (limit, output_path, seed, batch_size, data_dir) win."""
    if not isinstance(data, dict) or "tune" not in data:
        raise _fail(source, "missing required key 'tune' (a tune config is an eval config plus a 'tune:' block)")
    if "runs" in data or "method" in data:
        raise _fail(source, "a tune config has no 'runs'/'method': tune builds them from 'tune.members' and 'tune.methods'")
    raw = validate(data["tune"], TUNE_SCHEMA, source, "tune.")
    members = with_default_views(_member_names(list(raw["members"]), "tune.", source))
    if len(members) < 2 or len(set(members)) != len(members):
        raise _fail(source, f"key 'tune.members' must list at least 2 distinct members, got {members}")
    cfg = parse_config({**data, "tune": {**data["tune"], "members": members}}, source, **overrides)
    if any(t.task.split != "test" for t in cfg.tasks):
        raise _fail(source, "tasks: drop 'split' in a tune config; tune scores on dev rows and writes a config for test rows")
    rows = dev_rows if dev_rows is not None else raw["dev_rows"]
    if rows < 1:
        raise _fail(source, f"{'--dev_rows' if dev_rows is not None else 'key tune.dev_rows'} must be >= 1, got {rows}")
    min_rows = min(raw.get("min_rows", max(1, rows // 4)), rows)
    spec = TuneSpec(members=members, dev_rows=rows, min_rows=min_rows, methods=_parse_methods(raw["methods"], source),
                    eta=raw.get("eta", 2), prune_ratio=float(raw.get("prune_ratio", 0.5)),
                    subset_sizes=raw.get("subset_sizes"), lead=raw.get("lead", "best"),
                    weights=list(raw.get("weights", ["uniform"])), min_gain=float(raw.get("min_gain", 0.0)),
                    max_candidates=raw.get("max_candidates"), metric=raw.get("metric"))
    _check_numbers(spec, raw, source)
    _check_metric(spec, cfg, source)
    return TuneConfig(source=source, eval=cfg, tune=spec)


def with_default_views(members: list[str]) -> list[str]:
    """`members`, with each model's default prompt added (first, before its views) where only views
    of it are listed: the default prompt is always among the candidates."""
    out: list[str] = []
    for m in members:
        base = model_of(m)
        if base != m and base not in members and base not in out:
            out.append(base)
        out.append(m)
    return out


def _check_numbers(spec: TuneSpec, raw: dict[str, Any], source: str) -> None:
    if "min_rows" in raw and raw["min_rows"] < 1:
        raise _fail(source, f"key 'tune.min_rows' must be >= 1, got {raw['min_rows']}")
    if spec.eta < 2:
        raise _fail(source, f"key 'tune.eta' must be >= 2, got {spec.eta}")
    if not math.isfinite(spec.min_gain):
        raise _fail(source, f"key 'tune.min_gain' must be a finite number, got {spec.min_gain}")
    if not 0.0 <= spec.prune_ratio <= 1.0:
        raise _fail(source, f"key 'tune.prune_ratio' must be in [0, 1], got {spec.prune_ratio}")
    if spec.subset_sizes is not None and (not spec.subset_sizes or
                                          any(not 2 <= s <= len(spec.members) for s in spec.subset_sizes)):
        raise _fail(source, f"key 'tune.subset_sizes' must list sizes in 2..{len(spec.members)}, got {spec.subset_sizes}")
    if not spec.weights:
        raise _fail(source, "key 'tune.weights' is empty; use [uniform], [dev] or both")
    if spec.max_candidates is not None and spec.max_candidates < 1:
        raise _fail(source, f"key 'tune.max_candidates' must be >= 1, got {spec.max_candidates}")


def _check_metric(spec: TuneSpec, cfg: EvalConfig, source: str) -> None:
    """`tune.metric` must be a metric of every task (a finer one than exact match: e.g. f1 on NQ-open)."""
    if spec.metric is None:
        return
    for t in cfg.tasks:
        if spec.metric not in t.task.metric_names:
            raise _fail(source, f"key 'tune.metric': task {t.name} has no metric '{spec.metric}'; "
                                f"use one of {t.task.metric_names}")


def load_tune(path: str | Path, **overrides: Any) -> TuneConfig:
    """Read and validate a tune config file (`parse_tune` for the overrides)."""
    return parse_tune(read_yaml(path, "tune config"), str(path), **overrides)
