"""What ``max-profile serve --mode kernels`` costs a server, part by part, against a plain ``max serve`` with no
max_profile code under the same load.

    python benchmarks/serve_cost.py --model-path DIR [--devices gpu] [--concurrency 1,8] [--rounds 2] [--duration 8]
                                    [--servers plain,kernels,kernels+spans,plain] [--variants steps,paused,default]
                                    [--json out.json] [--raw-dir DIR] [-- MAX_SERVE_FLAGS...]

Servers run one after another, each warmed once (``max warm-cache``), each with every concurrency level in turn:

- ``plain``: ``max serve`` as a user starts it, in this shell's environment, nothing of max_profile (no worker hook on
  PYTHONPATH, no profiling mode, no telemetry setting): ``--rounds`` + 1 untraced windows per level;
- ``kernels``: the server ``serve --mode kernels`` starts, resolved as the product resolves it; per level its windows
  alternate untraced and recorded (each variant between two untraced windows, ``serve_ab.rounds_of``);
- ``kernels+spans``: the same with MAX's OTLP spans sent to a receiver (``serve --spans``);
- ``kernels+profiling``: the same with ``MODULAR_ENABLE_PROFILING=on`` and the NVTX log (the serve default before the
  worker hook's steps gave the phases; a compile key of its own).

Variants of a recorded window (``serve_ab.variant_plan``; ``+`` combines): ``steps`` the worker hook stamping passes,
CUPTI off; ``paused`` CUPTI subscribed and paused the whole window (``share=0.001``); ``default`` what ``serve --mode
kernels`` records; ``release`` the default with the subscription given up at each pause; ``full`` every kernel.
On a machine without CUPTI (the CPU) a recorded window stamps the worker's passes and reads MAX's op ranges where
profiling is on.

What it prints, level by level: every window (tokens/s streamed inside it, the server's own decode step from its
/metrics where it exports them), each variant's ratio to the untraced level at its place on the same server (every
round), and the parts:

- server environment: ``kernels`` untraced over ``plain`` (the metrics endpoint, the idle worker hook thread);
- worker hook, CUPTI paused, recording: each variant over the untraced windows of its server;
- spans, profiling mode: that server's untraced windows over ``kernels``'s;
- total: the ``default`` variant's tokens/s over ``plain``'s (what a user's server pays, all parts together).

Across servers the ratio is of medians (each server's windows), with both servers' spread beside it: a server start
moves the speed by itself (an earlier H100 pair: 0.914 and 1.05), so a cross-server part smaller than that spread says
nothing; ``--servers plain,kernels,plain`` brackets one server between two of the other.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_ab import ratios_by_round, rounds_of, token_gaps, variant_plan  # noqa: E402

from max_profile.analyze.load import window_tokens  # noqa: E402

SERVER_KINDS = ("plain", "kernels", "kernels+spans", "kernels+profiling")


def variant_spec(name: str) -> str:
    """A variant's ``serve_ab.variant_plan`` spec (``paused`` and ``release`` are named here)."""
    return {"paused": "share=0.001", "release": "default+release"}.get(name, name)


def level_order(kind: str, variants: list[str], rounds: int) -> list[str | None]:
    """One level's windows on a server of ``kind``: untraced only for a server without the recorder (``rounds`` + 1
    of them), else each variant between two untraced windows, rotated every round."""
    if kind == "plain" or not variants:
        return [None] * (rounds + 1)
    return rounds_of(variants, rounds)


def parts_of(levels: dict[int, dict[str, dict[str, Any]]]) -> dict[int, dict[str, dict[str, float | None]]]:
    """Per level, each part of the cost as tokens/s with / without it (see the module docstring): ``{"ratio", "a",
    "b"}`` with the two sides' median tokens/s."""

    def med(server: dict[str, Any] | None, variant: str | None) -> float | None:
        if server is None:
            return None
        tok = [w["tok_s"] for w in server["windows"] if w["variant"] == variant]
        return statistics.median(tok) if tok else None

    out: dict[int, dict[str, dict[str, float | None]]] = {}
    for level, servers in levels.items():
        plain, kernels = servers.get("plain"), servers.get("kernels")
        rows: dict[str, dict[str, float | None]] = {}

        def across(
            name: str, a: float | None, b: float | None, rows: dict[str, dict[str, float | None]] = rows
        ) -> None:
            rows[name] = {"ratio": a / b if a and b else None, "a": a, "b": b}

        across("server environment (kernels untraced / plain)", med(kernels, None), med(plain, None))
        if kernels is not None:
            for variant, figures in kernels["variants"].items():
                rows[f"{variant} (recorded / untraced, same server)"] = {
                    "ratio": figures["median_ratio"],
                    "a": med(kernels, variant),
                    "b": med(kernels, None),
                }
        for extra in ("kernels+spans", "kernels+profiling"):
            across(
                f"{extra.split('+')[1]} (untraced / kernels untraced)",
                med(servers.get(extra), None),
                med(kernels, None),
            )
        across("total: default recording / plain", med(kernels, "default"), med(plain, None))
        out[level] = {k: v for k, v in rows.items() if v["a"] is not None and v["b"] is not None}
    return out


def self_check() -> None:
    """The parts, checked on made-up windows before any server starts: each a ratio of the right two medians."""

    def server(tok: dict[str | None, list[float]], ratios: dict[str, float]) -> dict[str, Any]:
        windows = [{"variant": v, "tok_s": t} for v, ts in tok.items() for t in ts]
        return {"windows": windows, "variants": {v: {"median_ratio": r} for v, r in ratios.items()}}

    levels = {
        1: {
            "plain": server({None: [100.0, 102.0, 98.0]}, {}),
            "kernels": server({None: [99.0, 99.0], "default": [98.0]}, {"default": 0.99}),
            "kernels+spans": server({None: [90.0, 90.0]}, {}),
        }
    }
    parts = parts_of(levels)[1]
    assert parts["server environment (kernels untraced / plain)"]["ratio"] == 0.99
    assert parts["default (recorded / untraced, same server)"]["ratio"] == 0.99
    assert abs(parts["spans (untraced / kernels untraced)"]["ratio"] - 90 / 99) < 1e-12  # type: ignore[operator]
    assert parts["total: default recording / plain"]["ratio"] == 0.98
    assert "profiling (untraced / kernels untraced)" not in parts
    assert level_order("plain", ["default"], 2) == [None, None, None]
    assert level_order("kernels", ["steps", "default"], 1) == [None, "steps", None, "default", None]
    assert variant_plan(variant_spec("paused"), 0.0625, 0.5).share == 0.001
    assert variant_plan(variant_spec("release"), 0.0625, 0.5).options == ("release-while-paused",)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--devices", default="gpu")
    ap.add_argument("--concurrency", default="1", help="levels, e.g. 1,8 (each level's windows on every server)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the variants per level on a recording server")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per window")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--servers", default="plain,kernels", help=f"comma-separated, in order: {', '.join(SERVER_KINDS)}")
    ap.add_argument("--variants", default="steps,paused,default", help="recorded-window variants (module docstring)")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--raw-dir", help="save each recording server's capture (RawCapture .json.gz) in this folder")
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument("--self-check", action="store_true", help="check the arithmetic, and stop")
    ap.add_argument("server_args", nargs="*", help="after --: flags for `max serve` itself")
    args = ap.parse_args()
    self_check()
    if args.self_check:
        print("serve_cost: self-check passed")
        return 0
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = [s for s in servers if s not in SERVER_KINDS]
    if unknown:
        raise SystemExit(f"unknown --servers {unknown}: use {', '.join(SERVER_KINDS)}")
    levels = [int(c) for c in args.concurrency.split(",")]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    results: dict[int, dict[str, dict[str, Any]]] = {c: {} for c in levels}
    runs: list[dict[str, Any]] = []
    for n, kind in enumerate(servers):
        run = run_server(kind, levels, variants, args, n)
        runs.append(run)
        if args.json:  # after every server: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps({"runs": runs, "args": vars(args)}, indent=1))
        for level, figures in run["levels"].items():
            # a server kind named twice (plain,kernels,plain): its windows pooled
            have = results[level].get(kind)
            if have is None:
                results[level][kind] = figures
            else:
                have["windows"] += figures["windows"]
                for v, f in figures["variants"].items():
                    have["variants"].setdefault(v, f)
    parts = parts_of(results)
    print("\nparts of the cost (tokens/s with / without; < 1 costs), per concurrency level:")
    for level, rows in parts.items():
        print(f"  concurrency {level}:")
        for name, row in rows.items():
            ratio = row["ratio"]
            print(f"    {name:<52} {'-' if ratio is None else f'{ratio:.4f}'}  ({row['a']:.1f} / {row['b']:.1f} tok/s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "parts": parts, "args": vars(args)}, indent=1))
    return 0


def run_server(kind: str, levels: list[int], variants: list[str], args: argparse.Namespace, n: int) -> dict[str, Any]:
    """One server of ``kind`` through every level's windows; its windows and each variant's ratios per level."""
    from max_profile.analyze.load import server_metrics
    from max_profile.collect.probes.environment import detect_environment
    from max_profile.collect.server.serve_recorders import UtilizationRecorder
    from max_profile.serve import (
        ModeContext,
        ServePlan,
        free_port,
        new_serve_raw,
        resolve_plan,
        serve_windows,
        server_tmpdir,
        warm_pass,
    )
    from max_profile.util.procs import clean_child_env

    env = detect_environment(check_tools=False)
    orders = {c: level_order(kind, variants, args.rounds) for c in levels}
    flat = [(c, v) for c in levels for v in orders[c]]
    plan = ServePlan(
        model_path=args.model_path,
        devices=args.devices,
        mode="kernels",
        duration_s=args.duration,
        port=free_port(),
        metrics_port=free_port(),
        max_tokens=args.max_tokens,
        vendor=env.vendor,
        concurrency=[c for c, _ in flat],
        warm=not args.no_warm and (n == 0 or kind == "kernels+profiling"),  # one warm pass per compile key
        reference=False,  # the untraced windows are this benchmark's own reference
        spans=kind == "kernels+spans",
        profiling_mode="on" if kind == "kernels+profiling" else "auto",
        extra_args=list(args.server_args),
    )
    resolved = resolve_plan(plan, env.vendor)
    if kind == "plain":  # this shell's environment and `max serve` as a user types it: nothing of max_profile's
        plain_env = {k: v for k, v in clean_child_env().items() if not k.startswith("MAX_PROFILE")}
        added = {"--no-device-graph-capture"} - set(args.server_args)
        command = tuple(c for c in resolved.serve_command if c not in added)
        resolved = dataclasses.replace(
            resolved, server_env=plain_env, profiling="off", spans=False, serve_command=command
        )
    slice_s = plan.record_slice_s
    recordings = {
        i: variant_plan(variant_spec(v), plan.record_share, slice_s)
        for i, (_, v) in enumerate(flat, 1)
        if v is not None
    }

    def progress(line: str) -> None:
        print(f"[{kind}] {line}", file=sys.stderr, flush=True)

    print(f"\nserver {n + 1}: {kind}: " + " ".join(resolved.serve_command), flush=True)
    with server_tmpdir() as tmp:
        if plan.warm:
            warm_pass(resolved, tmp, 1800, progress)
        context = ModeContext(env, tmp, 1800, progress, None, window_recordings=recordings)
        recorder: Any = UtilizationRecorder() if kind == "plain" else resolved.mode.make_recorder(resolved, context)[0]
        raw = serve_windows(
            resolved,
            recorder,
            new_serve_raw(resolved, env, []),
            tmp,
            1800,
            progress,
            None,
            record=lambda w: flat[w - 1][1] is not None,
        )
    if args.raw_dir and kind != "plain":
        os.makedirs(args.raw_dir, exist_ok=True)
        raw.save(os.path.join(args.raw_dir, f"serve_cost_{n + 1}_{kind.replace('+', '_')}_raw.json.gz"))
    coverage = getattr(recorder, "coverage", {})
    out: dict[str, Any] = {"kind": kind, "command": list(resolved.serve_command), "levels": {}}
    for level in levels:
        windows = []
        at = [i for i, (c, _) in enumerate(flat) if c == level]
        for i in at:
            w = raw.load_windows[i]
            secs = (w.window_ns[1] - w.window_ns[0]) / 1e9
            srv = server_metrics(w.metrics_before, w.metrics_after, secs)
            cov = coverage.get(i + 1)
            windows.append(
                {
                    "window": i + 1,
                    "variant": flat[i][1],
                    "tok_s": window_tokens(w.requests, w.window_ns) / secs,
                    "server_tg_ms": srv.batch_execution_ms_mean.get("TG") if srv is not None else None,
                    "itl_ms": token_gaps(w.requests, w.window_ns),
                    "recorded_s": cov.covered_s if cov is not None else None,
                }
            )
        order = [w["variant"] for w in windows]
        tok_s = [w["tok_s"] for w in windows]
        figures: dict[str, Any] = {"windows": windows, "variants": {}}
        for v in dict.fromkeys(x for x in order if x is not None):
            ratios = ratios_by_round(tok_s, order, v)
            figures["variants"][v] = {"ratios": ratios, "median_ratio": statistics.median(ratios)}
        untraced = [t for t, v in zip(tok_s, order, strict=True) if v is None]
        for w in windows:
            step = w["server_tg_ms"]
            print(
                f"  c={level} window {w['window']:>2}: {w['variant'] or 'untraced':<10} {w['tok_s']:8.1f} tok/s, "
                f"server decode step {'-' if step is None else f'{step:.3f}'} ms, ITL p50 {w['itl_ms']['p50']:.3f} ms",
                flush=True,
            )
        spread = 100 * (max(untraced) - min(untraced)) / statistics.median(untraced) if untraced else float("nan")
        print(
            f"  c={level} untraced: median {statistics.median(untraced):.1f} tok/s, spread {spread:.1f} %"
            + "".join(
                f"; {v}: {', '.join(f'{r:.4f}' for r in f['ratios'])} (median {f['median_ratio']:.4f})"
                for v, f in figures["variants"].items()
            ),
            flush=True,
        )
        figures["untraced_spread_pct"] = spread
        out["levels"][level] = figures
    return out


if __name__ == "__main__":
    sys.exit(main())
