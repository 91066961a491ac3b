"""`adafuse rlid train|eval|distill|report CONFIG`: RLiD experiments from one YAML config.

    adafuse rlid train experiments/rlid/rlid_countdown.yaml --plane decision   # then --plane token (same budget)
    adafuse rlid distill experiments/rlid/rlid_countdown.yaml                  # SFT on the trained LDM's trajectories
    adafuse rlid eval experiments/rlid/rlid_countdown.yaml                     # held-out seeds, every policy
    adafuse rlid report runs/rlid_countdown                           # table + learning-curve plot

Folders under `output_path`: `decision/` and `token/` (each trainer's log.jsonl, checkpoints/),
`distill/` (examples.jsonl, log.jsonl, adapter/), `eval/` (<policy>.json summary and
<policy>.episodes.jsonl per evaluated policy; the ensemble also ensemble.alone<m>.episodes.jsonl per
member alone and ensemble.dev.json, its dev choice). Every verb resumes: training from its newest
checkpoint, eval skips policies already evaluated and finishes a killed one's seeds (`--force` redoes them)."""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from runtime.errors import ConfigError
from rlid.config import RlidConfig, load_rlid, seed_range

VERBS = ("train", "eval", "distill", "report")
PLANES = ("decision", "token")
POLICIES = ("untrained", "untrained-token", "decision", "token", "distill", "ensemble")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("verb", choices=VERBS, help="train a plane, distill, evaluate on held-out seeds, or report")
    parser.add_argument("config", help="an RLiD YAML config (experiments/rlid/rlid_*.yaml), or for report: its output folder")
    parser.add_argument("--plane", choices=PLANES, default="decision", help="train: decision plane or token level")
    parser.add_argument("--max_wall_s", type=float, default=None, help="train: override the wall-time budget")
    parser.add_argument("--max_steps", type=int, default=None, help="train: override the step budget")
    parser.add_argument("--policies", default=None,
                        help=f"eval: comma-separated subset of {', '.join(POLICIES)} (default: all that exist)")
    parser.add_argument("--force", action="store_true", help="eval: re-evaluate policies already evaluated")
    parser.add_argument("--seeds", default=None, metavar="START:COUNT",
                        help="eval: held-out seeds other than the config's (a replication set, declared before it is "
                             "run); results go to output_path/eval_START_nCOUNT/")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")


def _adapter_dir(cfg: RlidConfig, plane: str) -> Path | None:
    if plane == "distill":
        path = cfg.output_path / "distill" / "adapter"
        return path if path.is_dir() else None
    return _newest_adapter(cfg.output_path / plane)


def _newest_adapter(plane_dir: Path) -> Path | None:
    """The adapter of a trained plane folder's newest complete checkpoint, or None."""
    from rlid.checkpoint import ADAPTER, resume
    from rlid.train_loop import CHECKPOINTS

    ckpt = resume(plane_dir / CHECKPOINTS)
    return ckpt.path / ADAPTER if ckpt else None


def _member(cfg: RlidConfig, name: str | None = None, adapter: Path | None = None, trainable: bool = False):
    """A loaded member and its adapter: to train, a fresh LoRA adapter, the frozen layers packed; with an
    `adapter` folder for inference, that adapter folded into the (packed) weights, returned as None."""
    from rlid.lora import LoraSpec, add_lora
    from runtime.member import load_member

    member = load_member(name or cfg.model, dtype=cfg.dtype, pack_weights=False if (trainable or adapter) else None)
    lora = None
    if trainable or adapter:
        lora = add_lora(member, LoraSpec(**(cfg.train.get("lora") or {})), seed=cfg.seed)
        if adapter:
            lora.load(adapter)
        if not trainable:  # inference only: fold the adapter into the weights, then pack them
            lora.merge_for_inference()
            lora = None
        else:              # training: the frozen layers packed (faster forwards, same gradients to rounding)
            lora.pack_frozen()
    return member, lora


def _decision_model(cfg: RlidConfig, member):
    from rlid.decision_model import DecisionModel

    return DecisionModel(member, label_style=cfg.label_style, realise_action_text=cfg.realise_action_text,
                         answer=cfg.answer)


def train(cfg: RlidConfig, args: argparse.Namespace) -> int:
    from rlid.rollout import run_episodes
    from rlid.token_policy import TokenPolicy
    from rlid.token_train import TokenTrainer
    from rlid.train import DecisionTrainer

    overrides = {k: v for k, v in (("max_wall_s", args.max_wall_s), ("max_steps", args.max_steps)) if v is not None}
    tc = cfg.train_config(args.plane, progress=not args.no_progress, **overrides)
    member, adapter = _member(cfg, trainable=True)
    if args.plane == "decision":
        trainer = DecisionTrainer(_decision_model(cfg, member), cfg.make_env(), tc, adapter, rollout=run_episodes)
    else:
        trainer = TokenTrainer(TokenPolicy(member, max_new_tokens=cfg.token_max_new_tokens), cfg.make_env(), tc, adapter)
    records = trainer.run()
    last = next((r for r in reversed(records) if not r.get("gold")), {})   # the last rollout step
    print(f"{args.plane} plane: step {trainer.step}, {trainer.counters['wall_s']:.0f} s of training; "
          f"last rollout step reward {last.get('reward_mean', float('nan')):.3f}, success "
          f"{last.get('success_rate', float('nan')):.2f}; log: {tc.out_dir}/log.jsonl")
    return 0


def distill(cfg: RlidConfig, args: argparse.Namespace) -> int:
    from rlid.distill import DistillTrainer, collect_examples, write_examples
    from rlid.token_policy import TokenPolicy
    from runtime.files import write_json_atomic

    d = cfg.distill
    teacher_dir = Path(d["teacher"]) / "decision" if d.get("teacher") else cfg.output_path / "decision"
    teacher_adapter = _newest_adapter(teacher_dir)
    if teacher_adapter is None:
        fix = ("train that run's decision plane first, or fix distill.teacher" if d.get("teacher")
               else f"run `adafuse rlid train {cfg.source} --plane decision` first")
        raise ConfigError(f"no trained decision model under {teacher_dir}; {fix}")
    out = cfg.output_path / "distill"
    out.mkdir(parents=True, exist_ok=True)
    seeds = range(d["seeds"]["start"], d["seeds"]["start"] + d["seeds"]["count"]) if d.get("seeds") else cfg.train_seeds
    member, _ = _member(cfg, adapter=teacher_adapter)
    examples, result = collect_examples(_decision_model(cfg, member), cfg.make_env(), seeds,
                                        memory_k=cfg.memory_k, only_successful=d.get("only_successful", True))
    write_examples(out / "examples.jsonl", examples)
    print(f"teacher: {result.success_rate:.1%} solved on {len(seeds)} train seeds; {len(examples)} examples")
    del member
    student, lora = _member(cfg, trainable=True)
    if d.get("init", "fresh") == "decision":   # warm start: the student's adapter begins as the trained LDM's
        lora.load(teacher_adapter)
    policy = TokenPolicy(student, max_new_tokens=cfg.token_max_new_tokens)
    log = []
    trainer = DistillTrainer(policy, lora, examples, epochs=d.get("epochs", 2), lr=d.get("lr", 2e-4),
                             batch_size=d.get("batch_size", 8), seed=cfg.seed, log=lambda r: (log.append(r), print(r)))
    trainer.run()
    lora.save(out / "adapter")
    write_json_atomic(out / "log.json", {"teacher_train_success": result.success_rate, "examples": len(examples),
                                         "init": d.get("init", "fresh"), "teacher": str(teacher_adapter),
                                         "epochs": log})
    return 0


def _rollout(cfg: RlidConfig, which: str) -> tuple[Callable[[list[int]], Any], str] | None:
    """A single-model policy as a function rolling it out on a block of held-out seeds (an `EvalResult`;
    the model is loaded on the first call) and the policy's source (its adapter folder, else the
    model), or None where that policy is not trained yet."""
    from rlid.distill import evaluate_token_policy
    from rlid.evaluate import evaluate_policy
    from rlid.token_policy import TokenPolicy

    plane = {"untrained": None, "untrained-token": None, "decision": "decision", "token": "token", "distill": "distill"}[which]
    adapter = _adapter_dir(cfg, plane) if plane else None
    if plane and adapter is None:
        return None                                        # not trained yet: nothing to evaluate
    decision = which in ("untrained", "decision")
    evaluate = evaluate_policy if decision else evaluate_token_policy
    loaded = []

    def run(seeds: list[int]):
        if not loaded:
            member, _ = _member(cfg, adapter=adapter)
            loaded.append(_decision_model(cfg, member) if decision else
                          TokenPolicy(member, max_new_tokens=cfg.token_max_new_tokens))
        return evaluate(loaded[0], cfg.make_env(), seeds, greedy=cfg.eval_greedy, memory_k=cfg.memory_k)

    return run, f"{cfg.model}" + (f" + {adapter}" if adapter else "")


def _ensemble_adapter(cfg: RlidConfig, entry: str | None) -> Path | None:
    """An `ensemble.adapters` entry: null (the member as loaded), "decision" (this run's trained LDM
    adapter, its newest checkpoint), another run's trained plane folder (e.g. runs/x/decision: its
    newest checkpoint's adapter), or an adapter folder."""
    from rlid.train_loop import CHECKPOINTS

    if entry is None:
        return None
    path = _adapter_dir(cfg, "decision") if entry == "decision" else Path(entry)
    if path is not None and (path / CHECKPOINTS).is_dir():
        path = _newest_adapter(path)
    if path is None or not (path / "adapter_config.json").is_file():
        raise ConfigError(f"{cfg.source}: ensemble adapter {entry!r} not found; train the decision plane first, "
                          f"or give an adapter folder (with adapter_config.json) or a trained plane's folder")
    return path


def _ensemble_summary(cfg: RlidConfig, episodes: Path) -> dict[str, Any] | None:
    """The ensemble on the held-out seeds, then each member alone on the same seeds: each in blocks of
    `eval.batch` seeds written as they go and resumed after a kill (`rlid.eval_blocks`), so a member alone
    is batched as its own eval batches it and reports what that eval does. The dev choice is made once
    and kept beside the episodes (`ensemble.dev.json`); the gate's consultations are recorded per block."""
    from rlid.eval_blocks import evaluate_in_blocks
    from rlid.evaluate import evaluate_policy

    e = cfg.ensemble
    if not e:
        return None
    adapters = list(e.get("adapters") or [None] * len(e["members"]))
    if len(adapters) != len(e["members"]):
        raise ConfigError(f"{cfg.source}: ensemble.adapters needs one entry (a folder or null) per member")
    resolved = [_ensemble_adapter(cfg, a) for a in adapters]
    models = [_decision_model(cfg, _member(cfg, name, a)[0]) for name, a in zip(e["members"], resolved)]
    # what the records hold: the adapters as loaded (a newer checkpoint of "decision" is another policy)
    sources = [f"{name}" + (f" + {a}" if a else "") for name, a in zip(e["members"], resolved)]
    setting, dev = _dev_choice(cfg, models, episodes.with_name("ensemble.dev.json")) if e.get("dev") else (e, None)
    chosen = {k: v for k, v in setting.items() if k in SETTING_KEYS + ("alone",)}
    if chosen.get("alone") is not None:                    # dev chose one member alone
        policy, ens = models[chosen["alone"]], None
    else:
        policy = ens = _fused(models, setting)

    def rollout(block: list[int]):
        before = ens.counts.consulted if ens else 0
        result = evaluate_policy(policy, cfg.make_env(), block, greedy=cfg.eval_greedy, memory_k=cfg.memory_k)
        result.extra["consulted"] = (ens.counts.consulted - before) if ens else 0
        return result

    labels = [_member_label(cfg, m) for m in range(len(models))]
    source = f"ensemble of {', '.join(sources)}: {json.dumps(chosen, sort_keys=True)}"
    summary = evaluate_in_blocks(rollout, cfg.make_env(), list(cfg.eval_seeds), episodes, source=source,
                                 batch=cfg.eval_batch, label="ensemble", block_fields=("consulted",))
    consulted = round(summary.pop("consulted"))
    summary.update(consulted=consulted, consult_rate=consulted / summary["decisions"] if summary["decisions"] else 0.0,
                   members=e["members"], setting=chosen, **({"dev": dev} if dev is not None else {}))
    for m, (model, label) in enumerate(zip(models, labels)):   # each member alone, same seeds, same blocks
        def alone(block: list[int], model=model):
            return evaluate_policy(model, cfg.make_env(), block, greedy=cfg.eval_greedy, memory_k=cfg.memory_k)
        member = evaluate_in_blocks(alone, cfg.make_env(), list(cfg.eval_seeds),
                                    episodes.with_name(f"ensemble.alone{m}.episodes.jsonl"), source=sources[m],
                                    batch=cfg.eval_batch, label=f"ensemble, {label} alone")
        summary[f"alone:{label}"] = member["per_seed"]
    return summary


def _dev_choice(cfg: RlidConfig, models, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """`_choose_on_dev`, made once: its choice is written to `path` and read back on a resume (a
    different dev setting in the config is refused in one line: rerun with --force)."""
    from runtime.files import write_json_atomic

    asked = {"members": cfg.ensemble["members"], "adapters": cfg.ensemble.get("adapters"), "dev": cfg.ensemble["dev"]}
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("asked") != json.loads(json.dumps(asked)):
            raise ConfigError(f"{path} holds a dev choice for another ensemble setting; rerun with --force")
        return saved["setting"], saved["dev"]
    setting, dev = _choose_on_dev(cfg, models)
    write_json_atomic(path, {"asked": asked, "setting": setting, "dev": dev})
    return setting, dev


def _member_label(cfg: RlidConfig, m: int) -> str:
    """"member m (name)", or "member m (name + adapter)": unique even when one model is a member twice."""
    e = cfg.ensemble
    adapter = (e.get("adapters") or [None] * len(e["members"]))[m]
    return f"member {m} ({e['members'][m]}{f' + {adapter}' if adapter else ''})"


SETTING_KEYS = ("weights", "lead", "threshold", "rule")


def _fused(models, setting: dict[str, Any]):
    from rlid.ensemble import DecisionEnsemble

    return DecisionEnsemble(models, setting.get("weights"), lead=setting.get("lead", 0),
                            threshold=setting.get("threshold", 0.5), rule=setting.get("rule", "mixture"))


def _choose_on_dev(cfg: RlidConfig, models) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each member alone, then each `ensemble.dev.candidates` setting, on the dev seeds (greedy);
    the best by successes (`rlid.ensemble.pick_on_dev`: a tie keeps the earlier, so a single member
    wins ties). Returns the chosen setting ({"alone": m} for a member) and the dev table."""
    from rlid.ensemble import pick_on_dev
    from rlid.evaluate import evaluate_policy

    e = cfg.ensemble
    seeds = seed_range(e["dev"].get("seeds"), (5_000, 50))
    tried: list[tuple[str, dict[str, Any], Any]] = [(_member_label(cfg, m).replace(" (", " alone (", 1), {"alone": m},
                                                      models[m]) for m in range(len(models))]
    for i, c in enumerate(e["dev"].get("candidates") or []):
        tried.append((f"candidate {i}: " + ", ".join(f"{k} {c[k]}" for k in SETTING_KEYS if k in c), c, _fused(models, c)))
    scores = []
    for name, _, policy in tried:
        res = evaluate_policy(policy, cfg.make_env(), seeds, greedy=cfg.eval_greedy, memory_k=cfg.memory_k)
        scores.append((name, sum(res.successes)))
        print(f"dev {name}: {int(sum(res.successes))} / {len(seeds)} solved", flush=True)
    chosen = pick_on_dev(scores)
    setting = next(s for name, s, _ in tried if name == chosen)
    return setting, {"seeds": [seeds.start, seeds.stop], "scores": dict(scores), "chosen": chosen}


def _with_eval_seeds(cfg: RlidConfig, spec: str | None) -> tuple[RlidConfig, Path]:
    """The config with `--seeds START:COUNT` as its held-out seeds (checked disjoint from the training
    seeds), and the folder its results go to: output_path/eval, or output_path/eval_START_nCOUNT."""
    if spec is None:
        return cfg, cfg.output_path / "eval"
    try:
        start, count = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ConfigError(f"--seeds {spec!r}: give START:COUNT, e.g. --seeds 620000:500") from None
    seeds = seed_range({"start": start, "count": count}, (0, 0))
    if set(seeds) & set(cfg.train_seeds):
        raise ConfigError(f"--seeds {spec}: overlaps the training seeds {cfg.train_seeds.start}.."
                          f"{cfg.train_seeds.stop - 1}; held-out seeds must be disjoint")
    return replace(cfg, eval_seeds=seeds), cfg.output_path / f"eval_{start}_n{count}"


def _blocked_summary(cfg: RlidConfig, which: str, episodes: Path) -> dict[str, Any] | None:
    """A single-model policy's summary, its episodes written to `episodes` block by block (resumed)."""
    from rlid.eval_blocks import evaluate_in_blocks

    found = _rollout(cfg, which)
    if found is None:
        return None
    rollout, source = found
    return evaluate_in_blocks(rollout, cfg.make_env(), list(cfg.eval_seeds), episodes, source=source,
                              batch=cfg.eval_batch, label=which)


def evaluate(cfg: RlidConfig, args: argparse.Namespace) -> int:
    """Each wanted policy on the held-out seeds, skipping those with a summary (`--force` redoes them).
    Single-model policies run in blocks of `eval.batch` seeds, written as they go and resumed after a
    kill (`rlid.eval_blocks`); the ensemble and each of its members alone too (its dev choice made once)."""
    from rlid.report import print_table
    from runtime.files import write_json_atomic

    cfg, out = _with_eval_seeds(cfg, args.seeds)
    out.mkdir(parents=True, exist_ok=True)
    wanted = args.policies.split(",") if args.policies else list(POLICIES)
    bad = sorted(set(wanted) - set(POLICIES))
    if bad:
        raise ConfigError(f"unknown --policies {bad}; choose among {', '.join(POLICIES)}")
    for which in wanted:
        path, episodes = out / f"{which}.json", out / f"{which}.episodes.jsonl"
        if path.exists() and not args.force:
            continue
        if args.force:                                 # its episodes (the ensemble's: also dev choice, members alone)
            for old in [episodes, *out.glob(f"{which}.dev.json"), *out.glob(f"{which}.alone*.episodes.jsonl")]:
                old.unlink(missing_ok=True)
        summary = _ensemble_summary(cfg, episodes) if which == "ensemble" else _blocked_summary(cfg, which, episodes)
        if summary is None:
            print(f"{which}: nothing to evaluate yet (not trained / not configured)")
            continue
        write_json_atomic(path, {"policy": which, "seeds": [cfg.eval_seeds.start, cfg.eval_seeds.stop], **summary})
        print(f"{which}: success {summary['success']:.1%} on {summary['episodes']} held-out seeds")
    print_table(cfg.output_path, out.name)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.verb == "report":
        from rlid.report import report

        return report(Path(args.config))
    cfg = load_rlid(args.config)
    return {"train": train, "eval": evaluate, "distill": distill}[args.verb](cfg, args)


