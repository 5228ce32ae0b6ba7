"""Write docs/rules.md and docs/cli.md from the code: the rules registry, the thresholds and the CLI's parser.

    python docs/generate.py          # rewrite both
    python docs/generate.py --check  # exit 1 when either differs from what the code says (tests/cli/test_docs.py)

rules.md: every rule in the order the engine runs it: what it judges (its docstring), what it needs, the findings it
emits with the evidence keys its code sets, the next command each carries, what supersedes each, and every threshold
it reads with its default and meaning. cli.md: every verb with its description and every flag with its default.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from max_profile.analyze.rules import KEPT_WHEN, RULES, SUPERSEDED_BY  # noqa: E402
from max_profile.analyze.rules.base import NEEDS, RuleSpec  # noqa: E402
from max_profile.analyze.thresholds import Thresholds  # noqa: E402
from max_profile.flags import build_parser  # noqa: E402

RULES_MD = HERE / "rules.md"
CLI_MD = HERE / "cli.md"

COMMANDS = {
    "kernel_command": "`max-profile kernel` on the named kernel (Nsight Compute, 3 launches, full set), the capture's "
    "model and workload, its launches skipped into the phase",
    "_top_kernel_command": "`max-profile kernel` on the top kernel of the families concerned (decode launches)",
    "_host_command": "py-spy on the capture's own run with the kernel tracer off (a server: the same serve capture in "
    "utilization mode, its worker followed): where the host's time goes per step",
    "_default_run_command": "the capture's workload as MAX runs it by default (`max-profile run`, or `serve --mode "
    "kernels`): its steps judge the host's time",
    "attach_command": "`max-profile attach` on the same server (its URL and metrics URL)",
    "for_model": "a `max-profile` command on the capture's own model, devices and workload",
    "shell": "another tool's command line",
}


def _threshold_docs() -> dict[str, str]:
    """Each Thresholds field's docstring (the string literal after it in the class body)."""
    tree = ast.parse(inspect.getsource(Thresholds))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for a, b in zip(body, body[1:], strict=False):
        if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name):
            if isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
                out[a.target.id] = " ".join(b.value.value.split())
    return out


def _dict_keys(node: ast.AST | None) -> list[str]:
    return [k.value for k in getattr(node, "keys", []) if isinstance(k, ast.Constant) and isinstance(k.value, str)]


class _Findings(ast.NodeVisitor):
    """Per finding id: the evidence keys and next commands the rules' code gives it (read from ``Finding(...)`` calls,
    the dicts passed as their evidence and the helper functions that build those dicts)."""

    def __init__(self, modules: list[ast.Module]) -> None:
        self.functions = {f.name: f for m in modules for f in ast.walk(m) if isinstance(f, ast.FunctionDef)}
        self.evidence: dict[str, set[str]] = {}
        self.commands: dict[str, set[str]] = {}
        for f in self.functions.values():
            self._function(f)

    def _keys_of(self, fn: ast.FunctionDef, node: ast.AST, depth: int = 0) -> set[str]:
        if isinstance(node, ast.Dict):
            keys = set(_dict_keys(node))
            for k, v in zip(node.keys, node.values, strict=True):
                if k is None:  # ** spread
                    keys |= self._keys_of(fn, v, depth)
            return keys
        if isinstance(node, ast.Name):
            keys: set[str] = set()
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign | ast.AnnAssign):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    if any(isinstance(t, ast.Name) and t.id == node.id for t in targets) and n.value is not None:
                        keys |= self._keys_of(fn, n.value, depth)
                    for t in targets:
                        if (
                            isinstance(t, ast.Subscript)
                            and isinstance(t.value, ast.Name)
                            and t.value.id == node.id
                            and isinstance(t.slice, ast.Constant)
                        ):
                            keys.add(str(t.slice.value))
                if (
                    isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute)
                    and n.func.attr == "update"
                    and isinstance(n.func.value, ast.Name)
                    and n.func.value.id == node.id
                    and n.args
                ):
                    keys |= self._keys_of(fn, n.args[0], depth)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and depth < 3:
                    keys |= self._keys_set_by_helper(n, node.id, depth)
            return keys
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and depth < 3:
            helper = self.functions.get(node.func.id)
            if helper is not None:
                keys = set()
                for n in ast.walk(helper):
                    if isinstance(n, ast.Return) and n.value is not None:
                        keys |= self._keys_of(helper, n.value, depth + 1)
                return keys
        return set()

    def _keys_set_by_helper(self, call: ast.Call, name: str, depth: int) -> set[str]:
        """The keys a helper sets in the dict ``name`` passed to it (``helper(..., evidence)`` then
        ``evidence["key"] = ...`` inside it)."""
        helper = self.functions.get(call.func.id) if isinstance(call.func, ast.Name) else None
        if helper is None:
            return set()
        params = [a.arg for a in helper.args.args]
        passed = [
            params[i] for i, a in enumerate(call.args) if i < len(params) and isinstance(a, ast.Name) and a.id == name
        ]
        passed += [k.arg for k in call.keywords if k.arg and isinstance(k.value, ast.Name) and k.value.id == name]
        return {key for param in passed for key in self._keys_of(helper, ast.Name(id=param), depth + 1)}

    def _command(self, fn: ast.FunctionDef, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and node.value is None:
            return set()
        if isinstance(node, ast.IfExp | ast.BoolOp):
            parts = [node.body, node.orelse] if isinstance(node, ast.IfExp) else node.values
            return {c for p in parts for c in self._command(fn, p)}
        if isinstance(node, ast.Name):
            out: set[str] = set()
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets):
                    out |= self._command(fn, n.value)
                if isinstance(n, ast.Assign) and any(
                    isinstance(t, ast.Tuple) and any(isinstance(e, ast.Name) and e.id == node.id for e in t.elts)
                    for t in n.targets
                ):
                    out.add(ast.unparse(n.value))
            return out
        return {ast.unparse(node)}

    def _function(self, fn: ast.FunctionDef) -> None:
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Finding"):
                continue
            kw = {k.arg: k.value for k in call.keywords if k.arg}
            ids: list[str] = []
            node = kw.get("id")
            if isinstance(node, ast.Constant):
                ids = [str(node.value)]
            elif isinstance(node, ast.IfExp):
                ids = [str(x.value) for x in (node.body, node.orelse) if isinstance(x, ast.Constant)]
            elif isinstance(node, ast.JoinedStr):
                ids = [ast.unparse(node)]
            for fid in ids:
                self.evidence.setdefault(fid, set()).update(
                    self._keys_of(fn, kw["evidence"]) if "evidence" in kw else ()
                )
                if "command" in kw:
                    self.commands.setdefault(fid, set()).update(self._command(fn, kw["command"]))


def _gloss(expr: str) -> str:
    name = expr.split("(", 1)[0].strip()
    return COMMANDS.get(name, "")


def _modules() -> list[ast.Module]:
    folder = HERE.parent / "max_profile" / "analyze" / "rules"
    return [ast.parse(p.read_text()) for p in sorted(folder.glob("*.py"))]


def _needs_text(spec: RuleSpec) -> str:
    out = []
    for need in spec.needs:
        out.append(" or ".join(f"`{n}`" for n in need.split("|")))
    return ", ".join(out) or "nothing"


def rules_md() -> str:
    th = _threshold_docs()
    defaults = {f.name: f.default for f in fields(Thresholds)}
    found = _Findings(_modules())
    lines = [
        "# Rules and findings",
        "",
        "Generated by `python docs/generate.py` from the rules registry (`max_profile/analyze/rules/__init__.py`), "
        "the code of each rule and `Thresholds` (`max_profile/analyze/thresholds.py`); `tests/cli/test_docs.py` fails "
        "when this page is stale.",
        "",
        "Rules run in this order. A rule runs only when the report meets what it needs; otherwise it is listed in the "
        "report's `rules_skipped` with the reason. A finding another finding supersedes is dropped (and listed there "
        "too). Findings are ranked by severity, then by what their lever buys over the capture.",
        "",
        "## What rules need",
        "",
        "| need | what it asks |",
        "|---|---|",
    ]
    for name in NEEDS:
        lines.append(f"| `{name}` | {_need_doc(name)} |")
    for spec in RULES:
        doc = inspect.getdoc(spec.fn) or ""
        lines += ["", f"## `{spec.name}`", ""]
        if doc:
            lines += [" ".join(doc.split("\n\n")[0].split()), ""]
        lines += [f"Needs: {_needs_text(spec)}.", ""]
        lines += ["| finding | evidence keys | next command | superseded by |", "|---|---|---|---|"]
        for fid in spec.emits:
            keys = ", ".join(f"`{k}`" for k in sorted(found.evidence.get(fid, set()))) or "—"
            cmds = sorted(found.commands.get(fid, set()))
            cmd = "<br>".join(f"`{c}`" + (f": {_gloss(c)}" if _gloss(c) else "") for c in cmds) or "—"
            by = ", ".join(f"`{x}`" for x in sorted(SUPERSEDED_BY.get(fid, frozenset()))) or "—"
            if fid in KEPT_WHEN:
                by += " (kept where " + " ".join((inspect.getdoc(KEPT_WHEN[fid]) or "").split()).rstrip(".") + ")"
            lines.append(f"| `{fid}` | {keys} | {cmd} | {by} |")
        if spec.thresholds:
            lines += ["", "| threshold | default | meaning |", "|---|---|---|"]
            for name in spec.thresholds:
                lines.append(f"| `{name}` | {defaults[name]!r} | {th.get(name, '')} |")
    return "\n".join(lines) + "\n"


def _need_doc(name: str) -> str:
    """What a need asks, from its check's source: the section it reads (``_unavailable_reason(r.X, "what")``: the
    report has that section, else the section's own reason is given) or the reason it gives when unmet."""
    src = inspect.getsource(NEEDS[name]).strip()
    expr = ast.parse(textwrap.dedent(src).split(":", 1)[1].strip().rstrip(","), mode="eval")
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_unavailable_reason" and len(node.args) == 2:
            what = node.args[1]
            if isinstance(what, ast.Constant):
                return f"the report has a {what.value} (else: why it has none)"
    reasons = [
        c.value for c in ast.walk(expr) if isinstance(c, ast.Constant) and isinstance(c.value, str) and len(c.value) > 3
    ]
    return ("else skipped: " + reasons[0].replace("|", "\\|")) if reasons else ""


def cli_md() -> str:
    parser = build_parser()
    lines = [
        "# Command line",
        "",
        "Generated by `python docs/generate.py` from the parser (`max_profile/flags.py`); `tests/cli/test_docs.py` "
        "fails when this page is stale.",
        "",
        f"`{parser.prog}`: {parser.description}",
        "",
        "Exit codes: 0 done, 1 a regression (`diff`), 2 bad input, 3 a tool missing, 4 a capture failed, 5 "
        "inconclusive (`diff` could not judge: nothing judged, or a figure it could not judge got worse), 130 "
        "interrupted (Ctrl-C), 143 terminated (SIGTERM).",
    ]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        lines += ["", f"## `{parser.prog} {name}`", "", p.description or "", "", "| argument | default | what |"]
        lines.append("|---|---|---|")
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = ", ".join(action.option_strings) or action.metavar or action.dest
            default = action.default
            shown = "" if default in (None, False, argparse.SUPPRESS, [], {}) else f"`{default}`"
            what = (action.help or "").replace("%%", "%").replace("|", "\\|").replace("\n", " ")
            if action.choices and not isinstance(action, argparse._SubParsersAction):
                what += " (one of: " + ", ".join(f"`{c}`" for c in action.choices) + ")"
            lines.append(f"| `{flag}` | {shown} | {what} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="exit 1 when a page differs from what the code says")
    args = ap.parse_args()
    stale = []
    for path, text in ((RULES_MD, rules_md()), (CLI_MD, cli_md())):
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}: run python docs/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
