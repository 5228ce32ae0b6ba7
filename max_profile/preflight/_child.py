"""Child process of the custom-architecture preflight (run as a script; never imported by max_profile).

argv: PARENT_DIR MODULE_NAME RESULT_FILE [MODEL_PATH] [PROMPT]
Writes one JSON object per line to RESULT_FILE, flushed as it goes, so whatever the package does
at import (loop, exit, crash, megabytes of output) the parent keeps what was learned before.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

_OUT: Any = None


def emit(**event: Any) -> None:
    _OUT.write(json.dumps(event) + "\n")
    _OUT.flush()
    os.fsync(_OUT.fileno())


def _is_max(module: str) -> bool:
    return module == "max" or module.startswith("max.")


def _missing_name(name: str, module: str, mod: Any, where: str, used: str | None = None) -> dict[str, str]:
    """A drift entry for ``name`` missing from MAX's ``module``, with `` (did you mean 'X'?)`` where the module has
    public names close to it (a mistyped class name)."""
    import difflib

    close = difflib.get_close_matches(name, [n for n in dir(mod) if not n.startswith("_")], n=2, cutoff=0.75)
    what = f"name {name!r} in {module!r}" + (f" (used as {used})" if used else "")
    return {"what": what + (f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""), "where": where}


def drift_scan(pkg: Path) -> None:
    """Every absolute ``max`` import of the package, resolved against the installed MAX (nothing of the package runs).

    Checked: modules (``import max.x``), names (``from max.x import y``) and attributes used on an
    imported MAX module (``ops.some_op`` after ``from max.graph import ops``; ``max.nn.Foo`` after
    ``import max.nn``), the usual way an op or layer renamed between MAX releases shows up. A name the
    file assigns itself (a local ``ops = ...``) is not checked.
    """
    missing: list[dict[str, str]] = []
    checked = 0
    cache: dict[str, bool] = {}

    def module_exists(mod: str) -> bool:
        if mod not in cache:
            try:
                cache[mod] = importlib.util.find_spec(mod) is not None
            except (ImportError, ValueError, AttributeError):
                cache[mod] = False
        return cache[mod]

    def load(mod: str) -> Any:
        try:
            return importlib.import_module(mod)
        except Exception:  # noqa: BLE001 - MAX's own module failing to import
            return None

    for path in sorted(pkg.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
        except SyntaxError as exc:
            missing.append(
                {"what": f"syntax error: {exc.msg}", "where": f"{path.relative_to(pkg.parent)}:{exc.lineno}"}
            )
            continue
        module_aliases: dict[str, str] = {}  # local name -> the MAX module it names
        for node in ast.walk(tree):
            where = f"{path.relative_to(pkg.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_max(alias.name):
                        checked += 1
                        if not module_exists(alias.name):
                            missing.append({"what": f"module {alias.name!r}", "where": where})
                        elif alias.asname:
                            module_aliases[alias.asname] = alias.name
                        else:
                            module_aliases["max"] = "max"
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _is_max(node.module):
                checked += 1
                if not module_exists(node.module):
                    missing.append({"what": f"module {node.module!r}", "where": where})
                    continue
                try:
                    mod = importlib.import_module(node.module)
                except Exception as exc:  # noqa: BLE001 - MAX's own module failing to import
                    missing.append({"what": f"module {node.module!r} ({type(exc).__name__}: {exc})", "where": where})
                    continue
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    submodule = f"{node.module}.{alias.name}"
                    if not hasattr(mod, alias.name) and not module_exists(submodule):
                        missing.append(_missing_name(alias.name, node.module, mod, where))
                    elif module_exists(submodule):
                        module_aliases[alias.asname or alias.name] = submodule
                    elif isinstance(getattr(mod, alias.name), types.ModuleType):
                        module_aliases[alias.asname or alias.name] = getattr(mod, alias.name).__name__
        rebound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
        rebound |= {
            a.arg
            for n in ast.walk(tree)
            if isinstance(n, ast.arguments)
            for a in (*n.posonlyargs, *n.args, *n.kwonlyargs)
        }
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        # annotations are not evaluated at run time under `from __future__ import annotations`: not drift that breaks
        annotations = [
            a
            for n in ast.walk(tree)
            for a in (getattr(n, "annotation", None), getattr(n, "returns", None))
            if isinstance(a, ast.AST)
        ]
        inner |= {id(n) for a in annotations for n in ast.walk(a)}
        resolved: dict[tuple[str, str], str | None] = {}  # (module, attr) -> the submodule it names, None: chain ends
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or id(node) in inner:
                continue  # only whole chains: max.nn.Linear once, not also max.nn
            parts: list[str] = []
            cur: ast.expr = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if not isinstance(cur, ast.Name) or cur.id not in module_aliases or cur.id in rebound:
                continue
            target: str | None = module_aliases[cur.id]
            for attr in reversed(parts):  # down through submodules to the first name that is not a module
                assert target is not None
                key = (target, attr)
                if key not in resolved:
                    checked += 1
                    resolved[key] = None
                    if module_exists(f"{target}.{attr}"):
                        resolved[key] = f"{target}.{attr}"
                    elif (mod := load(target)) is not None:
                        if not hasattr(mod, attr):
                            at = f"{path.relative_to(pkg.parent)}:{node.lineno}"
                            missing.append(_missing_name(attr, target, mod, at, used=ast.unparse(node)))
                        elif isinstance(getattr(mod, attr), types.ModuleType):
                            resolved[key] = getattr(mod, attr).__name__
                target = resolved[key]
                if target is None:
                    break
    emit(kind="drift", missing=missing, checked=checked)


def builtin_names() -> list[str]:
    from max.pipelines.lib.registry import PIPELINE_REGISTRY

    names = set(getattr(PIPELINE_REGISTRY, "_lazy_architectures", {}) or {}) | set(
        getattr(PIPELINE_REGISTRY, "architectures", {}) or {}
    )
    return sorted(names)


def real_import(parent: str, name: str) -> None:
    """Import the package the way MAX's ArchLookup does: parent appended to sys.path, then import NAME."""
    sys.path.append(parent)
    t0 = time.perf_counter()  # MAX is imported by now (drift scan, built-in names): this is the package's own import
    try:
        module = importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - SystemExit / KeyboardInterrupt at import are reported too
        tb = traceback.extract_tb(exc.__traceback__)
        user = [f for f in tb if f.filename.startswith(parent)]
        frame = user[-1] if user else (tb[-1] if tb else None)
        where = f"{os.path.relpath(frame.filename, parent)}:{frame.lineno}" if frame else None
        emit(kind="import-error", error=f"{type(exc).__name__}: {exc}", where=where, import_s=time.perf_counter() - t0)
        return
    import_s = time.perf_counter() - t0
    archs = getattr(module, "ARCHITECTURES", None)
    if not archs or not isinstance(archs, list):
        origin = getattr(module, "__file__", "?")
        emit(
            kind="no-architectures",
            error=f"module {name!r} ({origin}) does not expose a non-empty ARCHITECTURES list "
            "(MAX: 'Custom model imported, but did not expose an `ARCHITECTURES` list')",
        )
        return
    names = [str(getattr(a, "name", a)) for a in archs]
    tasks = {str(getattr(a, "name", a)): str(getattr(a, "task", "")) for a in archs}
    emit(kind="imported", architectures=names, tasks=tasks, import_s=import_s)


def prompt_tokens(model_path: str, prompt: str) -> None:
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_path)
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
                ids = ids["input_ids"]
            n = len(ids[0]) if ids and isinstance(ids[0], list) else len(ids)
        else:
            n = len(tok(prompt)["input_ids"])
        emit(kind="prompt", tokens=n)
    except Exception as exc:  # noqa: BLE001
        emit(kind="prompt-error", error=f"{type(exc).__name__}: {exc}")


def main() -> None:
    global _OUT
    parent, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    model_path = sys.argv[4] if len(sys.argv) > 4 else ""
    prompt = sys.argv[5] if len(sys.argv) > 5 else "hello"
    _OUT = open(out, "a", encoding="utf-8")  # noqa: SIM115
    drift_scan(Path(parent) / name)
    try:
        emit(kind="builtins", names=builtin_names())
    except Exception as exc:  # noqa: BLE001
        emit(kind="builtins-error", error=str(exc))
    if model_path:
        prompt_tokens(model_path, prompt)
    real_import(parent, name)
    emit(kind="done")


if __name__ == "__main__":
    main()
