"""TextWorldExpress games as menu environments: the base of `rlid.envs.twc` and `rlid.envs.cooking`.

The games come from the `textworld-express` package (1.1): its JAR ships inside the wheel and runs in
a Java runtime >= 11, driven through py4j on the loopback interface (with py4j's auth token).

Episodes. `reset(seed)` generates the game of `seed` in its official fold (`PythonInterface.
generateNewGameJSON(seed, fold, True)`, gold path on: `gold_actions()`). The observation is the
game's task description and its latest feedback; the menu is the game's valid actions
(`validActions`), sorted (the game lists them in hash order) without duplicates; `step(i)` sends
`menu()[i]` (`stepJSON`). Each move earns the change of the game's normalised score, so an episode's
return is its final score (1.0 when solved, partial credit otherwise); success is the game's
`tasksuccess`. The episode ends on success, on the game's `taskfailure` (CookingWorld: e.g. eating
the wrong thing; the score so far stands), when no action is valid, or after `max_steps` moves.
`memory(k)`: the raw observation history or, with `compiled_memory`, the compact memory of
`rlid.envs.text_memory`. No solvability check (`solvable()` raises NotImplementedError); copies for
`option_wins` / `last_move_rewards` replay the moves in a fresh game.

Folds. TextWorldExpress's train, dev and test seeds (`getSeedsTrain/Dev/Test`: 0..999, 10000..10999,
20000..20999 in 1.1), disjoint; the fold also picks the game's objects (TWC splits its objects by
fold). Option `fold` "train", "dev" or "test" accepts only that fold's seeds; None (default) accepts
any official seed and plays it in its own fold, since one config's environment serves training and
held-out evaluation, and `check_stage_seeds` holds each stage of a config to its fold (train and
distill: train, ensemble dev: dev, eval: test). Any other seed is a one-line ConfigError.

The JVM. One Java process per Python process (`JavaPool`), started lazily by the first reset; each
environment holds its own game (a `textworldexpress.runtime.PythonInterface`) in it, so a batch of
rollouts over many games shares one JVM (the package's `TextWorldExpressEnv` starts one per game).
`close()` releases an environment's game and stops the JVM once no open environment uses it;
`shutdown_java()` stops it at once, and runs at interpreter exit. The JVM runs py4j's GatewayServer
with --die-on-broken-pipe: it reads its stdin, a pipe only this process holds, and exits at EOF, so
it dies with the Python process even on SIGKILL (tests/test_rlid_textworld.py kills one and polls);
a forked child closes its copy of that pipe and starts its own JVM if it needs one."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import threading
import weakref
from dataclasses import replace
from typing import Any, Iterable

from runtime.errors import ConfigError
from rlid.envs.base import MenuEnvironment, check_bool, check_int
from rlid.envs.text_memory import Record, compiled_memory, one_line, raw_memory
from rlid.types import StepResult

FOLDS = ("train", "dev", "test")
STAGE_FOLDS = {"train": "train", "distill": "train", "dev": "dev", "eval": "test"}
JVM_OPTIONS = ("-XX:+UseSerialGC",)  # one GC thread: the JVM shares a few cores with the models
STOP_TIMEOUT_S = 5.0
INSTALL_JAVA = "install Java >= 11 (Debian/Ubuntu: apt-get install default-jre-headless)"


def java_binary() -> str:
    """$JAVA_HOME/bin/java where JAVA_HOME is set and has one, else `java` on PATH; a one-line
    ConfigError if neither is there."""
    home = os.environ.get("JAVA_HOME")
    candidates = ([os.path.join(home, "bin", "java")] if home else []) + [shutil.which("java")]
    java = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if java is None:
        where = "`java` is not on PATH" + (f" and JAVA_HOME={home} has no bin/java" if home else "")
        raise ConfigError(f"the TextWorldExpress games need a Java runtime: {where}; {INSTALL_JAVA}")
    return java


class JavaPool:
    """This process's JVM running TextWorldExpress, and the environments holding games in it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.process: subprocess.Popen | None = None
        self.gateway: Any = None
        self.generation = 0           # bumped at every start: games of an earlier JVM are stale
        self.users: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def game(self, user: object) -> tuple[Any, int]:
        """A fresh game (`PythonInterface`) in the JVM, started if needed, held by `user`; and the
        JVM's generation."""
        with self._lock:
            if not self.running:
                self._start()
            self.users.add(user)
            return self.gateway.jvm.textworldexpress.runtime.PythonInterface(), self.generation

    def release(self, user: object) -> None:
        """`user` holds no game any more; the JVM stops when no user is left."""
        with self._lock:
            self.users.discard(user)
            if not self.users:
                self._stop()

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def _start(self) -> None:
        self._stop()  # a dead JVM's leftovers
        try:
            from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
            from textworld_express.constants import BASEPATH, JAR_PATH
        except ImportError as exc:
            raise ConfigError(f"the TextWorldExpress games need the textworld-express package ({exc}); "
                              "pip install 'textworld-express>=1.1,<1.2'") from None
        java = java_binary()
        try:
            port, token, process = launch_gateway(
                classpath=JAR_PATH, javaopts=list(JVM_OPTIONS), die_on_exit=True, java_path=java,
                enable_auth=True, cwd=BASEPATH, return_proc=True)
        except (OSError, ValueError) as exc:  # ValueError: the JVM exited before printing its port
            raise ConfigError(f"{java} could not start the TextWorldExpress server ({type(exc).__name__}: "
                              f"{one_line(str(exc))}); {INSTALL_JAVA}") from None
        self.process = process
        self.gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port, auth_token=token),
                                   java_process=process)
        self.generation += 1

    def _stop(self) -> None:
        gateway, process = self.gateway, self.process
        self.gateway = self.process = None
        self.users = weakref.WeakSet()  # their games are gone: each registers again when it next plays
        if gateway is not None:
            try:
                gateway.shutdown()
            except Exception:  # noqa: BLE001 - a JVM that is already gone
                pass
        if process is not None:
            try:
                process.stdin.close()  # EOF: --die-on-broken-pipe exits
                process.wait(timeout=STOP_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()

    def abandon(self) -> None:
        """In a forked child: let go of the parent's JVM without touching it (close this process's
        copies of its stdin pipe and sockets; no py4j message is sent)."""
        process, gateway = self.process, self.gateway
        self.process = self.gateway = None
        if process is not None and process.stdin is not None:
            process.stdin.close()
        client = getattr(gateway, "_gateway_client", None)
        if client is not None:
            client.is_connected = False
            for connection in list(getattr(client, "deque", ())):
                sock = getattr(connection, "socket", None)
                if sock is not None:
                    sock.close()


_POOL: JavaPool | None = None
_POOL_LOCK = threading.Lock()


def java_pool() -> JavaPool:
    """This process's pool (a new one in a forked child)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = JavaPool()
        return _POOL


def shutdown_java() -> None:
    """Stop this process's JVM now (environments start a new one when they next need a game)."""
    if _POOL is not None and _POOL.pid == os.getpid():
        _POOL.stop()


def _forget_pool_in_child() -> None:
    global _POOL, _POOL_LOCK
    pool, _POOL, _POOL_LOCK = _POOL, None, threading.Lock()
    if pool is not None:
        pool.abandon()


atexit.register(shutdown_java)
os.register_at_fork(after_in_child=_forget_pool_in_child)

_FOLD_SEEDS: dict[str, dict[str, range | frozenset[int]]] = {}


def _seed_set(seeds: Iterable[Any]) -> range | frozenset[int]:
    ordered = sorted(int(s) for s in seeds)
    if ordered and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return range(ordered[0], ordered[-1] + 1)
    return frozenset(ordered)


def describe_seeds(seeds: range | frozenset[int]) -> str:
    if isinstance(seeds, range):
        return f"{seeds.start}..{seeds.stop - 1}"
    return f"{len(seeds)} seeds from {min(seeds)} to {max(seeds)}" if seeds else "no seeds"


def check_textworld_options(o: Any) -> None:
    """The options every TextWorldExpress game shares: fold, max_steps, compiled_memory, doors,
    inventory limit."""
    if o.fold is not None and o.fold not in FOLDS:
        raise ConfigError(f"option fold must be train, dev, test or null (each seed's own fold), got {o.fold!r}")
    check_int("max_steps", o.max_steps, 1, 500)
    check_bool("compiled_memory", o.compiled_memory)
    check_bool("include_doors", o.include_doors)
    check_bool("limit_inventory_size", o.limit_inventory_size)


class TextWorldEnv(MenuEnvironment):
    """A seeded TextWorldExpress game (`rlid.types.Environment`); see the module docstring. A
    subclass names `game_name` (TextWorldExpress's) and gives `game_params()` and `progress()`."""

    game_name = ""

    def __init__(self, options: Any) -> None:
        super().__init__()
        self.options = options
        self.options.validate()
        self.max_steps = options.max_steps
        self.fold: str | None = None
        self._game: Any = None
        self._generation = -1
        self._state: dict[str, Any] = {}
        self._records: list[Record] = []
        self._task = ""
        self._gold: list[str] = []

    def game_params(self) -> str:
        """TextWorldExpress's gameParams string for these options."""
        raise NotImplementedError

    def progress(self, records: list[Record]) -> list[str]:
        """Compiled-memory lines on the task's progress (what is already placed, ...)."""
        return []

    # -- the game ----------------------------------------------------------------------------
    def _ensure_game(self) -> Any:
        pool = java_pool()
        if self._game is None or self._generation != pool.generation or not pool.running:
            game, generation = pool.game(self)
            error = game.load(self.game_name, self.game_params())
            if error:
                raise ConfigError(f"{self.name}: TextWorldExpress rejects {self.game_params()}: {one_line(error)}")
            self._game, self._generation = game, generation
        return self._game

    def close(self) -> None:
        """Release this environment's game (the JVM stops when no open environment is left)."""
        if self._game is not None:
            self._game = None
            java_pool().release(self)

    def folds(self) -> dict[str, range | frozenset[int]]:
        """TextWorldExpress's official seeds of each fold for this game (asked once per process)."""
        if self.game_name not in _FOLD_SEEDS:
            game = self._ensure_game()
            folds = {"train": _seed_set(game.getSeedsTrain()), "dev": _seed_set(game.getSeedsDev()),
                     "test": _seed_set(game.getSeedsTest())}
            for i, a in enumerate(FOLDS):
                for b in FOLDS[i + 1:]:
                    if set(folds[a]) & set(folds[b]):
                        raise RuntimeError(f"{self.name}: TextWorldExpress's {a} and {b} seeds overlap")
            _FOLD_SEEDS[self.game_name] = folds
        return dict(_FOLD_SEEDS[self.game_name])

    def fold_of(self, seed: int) -> str | None:
        """The official fold holding `seed` (None: none does)."""
        return next((fold for fold, seeds in self.folds().items() if seed in seeds), None)

    def _fold_for(self, seed: int) -> str:
        folds = self.folds()
        if self.options.fold is not None:
            if seed not in folds[self.options.fold]:
                raise ConfigError(f"{self.name}: seed {seed} is not in the {self.options.fold} fold "
                                  f"({describe_seeds(folds[self.options.fold])})")
            return self.options.fold
        fold = self.fold_of(seed)
        if fold is None:
            listed = ", ".join(f"{f} {describe_seeds(s)}" for f, s in folds.items())
            raise ConfigError(f"{self.name}: seed {seed} is in none of TextWorldExpress's folds ({listed})")
        return fold

    def check_stage_seeds(self, stage: str, seeds: Iterable[int]) -> None:
        """A one-line ConfigError unless every seed of a config's `stage` ("train", "distill", "dev",
        "eval") lies in its fold (`STAGE_FOLDS`, or the `fold` option where it is set)."""
        fold = self.options.fold or STAGE_FOLDS[stage]
        allowed = self.folds()[fold]
        seeds = list(seeds)
        outside = [s for s in seeds if s not in allowed]
        if outside:
            raise ConfigError(f"{self.name}: {stage} seeds must come from TextWorldExpress's {fold} fold "
                              f"({describe_seeds(allowed)}); {len(outside)} of {len(seeds)} do not, e.g. {outside[0]}")

    # -- MenuEnvironment ---------------------------------------------------------------------
    def _load(self, seed: int) -> None:
        fold = self._fold_for(seed)
        game = self._ensure_game()
        self._new_game(game, seed, fold)
        self.fold = fold
        self._task = str(game.getTaskDescription())
        self._gold = [str(a) for a in game.getGoldActionSequence()]
        self._records = [self._record(None, self._state, 0.0)]

    def _new_game(self, game: Any, seed: int, fold: str) -> None:
        self._state = json.loads(game.generateNewGameJSON(seed, fold, True))

    @staticmethod
    def _record(action: str | None, state: dict[str, Any], last_score: float) -> Record:
        score = float(state["score"])
        return Record(action, str(state["observation"]), str(state["look"]), str(state["inventory"]), score,
                      score - last_score)

    def _legal(self) -> list[str]:
        return sorted(set(self._state.get("validActions") or ()))

    def _apply(self, index: int, text: str) -> dict[str, Any]:
        self._state = json.loads(self._game.stepJSON(text))
        record = self._record(text, self._state, self._records[-1].score)
        self._records.append(record)
        return {"score": record.score, "fold": self.fold}

    def step(self, index: int) -> StepResult:
        """`MenuEnvironment.step`, each move earning the change of the game's score."""
        result = super().step(index)
        return replace(result, reward=self._records[-1].reward)

    def _solved(self) -> bool:
        return bool(self._state.get("tasksuccess"))

    def _stuck(self) -> bool:
        return bool(self._state.get("taskfailure")) or not self._state.get("validActions")

    def _twin(self) -> "TextWorldEnv":
        """A copy with its own game: the same seed replayed move by move."""
        twin = super()._twin()
        twin._game = None
        game = twin._ensure_game()
        twin._new_game(game, self.seed, self.fold)
        for action in self._moves:
            twin._state = json.loads(game.stepJSON(action))
        return twin

    # -- what the policy reads ---------------------------------------------------------------
    def observation(self) -> str:
        return f"Task: {one_line(self._task)}\n{self._records[-1].feedback.strip()}"

    def memory(self, k: int) -> str:
        """The last k moves with the game's feedback, or with `compiled_memory` the compact memory
        (rooms, what was seen where, what is held, `progress`, the last k moves); "" if k == 0."""
        if self.options.compiled_memory:
            return compiled_memory(self._records, k, self.progress)
        return raw_memory(self._records, k)

    @property
    def score(self) -> float:
        """The game's normalised score now (0 before any reset)."""
        return self._records[-1].score if self._records else 0.0

    @property
    def records(self) -> list[Record]:
        return list(self._records)

    def gold_actions(self) -> list[str]:
        """The game's gold path from the start of this episode (it may run on past the win)."""
        return list(self._gold)
