"""What the decision-plane trainer (`rlid.train`) and the token-level one (`rlid.token_train`) share:
the config, the seed order, lockstep rollouts, advantages, the budget loop with its JSONL log,
progress bar, checkpoints and resume.

A run is a pure function of its config: step t's seeds come from `step_seeds(config, t)`, and all
sampling draws from one `torch.Generator` (seeded by `config.seed`) whose state, with torch's and
Python's global RNGs, the optimizer and the adapter, is in every checkpoint. So a run killed and
resumed (`TrainerBase.run` resumes from the newest complete checkpoint in `out_dir` and cuts the
log back to that checkpoint's byte offset) writes the same log lines as one never killed; only the
timing fields (`TIME_FIELDS`) differ.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from runtime.errors import ConfigError
from runtime.options import parse_options
from runtime.files import append_line, write_json_atomic
from rlid.advantages import RunningBaseline, decision_returns, group_advantages
from rlid.checkpoint import restore, resume, rng_state, save_checkpoint, set_rng_state
from rlid.lora import LoraAdapter, LoraSpec, add_lora
from rlid.rollout import decision_state
from rlid.types import DecisionState, Environment, Episode, StepResult, Transition

TIME_FIELDS = ("wall_s", "rollout_s", "update_s", "decisions_per_s")
# settings a resumed run may change: budgets, bookkeeping, and `rescore_batch` (a memory knob: the
# chunks' gradients add up to the same one; only float rounding follows the chunking)
RESUMABLE_FIELDS = ("max_steps", "max_wall_s", "progress", "checkpoint_every", "keep_checkpoints", "rescore_batch")
LOG, CONFIG, CHECKPOINTS = "log.jsonl", "config.json", "checkpoints"
DECISION_ONLY = ("exact_last_move", "exact_values", "value_discount", "shuffle_menus", "immediate_rewards")   # settings of the labelled menu


@dataclass(frozen=True)
class TrainConfig:
    """One RL run. Each step: `seeds_per_step` train seeds × `group_size` rollouts each; advantage
    "group" (GRPO: group-normalised episode returns, every decision of an episode gets its
    episode's) or "baseline" (per-decision returns, `reward_to_go` or not, minus a running mean);
    AdamW on the LoRA parameters; KL(π ‖ π_ref) weight `beta`; entropy bonus `entropy_coef`.
    Budget: `max_steps` and/or `max_wall_s` (time spent in steps, summed over resumes).
    `exact_last_move` (decision plane): a last move whose every option's reward the environment can
    tell (`last_move_rewards()`) is scored by its exact expectation over the menu
    (`rlid.pg_loss.decision_pg_loss`), its option rewards scaled by 1 / the step's return std.
    `exact_values` (decision plane): every decision is scored so, with the options' Q* from the
    environment's solvability check (`option_values()`: 1 where the puzzle stays solvable, else
    what the option earns) — the all-action policy gradient with the environment as its critic.
    `value_discount` γ (with `exact_values`; None = 1): a live option is worth γ^d instead of 1, d the
    fewest moves still needed after it (`solution_length()`), so an option that wins now beats one
    that keeps a long solution open — Q* of an optimal continuation that finds each later move with
    probability γ, closer to what a weak policy's own continuation earns.
    `shuffle_menus` (decision plane): rollouts show each menu in a fresh random order, so a
    preference for a label or a position earns nothing and only what the options say can be learned.
    `gold_steps`: the first `gold_steps` steps imitate the environment's gold paths instead of rolling
    out (`gold_actions()`, TextWorldExpress games): each walks the gold path of this step's seeds and
    takes one optimizer step on the same loss with advantage 1 on every gold move — −mean log π(gold
    option) in the decision plane (with `shuffle_menus`, in a fresh order), −mean log p(gold text) at
    token level: behaviour cloning inside the same wall budget, log and checkpoints (`rlid.gold`).
    `immediate_rewards` λ (decision plane; 0 = off): every decision whose menu options earn different
    immediate rewards (`option_rewards()`, each option executed on a copy) also adds the exact term
    −λ Σ_a π(a | s) r(a) / (std of the step's returns) to the sampled one: the all-action gradient of
    what the move itself earns (TWC: +0.25 for a right put or a take, −0.25 for a wrong put), the
    episode's later credit left to the sampled term.
    `rl_lr`: the learning rate of the rollout steps after the gold steps (None: `lr`), e.g. lower, so
    RL refines what the imitation learned instead of undoing it; each log record has its step's `lr`.
    `rescore_batch`: decisions per forward-with-grad (None: all in one; may change on resume; the
    activations of a real model's batch of long prompts are what fills memory). `invalid_penalty`: the
    token-level reward of an unparsable action (the state stays; it counts as a step)."""

    train_seeds: tuple[int, ...]
    seeds_per_step: int = 4
    group_size: int = 4
    lr: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    beta: float = 0.0
    entropy_coef: float = 0.0
    advantage: str = "group"
    baseline_momentum: float | None = None
    gamma: float = 1.0
    reward_to_go: bool = False
    max_steps: int | None = None
    max_wall_s: float | None = None
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    out_dir: str | None = None
    seed: int = 0
    memory_k: int = 0
    rescore_batch: int | None = 32
    invalid_penalty: float = -0.1
    exact_last_move: bool = False
    exact_values: bool = False
    value_discount: float | None = None
    immediate_rewards: float = 0.0
    shuffle_menus: bool = False
    gold_steps: int = 0
    rl_lr: float | None = None
    progress: bool = True
    lora: LoraSpec = field(default_factory=LoraSpec)

    def __post_init__(self):
        object.__setattr__(self, "train_seeds", tuple(int(s) for s in self.train_seeds))
        if not self.train_seeds:
            raise ConfigError("train_seeds is empty; give the environment seeds to train on, e.g. 0..99")
        for name in ("seeds_per_step", "group_size", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.gold_steps < 0:
            raise ConfigError(f"gold_steps must be 0 or more, got {self.gold_steps}")
        for name in ("lr", "rl_lr"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if self.advantage not in ("group", "baseline"):
            raise ConfigError(f"advantage must be 'group' or 'baseline', got {self.advantage!r}")
        if self.max_steps is None and self.max_wall_s is None:
            raise ConfigError("no budget: set max_steps and/or max_wall_s")
        if self.advantage == "group" and self.group_size < 2:
            raise ConfigError("advantage 'group' needs group_size >= 2 (a group of one has no spread); "
                              "raise group_size or use advantage 'baseline'")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.exact_last_move and self.exact_values:
            raise ConfigError("exact_values already scores every last move exactly; set exact_last_move or exact_values, not both")
        if self.immediate_rewards < 0:
            raise ConfigError(f"immediate_rewards is a weight >= 0 (0: off), got {self.immediate_rewards}")
        if self.immediate_rewards and (self.exact_last_move or self.exact_values):
            raise ConfigError("immediate_rewards adds to the sampled term; set it or exact_last_move / exact_values, not both")
        if self.value_discount is not None:
            if not self.exact_values:
                raise ConfigError("value_discount discounts the exact option values: set exact_values: true with it")
            if not 0.0 < self.value_discount <= 1.0:
                raise ConfigError(f"value_discount must be in (0, 1], got {self.value_discount}")
        if self.rescore_batch is not None and self.rescore_batch < 1:
            raise ConfigError(f"rescore_batch must be at least 1 (or null), got {self.rescore_batch}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """From a YAML/JSON mapping (`lora` a mapping of `LoraSpec` fields); unknown keys are refused."""
        d = dict(d)
        lora = d.pop("lora", None) or {}
        if not isinstance(lora, dict):
            raise ConfigError(f"lora must be a mapping of {sorted(f.name for f in dataclasses.fields(LoraSpec))}, "
                              f"got {lora!r}")
        if lora.get("target_modules") is not None:
            lora = {**lora, "target_modules": tuple(lora["target_modules"])}
        spec = parse_options(LoraSpec, lora, "the training's lora", validate=False)
        return parse_options(cls, {**d, "lora": spec}, "the training settings", validate=False)

    def fingerprint(self) -> dict[str, Any]:
        """The settings a resumed run must share with the one it continues (budgets may change)."""
        d = dataclasses.asdict(self)
        for name in RESUMABLE_FIELDS:
            d.pop(name)
        for name in (*DECISION_ONLY, "gold_steps"):   # (runs from before these options have no such key)
            if not d[name]:
                d.pop(name)
        if d["rl_lr"] is None:                          # (rl_lr 0 is a setting: kept)
            d.pop("rl_lr")
        d["train_seeds"] = list(self.train_seeds)
        return json.loads(json.dumps(d))


def step_seeds(config: TrainConfig, step: int) -> list[int]:
    """The train seeds of step `step` (0-based): consecutive slices of an endless sequence of
    shuffles of `train_seeds`, shuffle e drawn with `random.Random((config.seed, e))` — a pure
    function of (config, step), so a resumed run draws the same seeds."""
    n, pool = config.seeds_per_step, list(config.train_seeds)
    out: list[int] = []
    for pos in range(step * n, (step + 1) * n):
        epoch, i = divmod(pos, len(pool))
        order = pool[:]
        random.Random(f"{config.seed}:{epoch}").shuffle(order)
        out.append(order[i])
    return out


Act = Callable[[list[DecisionState]], list[tuple[int | None, Any]]]


def lockstep(make_env: Callable[[], Environment], act: Act, seeds: Sequence[int], memory_k: int = 0,
             invalid_reward: float = 0.0) -> tuple[list[Episode], list[list[Any]]]:
    """Roll out one episode per seed, all live episodes stepped together: one `act` call per round
    over their states; `act` returns (menu index or None, payload) per state. None = invalid: reward
    `invalid_reward`, the env does not move, it counts as a step (`Transition.action` = −1).
    An episode ends when a step says done or after `env.max_steps` steps; one cut short that way
    (only invalid steps make that possible) also gets the env's `failure_reward()` where it has one,
    so a shaped reward is paid whichever way a failed episode ends. Returns the episodes and the
    payloads per episode in transition order."""
    envs = [make_env() for _ in seeds]
    episodes = []
    for env, seed in zip(envs, seeds):
        env.reset(seed)
        episodes.append(Episode(env=env.name, seed=seed))
    payloads: list[list[Any]] = [[] for _ in seeds]
    live = list(range(len(seeds)))
    while live:
        states = [decision_state(envs[i], memory_k) for i in live]
        choices = act(states)
        still = []
        for i, state, (index, payload) in zip(live, states, choices):
            ep = episodes[i]
            if index is None:
                ep.invalid += 1
                result = StepResult(invalid_reward, False, info={"invalid": True})
            else:
                result = envs[i].step(index)
            cut = not result.done and len(ep.transitions) + 1 >= envs[i].max_steps
            if cut and (failure_reward := getattr(envs[i], "failure_reward", None)) is not None:
                result = dataclasses.replace(result, reward=result.reward + failure_reward())
            ep.transitions.append(Transition(state, -1 if index is None else index, result))
            payloads[i].append(payload)
            ep.success = ep.success or (result.done and result.success)
            if not result.done and len(ep.transitions) < envs[i].max_steps:
                still.append(i)
        live = still
    return episodes, payloads


def advantages_for(config: TrainConfig, episodes: Sequence[Episode], baseline: RunningBaseline
                   ) -> tuple[list[list[float]], RunningBaseline]:
    """Each decision's advantage, per episode (episodes ordered seed by seed, `group_size` each),
    and the baseline after this batch (unchanged for "group")."""
    if config.advantage == "group":
        returns = [decision_returns([t.result.reward for t in ep.transitions], config.gamma)[0] if ep.transitions
                   else 0.0 for ep in episodes]
        adv = group_advantages(torch.tensor(returns).view(-1, config.group_size)).flatten().tolist()
        return [[a] * len(ep.transitions) for a, ep in zip(adv, episodes)], baseline
    per = [decision_returns([t.result.reward for t in ep.transitions], config.gamma, config.reward_to_go)
           for ep in episodes]
    flat = [g for ep in per for g in ep]
    out = [baseline.advantages(ep).tolist() for ep in per]
    return out, baseline.update(flat)


class TrainerBase:
    """The budget loop around a subclass's `rollout_and_update(seeds) -> dict` (one step's log fields).
    `member`: the model's owner (`member.model` gets the LoRA adapter unless `adapter` is given)."""

    kind = "rl"

    def __init__(self, member, make_env: Callable[[], Environment], config: TrainConfig,
                 adapter: LoraAdapter | None = None):
        self.member, self.make_env, self.config = member, make_env, config
        self.adapter = adapter if adapter is not None else add_lora(member, config.lora, seed=config.seed)
        self.optimizer = torch.optim.AdamW(self.adapter.parameters(), lr=config.lr,
                                           weight_decay=config.weight_decay)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.counters: dict[str, float] = {"wall_s": 0.0, "decisions": 0, "episodes": 0, "successes": 0}
        self.baseline = RunningBaseline(momentum=config.baseline_momentum)
        self.out_dir = Path(config.out_dir) if config.out_dir else None
        self._started = False

    # ---- the loop ---------------------------------------------------------------------------
    def budget_left(self) -> bool:
        c = self.config
        return ((c.max_steps is None or self.step < c.max_steps)
                and (c.max_wall_s is None or self.counters["wall_s"] < c.max_wall_s))

    def run(self, on_step: Callable[[dict], None] | None = None) -> list[dict]:
        """Train until the budget is spent, resuming from `out_dir`; returns this call's log records.
        `on_step(record)` is called after each step is logged (and checkpointed)."""
        self.start()
        records: list[dict] = []
        bar = self._progress()
        try:
            while self.budget_left():
                rec = self.train_step()
                records.append(rec)
                self._log(rec)
                if self.out_dir and self.step % self.config.checkpoint_every == 0:
                    self.save()
                bar.update(1)
                if not rec.get("gold"):
                    bar.set_postfix(reward=f"{rec['reward_mean']:.3f}", success=f"{rec['success_rate']:.2f}")
                if on_step is not None:
                    on_step(rec)
        finally:
            bar.close()
        if self.out_dir and (self.last_saved != self.step):
            self.save()
        return records

    def train_step(self) -> dict:
        """One step: rollouts on this step's seeds, one update; returns its log record."""
        seeds = step_seeds(self.config, self.step)
        gold = self.step < self.config.gold_steps
        lr = self.config.lr if gold or self.config.rl_lr is None else self.config.rl_lr
        for group in self.optimizer.param_groups:   # (set every step: a resumed optimizer's state holds the old one)
            group["lr"] = lr
        t0 = time.perf_counter()
        rec = self.imitate_gold(seeds) if gold else self.rollout_and_update(seeds)
        wall = time.perf_counter() - t0
        self.step += 1
        self.counters["wall_s"] += wall
        self.counters["decisions"] += rec["decisions"]
        return {"step": self.step, "wall_s": round(self.counters["wall_s"], 4), "seeds": seeds, "lr": lr, **rec}

    def rollout_and_update(self, seeds: list[int]) -> dict:
        """`group_size` rollouts of each seed (`collect`, under no_grad, eval mode), advantages, update."""
        run_seeds = [s for s in seeds for _ in range(self.config.group_size)]
        self.member.model.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            episodes, payloads = self.collect(run_seeds)
        if [ep.seed for ep in episodes] != run_seeds:  # groups are consecutive runs of one seed
            raise RuntimeError("the rollout returned episodes out of seed order; it must keep the order of its seeds")
        rollout_s = time.perf_counter() - t0
        adv, self.baseline = advantages_for(self.config, episodes, self.baseline)
        items = [(p, t.action, a) for ep, ep_pay, ep_adv in zip(episodes, payloads, adv)
                 for t, p, a in zip(ep.transitions, ep_pay, ep_adv)]
        t1 = time.perf_counter()
        stats = self.update_items(items)
        return {**self.episode_fields(episodes, rollout_s), **stats, "update_s": round(time.perf_counter() - t1, 4)}

    def imitate_gold(self, seeds: list[int]) -> dict:
        """One behaviour-cloning step on the gold paths of `seeds` (`gold_steps`): every gold move is an
        item with advantage 1 (`gold_payload` makes what `_rescore` needs of it), one update."""
        from rlid.gold import gold_moves

        t0 = time.perf_counter()
        moves = gold_moves(self.make_env, seeds, self.config.memory_k)
        items = [(self.gold_payload(state, index), index, 1.0) for state, index in moves]
        stats = self.update_items(items)
        return {"gold": True, "decisions": len(items), "reward_mean": None, "success_rate": None,
                **stats, "update_s": round(time.perf_counter() - t0, 4)}

    def gold_payload(self, state: DecisionState, index: int) -> Any:
        """What `_rescore` needs of a gold move (`state`, its gold option `index`)."""
        raise NotImplementedError

    def collect(self, run_seeds: list[int]) -> tuple[list[Episode], list[list[Any]]]:
        """The episodes of `run_seeds` and, per transition, what `_rescore` needs of it."""
        raise NotImplementedError

    def scores_exactly(self, payload: Any) -> bool:
        """Whether this decision has an exact expectation term (so it counts with advantage 0)."""
        return False

    def episode_fields(self, episodes: Sequence[Episode], rollout_s: float) -> dict:
        """The log fields every trainer reports about a step's rollouts."""
        decisions = sum(len(ep.transitions) for ep in episodes)
        invalid = sum(ep.invalid for ep in episodes)
        self.counters["episodes"] += len(episodes)
        self.counters["successes"] += sum(ep.success for ep in episodes)
        return {"reward_mean": sum(ep.total_reward for ep in episodes) / len(episodes),
                "success_rate": sum(ep.success for ep in episodes) / len(episodes),
                "decisions": decisions, "invalid_rate": invalid / decisions if decisions else 0.0,
                "rollout_s": round(rollout_s, 4), "decisions_per_s": round(decisions / rollout_s, 3) if rollout_s else None}

    def optimizer_step(self) -> float:
        """Clip, step, zero the gradients, drop stale caches; returns the gradient norm."""
        params = self.adapter.parameters()
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm or float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.adapter.weights_changed()
        return float(norm)

    # ---- files: config, log, checkpoints ------------------------------------------------------
    last_saved: int | None = None

    def start(self) -> None:
        """Check `out_dir`'s config, resume from its newest complete checkpoint, cut the log back to it."""
        if self._started or self.out_dir is None:
            self._started = True
            return
        self._started = True
        self.out_dir.mkdir(parents=True, exist_ok=True)
        cfg_path, fingerprint = self.out_dir / CONFIG, {"kind": self.kind, **self.config.fingerprint()}
        if cfg_path.exists():
            saved = json.loads(cfg_path.read_text(encoding="utf-8"))
            for name in RESUMABLE_FIELDS:   # an older run's config.json may still list them
                saved.pop(name, None)
            if saved != fingerprint:
                diff = sorted(k for k in set(saved) | set(fingerprint) if saved.get(k) != fingerprint.get(k))
                raise ConfigError(f"{self.out_dir} holds a run with other settings ({', '.join(diff)}); "
                                  f"use a new out_dir or the same settings to resume it")
        else:
            write_json_atomic(cfg_path, fingerprint)
        ckpt = resume(self.out_dir / CHECKPOINTS)
        offset = 0
        if ckpt is not None:
            set_rng_state(restore(ckpt, self.adapter, self.optimizer), self.generator)
            self.step, self.last_saved = ckpt.step, ckpt.step
            self.counters = dict(ckpt.state["counters"])
            self.baseline = RunningBaseline(**ckpt.state["baseline"])
            offset = ckpt.state["log_offset"]
        log = self.out_dir / LOG
        if log.exists() and log.stat().st_size > offset:  # lines the killed run wrote after its checkpoint
            os.truncate(log, offset)

    def _log(self, rec: dict) -> None:
        if self.out_dir is None:
            return
        path = self.out_dir / LOG
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            append_line(fd, json.dumps(rec, ensure_ascii=False) + "\n", path)
        finally:
            os.close(fd)

    def save(self) -> Path:
        """A checkpoint of the current step (after its log line)."""
        assert self.out_dir is not None
        log = self.out_dir / LOG
        state = {"counters": self.counters, "baseline": dataclasses.asdict(self.baseline),
                 "log_offset": log.stat().st_size if log.exists() else 0, "kind": self.kind}
        path = save_checkpoint(self.out_dir / CHECKPOINTS, self.step, self.adapter, self.optimizer, state,
                               rng_state(self.generator), keep=self.config.keep_checkpoints)
        self.last_saved = self.step
        return path

    def _progress(self):
        from tqdm import tqdm

        return tqdm(total=self.config.max_steps, initial=self.step, desc=f"{self.kind} RL", unit="step",
                    disable=not self.config.progress, dynamic_ncols=True)

    # ---- the update, shared -------------------------------------------------------------------
    def update_items(self, items: list[tuple[Any, int, float]]) -> dict:
        """Backpropagate the loss over `items` = (what to re-score, action, advantage) per decision, in
        chunks of `rescore_batch` (`self._rescore(part, n) -> (stats, gap)`, losses normalised by the
        step's n decisions), then one optimizer step. Zero-advantage items are skipped when no KL or
        entropy term needs them. Returns the step's loss fields."""
        c = self.config
        n = len(items)
        if not (c.beta or c.entropy_coef):
            items = [it for it in items if it[2] != 0.0 or self.scores_exactly(it[0])]
        out: dict[str, Any] = {"loss": 0.0, "pg_loss": 0.0, "kl": None, "entropy": None, "logp_chosen": None,
                               "rescored": len(items), "grad_norm": 0.0, "rescore_gap": None}
        if not items:
            return out
        if c.lora.dropout:
            self.member.model.train()
        sums: dict[str, float] = {}
        gaps: list[float] = []
        size = c.rescore_batch or len(items)
        try:
            for start in range(0, len(items), size):
                part = items[start: start + size]
                stats, gap = self._rescore(part, n)
                if gap is not None:
                    gaps.append(gap)
                for k, v in stats.items():  # loss parts are already /n; means are weighted by chunk size
                    sums[k] = sums.get(k, 0.0) + (v if k in ("loss", "pg_loss") else v * len(part) / len(items))
        finally:
            self.member.model.eval()
        out.update({k: round(v, 6) for k, v in sums.items()})
        out["rescore_gap"] = max(gaps) if gaps else None
        out["grad_norm"] = round(self.optimizer_step(), 6)
        return out

    def _rescore(self, part: list[tuple[Any, int, float]], n: int) -> tuple[dict[str, float], float | None]:
        raise NotImplementedError
