"""The package's size rules, checked by CI: no module over 800 lines, no function over 120 lines, at most 6 functions
over 100 lines (in max_profile/). Prints each breach and exits 1; prints the largest of each kind either way.

    python .ci/size_rules.py [PACKAGE_DIR]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 120
LONG_FUNCTION_LINES = 100
MAX_LONG_FUNCTIONS = 6


def sizes(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(lines, module) of every module and (lines, module:function) of every function or method under ``root``."""
    modules, functions = [], []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        modules.append((len(text.splitlines()), str(path)))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                functions.append((node.end_lineno - node.lineno + 1, f"{path}:{node.lineno}:{node.name}"))
    return sorted(modules, reverse=True), sorted(functions, reverse=True)


def breaches(root: Path) -> list[str]:
    modules, functions = sizes(root)
    out = [
        f"{where}: {n} lines (a module is at most {MAX_MODULE_LINES})" for n, where in modules if n > MAX_MODULE_LINES
    ]
    out += [
        f"{where}: {n} lines (a function is at most {MAX_FUNCTION_LINES})"
        for n, where in functions
        if n > MAX_FUNCTION_LINES
    ]
    long = [f"{where} ({n})" for n, where in functions if n > LONG_FUNCTION_LINES]
    if len(long) > MAX_LONG_FUNCTIONS:
        out.append(
            f"{len(long)} functions over {LONG_FUNCTION_LINES} lines (at most {MAX_LONG_FUNCTIONS}): {', '.join(long)}"
        )
    return out


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "max_profile")
    modules, functions = sizes(root)
    print(
        f"size rules: largest module {modules[0][1]} ({modules[0][0]} lines); largest function {functions[0][1]} "
        f"({functions[0][0]} lines); {sum(n > LONG_FUNCTION_LINES for n, _ in functions)} over {LONG_FUNCTION_LINES}"
    )
    found = breaches(root)
    for line in found:
        print(f"size rules: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
