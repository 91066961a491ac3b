"""RLiD experiment configs (`experiments/rlid/rlid_*.yaml`), validated like the eval configs: one environment,
one decision model (and optionally an ensemble), training for the decision plane and the token-level
baseline under the same budget, held-out evaluation seeds, and distillation.

    output_path: runs/rlid_countdown
    env: {name: countdown, options: {}, memory_k: 0}
    model: qwen2.5-coder-0.5b          # registry name, local folder or hub id
    train: {seeds: {start: 0, count: 400}, max_wall_s: 900, group_size: 4, lr: 1e-4, lora: {r: 8}}
    eval: {seeds: {start: 100000, count: 100}, batch: 100}   # batch: seeds rolled out together (written per block)
    distill: {epochs: 2, lr: 2e-4}     # init: decision starts the student's adapter from the trained LDM's
                                       # teacher: RUN_FOLDER distils another config's trained LDM (its
                                       #   output_path; default: this config's own decision plane)
    answer: text                       # the LDM answers with the action's own text, not its label
                                       #   (`rlid.text_law`; default: label)
    ensemble: {members: [qwen2.5-coder-0.5b, gemma3-270m], threshold: 0.5, rule: mixture}
    # or chosen on dev seeds among each member alone and these settings (disjoint from eval seeds):
    #   ensemble: {members: [...], dev: {seeds: {start: 5000, count: 50}, candidates: [{lead: 1, weights: [1, 3]}, ...]}}

Every `train` key other than `seeds` is a `rlid.train_loop.TrainConfig` field (checked there);
`train.decision` / `train.token` hold settings for one plane only (e.g. `{exact_last_move: true}`);
`train_seeds`/`out_dir` are set from `seeds`/`output_path`. Train and eval seed ranges must not overlap.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.errors import ConfigError
from runtime.config_files import read_yaml
from runtime.schema import Field, validate

SEEDS = Field((dict,), fields={"start": Field((int,), required=True), "count": Field((int,), required=True)})
PLANE_KEYS = ("decision", "token")  # train.<plane>: settings of one plane's run only
SETTING = {"weights": Field((list,), item=Field((float,))), "lead": Field((int,)), "threshold": Field((float,)),
           "rule": Field((str,), choices=("mixture", "product"))}   # one fused policy (rlid.ensemble.DecisionEnsemble)
SCHEMA: dict[str, Field] = {
    "description": Field((str,)),
    "output_path": Field((str,), required=True),
    "seed": Field((int,)),
    "dtype": Field((str,), choices=("float32", "bfloat16", "auto")),
    "env": Field((dict,), required=True, fields={"name": Field((str,), required=True), "options": Field((dict,)),
                                                 "memory_k": Field((int,))}),
    "model": Field((str,), required=True),
    "label_style": Field((str,), choices=("letters", "numbers")),
    "realise_action_text": Field((bool,)),
    "answer": Field((str,), choices=("label", "text")),
    "token_max_new_tokens": Field((int,)),
    "train": Field((dict,)),
    "eval": Field((dict,), fields={"seeds": SEEDS, "greedy": Field((bool,)), "batch": Field((int,))}),
    "distill": Field((dict,), fields={"epochs": Field((int,)), "lr": Field((float,)), "batch_size": Field((int,)),
                                      "seeds": SEEDS, "only_successful": Field((bool,)), "lora": Field((dict,)),
                                      "init": Field((str,), choices=("fresh", "decision")),
                                      "teacher": Field((str,))}),
    "ensemble": Field((dict,), fields={"members": Field((list,), required=True, item=Field((str,))),
                                       **SETTING,
                                       "adapters": Field((list,), item=Field((str, type(None)))),
                                       "dev": Field((dict,), fields={"seeds": SEEDS,
                                                                     "candidates": Field((list,), item=Field((dict,), fields=SETTING))})}),
}


def seed_range(spec: dict[str, int] | None, default: tuple[int, int]) -> range:
    start, count = (spec["start"], spec["count"]) if spec else default
    if count < 1:
        raise ConfigError(f"a seed range needs count >= 1, got {count}")
    return range(start, start + count)


@dataclass
class RlidConfig:
    """A validated RLiD experiment; `raw` is the mapping as read (for the run's setup record)."""

    source: str
    output_path: Path
    env_name: str
    env_options: dict[str, Any]
    memory_k: int
    model: str
    dtype: str
    seed: int
    label_style: str
    realise_action_text: bool
    token_max_new_tokens: int
    answer: str
    train: dict[str, Any]
    train_seeds: range
    eval_seeds: range
    eval_greedy: bool
    eval_batch: int
    distill: dict[str, Any]
    ensemble: dict[str, Any] | None
    raw: dict[str, Any] = field(default_factory=dict)

    def train_config(self, plane: str, **overrides: Any):
        """The `TrainConfig` of one plane's run (its folder: output_path/<plane>)."""
        from rlid.train_loop import TrainConfig

        shared = {k: v for k, v in self.train.items() if k not in PLANE_KEYS}
        own = self.train.get(plane) or {}
        if not isinstance(own, dict):
            raise ConfigError(f"train.{plane} must be a mapping of training settings for that plane, got {own!r}")
        d = {**shared, **own, "train_seeds": tuple(self.train_seeds), "seed": self.seed, "memory_k": self.memory_k,
             "out_dir": str(self.output_path / plane), **overrides}
        return TrainConfig.from_dict(d)

    def make_env(self):
        from rlid.envs import make_env

        return lambda: make_env(self.env_name, **self.env_options)


def parse_rlid(data: Any, source: str) -> RlidConfig:
    validate(data, SCHEMA, source)
    train = dict(data.get("train") or {})
    for key in ("train_seeds", "out_dir", "seed", "memory_k"):
        if key in train:
            raise ConfigError(f"{source}: 'train.{key}' is set from the config's top level; remove it")
    train_seeds = seed_range(train.pop("seeds", None), (0, 400))
    ev = data.get("eval") or {}
    eval_seeds = seed_range(ev.get("seeds"), (100_000, 100))
    if set(train_seeds) & set(eval_seeds):
        raise ConfigError(f"{source}: train seeds {train_seeds.start}..{train_seeds.stop - 1} overlap eval seeds "
                          f"{eval_seeds.start}..{eval_seeds.stop - 1}; held-out seeds must be disjoint")
    _check_ensemble(data.get("ensemble"), eval_seeds, source)
    if ev.get("batch", 1) < 1:
        raise ConfigError(f"{source}: eval.batch must be >= 1 (seeds rolled out together), got {ev['batch']}")
    env = data["env"]
    from rlid.envs import ENVIRONMENTS, make_env

    if env["name"] not in ENVIRONMENTS:
        raise ConfigError(f"{source}: unknown env '{env['name']}' (choose one of {', '.join(ENVIRONMENTS)})")
    if data.get("answer") == "text" and data.get("realise_action_text"):
        raise ConfigError(f"{source}: realise_action_text is for answer: label (answer: text realises the whole text); "
                          "drop one of them")
    probe = make_env(env["name"], **(env.get("options") or {}))    # bad env options fail here, before loading a model
    _check_stage_seeds(probe, data, train_seeds, eval_seeds, source)
    cfg = RlidConfig(source=source, output_path=Path(data["output_path"]), env_name=env["name"],
                     env_options=dict(env.get("options") or {}), memory_k=int(env.get("memory_k", 0)),
                     model=data["model"], dtype=data.get("dtype", "float32"), seed=int(data.get("seed", 0)),
                     label_style=data.get("label_style", "letters"),
                     realise_action_text=bool(data.get("realise_action_text", False)),
                     answer=data.get("answer", "label"),
                     token_max_new_tokens=int(data.get("token_max_new_tokens", 16)), train=train,
                     train_seeds=train_seeds, eval_seeds=eval_seeds, eval_greedy=bool(ev.get("greedy", True)),
                     eval_batch=int(ev.get("batch", 100)),
                     distill=dict(data.get("distill") or {}), ensemble=data.get("ensemble"), raw=data)
    try:
        token = [cfg.train_config(plane) for plane in PLANE_KEYS][1]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: train: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{source}: train: {exc}") from None
    from rlid.train_loop import DECISION_ONLY

    for name in DECISION_ONLY:
        if getattr(token, name):
            raise ConfigError(f"{source}: train.{name} is for the decision plane only; move it under train.decision")
    return cfg


def _check_stage_seeds(env: Any, data: dict[str, Any], train_seeds: range, eval_seeds: range, source: str) -> None:
    """Environments with official seed folds (`check_stage_seeds`: the TextWorldExpress games) hold
    each stage to its fold: train and distill seeds, ensemble dev seeds, eval seeds."""
    check = getattr(env, "check_stage_seeds", None)
    if check is None:
        return
    stages = [("train", train_seeds), ("eval", eval_seeds)]
    if (data.get("distill") or {}).get("seeds"):
        stages.append(("distill", seed_range(data["distill"]["seeds"], (0, 0))))
    if ((data.get("ensemble") or {}).get("dev")) is not None:
        stages.append(("dev", seed_range(data["ensemble"]["dev"].get("seeds"), (5_000, 50))))
    try:
        for stage, seeds in stages:
            check(stage, seeds)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    finally:
        env.close()                                            # its game (and JVM, if no one else uses it)


def _check_ensemble(e: dict[str, Any] | None, eval_seeds: range, source: str) -> None:
    """Leads inside the member list, one weight per member, dev seeds disjoint from the eval seeds."""
    if not e:
        return
    n = len(e["members"])
    dev = e.get("dev") or {}
    for where, setting in [("ensemble", e)] + [(f"ensemble.dev.candidates[{i}]", c) for i, c in enumerate(dev.get("candidates") or [])]:
        if not 0 <= setting.get("lead", 0) < n:
            raise ConfigError(f"{source}: {where}.lead {setting['lead']} is not a member index (0..{n - 1})")
        if setting.get("weights") is not None and len(setting["weights"]) != n:
            raise ConfigError(f"{source}: {where}.weights needs one weight per member ({n}), got {setting['weights']}")
    if dev:
        dev_seeds = seed_range(dev.get("seeds"), (5_000, 50))
        if set(dev_seeds) & set(eval_seeds):
            raise ConfigError(f"{source}: ensemble.dev seeds {dev_seeds.start}..{dev_seeds.stop - 1} overlap the eval "
                              f"seeds; choose dev seeds outside {eval_seeds.start}..{eval_seeds.stop - 1}")


def load_rlid(path: str | Path) -> RlidConfig:
    return parse_rlid(read_yaml(path), str(path))
