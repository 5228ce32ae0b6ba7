"""In-process kernel recording through max_profile's C recorder (``native/cupti_ring.c``): nothing per record in Python.

CUPTI's buffer callbacks run in C: records are copied by kind into two arrays and the buffers reused,
so the profiled process's GIL is never taken while recording. ``stop()`` flushes, copies the arrays
out and decodes them with numpy (:mod:`max_profile.collect.live.cupti_decode`). The library is compiled
on first use against the installed CUPTI headers (gcc), opens libcupti with dlopen, and refuses a
libcupti whose API version differs from the headers'. Another CUPTI client in the process (Nsight
Systems, Nsight Compute, kineto) is detected through ``cuptiSubscribe_v2`` and named: recording
backs off instead of garbling both traces.

Equivalent tool: ``nsys profile --trace=cuda`` (collection in C) then ``nsys stats --report cuda_gpu_kern_sum``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import os
import shutil
import subprocess
import sysconfig
import time
from pathlib import Path
from typing import Any, ClassVar, Protocol

from max_profile.collect.live.cupti_decode import (
    CUPTI_13_LAYOUT,
    DecodedKernels,
    RecordLayout,
    decode,
    unfinished_records,
)
from max_profile.collect.live.cupti_kernels import CuptiKernelCollector
from max_profile.errors import CaptureError, MaxProfileError, ToolMissingError
from max_profile.model import KernelTable
from max_profile.util.files import cache_dir

_SOURCE = Path(__file__).parent / "native" / "cupti_ring.c"
KERNEL_RECORD_STRUCTS = ("CUpti_ActivityKernel10", "CUpti_ActivityKernel9")
"""The kernel record struct the headers define, newest first (CUDA 13: version 10)."""
DEFAULT_BUFFER_BYTES = 16 << 20
DEFAULT_MAX_BYTES = 4 << 30
"""Recorded arrays are capped here (about 18M kernel records); records past it are counted as dropped."""
RECORDING_OPTIONS = {"zeroed-buffers": 1, "release-while-paused": 2, "flush-at-pause": 4}
"""What :meth:`NativeCuptiCollector.start` can be asked to record differently (cupti_ring.c's ``mp_set_options``):
``zeroed-buffers`` hands CUPTI buffers zeroed on CUPTI's own thread (``CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER``:
otherwise CUPTI zeroes each buffer on the launching thread). ``release-while-paused`` gives up the CUPTI subscription at
each pause and takes it again at resume (between slices the process has no CUPTI subscriber; a client that takes CUPTI
meanwhile ends the recording's slices, :attr:`NativeCuptiCollector.resume_problem` says so); not the default: on an
H100 (3B shape, 256 tokens) it bought nothing measurable, 0.9905 of untraced with device graphs against the
default's 0.9907, and eager within the rounds' spread. ``flush-at-pause`` hands every CUPTI buffer over at each
pause (a forced flush), so no partly filled buffer is carried from one slice into the next: an experiment on where
eager's cost after a resume comes from (``benchmarks/untraced_overhead.py``'s ``cupti-flush`` arm); not the default:
on an H100 (3B shape, 256 tokens, eager, 15 rounds) it cost more, 0.9759 of untraced against the default's
0.9918 (its four pauses and resumes 3.9 ms against 0.9 ms). A detach of CUPTI after each recording (``cuptiFinalize``
at the exit of the next driver call, as Kineto does) was tried and removed: with device graphs on it
broke the next generation (``CUDA_ERROR_LAUNCH_FAILED``, H100, CUDA 13.0), and it had nothing to cure: the untraced
arm ran at 0.9989 (graphs) and 1.0003 (eager) of its speed before CUPTI ever started in the process, after 12 and 64
recordings (tests/data/gpu/h100_llama3b_tracing_cost_in_process). (Graph-level records,
``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` switched on in a
running ``max serve`` worker, crashed it on the H200: segmentation fault; not offered.)"""
RESERVE_ARENA_BYTES = 128 << 20
RESERVE_BUFFERS = 4
"""What :meth:`NativeCuptiCollector.reserve` faults in ahead: about 600k kernel records and four activity buffers
(192 MB of the process's memory in all, held until it ends)."""


class CuptiBusy(CaptureError):
    """Another CUPTI client (Nsight Systems, Nsight Compute, kineto...) holds this process."""


def cupti_include_dirs() -> list[str]:
    """Folders holding ``cupti.h``: $CUDA_HOME, the CUDA toolkits, pip's nvidia packages."""
    roots = (
        [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", "")]
        + sorted(glob.glob("/usr/local/cuda*"), reverse=True)
        + ["/opt/cuda", "/usr"]
    )
    cands = []
    for root in filter(None, roots):
        cands += [os.path.join(root, "include"), os.path.join(root, "extras", "CUPTI", "include")]
    purelib = sysconfig.get_paths()["purelib"]
    cands += glob.glob(os.path.join(purelib, "nvidia", "*", "include")) + glob.glob(
        os.path.join(purelib, "nvidia", "*", "*", "include")
    )
    seen: list[str] = []
    for c in cands:
        if os.path.isfile(os.path.join(c, "cupti.h")) and os.path.isfile(os.path.join(c, "cuda.h")) and c not in seen:
            seen.append(c)
    for c in cands:  # cuda.h may live beside cupti's include folder (toolkit layout)
        if os.path.isfile(os.path.join(c, "cupti.h")) and c not in seen:
            seen.append(c)
    return seen


def find_libcupti() -> str | None:
    """``$MAX_PROFILE_LIBCUPTI``, the loader's ``libcupti``, CUDA toolkits, pip's nvidia / cupti-python packages."""
    explicit = os.environ.get("MAX_PROFILE_LIBCUPTI")
    if explicit:
        return explicit if os.path.exists(explicit) else None
    purelib = sysconfig.get_paths()["purelib"]
    patterns = [
        "/usr/local/cuda*/extras/CUPTI/lib64/libcupti.so*",
        "/usr/local/cuda*/lib64/libcupti.so*",
        "/usr/local/cuda*/lib/libcupti.so*",
        "/usr/local/cuda*/targets/*/lib/libcupti.so*",
        os.path.join(purelib, "nvidia", "*", "lib", "libcupti.so*"),
        os.path.join(purelib, "nvidia", "*", "*", "lib", "libcupti.so*"),
        os.path.join(purelib, "cupti", "*", "libcupti.so*"),
    ]
    for pattern in patterns:
        hits = sorted(glob.glob(pattern), reverse=True)
        if hits:
            return hits[0]
    name = ctypes.util.find_library("cupti")
    return name


def build_cupti_library(out_dir: str | os.PathLike[str] | None = None) -> str:
    """Compile the recorder once per source version and header folder; returns the shared library's path."""
    prebuilt = os.environ.get("MAX_PROFILE_CUPTI_RING_LIB")
    if prebuilt and os.path.exists(prebuilt):
        return prebuilt
    include = cupti_include_dirs()
    if not include:
        raise ToolMissingError(
            "CUPTI headers (cupti.h) not found: install the CUDA toolkit (it ships them in <cuda>/include or "
            "<cuda>/extras/CUPTI/include) or `pip install nvidia-cuda-cupti-cu12`; or set CUDA_HOME"
        )
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if not cc:
        raise ToolMissingError("no C compiler found for the CUPTI recorder (gcc / cc): apt-get install gcc")
    folder = Path(out_dir) if out_dir else cache_dir()
    errors = []
    for struct in KERNEL_RECORD_STRUCTS:
        digest = hashlib.sha256(_SOURCE.read_bytes() + struct.encode() + include[0].encode()).hexdigest()[:12]
        lib = folder / f"libmax_profile_cupti-{digest}.so"
        if lib.exists():
            return str(lib)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        flags = [f"-I{d}" for d in include]
        cmd = [
            cc,
            "-shared",
            "-fPIC",
            "-O2",
            f"-DMP_KERNEL_RECORD={struct}",
            *flags,
            "-o",
            str(tmp),
            str(_SOURCE),
            "-ldl",
            "-lpthread",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode == 0:
            os.replace(tmp, lib)
            return str(lib)
        tmp.unlink(missing_ok=True)
        errors.append(res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}")
    raise ToolMissingError(f"building the CUPTI recorder failed against {include[0]}: {errors[-1][:300]}")


def _bind(path: str) -> Any:
    lib = ctypes.CDLL(path)
    lib.mp_open.argtypes = [ctypes.c_char_p]
    lib.mp_start.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_size_t]
    lib.mp_timestamp.restype = ctypes.c_uint64
    for name in ("mp_kernels", "mp_apis"):
        getattr(lib, name).restype = ctypes.c_void_p
        getattr(lib, name).argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    for name in ("mp_error", "mp_holder"):
        getattr(lib, name).restype = ctypes.c_char_p
    lib.mp_callback_name.restype = ctypes.c_char_p
    lib.mp_reserve.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_size_t]
    lib.mp_held.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
    lib.mp_callback_name.argtypes = [ctypes.c_int, ctypes.c_uint32]
    lib.mp_set_options.argtypes = [ctypes.c_uint]
    return lib


def layout_of(lib: Any) -> RecordLayout:
    out = (ctypes.c_int32 * 64)()
    n = lib.mp_layout(out, 64)
    return RecordLayout.from_values(list(out)[:n])


class NativeCuptiCollector:
    """Start / stop kernel recording in this process; ``stop()`` returns the kernels as a :class:`KernelTable`."""

    native = True
    """The C recorder (nothing per record in Python); cupti-python's collector says False."""
    default_options: ClassVar[tuple[str, ...]] = ()
    """The :data:`RECORDING_OPTIONS` a new collector starts with (``benchmarks/untraced_overhead.py`` sets them per
    arm)."""

    def __init__(
        self, buffer_bytes: int = DEFAULT_BUFFER_BYTES, launches: bool = True, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        libcupti = find_libcupti()
        if libcupti is None:
            raise ToolMissingError(
                "libcupti not found: install the CUDA toolkit, or `pip install nvidia-cuda-cupti-cu12` "
                "(or set MAX_PROFILE_LIBCUPTI=/path/to/libcupti.so)"
            )
        self._lib = _bind(build_cupti_library())
        if self._lib.mp_open(libcupti.encode()) != 0:
            raise ToolMissingError(
                f"the CUPTI recorder cannot use {libcupti}: {self._lib.mp_error().decode(errors='replace')}"
            )
        runtime, compiled = ctypes.c_uint32(), ctypes.c_uint32()
        self._lib.mp_versions(ctypes.byref(runtime), ctypes.byref(compiled))
        if runtime.value and runtime.value // 10000 != compiled.value // 10000:
            raise ToolMissingError(
                f"{libcupti} is CUPTI API {runtime.value} but the recorder was built against headers of API "
                f"{compiled.value}: their record layouts differ; point CUDA_HOME at the toolkit of the same version"
            )
        self.layout = layout_of(self._lib)
        self.cupti_version = runtime.value
        self.libcupti = libcupti
        self._buffer_bytes, self._launches, self._max_bytes = buffer_bytes, launches, max_bytes
        self._sync: list[tuple[int, int]] = []
        self.kernels = KernelTable.empty()
        self.dropped = 0
        self.unfinished = 0
        """Kernel records without a start or end time: the kernel was still running at the forced flush."""
        self.other_records = 0
        self.api_records = 0
        self.graph_launches = 0
        self.rejected_launches = 0
        self.callback_s = 0.0
        self.callback_s_before_stop = 0.0
        self.stop_s = 0.0
        self.recorded_bytes = 0
        self.options: tuple[str, ...] = self.default_options
        """:data:`RECORDING_OPTIONS` of the next :meth:`start` (none: the default recording)."""
        self.resume_problem: str | None = None
        """Why a paused recording could not resume (another CUPTI client took the released subscription)."""
        self.api_filter = "no API records (kernels only)" if not launches else "all API records"
        self.raw: tuple[bytes, bytes, dict[int, str]] | None = None
        """The recorded arrays and the kernel names by address (what tests decode offline)."""

    def _pair(self) -> tuple[int, int]:
        h0 = time.perf_counter_ns()
        c = int(self._lib.mp_timestamp())
        h1 = time.perf_counter_ns()
        return (h0 + h1) // 2, c

    def reserve(self, arena_bytes: int = RESERVE_ARENA_BYTES, buffers: int = RESERVE_BUFFERS) -> None:
        """Fault in the record arrays and a few activity buffers now (``serve``'s worker does it before its first
        window): otherwise the first recording grows its arrays and touches fresh pages inside CUPTI's callbacks (the
        H200's first serve window spent ~6x the callback time of later ones)."""
        if self._lib.mp_reserve(arena_bytes, buffers, self._buffer_bytes) != 0:
            raise CaptureError(
                f"could not set aside {arena_bytes >> 20} MB for kernel records and {buffers} CUPTI buffers"
            )

    def held(self) -> tuple[int, int]:
        """The kernel array's capacity (bytes) and the free activity buffers kept between recordings."""
        cap, n = ctypes.c_size_t(), ctypes.c_int()
        self._lib.mp_held(ctypes.byref(cap), ctypes.byref(n))
        return cap.value, n.value

    def start(self) -> None:
        self._lib.mp_clear()
        unknown = [o for o in self.options if o not in RECORDING_OPTIONS]
        if unknown:
            raise CaptureError(
                f"unknown CUPTI recording option(s) {', '.join(unknown)}: known are {', '.join(RECORDING_OPTIONS)}"
            )
        self._lib.mp_set_options(sum(RECORDING_OPTIONS[o] for o in set(self.options)))
        rc = self._lib.mp_start(self._buffer_bytes, 1 if self._launches else 0, self._max_bytes)
        if rc == 1:
            holder = self._lib.mp_holder().decode(errors="replace")
            if "<not provided>" in holder or not holder.strip():
                holder = f"another CUPTI client (Nsight Systems, Nsight Compute, kineto...; it names itself {holder!r})"
            raise CuptiBusy(
                f"CUPTI in this process is already held by {holder}: kernel recording backs off rather than garble "
                "both traces (run without nsys / ncu / kineto around it, or read that tool's trace with `max-profile "
                "report`)"
            )
        if rc != 0:
            raise CaptureError(f"CUPTI recording could not start: {self._lib.mp_error().decode(errors='replace')}")
        stats = (ctypes.c_uint64 * 5)()
        self._lib.mp_stats(stats)
        if self._launches:
            self.api_filter = (
                f"launch calls only ({stats[4]} kept)"
                if stats[4]
                else "all API records (this CUPTI cannot filter by call)"
            )
        self.resume_problem = None
        self._sync = [self._pair()]

    def pause(self) -> None:
        """Stop recording new work until :meth:`resume` (one slice of a sampled window ended); nothing is flushed
        unless ``flush-at-pause`` is among :attr:`options`."""
        self._lib.mp_pause()

    def resume(self) -> None:
        """Record again after :meth:`pause`; where that cannot be (``release-while-paused`` and another CUPTI client
        subscribed meanwhile) the recording stays paused and :attr:`resume_problem` says why."""
        if self._lib.mp_resume() == 1 and self.resume_problem is None:
            holder = self._lib.mp_holder().decode(errors="replace") or "another CUPTI client"
            self.resume_problem = (
                f"CUPTI was taken by {holder} while the recording was paused: the slices after it were not recorded"
            )

    def stop(self) -> KernelTable:
        t0 = time.perf_counter()
        stats = (ctypes.c_uint64 * 5)()
        self._lib.mp_stats(stats)
        self.callback_s_before_stop = stats[3] / 1e9
        self._sync.append(self._pair())
        if self._lib.mp_stop() != 0:
            raise CaptureError(f"CUPTI flush failed: {self._lib.mp_error().decode(errors='replace')}")
        self._lib.mp_stats(stats)
        self.dropped, self.other_records, self.callback_s = int(stats[0]), int(stats[1]), stats[3] / 1e9
        kernel_bytes, api_bytes = self._copy("mp_kernels"), self._copy("mp_apis")
        self.recorded_bytes = len(kernel_bytes) + len(api_bytes)
        names = self._names(kernel_bytes)
        decoded = self._decode(kernel_bytes, api_bytes, names)
        self.unfinished = unfinished_records(kernel_bytes, self.layout)
        self.raw = (kernel_bytes, api_bytes, names)
        self._lib.mp_clear()
        self.kernels = decoded.table
        self.api_records, self.graph_launches = decoded.api_records, decoded.graph_launches
        self.rejected_launches = decoded.rejected_launches
        self.stop_s = time.perf_counter() - t0
        return self.kernels

    def _copy(self, which: str) -> bytes:
        size = ctypes.c_size_t()
        ptr = getattr(self._lib, which)(ctypes.byref(size))
        return ctypes.string_at(ptr, size.value) if ptr and size.value else b""

    def _names(self, kernel_bytes: bytes) -> dict[int, str]:
        import numpy as np

        if not kernel_bytes:
            return {}
        k = np.frombuffer(kernel_bytes, dtype=self.layout.kernel_dtype())
        out = {}
        for address in np.unique(k["name"]):
            if address:
                out[int(address)] = ctypes.string_at(int(address)).decode("utf-8", errors="replace")
        return out

    def _decode(self, kernel_bytes: bytes, api_bytes: bytes, names: dict[int, str]) -> DecodedKernels:
        import numpy as np

        graph_cbids: set[int] = set()
        if api_bytes:
            a = np.frombuffer(api_bytes, dtype=self.layout.api_dtype())
            for kind, cbid in {(int(k), int(c)) for k, c in zip(a["kind"], a["cbid"], strict=True)}:
                if "Graph" in self._lib.mp_callback_name(kind, cbid).decode(errors="replace"):
                    graph_cbids.add(cbid)
        return decode(kernel_bytes, api_bytes, self.layout, names, self._sync, graph_cbids=frozenset(graph_cbids))


def static_layout_matches(layout: RecordLayout) -> bool:
    """Whether a compiled layout is the CUDA 13.0 one this module documents (a check, not a requirement)."""
    return layout.values() == list(CUPTI_13_LAYOUT)


class KernelCollector(Protocol):
    """An in-process CUPTI kernel recorder: the C one (:class:`NativeCuptiCollector`) or cupti-python's
    (:class:`~max_profile.collect.live.cupti_kernels.CuptiKernelCollector`). Counters are read after :meth:`stop`."""

    native: bool
    """Whether records are handled in C (False: a Python object per record, and no cheap pause)."""
    dropped: int
    unfinished: int
    """Kernels with no start or end time: still running when recording stopped."""
    api_records: int
    api_filter: str
    """Which driver / runtime API records were kept (launch calls only, where CUPTI can filter)."""
    graph_launches: int
    rejected_launches: int
    """Kernels whose launch-call join was impossible (``cupti_decode.impossible_launch_joins``): timed by start."""
    resume_problem: str | None
    """Why a paused recording could not resume (its later slices are missing), or None."""
    callback_s: float
    """Seconds spent in CUPTI's buffer callbacks (the recorder's own cost)."""
    callback_s_before_stop: float
    stop_s: float

    def start(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self) -> KernelTable: ...


def make_cupti_collector(notes: list[str], launches: bool = True) -> KernelCollector:
    """The C recorder (nothing per record in Python); cupti-python's per-record callbacks only where it cannot be built.

    The fallback is said in ``notes``: it holds the profiled process's GIL per record (the
    ``tracer-overhead`` rule reports what that cost).
    """
    try:
        return NativeCuptiCollector(launches=launches)
    except MaxProfileError as native_problem:
        try:
            collector = CuptiKernelCollector(launches=launches)
        except MaxProfileError:
            raise native_problem from None
        notes.append(
            "CUPTI through cupti-python (a Python object per record, slower): the C recorder is unavailable "
            f"({native_problem})"
        )
        return collector
