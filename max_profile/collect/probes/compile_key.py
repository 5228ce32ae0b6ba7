"""MAX's compile-cache key for a load, and why a load missed the cache: the settings that make a graph compile again
(model, devices, MODULAR_ENABLE_PROFILING, device graphs, batch size, max length, encoding, custom architectures'
code, MAX version), a small ledger of the keys loaded on this machine, and the ``max warm-cache`` command that fills
the cache for a key."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import time
from pathlib import Path

from max_profile.collect.probes.model_files import read_model_config
from max_profile.util.files import cache_dir
from max_profile.util.procs import max_command

KEY_LABELS = {
    "max_version": "the MAX version",
    "devices": "the devices",
    "profiling": "MODULAR_ENABLE_PROFILING",
    "device_graphs": "device graph capture",
    "max_batch_size": "--max-batch-size",
    "max_length": "--max-length",
    "encoding": "the weight encoding",
    "custom_code": "the custom architecture's code",
}


def _digest(*parts: str) -> str:

    h = hashlib.sha1()
    for p in parts:
        h.update(p.encode())
    return h.hexdigest()[:12]


def model_identity(model_path: str) -> str:
    """What of the model shapes its graphs: config.json's architecture fields (not the weights' values)."""

    cfg = read_model_config(model_path) or {}

    return _digest(json.dumps(cfg, sort_keys=True, default=str))


def code_digest(specs: list[str]) -> str:
    """A digest of every .py file of the custom architecture packages (their code is part of the graphs)."""
    parts = []
    for spec in specs:
        root = Path(spec.split(":")[0] if ":" in spec and not os.path.exists(spec) else spec)
        for path in sorted(root.rglob("*.py")) if root.is_dir() else []:
            with contextlib.suppress(OSError):
                parts.append(f"{path.relative_to(root)}\n{path.read_text(errors='replace')}")
    return _digest(*parts) if parts else "none"


def compile_key(
    *,
    model_path: str,
    devices: str,
    profiling: str,
    device_graphs: bool | None,
    max_batch_size: int | None,
    max_length: int | None,
    encoding: str | None,
    custom_architectures: list[str],
    max_version: str | None,
) -> dict[str, str]:
    """What max_profile knows to be part of MAX's compile key for a load (MAX hashes the graph; these decide the
    graph)."""
    return {
        "model": model_identity(model_path),
        "max_version": max_version or "?",
        "devices": devices,
        "profiling": profiling or "off",
        "device_graphs": {True: "on", False: "off", None: "default"}[device_graphs],
        "max_batch_size": str(max_batch_size or "default"),
        "max_length": str(max_length or "default"),
        "encoding": encoding or "default",
        "custom_code": code_digest(custom_architectures),
    }


def ledger_path(cache: Path | None) -> Path:
    return cache_dir("compile-ledger") / f"{_digest(str(cache.resolve() if cache else 'none'))}.jsonl"


def read_ledger(path: Path) -> list[dict[str, object]]:

    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict) and isinstance(doc.get("key"), dict):
                    out.append(doc)
    return out


def append_ledger(path: Path, key: dict[str, str], state: str) -> None:

    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"t": time.time(), "key": key, "cache": state}) + "\n")


def explain_cache(
    state: str, key: dict[str, str], history: list[dict[str, object]], cache: Path | None, cache_was_empty: bool
) -> str:
    """Why the graphs compiled (or did not): the parts of the compile key no earlier load of this model into this cache
    had."""
    where = str(cache) if cache else "MAX's default cache folder"
    if state == "hit":
        return f"every graph came from MAX's compile cache ({where})"
    if state == "unknown":
        return "MAX's cache log showed no graph lookup (caching off, or this MAX does not log it)"
    if cache_was_empty:
        return f"the compile cache {where} was empty: a first load on this machine or image"
    same_model: list[dict[str, object]] = []
    for h in history:
        k = h.get("key")
        if isinstance(k, dict) and k.get("model") == key["model"]:
            same_model.append(k)
    if not same_model:
        return f"this model shape was not compiled into {where} before (by a load max_profile saw)"
    best = min(same_model, key=lambda k: sum(k.get(f) != v for f, v in key.items()))
    diffs = [f for f, v in key.items() if f != "model" and best.get(f) != v]
    if not diffs:
        return (
            f"this exact compile key was compiled into {where} before: its entries were removed, or MAX "
            "invalidated them"
        )
    said = []
    for f in diffs:
        if f == "profiling":
            said.append(
                f"MODULAR_ENABLE_PROFILING={key[f]} is a new compile key (earlier loads of this model here used "
                f"{best.get(f)})"
            )
        else:
            said.append(f"{KEY_LABELS.get(f, f)} {key[f]} is new (earlier: {best.get(f)})")
    return "; ".join(said)


def warm_cache_command(
    *,
    model_path: str,
    devices: str,
    profiling: str,
    device_graphs: bool | None,
    max_batch_size: int | None,
    max_length: int | None,
    encoding: str | None,
    custom_architectures: list[str],
) -> str:
    """``max warm-cache`` with the same compile key (run it in the image, before serving or profiling)."""

    cmd = [*max_command(), "warm-cache", "--model-path", model_path, "--devices", devices]
    if max_batch_size:
        cmd += ["--max-batch-size", str(max_batch_size)]
    if max_length:
        cmd += ["--max-length", str(max_length)]
    if encoding:
        cmd += ["--quantization-encoding", encoding]
    if device_graphs is not None:
        cmd.append("--device-graph-capture" if device_graphs else "--no-device-graph-capture")
    for spec in custom_architectures:
        cmd += ["--custom-architectures", spec]
    prefix = f"MODULAR_ENABLE_PROFILING={profiling} " if profiling and profiling != "off" else ""
    return prefix + " ".join(shlex.quote(c) for c in cmd)
