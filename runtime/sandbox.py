"""Run a model-written Python program safely: `run_program(code, limits) -> ProgramResult`.

A fresh interpreter (`python -I -S -B <this file> <config>`, own session, empty temporary work folder,
stdout/stderr/verdict to files) applies, before the program and not in a `preexec_fn` (unsafe in a
threaded evaluation process): rlimits (CPU, address space, file size = the output cap, open files, no
core, no processes), netns (no network), landlock (read-only import paths and shared libraries, all
rights beneath the work folder only), seccomp (fork/clone/exec, sockets, ptrace, namespaces, mounts,
rlimit raises, io_uring, bpf, modules -> EPERM) and an audit hook (a stricter human-eval
`reliability_guard`, which also names what an OS layer refused). A layer the machine does not allow
is skipped (`guards` lists the active ones). The parent waits `wall_s`, kills the process group,
always reaps, and removes the folder.
"""
from __future__ import annotations

import contextlib
import errno
import builtins
import json
import linecache
import os
import re
import resource
import select
import signal
import struct
import sys
import tempfile
import textwrap
import time
import traceback
import types
from dataclasses import asdict, dataclass
from functools import lru_cache

TEMP_PREFIX = "adafuse-sandbox-"
LAYERS = ("rlimits", "audit", "seccomp", "netns", "landlock")
PRELOADED = ("math", "fractions", "decimal", "itertools", "functools", "collections", "datetime", "statistics", "re",
             "string", "random", "heapq", "bisect", "operator", "json", "cmath", "numbers", "typing", "dataclasses")
_DETAIL_CHARS = 500


@dataclass(frozen=True)
class SandboxLimits:
    """What one program may use; its process group is killed after `wall_s`."""
    wall_s: float = 10.0  # wall clock; then the whole process group is killed
    cpu_s: int = 5  # RLIMIT_CPU
    memory_mb: int = 512  # RLIMIT_AS
    output_bytes: int = 65536  # RLIMIT_FSIZE: the most stdout (and stderr, and any file) the program can write
    max_open_files: int = 32  # RLIMIT_NOFILE


@dataclass(frozen=True)
class ProgramResult:
    """One run: stdout (capped); `error` None (ran cleanly and printed) or, by priority, "timeout",
    "memory", "forbidden: <what>", "syntax", "output limit", "runtime: <Exception>", "no output" (also
    "empty program"; "sandbox: <Exception>" when the sandbox could not start); the tail of stderr."""
    stdout: str
    error: str | None
    detail: str = ""
    wall_s: float = 0.0
    guards: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {**asdict(self), "guards": list(self.guards)}


_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.S | re.M)


def extract_program(text: str) -> str:
    """The Python code in a model's answer: the last ```python (or untagged ```) fenced block, preferring
    blocks that print; without one, the text itself, stripped."""
    blocks = [textwrap.dedent(body).strip() for tag, body in _FENCE.findall(text or "")
              if tag.lower() in ("", "python", "py", "python3", "py3")]
    blocks = [b for b in blocks if b]
    return ([b for b in blocks if "print" in b] or blocks)[-1] if blocks else (text or "").strip()


@lru_cache(maxsize=1)
def available_guards() -> tuple[str, ...]:
    """The guard layers this machine allows (one probe run per process, cached)."""
    return run_program("pass", SandboxLimits(wall_s=20.0)).guards


def run_program(code: str, limits: SandboxLimits | None = None, *, _layers: frozenset[str] | None = None
                ) -> ProgramResult:
    """Run `code` in a fresh sandboxed interpreter. Never raises for a bad program, returns within
    `limits.wall_s` (plus reaping), leaves no process and no temporary folder behind. `_layers` (tests
    only) restricts which guard layers are tried."""
    limits = limits or SandboxLimits()
    if not code or not code.strip():
        return ProgramResult("", "empty program")
    try:  # the folder goes, also where the program took its own permissions away
        with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX, ignore_cleanup_errors=True) as box:
            return _run_in(box, code, limits, [name for name in LAYERS if _layers is None or name in _layers])
    except OSError as exc:  # no temp space, no process slot: the sandbox could not start
        return ProgramResult("", f"sandbox: {type(exc).__name__}", detail=str(exc)[:_DETAIL_CHARS])


def _run_in(box: str, code: str, limits: SandboxLimits, layers: list[str]) -> ProgramResult:
    import site
    import subprocess  # here, not at the top: the child must not have `_posixsubprocess` loaded

    work = os.path.join(box, "work")
    os.mkdir(work, 0o700)
    path = {name: os.path.join(box, name) for name in ("code.py", "config.json", "stdout", "stderr", "verdict")}
    with open(path["code.py"], "w", encoding="utf-8", errors="replace") as f:
        f.write(code)
    with open(path["config.json"], "w") as f:
        json.dump({"work": work, "code": path["code.py"], "verdict": path["verdict"], "layers": layers,
                   "limits": asdict(limits), "site": [p for p in site.getsitepackages() if os.path.isdir(p)]}, f)
    env = {"PATH": "", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(path["stdout"], "wb") as out, open(path["stderr"], "wb") as err:
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), path["config.json"]],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=work, env=env,
                                start_new_session=True)
    status, cpu_used, timed_out = _wait_and_reap(proc.pid, limits.wall_s)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    stdout, verdict = _read(path["stdout"], limits.output_bytes + 1), _read_verdict(path["verdict"])
    text = stdout[:limits.output_bytes].decode("utf-8", errors="replace")
    note = f"wall-clock limit {limits.wall_s:g} s" if timed_out else (
        f"killed by {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status) else "")
    stderr = _read(path["stderr"], 1 << 22)[-4 * _DETAIL_CHARS:].decode("utf-8", errors="replace")
    detail = "\n".join(part for part in (stderr.strip(), note) if part)
    detail = detail[-_DETAIL_CHARS:].split("\n", 1)[-1] if len(detail) > _DETAIL_CHARS else detail
    return ProgramResult(text, classify(timed_out, status, cpu_used, limits, verdict, text, len(stdout)),
                         detail, round(wall, 3), tuple(verdict.get("guards", ())))


def classify(timed_out: bool, status: int, cpu_used: float, limits: SandboxLimits, verdict: dict,
             stdout: str, stdout_size: int) -> str | None:
    """The error kind of a finished run, by priority: timeout, memory, forbidden, syntax, output limit,
    runtime, no output; None for a clean run that printed."""
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if timed_out or sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_used >= limits.cpu_s):
        return "timeout"
    if verdict.get("memory") or sig == signal.SIGKILL:  # SIGKILL below the CPU limit: the OOM killer
        return "memory"
    if verdict.get("refused") or verdict.get("what"):
        return f"forbidden: {verdict.get('refused') or verdict['what']}"
    if sig == getattr(signal, "SIGSYS", None):
        return "forbidden: syscall"
    if verdict.get("syntax"):
        return "syntax"
    if verdict.get("output_limit") or stdout_size >= limits.output_bytes:
        return "output limit"
    if verdict.get("exc"):
        return f"runtime: {verdict['exc']}"
    if sig is not None:
        return f"runtime: {signal.Signals(sig).name}"
    if os.WEXITSTATUS(status):
        return f"runtime: exit {os.WEXITSTATUS(status)}"
    return None if stdout.strip() else "no output"


def _wait_and_reap(pid: int, wall_s: float) -> tuple[int, float, bool]:
    """Wait up to `wall_s` for the child, kill its process group (always: nothing it started survives),
    reap it: (wait status, CPU seconds it used, whether the wall clock ran out). Linux watches a pidfd,
    which does not reap, so the pid (the group's id) cannot be reused before the kill; elsewhere: polling."""
    timed_out, reaped = True, None
    try:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            deadline = time.monotonic() + wall_s
            while not (reaped := os.wait4(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
                time.sleep(0.005)
            reaped, timed_out = (reaped, False) if reaped[0] else (None, True)
        else:
            try:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                timed_out = not poller.poll(int(wall_s * 1000) + 1)
            finally:
                os.close(fd)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        reaped = reaped or os.wait4(pid, 0)
    return reaped[1], reaped[2].ru_utime + reaped[2].ru_stime, timed_out


def _read(path: str, limit: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(limit)


def _read_verdict(path: str) -> dict:
    """The child's verdict lines merged: `guards` (ready), `refused` (the first refusal), the outcome."""
    verdict: dict = {}
    for line in _read(path, 1 << 20).splitlines() if os.path.exists(path) else ():
        with contextlib.suppress(ValueError, AttributeError):  # not a line the bootstrap wrote
            verdict.update({k: v for k, v in json.loads(line).items() if k != "refused" or "refused" not in verdict})
    return verdict


# ---- the child: everything below runs inside the sandboxed interpreter ----

_NAMED_EVENTS = {"os.system": "os.system", "os.exec": "exec", "os.posix_spawn": "spawn", "os.spawn": "spawn",
                 "os.fork": "fork", "os.forkpty": "fork", "subprocess.Popen": "subprocess", "os.kill": "kill",
                 "os.killpg": "kill", "signal.pthread_kill": "kill", "resource.setrlimit": "setrlimit",
                 "resource.prlimit": "setrlimit", "_thread.start_new_thread": "thread"}
_REFUSED_IMPORTS = {"_posixsubprocess": "subprocess", "ctypes": "ctypes", "_ctypes": "ctypes"}
_WRITE_EVENTS = {"os.remove": (0,), "os.rename": (0, 1), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,),
                 "os.chown": (0,), "os.link": (0, 1), "os.symlink": (0, 1), "os.truncate": (0,), "os.utime": (0,),
                 "os.chdir": (0,), "os.chflags": (0,), "os.lchflags": (0,), "os.setxattr": (0,),
                 "os.removexattr": (0,), "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.copytree": (1,),
                 "shutil.move": (0, 1), "shutil.chown": (0,)}
_READ_EVENTS = {"os.listdir", "os.scandir", "glob.glob", "os.listxattr", "os.getxattr"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def judge_event(event: str, args: tuple, work: str, read_roots: tuple[str, ...]) -> tuple[str | None, bool]:
    """An audit event -> (what it does, as a verdict names it; None when irrelevant) and whether allowed."""
    if event in _NAMED_EVENTS:
        return _NAMED_EVENTS[event], False
    if event.startswith(("socket.", "ctypes.")):
        return event.split(".")[0], False
    if event == "import":
        return (_REFUSED_IMPORTS[args[0]], False) if args and args[0] in _REFUSED_IMPORTS else (None, True)
    if event == "open":
        flags, mode = (args[2] or 0, str(args[1] or "")) if len(args) > 2 else (0, "")
        paths, writes, name = args[:1], bool(flags & _WRITE_FLAGS) or any(c in mode for c in "wax+"), "open"
    elif event in _WRITE_EVENTS:
        paths, writes, name = [args[i] for i in _WRITE_EVENTS[event] if i < len(args)], True, event
    elif event in _READ_EVENTS:
        paths, writes, name = [args[0] if args else None], False, event
    else:
        return None, True
    for path in paths:
        if isinstance(path, int):  # a file descriptor: already open
            continue
        if not (_inside(path, (work, "/dev/null")) or (not writes and _inside(path, read_roots))):
            return f"{name} {os.fsdecode(path) if isinstance(path, (str, bytes)) else path}"[:200], False
    return f"{name} {paths[0]}"[:200] if paths else name, True


def _inside(path, roots) -> bool:
    """Whether `path` (str, bytes, PathLike; None: the cwd) resolves, links followed, beneath a root."""
    try:
        real = os.path.realpath(os.path.join(os.getcwd(), os.fsdecode(os.fspath("." if path is None else path))))
    except (OSError, TypeError, ValueError):
        return False
    return any(real == root or real.startswith(root.rstrip("/") + "/") for root in roots)


def _audit_hook(work: str, read_roots: tuple[str, ...], enforce: bool, report):
    """The audit hook and its state: `last`, the last OS-relevant call (to name what an OS layer refused),
    and `refused`, the first refusal; when enforcing, it refuses the forbidden calls, reporting each."""
    state: dict = {"last": None, "refused": None, "count": 0}

    def hook(event: str, args: tuple) -> None:
        what, allowed = judge_event(event, args, work, read_roots)
        if what is not None:
            state["last"] = what
            if enforce and not allowed:
                state["refused"], state["count"] = state["refused"] or what, state["count"] + 1
                if state["count"] <= 20:
                    report(refused=what)
                raise PermissionError(errno.EPERM, f"sandbox: forbidden {what}")

    return hook, state


def _read_roots(site_dirs: list[str]) -> tuple[str, ...]:
    """What the program may read besides its work folder: import paths, shared libraries, a few devices."""
    found = [p for p in sys.path if p] + list(site_dirs) + [
        os.path.join(sys.base_prefix, "lib"), "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib",
        "/usr/share/zoneinfo", "/etc/ld.so.cache", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"]
    return tuple(sorted({os.path.realpath(p) for p in found if os.path.exists(p)} - {"/"}))


def _set_rlimits(limits: dict, open_files: bool) -> None:
    """All limits but the open-files one (open_files=False), or that one alone (set after landlock's files)."""
    mem, cpu, out, files = limits["memory_mb"] << 20, limits["cpu_s"], limits["output_bytes"], limits["max_open_files"]
    wanted = [("RLIMIT_NOFILE", files, files)] if open_files else [
        ("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_AS", mem, mem), ("RLIMIT_FSIZE", out, out), ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NPROC", 0, 0)]
    for name, soft, hard in wanted:
        res = getattr(resource, name, None)
        if res is not None:
            old_hard = resource.getrlimit(res)[1]
            hard = hard if old_hard == resource.RLIM_INFINITY else min(hard, old_hard)
            with contextlib.suppress(ValueError, OSError):  # e.g. RLIMIT_AS on macOS
                resource.setrlimit(res, (min(soft, hard), hard))


def _layer_ok(install, *args) -> bool:
    """Whether a ctypes layer got installed; one that fails on this machine is skipped, not fatal."""
    try:
        return bool(install(*args))
    except (OSError, AttributeError, ValueError, TypeError):
        return False


def _install_landlock(libc, read_roots: tuple[str, ...], work: str) -> bool:
    """Read-only beneath `read_roots`, every right but execute and device nodes beneath `work`, nothing
    elsewhere; from ABI 4 no TCP bind/connect, from ABI 6 no signals or abstract sockets outside."""
    import ctypes

    def syscall(nr: int, *args: int | bytes) -> int:  # bytes go as a pointer to a copy
        return libc.syscall(ctypes.c_long(nr), *[ctypes.create_string_buffer(a, len(a)) if isinstance(a, bytes)
                                                 else ctypes.c_long(a) for a in args])

    libc.syscall.restype = ctypes.c_long
    abi = syscall(444, 0, 0, 1)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return False
    fs_all = (1 << (13, 14, 15, 15, 16)[min(abi, 5) - 1]) - 1  # every filesystem right this ABI knows
    file_rights = fs_all & (1 | 2 | 4 | 1 << 14 | 1 << 15)  # execute, write, read, truncate, ioctl_dev
    attr = struct.pack("=QQQ", fs_all, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)[:8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = syscall(444, attr, len(attr), 0)
    if ruleset < 0:
        return False

    def allow(path: str, rights: int) -> bool:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return False
        try:  # landlock_add_rule(LANDLOCK_RULE_PATH_BENEATH, {allowed_access, parent_fd} packed)
            return syscall(445, ruleset, 1, struct.pack("=Qi", rights if os.path.isdir(path) else rights & file_rights,
                                                        fd), 0) == 0
        finally:
            os.close(fd)

    try:
        for root in read_roots:
            allow(root, 4 | 8)  # read_file, read_dir
        allow("/dev/null", 2 | 4)
        return allow(work, fs_all & ~(1 | 1 << 6 | 1 << 11)) and syscall(446, ruleset, 0) == 0
    finally:
        os.close(ruleset)


_X86_64 = ("fork 57 vfork 58 clone 56 clone3 435 execve 59 execveat 322 socket 41 socketpair 53 connect 42 bind 49 "
           "listen 50 accept 43 accept4 288 sendto 44 ptrace 101 unshare 272 setns 308 mount 165 umount2 166 "
           "chroot 161 pivot_root 155 setrlimit 160 prlimit64 302 mknod 133 mknodat 259 io_uring_setup 425 bpf 321 "
           "perf_event_open 298 process_vm_readv 310 process_vm_writev 311 kexec_load 246 kexec_file_load 320 "
           "init_module 175 finit_module 313 delete_module 176 open_tree 428 move_mount 429 fsopen 430 fsconfig 431 "
           "fsmount 432 fspick 433 mount_setattr 442 keyctl 250 add_key 248 request_key 249 reboot 169 swapon 167 "
           "swapoff 168")
_AARCH64 = ("clone 220 clone3 435 execve 221 execveat 281 socket 198 socketpair 199 bind 200 listen 201 accept 202 "
            "connect 203 sendto 206 accept4 242 ptrace 117 unshare 97 setns 268 mount 40 umount2 39 chroot 51 "
            "pivot_root 41 setrlimit 164 prlimit64 261 mknodat 33 io_uring_setup 425 bpf 280 perf_event_open 241 "
            "process_vm_readv 270 process_vm_writev 271 kexec_load 104 kexec_file_load 294 init_module 105 "
            "finit_module 273 delete_module 106 open_tree 428 move_mount 429 fsopen 430 fsconfig 431 fsmount 432 "
            "fspick 433 mount_setattr 442 keyctl 219 add_key 217 request_key 218 reboot 142 swapon 224 swapoff 225")
SECCOMP_ARCHES = {arch: (audit_arch, dict(zip(names.split()[::2], map(int, names.split()[1::2]))))
                  for arch, audit_arch, names in (("x86_64", 0xC000003E, _X86_64), ("aarch64", 0xC00000B7, _AARCH64))}


def seccomp_filter(arch: str) -> list[tuple[int, int, int, int]]:
    """The classic-BPF program, as (code, jt, jf, k): another arch is killed; the listed calls get EPERM
    (clone3 ENOSYS, so that libc falls back to clone); prlimit64 only when it sets a limit; the rest passes."""
    audit_arch, numbers = SECCOMP_ARCHES[arch]
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    eperm, allow = 0x00050000 | errno.EPERM, 0x7FFF0000  # SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ALLOW
    prog = [(load, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, 0x80000000), (load, 0, 0, 0)]  # KILL_PROCESS
    if arch == "x86_64":  # x32 syscall numbers
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    for name, nr in numbers.items():
        if name != "prlimit64":
            prog += [(jeq, 0, 1, nr), (ret, 0, 0, 0x00050000 | (errno.ENOSYS if name == "clone3" else errno.EPERM))]
    return prog + [(jeq, 0, 5, numbers["prlimit64"]), (load, 0, 0, 32), (jeq, 0, 2, 0), (load, 0, 0, 36),
                   (jeq, 1, 0, 0), (ret, 0, 0, eperm), (ret, 0, 0, allow)]  # args[2] (new limit) == NULL: allow


def _install_seccomp(libc) -> bool:
    import ctypes

    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(os.uname().machine.lower(), os.uname().machine.lower())
    if arch not in SECCOMP_ARCHES or sys.maxsize < 2**32:
        return False
    prog = b"".join(struct.pack("=HBBI", *insn) for insn in seccomp_filter(arch))  # struct sock_filter[]
    insns = ctypes.create_string_buffer(prog, len(prog))
    fprog = ctypes.create_string_buffer(struct.pack("@HP", len(prog) // 8, ctypes.addressof(insns)))  # sock_fprog
    return libc.prctl(22, 2, ctypes.addressof(fprog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _prepare(cfg: dict, guards: list[str]):
    """Everything before the program, appending each active layer to `guards`: rlimits, compiling (a
    SyntaxError propagates), pre-imports, netns, landlock, seccomp. Returns (code object, read roots)."""
    layers = set(cfg["layers"])
    with open(cfg["code"], encoding="utf-8", errors="replace") as f:
        source = f.read()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the output cap a write fails with EFBIG
    if "rlimits" in layers:
        _set_rlimits(cfg["limits"], open_files=False)
        guards.append("rlimits")
    try:
        program = compile(source, "<program>", "exec")
    except ValueError as exc:  # null bytes
        raise SyntaxError(str(exc)) from None
    linecache.cache["<program>"] = (len(source), None, source.splitlines(True), "<program>")
    linecache.getlines(__file__)  # tracebacks show this file's lines without reading it later
    sys.path[:] = [p for p in sys.path if p] + cfg["site"]
    for name in PRELOADED:
        __import__(name)
    roots, libc, no_new_privs = _read_roots(cfg["site"]), None, False
    if sys.platform == "linux" and layers & {"seccomp", "netns", "landlock"}:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        # unshare(CLONE_NEWNET); unprivileged, together with CLONE_NEWUSER
        if "netns" in layers and _layer_ok(lambda: any(libc.unshare(f) == 0 for f in (0x40000000, 0x50000000))):
            guards.append("netns")
        no_new_privs = libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS, which landlock and seccomp need
        if "landlock" in layers and no_new_privs and _layer_ok(_install_landlock, libc, roots, cfg["work"]):
            guards.append("landlock")
    if "rlimits" in layers:
        _set_rlimits(cfg["limits"], open_files=True)
    if "seccomp" in layers and no_new_privs and _layer_ok(_install_seccomp, libc):
        guards.append("seccomp")
    return program, roots


def _child_main(config_path: str) -> None:
    """The sandboxed interpreter: limits and guards, then the program; verdict lines to their own file."""
    with open(config_path) as f:
        cfg = json.load(f)
    verdict_fd = os.open(cfg["verdict"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def report(**fields) -> None:
        try:
            os.write(verdict_fd, (json.dumps(fields) + "\n").encode())
        except MemoryError:
            os.write(verdict_fd, b'{"memory": true}\n')
        except (OSError, ValueError, TypeError):
            pass

    guards: list[str] = []
    try:
        program, roots = _prepare(cfg, guards)
    except SyntaxError as exc:
        traceback.print_exception(exc, limit=0)
        report(guards=guards, syntax=True, exc=type(exc).__name__)
        os._exit(0)
    except MemoryError:  # the memory limit is below what the interpreter itself needs
        report(guards=guards, memory=True)
        os._exit(0)
    hook, watch = _audit_hook(os.path.realpath(cfg["work"]), roots, "audit" in cfg["layers"], report)
    sys.addaudithook(hook)
    guards += ["audit"] if "audit" in cfg["layers"] else []
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="utf-8", errors="replace")
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    report(guards=[name for name in LAYERS if name in guards])
    failure: BaseException | None = None
    try:
        exec(program, main.__dict__)
    except SystemExit as exc:
        failure = None if exc.code in (None, 0) else exc
    except BaseException as exc:  # noqa: BLE001 - every outcome of the program is reported
        failure = exc
    outcome = _describe(failure, watch, main, "netns" in guards)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except OSError as exc:
            outcome["output_limit"] = outcome.get("output_limit") or exc.errno == errno.EFBIG
        except Exception:  # noqa: BLE001 - the program may have replaced or closed the streams
            pass
    report(**outcome)
    os._exit(0)


def _describe(failure: BaseException | None, watch: dict, main, netns: bool) -> dict:
    """The verdict fields of how the program ended; the traceback goes to stderr."""
    if failure is None:
        return {"what": watch["refused"]}
    err = failure.errno if isinstance(failure, OSError) else None
    memory = isinstance(failure, MemoryError) or err == errno.ENOMEM
    if memory:
        main.__dict__.clear()  # free what the program held, so that the report can be written
    on_socket = (watch["last"] or "").startswith("socket")
    unreachable = netns and on_socket and (err in (errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTUNREACH)
                                           or type(failure).__name__ == "gaierror")
    no_process = err == errno.EAGAIN and watch["last"] in ("fork", "spawn", "subprocess", "thread")  # RLIMIT_NPROC
    what = watch["refused"] or (("socket" if on_socket else watch["last"] or "os call")
                             if err in (errno.EPERM, errno.EACCES) or unreachable or no_process else None)
    with contextlib.suppress(BaseException):  # stderr full or memory short: the verdict still goes out
        traceback.print_exception(type(failure), failure, failure.__traceback__.tb_next)
    return {"exc": type(failure).__name__[:60], "errno": err, "memory": memory, "what": what,
            "output_limit": err == errno.EFBIG}


if __name__ == "__main__":
    _child_main(sys.argv[1])
