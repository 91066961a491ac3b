"""RLiD reports: the held-out table of every evaluated policy (success with Wilson intervals, paired
differences on the same seeds, invalid actions, decisions per second) and the learning curve
(training success vs wall time, decision plane vs token level).

    adafuse rlid report runs/rlid_countdown      # writes report.md and learning_curve.png there"""
from __future__ import annotations

import json
import re
from pathlib import Path

from runtime.errors import ConfigError
from rlid.evaluate import paired_difference

ORDER = ("untrained", "untrained-token", "decision", "token", "distill", "ensemble")


def load_results(folder: Path, eval_dir: str = "eval") -> dict[str, dict]:
    """Each evaluated policy's summary (`<policy>.json`, a summary of its episodes; other files there,
    e.g. the ensemble's kept dev choice, are not policies), in the report's order."""
    found = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted((folder / eval_dir).glob("*.json"))}
    found = {k: v for k, v in found.items() if isinstance(v, dict) and "episodes" in v and "per_seed" in v}
    return {k: found[k] for k in sorted(found, key=lambda k: ORDER.index(k) if k in ORDER else len(ORDER))}


def _diff(a: list[float], b: list[float]) -> str:
    mean, lo, hi = paired_difference(a, b)
    star = "*" if lo > 0 or hi < 0 else ""
    return f"{100 * mean:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]{star}"


def _steps(r: dict) -> str:
    """Mean moves of the solved episodes, blank where none was solved (or not recorded)."""
    return f"{r['steps_to_success']:.1f}" if r.get("steps_to_success") is not None else ""


def _live(r: dict) -> str:
    """'kept % (chance %)' of an evaluated policy (`rlid.evaluate.live_moves`), blank where not measured."""
    return f"{100 * r['live_moves']:.1f} ({100 * r['live_chance']:.1f})" if "live_moves" in r else ""


def _wins(r: dict) -> str:
    """'taken % (chance %) of n' at the decisions where some option solves the puzzle at once, blank where
    not measured (`rlid.evaluate.live_moves`)."""
    if "wins_taken" not in r:
        return ""
    return f"{100 * r['wins_taken']:.1f} ({100 * r['win_chance']:.1f}) of {r['win_decisions']}"


def eval_dirs(folder: Path) -> list[str]:
    """The run's evaluation folders: `eval` (the config's held-out seeds), then each `eval_START_nCOUNT`
    (`adafuse rlid eval --seeds START:COUNT`), in seed order."""
    extra = [(int(m[1]), p.name) for p in folder.glob("eval_*_n*")
             if p.is_dir() and (m := re.fullmatch(r"eval_(\d+)_n\d+", p.name))]
    return ["eval"] + [name for _, name in sorted(extra)]


def table(folder: Path, eval_dir: str = "eval") -> str:
    """The markdown table of `folder/<eval_dir>/*.json` (paired columns: vs the untrained LDM and vs
    token-level RL)."""
    results = load_results(folder, eval_dir)
    if not results:
        return f"(no evaluated policies under {folder / eval_dir})"
    base, tok = results.get("untrained"), results.get("token")
    lines = ["| policy | held-out seeds | success % [95 % CI] | vs untrained LDM (pp) | vs token-level RL (pp) "
             "| mean score | steps to success | invalid actions | moves kept solvable % (chance %) "
             "| winning moves taken % (chance %) | decisions / s |",
             "|---|--:|---|---|---|--:|--:|--:|--:|--:|--:|"]
    for name, r in results.items():
        vs_base = _diff(r["per_seed"], base["per_seed"]) if base and name != "untrained" else ""
        vs_tok = _diff(r["per_seed"], tok["per_seed"]) if tok and name != "token" else ""
        lines.append(f"| {name} | {r['episodes']} | {100 * r['success']:.1f} [{100 * r['success_lo']:.1f}, "
                     f"{100 * r['success_hi']:.1f}] | {vs_base} | {vs_tok} | {r['mean_reward']:.3f} | "
                     f"{_steps(r)} | {r['invalid']} "
                     f"({r['invalid'] / max(1, r['decisions']):.0%}) | {_live(r)} | {_wins(r)} | {r['decisions_per_s']:.2f} |")
    dec, dis = results.get("decision"), results.get("distill")
    if dec and dis:
        kept = f"{dis['success'] / dec['success']:.0%}" if dec["success"] else "n/a (the decision model solved none)"
        lines += ["", f"Distilled generating model: {kept} of the decision model's success "
                      f"(distill - decision: {_diff(dis['per_seed'], dec['per_seed'])} pp)."]
    ens = results.get("ensemble")
    if ens:
        lines += ["", f"Ensemble of {', '.join(ens['members'])}: the gate consulted the others on "
                      f"{ens['consulted']} of {ens['decisions']} decisions ({ens['consult_rate']:.0%})."]
        if ens.get("dev"):
            dev = ens["dev"]
            tried = "; ".join(f"{name} {score:g}" for name, score in dev["scores"].items())
            lines.append(f"Chosen on dev seeds {dev['seeds'][0]}..{dev['seeds'][1] - 1}: **{dev['chosen']}** "
                         f"(solved: {tried}).")
        for key, alone in ens.items():
            if key.startswith("alone:"):
                lines.append(f"- vs {key[6:]} alone ({100 * sum(alone) / len(alone):.1f} %): "
                             f"{_diff(ens['per_seed'], alone)} pp")
    return "\n".join(lines)


def print_table(folder: Path, eval_dir: str = "eval") -> None:
    print(table(folder, eval_dir))


def curves(path: Path) -> dict[str, tuple[list[float], list[float]]]:
    """From one plane's training log: "success" = (wall minutes, sampled train success %, running mean
    of the last 5 rollout steps) and "imitation" = (wall minutes, the gold steps' loss = −mean log-prob
    of the gold moves, nats)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    out: dict[str, tuple[list[float], list[float]]] = {"success": ([], []), "imitation": ([], [])}
    window: list[float] = []
    for r in rows:
        if r.get("gold"):                                       # gold-path imitation steps: no rollouts
            out["imitation"][0].append(r["wall_s"] / 60)
            out["imitation"][1].append(r["loss"])
            continue
        window = (window + [r["success_rate"]])[-5:]
        out["success"][0].append(r["wall_s"] / 60)
        out["success"][1].append(100 * sum(window) / len(window))
    return out


def plot(folder: Path) -> Path | None:
    """Training success (sampled rollouts on train seeds, running mean of 5 steps) vs wall minutes, and
    beside it, where a plane began with gold steps, their imitation loss."""
    logs = {plane: folder / plane / "log.jsonl" for plane in ("decision", "token")}
    logs = {k: curves(v) for k, v in logs.items() if v.exists()}
    if not logs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gold = any(c["imitation"][0] for c in logs.values())
    fig, axes = plt.subplots(1, 2 if gold else 1, figsize=(11 if gold else 6, 3.6), squeeze=False)
    names = {"decision": "decision plane (LDM)", "token": "token-level RL"}
    panels = ([("imitation", "gold-step loss (nats per gold move)")] if gold else []) + \
        [("success", "train success % (5-step mean)")]
    for ax, (key, ylabel) in zip(axes[0], panels):
        for plane, c in logs.items():
            ax.plot(*c[key], label=names[plane], marker="." if key == "imitation" else None)
        if not any(c[key][0] for c in logs.values()):
            ax.text(0.5, 0.5, "no rollout steps (gold steps only)", ha="center", transform=ax.transAxes)
        ax.set_xlabel("training wall time (min)")
        ax.set_ylabel(ylabel)
        ax.set_title(folder.name if key == "success" else f"{folder.name}: imitation of the gold paths")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = folder / "learning_curve.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def report(folder: Path) -> int:
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder; give an RLiD run's output_path (e.g. runs/rlid_countdown)")
    from runtime.files import write_text_atomic

    sections = []
    for name in eval_dirs(folder):
        results = load_results(folder, name)
        seeds = next((r["seeds"] for r in results.values() if "seeds" in r), None)
        title = f"## held-out seeds {seeds[0]}..{seeds[1] - 1} ({name}/)" if seeds else f"## {name}/"
        sections.append(f"{title}\n\n{table(folder, name)}")
    text = "\n\n".join(sections)
    png = plot(folder)
    write_text_atomic(folder / "report.md", f"# {folder.name}\n\n{text}\n" + (f"\n![learning curve]({png.name})\n" if png else ""))
    print(text)
    if png:
        print(f"learning curve: {png}")
    return 0
