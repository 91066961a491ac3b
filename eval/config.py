"""Experiment configs (`configs/*.yaml`): tasks x runs (method + members + options), decoding,
limit, seed, batch size and output folder. Validated up front; every mistake is one `ConfigError` line.

    tasks: [gsm8k, {name: nq_open, num_fewshot: 2, limit: 5, generation: {max_new_tokens: 16}}]
    generation: {max_new_tokens: 128, temperature: 0.0}
    limit: 5
    runs:
      - {name: smollm2, method: single, members: [smollm2-135m]}
      - {name: ens, method: adafuse, members: [smollm2-135m, gemma3-270m], options: {...}}

A single run may be written at top level instead of `runs:` (`method`, `members`, `options`, `name`).
`baseline: RUN` names the run every other run is paired with on the same examples (its task, or
another task over the same rows: the strongest model at its best prompt beside its default prompt).
A task entry's `split: dev` evaluates the dev rows (`eval.data`; default `test`); a test range that
would reach the dev rows is refused. A tune config (`adafuse tune`, `eval.tune`) is an eval config
with a `tune:` block; read as an eval config, its runs are then each `tune.members` member alone.
Generation settings: task file < config `generation` < task entry `generation`. Limits: config
`limit` < task entry `limit` < `--limit`.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


from runtime.devices import check_devices
from runtime.errors import ConfigError
from runtime.config_files import read_yaml, resolve_config_path, shipped_config_dirs  # noqa: F401 (re-exported)
from runtime.views import member_spec, normalise_member, parse_view
from eval.methods import known_methods
from runtime.schema import Field, validate
from eval.data import SPLITS
from eval.task import Task, get_task

GENERATION = Field((dict,), fields={"max_new_tokens": Field((int,)), "temperature": Field((float,))})
TASK_ENTRY = {
    "name": Field((str,), required=True),
    "num_fewshot": Field((int,)),
    "limit": Field((int,)),
    "offset": Field((int,)),   # skip the first `offset` rows of the split (then `limit` rows)
    "until": Field((list,), item=Field((str,))),
    "generation": GENERATION,
    "split": Field((str,), choices=SPLITS),
}
MEMBER_ENTRY = {"name": Field((str,), required=True), "device": Field((str,)), "view": Field((dict,))}
RUN = {
    "name": Field((str,)),
    "method": Field((str,), required=True),
    "members": Field((list,), required=True, item=Field((str, dict), fields=MEMBER_ENTRY)),
    "options": Field((dict,)),
    "tasks": Field((list,), item=Field((str,))),
}
CONFIG_SCHEMA: dict[str, Field] = {
    "description": Field((str,)),
    "tasks": Field((list, str), required=True),
    "runs": Field((list,), item=Field((dict,), fields=RUN)),
    "name": Field((str,)),
    "method": Field((str,)),
    "members": Field((list,), item=Field((str,))),
    "options": Field((dict,)),
    "generation": GENERATION,
    "limit": Field((int, type(None))),
    "seed": Field((int,)),
    "batch_size": Field((int,)),
    "output_path": Field((str,)),
    "data_dir": Field((str, type(None))),
    "bootstrap": Field((int,)),
    "dtype": Field((str,)),  # every run's model dtype unless its options set one (default float32)
    "tune": Field((dict,)),  # validated by eval.tune; here only its `members` (the runs when none are given)
    "baseline": Field((str,)),  # the run every other run is paired with (the strongest model at its best prompt)
}


@dataclass
class TaskSpec:
    """One task as a config resolves it."""

    name: str
    task: Task
    limit: int | None
    max_new_tokens: int
    temperature: float
    offset: int = 0                      # rows offset .. offset + limit - 1 of the split

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "num_fewshot": self.task.num_fewshot, "limit": self.limit, "until": self.task.until,
                "generation": {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature},
                **({"split": self.task.split} if self.task.split != "test" else {}),
                **({"offset": self.offset} if self.offset else {})}


@dataclass
class RunSpec:
    """One system to evaluate."""

    name: str
    method: str
    members: list[str]
    options: dict[str, Any] = field(default_factory=dict)
    tasks: list[str] | None = None        # only these of the config's tasks (None: all of them)

    def to_dict(self) -> dict[str, Any]:
        """The run as a config entry (`tasks` only when set)."""
        return {k: v for k, v in asdict(self).items() if k != "tasks" or v is not None}

    def runs_on(self, task: str) -> bool:
        """Whether this run is evaluated on `task`."""
        return self.tasks is None or task in self.tasks


@dataclass
class EvalConfig:
    """A validated, fully resolved experiment config."""

    source: str
    tasks: list[TaskSpec]
    runs: list[RunSpec]
    output_path: str
    data_dir: str | None = None
    seed: int = 0
    batch_size: int = 1
    bootstrap: int = 1000
    description: str = ""
    dtype: str | None = None
    baseline: str | None = None           # the run every other run is paired with, on the same examples

    def to_dict(self) -> dict[str, Any]:
        """The resolved config (what `config.yaml` in the output folder records)."""
        return {"source": self.source, "description": self.description, "output_path": self.output_path,
                "data_dir": self.data_dir, "seed": self.seed, "batch_size": self.batch_size, "bootstrap": self.bootstrap,
                **({"dtype": self.dtype} if self.dtype else {}),
                **({"baseline": self.baseline} if self.baseline else {}),
                "tasks": [t.to_dict() for t in self.tasks], "runs": [r.to_dict() for r in self.runs]}

    def run_options(self, run: RunSpec) -> dict[str, Any]:
        """`run`'s options with the config's `dtype` where the run sets none."""
        if self.dtype and "dtype" not in run.options:
            return {**run.options, "dtype": self.dtype}
        return dict(run.options)


def _positive(value: Any, key: str, source: str, minimum: int = 1) -> None:
    if value is not None and value < minimum:
        if key.startswith("--"):  # a command-line flag, not a key of the file
            raise ConfigError(f"{key} must be >= {minimum}, got {value}")
        raise ConfigError(f"{source}: key '{key}' must be >= {minimum}, got {value}")


def _check_temperature(value: Any, key: str, source: str) -> None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{source}: key '{key}' must be a finite number >= 0 (0: greedy), got {value}")


def _check_method(method: str, where: str, source: str) -> None:
    known = known_methods()
    if method not in known:
        close = difflib.get_close_matches(method, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(known)})"
        raise ConfigError(f"{source}: {where}method: unknown method '{method}'{hint}")


def _tune_runs(data: dict[str, Any], source: str) -> dict[str, Any]:
    """A tune config read as an eval config: without runs of its own, each `tune.members` member
    alone is a run (what `adafuse eval` on it compares); the rest of `tune:` is `eval.tune`'s."""
    if "tune" not in data or "runs" in data or "method" in data:
        return data
    members = data["tune"].get("members")
    if not isinstance(members, list) or not members or not all(isinstance(m, (str, dict)) for m in members):
        raise ConfigError(f"{source}: key 'tune.members' must be a non-empty list of members (names or views)")
    names = _member_names(members, "tune.", source)
    return {**data, "runs": [{"name": m, "method": "single", "members": [m]} for m in names]}


def _member_names(entries: list, where: str, source: str) -> list[str]:
    """Each member entry as its member spec string: a name, or a view of a model in its canonical
    form `name[k=v,...]` (`runtime.views`; a mapping's `view:` or the bracket spelling)."""
    names = []
    for i, m in enumerate(entries):
        try:
            if isinstance(m, dict):
                names.append(member_spec(m["name"], parse_view(m.get("view"), "view.")) if m.get("view") is not None
                             else normalise_member(m["name"]))
            else:
                names.append(normalise_member(m))
        except ConfigError as exc:
            raise ConfigError(f"{source}: key '{where}members[{i}]': {exc}") from None
    return names


def _placed_members(run: dict[str, Any], where: str, source: str) -> dict[str, Any]:
    """`members: [{name: a, device: cuda:1, view: {...}}, b]` -> member specs (views in their
    canonical string form) plus the devices as the method's option (`device` for single, `devices`
    for ensembles; members without one stay on the CPU)."""
    entries = run["members"]
    names = _member_names(entries, where, source)
    if not any(isinstance(m, dict) and m.get("device") for m in entries):
        return {"members": names}
    devices = [(m.get("device") if isinstance(m, dict) else None) or "cpu" for m in entries]
    key = "device" if run["method"] == "single" else "devices"
    options = dict(run.get("options") or {})
    if key in options:
        raise ConfigError(f"{source}: key '{where}options.{key}' and devices in '{where}members' both place the "
                          f"members; keep one")
    try:
        placed = check_devices(devices, len(devices))
    except ConfigError as exc:
        raise ConfigError(f"{source}: key '{where}members': {exc}") from None
    options[key] = placed[0] if key == "device" else placed
    return {"members": names, "options": options}


def _check_run_tasks(runs: list[RunSpec], tasks: list[str], source: str) -> None:
    """A run's `tasks` name tasks of the config; two runs share a name only on disjoint tasks (one
    row per task in the report, e.g. each task's tuned ensemble under one name)."""
    for i, run in enumerate(runs):
        if run.tasks is not None:
            unknown = [t for t in run.tasks if t not in tasks]
            if not run.tasks or unknown:
                raise ConfigError(f"{source}: key 'runs[{i}].tasks' must list tasks of this config ({', '.join(tasks)}), "
                                  f"got {run.tasks}")
    for task in tasks:
        names = [r.name for r in runs if r.runs_on(task)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"{source}: run name(s) {', '.join(dupes)} used twice on task {task}; give each run a "
                              f"distinct 'name' (or disjoint 'tasks')")


def _parse_task(entry: Any, i: int, limit: int | None, data: dict, base_gen: dict, source: str) -> TaskSpec:
    """`tasks[i]` of a config (a name or a mapping) as a `TaskSpec`; `limit`: the command line's."""
    if isinstance(entry, str):
        entry = {"name": entry}
    elif not isinstance(entry, dict):
        raise ConfigError(f"{source}: key 'tasks[{i}]' must be a task name or a mapping, got {type(entry).__name__}")
    validate(entry, TASK_ENTRY, source, f"tasks[{i}].")
    _positive(entry.get("num_fewshot"), f"tasks[{i}].num_fewshot", source, 0)
    _positive(entry.get("limit"), f"tasks[{i}].limit", source)
    _positive(entry.get("offset"), f"tasks[{i}].offset", source, 0)
    task_limit = limit if limit is not None else entry.get("limit", data.get("limit"))
    offset = entry.get("offset", 0)
    try:
        task = get_task(entry["name"], num_fewshot=entry.get("num_fewshot"), until=entry.get("until"),
                        split=entry.get("split"))
        task.check_range(None if task_limit is None else offset + task_limit)
    except ConfigError as exc:
        raise ConfigError(f"{source}: tasks[{i}]: {exc}") from None
    gen = {**task.generation_kwargs, **base_gen, **(entry.get("generation") or {})}
    _positive(gen.get("max_new_tokens"), f"tasks[{i}].generation.max_new_tokens", source)
    _check_temperature(gen.get("temperature"), f"tasks[{i}].generation.temperature", source)
    return TaskSpec(name=task.name, task=task, limit=task_limit, max_new_tokens=int(gen.get("max_new_tokens", 128)),
                    temperature=float(gen.get("temperature", 0.0)), offset=offset)


def parse_config(data: Any, source: str = "<config>", *, limit: int | None = None, output_path: str | None = None,
                 seed: int | None = None, batch_size: int | None = None, data_dir: str | None = None) -> EvalConfig:
    """Validate a config mapping and resolve it; keyword arguments are command-line overrides."""
    if isinstance(data, dict) and "env" in data and "model" in data and "tasks" not in data:
        raise ConfigError(f"{source} is an RLiD experiment config; run it with `adafuse rlid train|distill|eval {source}`")
    validate(data, CONFIG_SCHEMA, source)
    data = _tune_runs(data, source)
    if "runs" in data and any(k in data for k in ("method", "members", "options", "name")):
        raise ConfigError(f"{source}: give either 'runs:' or a top-level 'method'/'members', not both")
    if "runs" not in data and "method" not in data:
        raise ConfigError(f"{source}: missing required key 'runs' (or a top-level 'method' and 'members')")
    if "runs" in data and not data["runs"]:
        raise ConfigError(f"{source}: 'runs' is empty; list at least one run (method and members)")
    raw_runs = data.get("runs") or [{k: data[k] for k in ("name", "method", "members", "options") if k in data}]
    runs: list[RunSpec] = []
    for i, r in enumerate(raw_runs):
        where = f"runs[{i}]." if "runs" in data else ""
        if "members" not in r:
            raise ConfigError(f"{source}: missing required key '{where}members'")
        _check_method(r["method"], where, source)
        if not r["members"]:
            raise ConfigError(f"{source}: key '{where}members' is empty; list the run's member model(s)")
        r = {**r, **_placed_members(r, where, source)}
        name = r.get("name") or (r["members"][0] if r["method"] == "single" else r["method"])
        if any(ch in name for ch in "/\\") or name in (".", ".."):
            raise ConfigError(f"{source}: key '{where}name' must not contain '/' ({name!r})")
        runs.append(RunSpec(name=name, method=r["method"], members=list(r["members"]), options=dict(r.get("options") or {}),
                            tasks=list(r["tasks"]) if "tasks" in r else None))

    raw_tasks = data["tasks"] if isinstance(data["tasks"], list) else [data["tasks"]]
    if not raw_tasks:
        raise ConfigError(f"{source}: 'tasks' is empty; list at least one task (e.g. tasks: [gsm8k])")
    base_gen = data.get("generation") or {}
    _check_temperature(base_gen.get("temperature"), "generation.temperature", source)
    tasks: list[TaskSpec] = []
    for i, entry in enumerate(raw_tasks):
        tasks.append(_parse_task(entry, i, limit, data, base_gen, source))
    if len({t.name for t in tasks}) != len(tasks):
        raise ConfigError(f"{source}: a task is listed twice in 'tasks'")
    _check_run_tasks(runs, [t.name for t in tasks], source)

    cfg = EvalConfig(
        source=source, tasks=tasks, runs=runs, description=data.get("description", ""),
        output_path=output_path or data.get("output_path") or str(Path("results") / Path(source).stem),
        data_dir=data_dir or data.get("data_dir"),
        seed=seed if seed is not None else data.get("seed", 0),
        batch_size=batch_size if batch_size is not None else data.get("batch_size", 1),
        bootstrap=data.get("bootstrap", 1000), dtype=data.get("dtype"), baseline=data.get("baseline"),
    )
    if cfg.baseline is not None and cfg.baseline not in {r.name for r in runs}:
        close = difflib.get_close_matches(cfg.baseline, [r.name for r in runs], n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"{source}: key 'baseline' names no run ({cfg.baseline!r}); {hint}runs: "
                          f"{', '.join(r.name for r in runs)}")
    if cfg.dtype is not None:
        from runtime.member import resolve_dtype

        try:
            resolve_dtype("float32" if cfg.dtype == "auto" else cfg.dtype)  # (auto is measured when a model loads)
        except (ConfigError, ValueError, KeyError) as exc:
            raise ConfigError(f"{source}: key 'dtype': {exc}") from None
        cfg.runs = [RunSpec(r.name, r.method, r.members, cfg.run_options(r), r.tasks) for r in cfg.runs]
    _positive(cfg.batch_size, "--batch_size" if batch_size is not None else "batch_size", source)
    _positive(cfg.bootstrap, "bootstrap", source)
    _positive(limit, "--limit", source)
    _positive(data.get("limit"), "limit", source)
    return cfg


def load_config(path: str | Path, **overrides: Any) -> EvalConfig:
    """Read, validate and resolve a config file (see `parse_config` for the overrides)."""
    return parse_config(read_yaml(path), str(path), **overrides)
