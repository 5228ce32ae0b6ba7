"""Start-up: a failed compile, compile-dominated start-ups, slow weights, a large KV-cache allocation, a slow custom
import."""

from __future__ import annotations

from max_profile.analyze.commands import shell
from max_profile.analyze.thresholds import Thresholds
from max_profile.model import Finding, Report, StartupProfile


def _custom_import_slow(report: Report, st: StartupProfile, th: Thresholds) -> list[Finding]:
    """A custom architecture whose own import is slow (MAX's import not counted)."""
    out: list[Finding] = []
    # the package's own import: the preflight child's import of it after MAX (its phase is mostly MAX's own import, the
    # H200: 19.4 s of which 13-15 s MAX), and the load's architecture lookup, where MAX imports it again
    own = [
        (f"{r.spec}: its import in the preflight child, MAX already imported", r.package_import_s)
        for r in report.preflight
        if r.package_import_s is not None
    ]
    own += [(p.name, p.seconds) for p in st.phases if "custom architectures imported" in p.name and report.preflight]
    slow = next(((name, s) for name, s in own if s >= th.custom_import_slow_s), None)
    if slow is not None:
        preflight_phase = next((p for p in st.phases if "custom-architecture preflight" in p.name), None)
        out.append(
            Finding(
                id="startup-custom-import-slow",
                severity="warning",
                confidence=0.6,
                evidence={
                    "where": slow[0],
                    "seconds": round(slow[1], 2),
                    "preflight_child_s": preflight_phase.seconds if preflight_phase else None,
                },
                title=f"The custom architecture's own import takes {slow[1]:.0f} s (MAX's import not counted)",
                next_step="Keep import time free of work: no weight loading, graph building or network calls at module "
                "level.",
            )
        )
    return out


def rule_startup(report: Report, th: Thresholds) -> list[Finding]:
    """Where start-up went: a failed compile, compile-dominated (and the warm-cache command), slow weights, a KV-cache
    allocation that dominates, a slow custom-architecture import."""
    st = report.startup
    if st is None:
        return []
    out: list[Finding] = []
    if st.failure:
        out.append(
            Finding(
                id="compile-failed",
                severity="error",
                confidence=0.9,
                title="MAX failed to compile the model: " + st.failure.split(";")[0],
                evidence={"failure": st.failure[:400], "after_s": st.total_s, "cache": st.cache},
                next_step=st.failure.split("; ")[-1] if "; " in st.failure else None,
            )
        )
    if st.total_s < th.startup_min_s:
        return out
    compile_s = sum(p.seconds for p in st.phases if "compile" in p.name)
    ev: dict[str, float | int | str | None] = {
        "startup_s": st.total_s,
        "compile_s": round(compile_s, 2),
        "cache": st.cache,
        "cache_reason": st.cache_reason[:300],
        "max_logged_compile_s": st.max_logged_compile_s,
    }
    if st.cache in ("miss", "partial") and compile_s >= th.startup_compile_share_pct / 100 * st.total_s:
        out.append(
            Finding(
                id="startup-compile",
                severity="warning",
                confidence=0.85,
                evidence=ev,
                title=f"Start-up is compile-dominated: {compile_s:.0f} of {st.total_s:.0f} s compiling (cache "
                f"{st.cache})",
                next_step="Fill the compile cache in the image or before serving, with the same compile key (the "
                "command below); MODULAR_ENABLE_PROFILING, device graph capture, batch size, max length and the MAX "
                "version are all part of the key.",
                command=shell(st.warm_cache_command) if st.warm_cache_command else None,
            )
        )
    weights = next((p for p in st.phases if "weights" in p.name and p.bytes and p.gb_per_s is not None), None)
    if (
        weights is not None
        and weights.bytes
        and weights.bytes >= th.weights_min_bytes
        and weights.gb_per_s is not None
        and weights.gb_per_s < th.weights_slow_gbps
    ):
        out.append(
            Finding(
                id="startup-weights-slow",
                severity="warning",
                confidence=0.6,
                title=f"Weights moved at {weights.gb_per_s:.2f} GB/s ({weights.bytes / 1e9:.1f} GB in "
                f"{weights.seconds:.0f} s, {weights.name}): far below a local SSD",
                evidence={
                    "phase": weights.name,
                    "weights_bytes": weights.bytes,
                    "seconds": weights.seconds,
                    "gb_per_s": weights.gb_per_s,
                    "threshold_gbps": th.weights_slow_gbps,
                },
                next_step="The weights are read from their files while they are copied to the device: check where they "
                "live (a network file "
                "system, a cold object-store mount) and copy them to local disk.",
            )
        )
    kv = next((p for p in st.phases if p.name.startswith("KV cache allocation")), None)
    if kv is not None and kv.seconds >= th.kv_alloc_share_pct / 100 * st.total_s:
        out.append(
            Finding(
                id="startup-kv-alloc",
                severity="warning",
                confidence=0.6,
                evidence={"seconds": kv.seconds, "bytes": kv.bytes, "startup_s": st.total_s},
                title=f"KV-cache allocation takes {kv.seconds:.0f} of {st.total_s:.0f} s of start-up",
                next_step="Allocate less up front: --device-memory-utilization or a smaller --max-batch-size / "
                "--max-length.",
            )
        )
    out += _custom_import_slow(report, st, th)
    return out
