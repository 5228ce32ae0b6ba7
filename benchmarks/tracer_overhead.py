"""In-process kernel tracing cost: decode tokens/s with each recorder against none, in one process, interleaved.

    python benchmarks/tracer_overhead.py --model-path DIR --devices gpu [--tokens 128] [--repeats 5]
        [--arms off,native,python,ctypes,profile-off,profile-cupti] [--device-graph-capture] [--record PATH]

Arms (each repeat runs every arm once, in a rotated order, after a warm-up):
  off            the pipeline hook alone (host step times)
  native         + max_profile's C recorder (collect/live/cupti_native.py): buffers handled in C, numpy decode after
  stop native-kernels + the C recorder without launch-call records (kernels attributed by start time)
  native-warm    + the C recorder started before a 16-token traced warm-up in the same arm: whether CUPTI's cost is
                 paid once after enabling it (it is not: on the H200 this arm costs what `native` costs)
  python         + cupti-python per-record callbacks (the previous collector)
  ctypes         + idea 1: libcupti's buffer callbacks registered through ctypes, each full buffer copied into
                 Python bytes (one Python call per buffer), records walked in Python after stop
  profile-off / profile-cupti   the product path, ``profile(kernels="off" | "cupti")`` with sampling and markers

Prints per-repeat decode tok/s (with the host's load around each repeat), each arm's median, min, max and spread, its
ratio to ``off`` (or ``profile-off``) of medians and paired per repeat, and per
recorder: records, seconds in buffer callbacks while recording, seconds to stop + decode.
``--record PATH`` saves one native recording (arrays, names, layout, clock pairs) as .npz for CPU tests.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from repeats import RepeatLoad, report_arms  # noqa: E402


def decode_tps(steps: list[Any]) -> float:
    dec = [s for s in steps if s.phase == "decode" and s.batch_size > 0]
    secs = sum(s.duration_ns for s in dec) / 1e9
    return sum(s.batch_size for s in dec) / secs if secs else 0.0


def step_ms(steps: list[Any]) -> dict[str, float]:
    """Median decode step time of the first 32 steps and of the rest: where a tracer's cost falls in a generation."""
    dec = [s.duration_ns / 1e6 for s in steps if s.phase == "decode" and s.batch_size > 0]
    return {
        "first32_step_ms": statistics.median(dec[:32]) if dec else 0.0,
        "rest_step_ms": statistics.median(dec[32:]) if len(dec) > 32 else 0.0,
    }


class CtypesBufferCollector:
    """Idea 1: CUPTI's activity buffers through ctypes callbacks; one Python call per full buffer, no C to build.

    Records are walked in Python after stop (each record's size from the compiled layout), then decoded
    with the same numpy decoder as the C recorder.
    """

    REQUEST = ctypes.CFUNCTYPE(
        None,
        ctypes.POINTER(ctypes.POINTER(ctypes.c_uint8)),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    )
    COMPLETE = ctypes.CFUNCTYPE(
        None, ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint8), ctypes.c_size_t, ctypes.c_size_t
    )

    def __init__(self, buffer_bytes: int = 16 << 20) -> None:
        from max_profile.collect.live.cupti_decode import CUPTI_13_LAYOUT, RecordLayout
        from max_profile.collect.live.cupti_native import find_libcupti

        path = find_libcupti()
        assert path, "libcupti not found"
        self.lib = ctypes.CDLL(path)
        self.layout = RecordLayout.from_values(CUPTI_13_LAYOUT)
        self.buffer_bytes = buffer_bytes
        self.pool: dict[int, Any] = {}
        self.free: list[int] = []
        self.chunks: list[bytes] = []
        self.callback_s = 0.0
        self.stop_s = 0.0
        self._request = self.REQUEST(self._on_request)
        self._complete = self.COMPLETE(self._on_complete)
        self.sync: list[tuple[int, int]] = []

    def _on_request(self, buf: Any, size: Any, max_records: Any) -> None:
        if self.free:
            addr = self.free.pop()
        else:
            block = ctypes.create_string_buffer(self.buffer_bytes + 8)
            addr = (ctypes.addressof(block) + 7) & ~7
            self.pool[addr] = block
        buf[0] = ctypes.cast(addr, ctypes.POINTER(ctypes.c_uint8))
        size[0] = self.buffer_bytes
        max_records[0] = 0

    def _on_complete(self, ctx: Any, stream: int, buf: Any, size: int, valid: int) -> None:
        t0 = time.perf_counter()
        addr = ctypes.cast(buf, ctypes.c_void_p).value or 0
        if valid:
            self.chunks.append(ctypes.string_at(addr, valid))
        self.free.append(addr)
        self.callback_s += time.perf_counter() - t0

    def _pair(self) -> tuple[int, int]:
        t = ctypes.c_uint64()
        h0 = time.perf_counter_ns()
        self.lib.cuptiGetTimestamp(ctypes.byref(t))
        return (h0 + time.perf_counter_ns()) // 2, t.value

    def start(self) -> None:
        kinds = self.layout.kinds
        assert self.lib.cuptiActivityRegisterCallbacks(self._request, self._complete) == 0
        for kind in (kinds["CONCURRENT_KERNEL"], kinds["DRIVER"], kinds["RUNTIME"]):
            assert self.lib.cuptiActivityEnable(kind) == 0
        self.sync = [self._pair()]

    def stop(self) -> Any:
        from max_profile.collect.live.cupti_decode import decode

        t0 = time.perf_counter()
        self.sync.append(self._pair())
        kinds = self.layout.kinds
        for kind in (kinds["CONCURRENT_KERNEL"], kinds["DRIVER"], kinds["RUNTIME"]):
            self.lib.cuptiActivityDisable(kind)
        self.lib.cuptiActivityFlushAll(1)
        ksize, asize = self.layout.kernel["size"], self.layout.api["size"]
        kernel_kinds = {kinds["CONCURRENT_KERNEL"], kinds["KERNEL"]}
        api_kinds = {kinds["DRIVER"], kinds["RUNTIME"]}
        kparts, aparts = [], []
        for chunk in self.chunks:  # the per-record walk (Python, after stop)
            off = 0
            while off + 4 <= len(chunk):
                (kind,) = struct.unpack_from("<I", chunk, off)
                if kind in kernel_kinds:
                    kparts.append(chunk[off : off + ksize])
                    off += ksize
                elif kind in api_kinds:
                    aparts.append(chunk[off : off + asize])
                    off += asize
                else:
                    raise RuntimeError(f"record kind {kind} at offset {off}: unknown size")
        kernel_bytes, api_bytes = b"".join(kparts), b"".join(aparts)
        import numpy as np

        k = np.frombuffer(kernel_bytes, dtype=self.layout.kernel_dtype())
        names = {int(p): ctypes.string_at(int(p)).decode(errors="replace") for p in np.unique(k["name"]) if p}
        decoded = decode(kernel_bytes, api_bytes, self.layout, names, self.sync)
        self.chunks = []
        self.stop_s = time.perf_counter() - t0
        self.records = len(k) + len(api_bytes) // asize
        return decoded.table


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--devices", default="gpu")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--arms", default="off,native,profile-off,profile-cupti")
    ap.add_argument("--device-graph-capture", action="store_true")
    ap.add_argument("--record", help="save one native recording here (.npz) for the CPU decoder tests")
    ap.add_argument("--json", help="write all numbers here")
    args = ap.parse_args()

    from max_profile.collect.live.pipeline_hook import PipelineHook
    from max_profile.runner import generate, load_model
    from max_profile.session import profile

    t = time.perf_counter()
    model = load_model(args.model_path, devices=args.devices, device_graph_capture=args.device_graph_capture)
    print(
        f"loaded {args.model_path} on {args.devices} in {time.perf_counter() - t:.1f} s "
        f"({type(model.pipeline).__name__}, "
        f"device graphs {'on' if args.device_graph_capture else 'off'})",
        flush=True,
    )
    prompt = ["I believe the meaning of life is"]
    generate(model, prompt, 16)
    arms = args.arms.split(",")
    tps: dict[str, list[float]] = {a: [] for a in arms}
    cost: dict[str, list[dict[str, float]]] = {a: [] for a in arms}

    def make(arm: str) -> Any:
        if arm.startswith("native"):
            from max_profile.collect.live.cupti_native import NativeCuptiCollector

            return NativeCuptiCollector(launches=arm != "native-kernels")
        if arm == "python":
            from max_profile.collect.live.cupti_kernels import CuptiKernelCollector

            return CuptiKernelCollector()
        if arm == "ctypes":
            return CtypesBufferCollector()
        return None

    def run_repeat(order: list[str]) -> None:
        for arm in order:
            if arm.startswith("profile-"):
                mode = arm.removeprefix("profile-")
                with profile(model.pipeline, kernels=mode, sample_interval_s=0.1) as p:  # type: ignore[arg-type]
                    generate(model, prompt, args.tokens)
                tps[arm].append(decode_tps(p.steps))
                k = p.report.kernels
                cost[arm].append({"kernels": float(getattr(k, "kernels", 0) or 0), **step_ms(p.steps)})
                continue
            collector = make(arm)
            if collector is not None:
                collector.start()
                if arm == "native-warm":
                    generate(model, prompt, 16)
            hook = PipelineHook(model.pipeline)
            hook.install()
            try:
                generate(model, prompt, args.tokens)
                if collector is not None:
                    table = collector.stop()
            finally:
                hook.uninstall()
            tps[arm].append(decode_tps(hook.steps))
            if collector is not None:
                cost[arm].append(
                    {
                        "kernels": float(len(table)),
                        "callback_s": float(getattr(collector, "callback_s_before_stop", collector.callback_s)),
                        "stop_s": float(getattr(collector, "stop_s", 0.0)),
                        "records": float(
                            getattr(collector, "records", 0) or (len(table) + getattr(collector, "api_records", 0))
                        ),
                        "graph_kernels": float((table.graph_id > 0).sum()) if table.graph_id is not None else 0.0,
                        **step_ms(hook.steps),
                    }
                )
            else:
                cost[arm].append(step_ms(hook.steps))

    load = RepeatLoad()
    for i in range(args.repeats):
        order = arms[i % len(arms) :] + arms[: i % len(arms)]
        with load.repeat(i):
            run_repeat(order)
        print(
            f"repeat {i}: " + ", ".join(f"{a} {tps[a][-1]:.1f}" for a in arms) + f"   ({load.describe(i)})", flush=True
        )
    base_of = {arm: "profile-off" if arm.startswith("profile-") else "off" for arm in arms}
    summary = report_arms(tps, base_of, load)
    out: dict[str, Any] = {
        "model": args.model_path,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "device_graph_capture": args.device_graph_capture,
        "arms": {},
        "busy_repeats": summary.pop("_busy_repeats"),
    }
    for arm in arms:
        c = {key: statistics.median(x[key] for x in cost[arm]) for key in (cost[arm][0] if cost[arm] else {})}
        out["arms"][arm] = {"decode_tok_s": summary[arm]["median"], **summary[arm], **c}
        if c:
            print(f"{arm:14s} " + ", ".join(f"{k} {v:.4g}" for k, v in c.items()))
    if args.record:
        import numpy as np

        from max_profile.collect.live.cupti_native import NativeCuptiCollector

        rec = NativeCuptiCollector()
        rec.start()
        generate(model, prompt, 16)
        from max_profile.collect.live.pipeline_hook import synchronize_accelerators

        synchronize_accelerators(model.pipeline)
        table = rec.stop()
        assert rec.raw is not None
        kernel_bytes, api_bytes, names = rec.raw
        np.savez_compressed(
            args.record,
            kernels=np.frombuffer(kernel_bytes, dtype=np.uint8),
            apis=np.frombuffer(api_bytes, dtype=np.uint8),
            meta=np.frombuffer(
                json.dumps(
                    {
                        "layout": rec.layout.values(),
                        "names": {str(k): v for k, v in names.items()},
                        "clock": rec._sync,
                        "cupti_version": rec.cupti_version,
                        "kernels": len(table),
                        "api_records": rec.api_records,
                        "libcupti": rec.libcupti,
                        "stop_s": rec.stop_s,
                        "unfinished": rec.unfinished,
                        "device_graph_capture": args.device_graph_capture,
                    }
                ).encode(),
                dtype=np.uint8,
            ),
        )
        print(f"recorded {len(table)} kernels / {rec.api_records} launch records into {args.record}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
