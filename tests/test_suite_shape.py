"""The suite tests the product: every test function reaches package code (directly, through a helper or fixture of the
suite, or by running the CLI, an example or a benchmark script that does). A figure that only re-reads committed
benchmark output belongs to that benchmark, not here."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
RUNNERS = {"run_cli", "_run", "subprocess", "Popen", "run_script"}
"""Names whose call runs the product in a child process (the CLI, an example, a script)."""


class _Module:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text())
        self.package_names: set[str] = set()  # names bound to max_profile modules or objects
        self.imported_from_tests: dict[str, str] = {}  # local name -> tests module it comes from
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    name = alias.asname or alias.name
                    if node.module.startswith("max_profile"):
                        self.package_names.add(name)
                    elif node.level >= 1:  # from .module import name
                        self.imported_from_tests[name] = node.module or ""
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("max_profile"):
                        self.package_names.add((alias.asname or alias.name).split(".")[0])
        self.functions = {
            f.name: f for f in ast.walk(self.tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        }


def _names(fn: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)  # fixtures by parameter name
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(".py"):
            out.add("subprocess")  # a script path handed to a runner
    return out


def _dotted(path: Path) -> str:
    """A suite module's name from the tests folder (``analyze.test_ledger``): what its relative imports name."""
    return ".".join(path.relative_to(TESTS).with_suffix("").parts)


def _suite() -> dict[str, _Module]:
    return {
        _dotted(p): _Module(p)
        for p in sorted(TESTS.rglob("*.py"))
        if p.name != "__init__.py" and not {"data", "fakes"} & set(p.relative_to(TESTS).parts)
    }


def tests_without_package_code() -> list[str]:
    modules = _suite()
    fixtures: dict[str, tuple[_Module, ast.AST]] = {}
    for m in modules.values():
        for name, fn in m.functions.items():
            fixtures.setdefault(name, (m, fn))
    memo: dict[tuple[str, str], bool] = {}

    def reaches(m: _Module, fn: ast.AST, name: str, seen: set[tuple[str, str]]) -> bool:
        key = (_dotted(m.path), name)
        if key in memo:
            return memo[key]
        if key in seen:
            return False
        seen = seen | {key}
        names = _names(fn)
        hit = bool(names & (m.package_names | RUNNERS))
        if not hit:
            for n in names:
                if n in m.functions and n != name:
                    hit = reaches(m, m.functions[n], n, seen)
                elif n in m.imported_from_tests and m.imported_from_tests[n] in modules:
                    other = modules[m.imported_from_tests[n]]
                    if n in other.functions:
                        hit = reaches(other, other.functions[n], n, seen)
                elif n in fixtures and n not in m.functions:
                    other, ffn = fixtures[n]
                    hit = reaches(other, ffn, n, seen)
                if hit:
                    break
        memo[key] = hit
        return hit

    out = []
    for m in modules.values():
        for name, fn in m.functions.items():
            if name.startswith("test_") and not reaches(m, fn, name, set()):
                out.append(f"{m.path.relative_to(TESTS)}::{name}")
    return sorted(out)


def test_every_test_reaches_package_code() -> None:
    assert tests_without_package_code() == []
