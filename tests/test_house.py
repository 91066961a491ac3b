"""The house: floors import only downward (runtime < specdec < adafuse, rlid < eval), no package imports
another in a circle, and source files and functions stay small enough to read whole."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = {"runtime": 1, "specdec": 2, "adafuse": 3, "rlid": 3, "eval": 4}
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def sources(packages=FLOORS) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every import in the file, at module level or inside functions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_floors_import_only_downward():
    upward = []
    for path in sources():
        pkg = path.relative_to(ROOT).parts[0]
        for name in imported_packages(path) & set(FLOORS):
            if FLOORS[name] > FLOORS[pkg]:
                upward.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not upward, "imports that run back up:\n" + "\n".join(upward)


def test_no_string_imports_of_higher_floors():
    """No importlib/string dispatch up the house either (a lazy import that dodges the rule)."""
    found = []
    for path in sources():
        pkg = path.relative_to(ROOT).parts[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                head = node.value.split(".")[0]
                if head in FLOORS and FLOORS[head] > FLOORS[pkg] and "." in node.value and " " not in node.value:
                    found.append(f"{path.relative_to(ROOT)}: {node.value!r}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_file_and_function_sizes(path):
    src = path.read_text(encoding="utf-8")
    assert src.count("\n") <= MAX_FILE_LINES, f"{path.name}: {src.count(chr(10))} lines"
    long = [f"{n.name}: {n.end_lineno - n.lineno + 1} lines" for n in ast.walk(ast.parse(src))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: " + ", ".join(long)


def module_imports(path: Path) -> set[str]:
    """Modules of ours a file imports, anywhere in it (lazy imports and TYPE_CHECKING ones too: a
    circle hidden from the interpreter is still a circle for whoever reads the code)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_no_module_imports_another_in_a_circle():
    names = {}
    for path in sources():
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {m: {d for d in module_imports(p) if d in names and d != m and not m.startswith(d + ".")}
             for m, p in names.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, "modules importing each other in a circle: " + "; ".join(" -> ".join(c) for c in cycles)
