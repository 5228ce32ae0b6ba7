"""Custom-architecture preflight: the checks that make ``--custom-architectures`` loads fail fast.

``check_architecture(spec, model_path=None, serve=False)`` — CLI ``max-profile check-arch SPEC``.

Checks in this process (no user code runs here): the spec's form, a package name that shadows an
installed module, ``PYTHONPATH`` traps, the model folder's config / tokenizer. Then one child
process, with a timeout and its own process group, scans every ``max`` import of the package
against the installed MAX (AST + ``find_spec`` / attribute lookup; nothing of the package runs),
then imports the package the way MAX does and lists what ``ARCHITECTURES`` registers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from max_profile.collect.probes.environment import max_version
from max_profile.defaults import PREFLIGHT_TIMEOUT_S
from max_profile.errors import InputError
from max_profile.model import PreflightCheck, PreflightResult, Severity
from max_profile.util.files import cache_dir, write_output
from max_profile.util.procs import clean_child_env, die_with_parent, kill_group

PASS_THROUGH_CHAT_TEMPLATE = '{% for m in messages %}{{ m["content"] }}{% endfor %}'
"""A chat template that sends the messages' text unchanged (for base models without one)."""

DEFAULT_TIMEOUT_S = PREFLIGHT_TIMEOUT_S
_CHILD = Path(__file__).with_name("_child.py")


def _check(
    cid: str, ok: bool, severity: Severity, message: str, fix: str | None = None, where: str | None = None
) -> PreflightCheck:
    return PreflightCheck(id=cid, ok=ok, severity=severity, message=message, fix=fix, where=where)


def import_path_form(spec: str) -> tuple[str, str] | None:
    """(import path, module name) of a spec written ``IMPORT_PATH:MODULE``; None for a package folder path (a drive
    letter's colon is not the separator)."""
    parts = spec.split(":")
    if len(parts) == 2 and not (len(parts[0]) == 1 and parts[0].isalpha()):
        return parts[0], parts[1]
    return None


def parse_spec(spec: str) -> tuple[str, str, list[PreflightCheck]]:
    """(import path, module name, problems) — the way MAX 26.7's ArchLookup splits a spec."""
    problems: list[PreflightCheck] = []
    parts = spec.split(":")
    if len(parts) > 2:
        problems.append(
            _check(
                "spec-form",
                False,
                "error",
                f"spec {spec!r} has more than one ':' (MAX: 'Custom module spec contains too many colons')",
                fix="use either a package folder path (/x/pkg) or IMPORT_PATH:MODULE (/x:pkg)",
            )
        )
        return "", "", problems
    colon = import_path_form(spec)
    if colon is not None:
        return colon[0], colon[1], problems
    path, name = os.path.dirname(spec), os.path.basename(spec)
    if spec.endswith(("/", os.sep)):
        problems.append(
            _check(
                "trailing-slash",
                False,
                "error",
                f"spec {spec!r} ends with a slash: MAX takes the empty last part as the module name ('Empty module "
                "name')",
                fix=f"--custom-architectures {spec.rstrip('/' + os.sep)}",
            )
        )
    return path, name, problems


def _static_checks(spec: str, serve: bool) -> tuple[list[PreflightCheck], Path | None, str]:
    checks: list[PreflightCheck] = []
    import_path, name, problems = parse_spec(spec)
    checks += problems
    if any(not c.ok and c.severity == "error" for c in problems):
        return checks, None, name
    pkg = Path(import_path or ".") / name
    if name.endswith(".py") or (pkg.is_file() and pkg.suffix == ".py"):
        checks.append(
            _check(
                "spec-is-file",
                False,
                "error",
                f"{spec!r} is a .py file: MAX imports a package (a folder with __init__.py); relative imports "
                "then fail",
                fix=f"--custom-architectures {os.path.dirname(os.path.abspath(spec))}",
            )
        )
        return checks, None, name
    if not pkg.exists():
        checks.append(
            _check(
                "spec-exists",
                False,
                "error",
                f"{pkg} does not exist",
                fix="pass the folder of the architecture package",
            )
        )
        return checks, None, name
    if not pkg.is_dir() or not (pkg / "__init__.py").is_file():
        checks.append(
            _check(
                "spec-package",
                False,
                "error",
                f"{pkg} is not a Python package (no __init__.py)",
                fix="add __init__.py that defines ARCHITECTURES = [...]",
            )
        )
        return checks, None, name
    checks.append(_check("spec", True, "info", f"package {name!r} from {os.path.abspath(import_path or '.')}"))
    # A package named like an installed module loses: MAX *appends* its parent to sys.path.
    from importlib.util import find_spec

    try:
        installed = find_spec(name)
    except (ImportError, ValueError):
        installed = None
    if (
        installed is not None
        and installed.origin
        and not os.path.abspath(installed.origin).startswith(os.path.abspath(pkg))
    ):
        checks.append(
            _check(
                "shadowed-name",
                False,
                "error",
                f"package name {name!r} is already importable here ({installed.origin}); MAX appends the package's "
                "parent to sys.path, "
                f"so `import {name}` gets the installed module ('module {name!r} has no attribute ARCHITECTURES')",
                fix=f"rename the package folder (e.g. {name}_arch) and its references",
            )
        )
    for entry in filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if os.path.abspath(entry) == os.path.abspath(pkg):
            checks.append(
                _check(
                    "pythonpath-trap",
                    False,
                    "warning",
                    f"PYTHONPATH contains the architecture folder itself ({entry}): its modules (e.g. arch, model) "
                    "become top-level names that can shadow other packages, and a bare-name spec fails with 'No "
                    "module named'",
                    fix=f"remove it from PYTHONPATH; pass --custom-architectures {os.path.abspath(pkg)} (MAX adds the "
                    "parent itself)",
                )
            )
    return checks, pkg, name


def _architecture_checks(
    cfg: dict[str, object],
    cfg_path: Path,
    serve: bool,
    registered: list[str],
    builtins: list[str],
    tasks: dict[str, str],
) -> list[PreflightCheck]:
    """Which code runs the model: config.json's architectures[0] against what the package registers and MAX's
    built-ins."""
    checks: list[PreflightCheck] = []
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch is None:
        checks.append(
            _check(
                "model-arch",
                False,
                "error",
                f"{cfg_path} has no architectures[0]",
                fix='add "architectures": ["YourArchForCausalLM"]',
            )
        )
    elif arch in registered:
        checks.append(
            _check(
                "model-arch",
                True,
                "info",
                f"config.json architectures[0] = {arch!r} is registered by the custom package",
            )
        )
        if serve and tasks.get(arch, "").endswith("EMBEDDINGS_GENERATION"):
            checks.append(
                _check(
                    "serve-embeddings",
                    False,
                    "error",
                    f"{arch!r} is an embeddings architecture: `max serve --custom-architectures` 26.7 detects the task "
                    'before importing custom packages, so it fails with "Architecture not found in registry"',
                    fix="profile it in-process (max-profile run / profile()) or use the utilization check around the "
                    "load you can drive",
                )
            )
    elif arch in builtins and registered:
        checks.append(
            _check(
                "model-arch-not-custom",
                False,
                "warning",
                f"config.json architectures[0] = {arch!r} is a built-in MAX architecture, and the custom package "
                f"registers {', '.join(repr(a) for a in registered)} instead: MAX will run the built-in {arch!r}, and "
                "the custom code is never used",
                fix=f"set architectures[0] in {cfg_path} to {registered[0]!r} (the name the package registers), or "
                f"register {arch!r} in the package's ARCHITECTURES (it then replaces the built-in)",
            )
        )
    elif arch in builtins:
        checks.append(
            _check(
                "model-arch",
                True,
                "info",
                f"config.json architectures[0] = {arch!r} is a built-in MAX architecture (the custom package does not "
                "register it)",
            )
        )
    else:
        checks.append(
            _check(
                "model-arch",
                False,
                "error",
                f"config.json architectures[0] = {arch!r} is registered neither by the package nor by MAX ('No "
                f"architecture found for {arch}')",
                fix=f"register {arch!r} in ARCHITECTURES or fix config.json",
            )
        )
    return checks


def _model_checks(
    model_path: str | None,
    serve: bool,
    max_length: int | None,
    registered: list[str],
    builtins: list[str],
    tasks: dict[str, str],
    prompt_tokens: int | None,
) -> list[PreflightCheck]:
    checks: list[PreflightCheck] = []
    if not model_path:
        return checks
    cfg_path = Path(model_path) / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        return [
            _check(
                "model-config",
                False,
                "error",
                f"{cfg_path}: cannot read config.json ({exc})",
                fix="pass a local HF model folder",
            )
        ]
    checks += _architecture_checks(cfg, cfg_path, serve, registered, builtins, tasks)
    if cfg.get("auto_map"):
        checks.append(
            _check(
                "trust-remote-code",
                False,
                "warning",
                "config.json has auto_map (custom modeling code on the hub side)",
                fix="add --trust-remote-code",
            )
        )
    has_template = (Path(model_path) / "chat_template.jinja").exists() or _tokenizer_config_has_template(model_path)
    if has_template:
        checks.append(_check("chat-template", True, "info", "tokenizer has a chat template"))
    else:
        tmpl = passthrough_template()
        checks.append(
            _check(
                "chat-template",
                not serve,
                "warning" if serve else "info",
                "no chat template: `max generate` sends the raw prompt, but chat endpoints fail "
                "('tokenizer.chat_template is not set'; serve answers HTTP 400)",
                fix=f"--chat-template {tmpl}  (a pass-through template, written there)",
            )
        )
    if max_length is not None and prompt_tokens is not None and prompt_tokens > max_length:
        checks.append(
            _check(
                "max-length",
                False,
                "error",
                f"the chat-templated prompt is {prompt_tokens} tokens but --max-length is {max_length}: MAX raises "
                "PromptTooLongError",
                fix=f"--max-length {prompt_tokens + 64} or a shorter prompt",
            )
        )
    return checks


def passthrough_template() -> Path:
    """The pass-through chat template as a file of this user's (max_profile's cache folder), written once per
    content."""
    import hashlib

    path = (
        cache_dir("templates")
        / f"passthrough-{hashlib.sha1(PASS_THROUGH_CHAT_TEMPLATE.encode()).hexdigest()[:8]}.jinja"
    )
    if not path.exists():
        write_output(path, PASS_THROUGH_CHAT_TEMPLATE.encode())
    return path


def _tokenizer_config_has_template(model_path: str) -> bool:
    try:
        return bool(json.loads((Path(model_path) / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def check_architecture(
    spec: str,
    model_path: str | None = None,
    serve: bool = False,
    *,
    max_length: int | None = None,
    prompt: str = "I believe the meaning of life is",
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> PreflightResult:
    """Run every preflight check for one ``--custom-architectures`` spec; never imports user code here."""

    t0 = time.perf_counter()
    checks, pkg, name = _static_checks(spec, serve)
    child: dict[str, Any] = {}
    if pkg is not None and not any(c.id == "shadowed-name" for c in checks):
        child, child_checks = _run_child(pkg, name, model_path, prompt, timeout_s)
        checks += child_checks
    registered = list(child.get("architectures", []))
    builtins = list(child.get("builtins", []))
    for clash in sorted(set(registered) & set(builtins)):
        checks.append(
            _check(
                "builtin-clash",
                False,
                "warning",
                f"{clash!r} is also a built-in MAX architecture: MAX 26.7 lets the custom one replace it silently "
                "(only a DEBUG log line)",
                fix=f"profile the built-in {clash!r} instead (drop --custom-architectures), or give the custom "
                "architecture its own name",
            )
        )
    if child.get("architectures") is None:
        # the package could not be imported (a mistyped path, an import error): what it registers is unknown, so the
        # model's
        # architecture is not judged against it (its error above is the only one); the tokenizer and length checks
        # still run
        model_checks = [
            c
            for c in _model_checks(
                model_path, serve, max_length, registered, builtins, child.get("tasks", {}), child.get("prompt_tokens")
            )
            if not c.id.startswith("model-arch")
        ]
    else:
        model_checks = _model_checks(
            model_path, serve, max_length, registered, builtins, child.get("tasks", {}), child.get("prompt_tokens")
        )
    checks += model_checks
    return PreflightResult(
        spec=spec,
        max_version=max_version(),
        checks=checks,
        architectures=registered,
        duration_s=time.perf_counter() - t0,
        package_import_s=child.get("import_s"),
    )


def _run_child(
    pkg: Path, name: str, model_path: str | None, prompt: str, timeout_s: float
) -> tuple[dict[str, Any], list[PreflightCheck]]:
    with tempfile.TemporaryDirectory(prefix="max-profile-preflight-") as tmp:
        out = Path(tmp) / "result.jsonl"
        log = Path(tmp) / "child.log"
        args = [sys.executable, str(_CHILD), str(pkg.parent.resolve()), name, str(out), model_path or "", prompt]
        env = clean_child_env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"})
        with open(log, "wb") as log_fh:
            proc = subprocess.Popen(
                args,
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            except KeyboardInterrupt:
                kill_group(proc, grace_s=3)
                raise
            finally:
                if proc.poll() is None:
                    kill_group(proc, grace_s=3)
        events = _read_events(out)
        tail = _tail(log)
    result: dict[str, Any] = {}
    checks: list[PreflightCheck] = []
    for ev in events:
        kind = ev.get("kind")
        if kind == "drift":
            for item in ev["missing"]:
                checks.append(
                    _check(
                        "import-drift",
                        False,
                        "error",
                        f"{item['what']} not found in the installed MAX",
                        where=item["where"],
                        fix="update the import to the installed MAX's layout (see `max list` / the MAX changelog), or "
                        "install the MAX version it was written for",
                    )
                )
            if not ev["missing"]:
                checks.append(
                    _check(
                        "import-drift",
                        True,
                        "info",
                        f"all {ev['checked']} `max` imports and module attributes resolve against the installed MAX",
                    )
                )
        elif kind == "builtins":
            result["builtins"] = ev["names"]
        elif kind == "imported":
            result["import_s"] = ev.get("import_s")
            result["architectures"] = ev["architectures"]
            result["tasks"] = ev.get("tasks", {})
            checks.append(
                _check(
                    "import", True, "info", f"imports cleanly; ARCHITECTURES registers {', '.join(ev['architectures'])}"
                )
            )
        elif kind == "import-error":
            result["import_s"] = ev.get("import_s")
            checks.append(
                _check(
                    "import",
                    False,
                    "error",
                    f"import failed: {ev['error']}",
                    where=ev.get("where"),
                    fix="fix the error above; MAX would fail the same way ('Failed to import custom model from ...')",
                )
            )
        elif kind == "no-architectures":
            checks.append(
                _check(
                    "architectures-list",
                    False,
                    "error",
                    ev["error"],
                    fix="define ARCHITECTURES = [your SupportedArchitecture, ...] in the package's __init__.py",
                )
            )
        elif kind == "prompt":
            result["prompt_tokens"] = ev["tokens"]
    finished = any(ev.get("kind") == "done" for ev in events)
    if timed_out:
        checks.append(
            _check(
                "import-timeout",
                False,
                "error",
                f"importing the package did not finish within {timeout_s:.0f} s (stopped; an endless loop or a "
                "blocking call at import time?)",
                fix="make the package's import side-effect free",
            )
        )
    elif not finished:
        code = proc.returncode
        checks.append(
            _check(
                "import-exit",
                False,
                "error",
                f"the package's import ended the process (exit code {code}) before it finished"
                + (f"; last output: {tail}" if tail else ""),
                fix="remove sys.exit / os._exit / crashing code from import time",
            )
        )
    return result, checks


def _read_events(path: Path) -> list[dict[str, Any]]:
    events = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return events


def _tail(path: Path, limit: int = 300) -> str:
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            fh.seek(max(0, size - 4096))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:limit]


def preflight_gate(
    specs: list[str], model_path: str | None, *, serve: bool = False, progress: Any = lambda m: None
) -> list[PreflightResult]:
    """Preflight every custom-architecture spec before a load; :class:`InputError` on the first that fails.

    The one gate in front of ``run`` / ``demo`` / ``serve``: the long load never starts on a package that cannot work.
    """
    results = []
    for spec in specs:
        progress(f"preflight of custom architecture {spec}")
        result = check_architecture(spec, model_path=model_path, serve=serve)
        results.append(result)
        if not result.ok:
            raise PreflightFailed(result)
    return results


class PreflightFailed(InputError):
    """A custom architecture failed its preflight; ``result`` holds every check."""

    def __init__(self, result: PreflightResult) -> None:
        first = next(c for c in result.checks if not c.ok and c.severity == "error")
        super().__init__(
            f"custom architecture {result.spec} fails preflight: {first.message}"
            + (f" — fix: {first.fix}" if first.fix else "")
        )
        self.result = result
