"""runtime.sandbox: every hostile program is contained, its verdict recorded, nothing happens outside
its work folder, and the evaluating process goes on (each run is followed by a clean one). Each OS
layer is also tested alone, so that removing or breaking one fails a test; a layer this kernel does
not allow is detected by a probe written here, independently of the module, and only then skipped."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest

from runtime import sandbox
from runtime.sandbox import ProgramResult, SandboxLimits, available_guards, extract_program, run_program

LIMITS = SandboxLimits(wall_s=3.0, cpu_s=2, memory_mb=256, output_bytes=4096)
FAST = SandboxLimits(wall_s=1.5, cpu_s=1, memory_mb=256, output_bytes=4096)
LINUX = sys.platform == "linux"

FORK = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('forked')"
SOCKET = "import socket\ns = socket.socket()\nprint('made')"
PASSWD = "print(open('/etc/passwd').read())"
HOG = "x = [bytearray(10**6) for _ in range(1000)]\nprint('survived')"  # 1 GB, bounded: safe if unguarded
LOOP = "while True:\n    pass"

# The probes: a fresh interpreter tries the kernel feature itself (not through runtime.sandbox).
PROBES = {
    "seccomp": """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
prog = Prog(1, (Insn * 1)(Insn(6, 0, 0, 0x7FFF0000)))   # return ALLOW
ok = os.uname().machine in ("x86_64", "aarch64") and libc.prctl(38, 1, 0, 0, 0) == 0 \\
    and libc.prctl(22, 2, ctypes.addressof(prog), 0, 0) == 0
sys.exit(0 if ok else 1)""",
    "landlock": """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
sys.exit(0 if libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1)) >= 1 else 1)""",
    "netns": """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
sys.exit(0 if libc.unshare(0x40000000) == 0 or libc.unshare(0x50000000) == 0 else 1)""",
}
_probed: dict[str, str | None] = {}


def kernel_refuses(layer: str) -> str | None:
    """Why this machine does not allow `layer` (None: it does), probed in a bounded child process."""
    if layer not in _probed:
        if not LINUX:
            _probed[layer] = "Linux only"
        else:
            try:
                done = subprocess.run([sys.executable, "-I", "-c", PROBES[layer]], timeout=20, capture_output=True)
                _probed[layer] = None if done.returncode == 0 else f"the kernel refuses {layer} here (probe rc {done.returncode})"
            except subprocess.TimeoutExpired:  # run() kills the probe
                _probed[layer] = f"the {layer} probe hung"
    return _probed[layer]


def sandbox_dirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(sandbox.TEMP_PREFIX)}


def descendants() -> set[int]:
    """Our child processes and theirs, zombies included."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def run(code: str, limits: SandboxLimits = LIMITS, layers: set[str] | None = None) -> ProgramResult:
    """run_program, then: no temp folder left, no process left (not even a zombie), and a clean program
    still runs."""
    dirs, processes = sandbox_dirs(), descendants()
    result = run_program(code, limits, _layers=None if layers is None else frozenset(layers))
    assert isinstance(result, ProgramResult)
    assert sandbox_dirs() <= dirs, "a sandbox temp folder was left behind"
    assert descendants() <= processes, "a process was left behind"
    after = run_program("print(6*7)", LIMITS)
    assert (after.stdout, after.error) == ("42\n", None)
    return result


@pytest.fixture
def listener():
    """A loopback TCP listener the sandboxed program tries to reach; yields (socket, port)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    yield server, server.getsockname()[1]
    server.close()


def assert_no_connection(server: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        server.accept()


# ---- containment with every layer on ----

def test_endless_loop_is_a_timeout_and_leaves_no_process():
    result = run("import os\nprint(os.getpid(), flush=True)\n" + LOOP, FAST)
    assert result.error == "timeout"
    assert result.wall_s < FAST.wall_s + 1.0
    pid = int(result.stdout)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # its process group is gone too


def test_sleep_forever_is_a_timeout_by_the_wall_clock():
    result = run("import time\ntime.sleep(1000)", FAST)
    assert result.error == "timeout"
    assert FAST.wall_s - 0.1 <= result.wall_s < FAST.wall_s + 1.0
    assert "wall-clock" in result.detail


@pytest.mark.parametrize("code", ["x = bytearray(10**10)", HOG, "x = []\nfor _ in range(1000):\n    x.append(' ' * 10**6)\nprint(1)"])
def test_memory_hog_is_stopped(code):
    assert run(code).error == "memory"


def test_fork_is_forbidden():
    result = run(FORK)
    assert result.error == "forbidden: fork"
    assert "forked" not in result.stdout


def test_os_system_is_forbidden_and_nothing_ran(tmp_path):
    target = tmp_path / "x"
    result = run(f"import os\nos.system('echo hi > {target}')\nprint('done')")
    assert result.error == "forbidden: os.system"
    assert not target.exists()


def test_subprocess_is_forbidden_and_nothing_ran(tmp_path):
    target = tmp_path / "x"
    result = run(f"import subprocess\nsubprocess.run(['/bin/sh', '-c', 'echo hi > {target}'])\nprint('done')")
    assert result.error.startswith("forbidden: ")
    assert not target.exists()


def test_writing_elsewhere_is_forbidden(tmp_path):
    target = tmp_path / "escape.txt"
    result = run(f"open({str(target)!r}, 'w').write('x')\nprint('wrote')")
    assert result.error == f"forbidden: open {target}"
    assert not target.exists()


def test_reading_a_system_file_is_forbidden():
    result = run(PASSWD)
    assert result.error == "forbidden: open /etc/passwd"
    assert "root:" not in result.stdout


def test_a_caught_refusal_is_still_recorded():
    result = run("import os\ntry:\n    os.system('true')\nexcept OSError:\n    pass\nprint('went on')")
    assert (result.stdout, result.error) == ("went on\n", "forbidden: os.system")


def test_socket_is_forbidden_and_nothing_connected(listener):
    server, port = listener
    result = run(f"import socket\nsocket.socket().connect(('127.0.0.1', {port}))\nprint('connected')")
    assert result.error == "forbidden: socket"
    assert "connected" not in result.stdout
    assert_no_connection(server)


@pytest.mark.parametrize("code", ["def f(:\n    pass", "if True:\nprint(1)", "x = 'unclosed"])
def test_syntax_error(code):
    assert run(code).error == "syntax"


def test_no_output_runtime_error_and_empty_program():
    assert run("x = 1").error == "no output"
    result = run("print('before')\n1/0")
    assert (result.stdout, result.error) == ("before\n", "runtime: ZeroDivisionError")
    assert "ZeroDivisionError" in result.detail
    assert run("import sys\nsys.exit(3)").error == "runtime: SystemExit"
    assert run_program("  \n").error == "empty program"


def test_printing_forever_is_capped():
    result = run("while True:\n    print('y' * 100)", FAST)
    assert result.error in ("output limit", "timeout")
    assert 0 < len(result.stdout.encode()) <= FAST.output_bytes


def test_clean_programs_and_imports():
    result = run("print(sum(range(10)))")
    assert (result.stdout, result.error) == ("45\n", None)
    assert set(result.guards) == set(available_guards())
    result = run("import fractions, math, statistics, textwrap, hashlib\n"
                 "print(fractions.Fraction(1, 3) + fractions.Fraction(1, 6), math.gcd(12, 18), statistics.mean([1, 2]))")
    assert (result.stdout, result.error) == ("1/2 6 1.5\n", None)
    result = run("open('a.txt', 'w').write('kept')\nprint(open('a.txt').read())\nif __name__ == '__main__':\n    print('main')")
    assert (result.stdout, result.error) == ("kept\nmain\n", None)


def test_result_to_dict():
    result = run("print(1)")
    assert result.to_dict() == {"stdout": "1\n", "error": None, "detail": "", "wall_s": result.wall_s,
                                "guards": list(result.guards)}


def test_available_guards_match_the_kernel_probes():
    guards = available_guards()
    assert {"rlimits", "audit"} <= set(guards)
    for layer in ("seccomp", "netns", "landlock"):
        assert (layer in guards) == (kernel_refuses(layer) is None), layer


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_the_whole_process_group_is_killed():
    """Even with no guard (so the program can fork), a grandchild left running is killed with the group."""
    result = run("import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)\n"
                 "print(pid, flush=True)", LIMITS, set())
    grandchild = int(result.stdout)
    for _ in range(200):  # killed at once; give its new parent a moment to reap it
        try:
            with open(f"/proc/{grandchild}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state in "ZX":
            return
        time.sleep(0.01)
    pytest.fail(f"the grandchild {grandchild} is still running (state {state})")


def test_many_runs_leave_nothing_behind():
    dirs, processes = sandbox_dirs(), descendants()
    for i in range(15):
        assert run_program(f"print({i})", LIMITS).stdout == f"{i}\n"
    assert sandbox_dirs() <= dirs
    assert descendants() <= processes


# ---- each OS layer alone: these fail if that layer is removed or broken ----

def only(layer: str, code: str, limits: SandboxLimits = LIMITS) -> ProgramResult:
    if layer in ("seccomp", "netns", "landlock") and (reason := kernel_refuses(layer)):
        pytest.skip(reason)
    result = run(code, limits, {layer})
    assert result.guards == (layer,), f"{layer} was not installed (guards {result.guards})"
    return result


def test_seccomp_alone_refuses_fork_and_sockets():
    result = only("seccomp", FORK)
    assert (result.error, result.stdout) == ("forbidden: fork", "")
    assert "Operation not permitted" in result.detail
    result = only("seccomp", SOCKET)
    assert (result.error, result.stdout) == ("forbidden: socket", "")


def test_landlock_alone_refuses_reading_and_writing_outside(tmp_path):
    result = only("landlock", PASSWD)
    assert result.error == "forbidden: open /etc/passwd"
    assert "root:" not in result.stdout and "Permission denied" in result.detail
    target = tmp_path / "escape.txt"
    result = only("landlock", f"open({str(target)!r}, 'w').write('x')\nprint('wrote')")
    assert result.error == f"forbidden: open {target}"
    assert not target.exists()


def test_netns_alone_cuts_the_network(listener):
    server, port = listener
    result = only("netns", f"import socket\nsocket.socket().connect(('127.0.0.1', {port}))\nprint('connected')")
    assert (result.error, result.stdout) == ("forbidden: socket", "")
    assert_no_connection(server)


def test_rlimits_alone_stop_the_memory_hog_and_the_cpu_loop():
    assert only("rlimits", HOG).error == "memory"
    limits = SandboxLimits(wall_s=4.0, cpu_s=1, memory_mb=256, output_bytes=4096)
    result = only("rlimits", LOOP, limits)
    assert result.error == "timeout" and result.wall_s < 3.0  # the CPU limit, well before the wall clock
    assert "SIGXCPU" in result.detail


def test_audit_alone_refuses_os_system(tmp_path):
    target = tmp_path / "x"
    result = only("audit", f"import os\nos.system('echo hi > {target}')\nprint('done')")
    assert result.error == "forbidden: os.system"
    assert not target.exists()


def test_without_layers_the_same_programs_get_through(tmp_path, listener):
    """The control: with no layer on, the layer tests' programs do what they try (so those tests test the layers)."""
    server, port = listener
    target = tmp_path / "x"
    assert run(FORK, LIMITS, set()).stdout == "forked\n"
    assert run(f"import os\nos.system('echo hi > {target}')\nprint('done')", LIMITS, set()).stdout == "done\n"
    assert target.exists()
    result = run(f"import socket\nsocket.socket().connect(('127.0.0.1', {port}))\nprint('connected')", LIMITS, set())
    assert result.stdout == "connected\n" and result.guards == ()


# ---- the seccomp syscall numbers against the kernel headers, where installed ----

@pytest.mark.parametrize("arch,header", [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                         ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_seccomp_syscall_numbers_match_the_headers(arch, header):
    if not os.path.exists(header):
        pytest.skip(f"{header} is not installed")
    with open(header) as f:
        defined = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\b", f.read())}
    numbers = sandbox.SECCOMP_ARCHES[arch][1]
    known = {name: nr for name, nr in numbers.items() if name in defined}
    assert known == {name: defined[name] for name in known}
    assert len(known) >= len(numbers) - 2, f"names missing from {header}: {set(numbers) - set(defined)}"


# ---- extract_program ----

def test_extract_program():
    assert extract_program("Here:\n```python\nprint(1)\n```\nDone.") == "print(1)"
    assert extract_program("```\nx = 2\nprint(x)\n```") == "x = 2\nprint(x)"
    several = textwrap.dedent("""\
        First try:
        ```python
        print('old')
        ```
        Better:
        ```python
        print('new')
        ```
        Helper:
        ```python
        def unused():
            return 0
        ```
        Output:
        ```text
        new
        ```""")
    assert extract_program(several) == "print('new')"
    assert extract_program("  print(3)\n  ") == "print(3)"
    assert extract_program("```python\nprint(4)\n") == "print(4)"  # an unclosed fence
    assert extract_program("1. code:\n   ```python\n   print(5)\n   ```") == "print(5)"  # indented
