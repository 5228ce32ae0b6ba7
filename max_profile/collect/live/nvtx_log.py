"""NVTX ranges on any machine, through max_profile's own NVTX injection library.

With ``MODULAR_ENABLE_PROFILING=on`` MAX emits NVTX ranges for its Python spans (``execute``,
``prepare_batch``...) and for every op it runs (``matmul``, ``mo.mha.ragged.paged...``,
``composite.rms_norm_residual_add``...), also on the CPU. Started with
``NVTX_INJECTION64_PATH=<libmax_profile_nvtx.so>`` and ``MAX_PROFILE_NVTX_LOG=<file>``, a
process logs every range to that file; :func:`read_nvtx_log` turns it into phase ranges
(ours, domain ``max_profile``) and op records that the kernel breakdown can aggregate.
Times are ``CLOCK_MONOTONIC`` ns, the clock of ``time.perf_counter_ns()``.

Equivalent tool: ``nsys profile --trace=nvtx`` then ``nsys stats --report nvtx_sum``.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from max_profile.errors import ToolMissingError, TraceFormatError
from max_profile.model import KernelRecord, KernelTable, PhaseRange
from max_profile.util.files import cache_dir

_SOURCE = Path(__file__).parent / "native" / "nvtx_log_inject.c"

PYTHON_SPANS: frozenset[str] = frozenset(
    {
        "execute",
        "_execute",
        "prepare_batch",
        "_maybe_sort_loras",
        "FusedSamplingProcessor",
        "sample_next_token",
        "compute_log_probabilities",
        "d2h_generated_tokens",
        "_Model_execute",
        "sync_and_process_outputs",
        "realize_future_tokens",
        "prepare_initial_token_inputs",
        "pipeline_model.execute",
        "apply_logits_processors",
        "D2H generated_tokens",
        "_sample_logits",
        "_build_min_tokens_masks",
        "inference",
        "load_model",
        "load_graphs",
    }
)
"""MAX's Python-level spans (``Tracer`` / ``@traced``), which are not ops."""

_KINDS = frozenset({"PUSH", "POP", "START", "END", "MARK"})
_INT62 = 1 << 62
_NON_OP_PREFIXES = ("max._core", "forward_pass_step_", "_schedule(", "fused_sampling_processor", "max_profile")


def nvtx_include_dirs() -> list[str]:
    """Folders holding ``nvtx3/nvToolsExt.h``: CUDA toolkits, then pip's nvidia / nvtx packages."""
    cands = sorted(glob.glob("/usr/local/cuda*/include")) + ["/usr/include", "/opt/cuda/include"]
    purelib = sysconfig.get_paths()["purelib"]
    cands += glob.glob(os.path.join(purelib, "nvidia", "*", "include")) + glob.glob(
        os.path.join(purelib, "nvtx", "**", "include"), recursive=True
    )
    return [c for c in cands if os.path.isfile(os.path.join(c, "nvtx3", "nvToolsExt.h"))]


def build_injection_library(out_dir: str | os.PathLike[str] | None = None) -> str:
    """Compile the injection library (gcc, NVTX headers) once per source version; returns its path."""
    include = nvtx_include_dirs()
    if not include:
        raise ToolMissingError(
            "NVTX headers (nvtx3/nvToolsExt.h) not found: install the CUDA toolkit headers "
            "(apt-get install nvidia-cuda-toolkit) or `pip install nvidia-nvtx-cu12`"
        )
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if not cc:
        raise ToolMissingError("no C compiler found (gcc / cc): apt-get install gcc")
    digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:12]
    folder = Path(out_dir) if out_dir else cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"libmax_profile_nvtx-{digest}.so"
    if lib.exists():
        return str(lib)
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    cmd = [cc, "-shared", "-fPIC", "-O2", f"-I{include[0]}", "-o", str(tmp), str(_SOURCE), "-lpthread"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ToolMissingError(f"building the NVTX injection library failed: {res.stderr.strip()[:400]}")
    os.replace(tmp, lib)
    return str(lib)


def log_path_for(template: str, pid: int | None = None) -> str:
    """The file a process writes for a ``MAX_PROFILE_NVTX_LOG`` template (``%p`` = its pid)."""
    return template.replace("%p", str(os.getpid() if pid is None else pid))


LOG_CAP_ENV = "MAX_PROFILE_NVTX_LOG_MAX_BYTES"
"""The log's size cap in bytes (default 1 GiB); events past it are counted, not written."""
GATED_ENV = "MAX_PROFILE_NVTX_GATED"
"""Set to ``1``: the library writes only inside ``profile()`` blocks and the log is emptied after each is read."""


def injection_env(log_path: str, lib: str | None = None, profiling: str = "on", gated: bool = False) -> dict[str, str]:
    """Environment variables that make a new process log its NVTX ranges to ``log_path`` (``%p`` = pid).

    ``gated``: for a long-running app, nothing is written outside recordings, and each recording's part is removed once
    read (the log stays as small as one ``profile()`` block)."""
    env = {
        "NVTX_INJECTION64_PATH": lib or build_injection_library(),
        "MAX_PROFILE_NVTX_LOG": log_path,
        "MODULAR_ENABLE_PROFILING": profiling,
    }
    if gated:
        env[GATED_ENV] = "1"
    return env


def _in_process_library() -> ctypes.CDLL | None:
    """The injection library when this process was started with it (``None`` otherwise)."""
    lib = os.environ.get("NVTX_INJECTION64_PATH", "")
    return _opened(lib) if "libmax_profile_nvtx" in lib else None


@functools.cache
def _opened(path: str) -> ctypes.CDLL | None:
    """The library at ``path``, opened once per process, its result types set (``None`` where it cannot be opened)."""
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for symbol in ("max_profile_nvtx_flush", "max_profile_nvtx_record", "max_profile_nvtx_truncate"):
        if hasattr(lib, symbol):
            getattr(lib, symbol).restype = None
    if hasattr(lib, "max_profile_nvtx_dropped"):
        lib.max_profile_nvtx_dropped.restype = ctypes.c_ulonglong
    return lib


def _call_in_process(symbol: str, *args: int) -> int | None:
    lib = _in_process_library()
    fn = getattr(lib, symbol, None) if lib is not None else None
    return fn(*args) if fn is not None else None  # type: ignore[no-any-return]


def flush_in_process() -> None:
    """Flush this process's log buffer when the injection library is loaded here."""
    _call_in_process("max_profile_nvtx_flush")


def gated_in_process() -> bool:
    """Whether this process's log is written only inside recordings (started with ``MAX_PROFILE_NVTX_GATED=1``)."""
    return os.environ.get(GATED_ENV) == "1" and _in_process_library() is not None


def set_recording_in_process(on: bool) -> None:
    """Gated log: start / stop writing this process's NVTX events."""
    _call_in_process("max_profile_nvtx_record", int(on))


def dropped_in_process() -> int:
    """Events this process's log did not write because it reached its size cap (:data:`LOG_CAP_ENV`)."""
    return _call_in_process("max_profile_nvtx_dropped") or 0


def truncate_in_process() -> None:
    """Gated log: empty the log once a recording has been read (the size cap starts again)."""
    _call_in_process("max_profile_nvtx_truncate")


@dataclass
class NvtxRange:
    name: str
    domain: str
    start_ns: int
    end_ns: int
    tid: int
    depth: int


@dataclass
class NvtxLog:
    ranges: list[NvtxRange] = field(default_factory=list)
    marks: int = 0
    unclosed: int = 0
    malformed: int = 0

    def phase_ranges(self) -> list[PhaseRange]:
        """Our phase ranges (domain ``max_profile``), plus MAX's scheduler ranges when serving."""
        out = []
        for r in self.ranges:
            if r.domain == "max_profile" or r.name.startswith("_schedule("):
                out.append(PhaseRange(name=r.name, start_ns=r.start_ns, end_ns=r.end_ns, tid=r.tid, domain=r.domain))
        return out

    def python_threads(self) -> set[int]:
        """Threads running Python pipeline code: those holding our phase ranges or MAX's driver spans."""
        ours = {r.tid for r in self.ranges if r.domain == "max_profile"}
        if ours:
            return ours
        counts: dict[int, int] = defaultdict(int)
        for r in self.ranges:
            if r.name.startswith("max._core") or r.name in PYTHON_SPANS:
                counts[r.tid] += 1
        return {max(counts, key=counts.__getitem__)} if counts else set()

    def op_records(self) -> list[KernelRecord]:
        """MAX's op ranges as kernel-like records (host execution time of each op).

        Ops run on MAX's runtime worker threads; their ranges nest (``matmul`` holds
        ``matmulmo.matmul``), so only the innermost range of each nest is kept, and the
        Python thread's spans (``execute``, ``prepare_batch``, ``max._core...``) are left out.
        """
        skip = self.python_threads()
        by_tid: dict[int, list[NvtxRange]] = defaultdict(list)
        for r in self.ranges:
            if r.domain != "-" or r.tid in skip or r.name in PYTHON_SPANS or r.name.startswith(_NON_OP_PREFIXES):
                continue
            by_tid[r.tid].append(r)
        out = []
        for tid, rs in by_tid.items():
            rs.sort(key=lambda r: (r.start_ns, -r.end_ns))
            for i, r in enumerate(rs):
                nxt = rs[i + 1] if i + 1 < len(rs) else None
                if nxt is not None and nxt.start_ns < r.end_ns:
                    continue  # has a child: keep the innermost
                out.append(
                    KernelRecord(
                        name=r.name,
                        start_ns=r.start_ns,
                        end_ns=r.end_ns,
                        device=-1,
                        launch_tid=tid,
                        launch_ns=r.start_ns,
                    )
                )
        out.sort(key=lambda k: k.start_ns)
        return out

    def op_table(self) -> KernelTable:
        return KernelTable.from_records(self.op_records())

    def names(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for r in self.ranges:
            counts[f"{r.domain}:{r.name}" if r.domain != "-" else r.name] += 1
        return dict(counts)


def read_nvtx_log(path: str | os.PathLike[str]) -> NvtxLog:
    """Parse the injection library's log; pairs START/END by id and PUSH/POP per thread and domain."""
    flush_in_process()
    log = NvtxLog()
    open_by_id: dict[int, tuple[int, int, str, str]] = {}
    stacks: dict[tuple[int, str], list[tuple[int, str]]] = defaultdict(list)
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            head, _, message = line.rstrip("\n").partition("\t")
            parts = head.split(" ")
            try:
                t, tid, kind, rid, domain = int(parts[0]), int(parts[1]), parts[2], int(parts[3]), parts[4]
                if (
                    len(parts) != 5
                    or kind not in _KINDS
                    or not (0 <= t < _INT62 and 0 <= tid < _INT62 and 0 <= rid < _INT62)
                ):
                    raise ValueError
            except (ValueError, IndexError):
                if line.strip():
                    log.malformed += 1
                    if log.malformed > 100 and log.malformed > lineno // 10:
                        raise TraceFormatError(
                            f"{path}:{lineno}: not a max_profile NVTX log (e.g. {line[:80]!r})"
                        ) from None
                continue
            if kind == "PUSH":
                stacks[(tid, domain)].append((t, message))
            elif kind == "POP":
                st = stacks[(tid, domain)]
                if st:
                    start, name = st.pop()
                    log.ranges.append(NvtxRange(name, domain, start, t, tid, len(st)))
            elif kind == "START":
                open_by_id[rid] = (t, tid, message, domain)
            elif kind == "END":
                opened = open_by_id.pop(rid, None)
                if opened:
                    log.ranges.append(NvtxRange(opened[2], opened[3], opened[0], t, opened[1], 0))
            elif kind == "MARK":
                log.marks += 1
    log.unclosed = len(open_by_id) + sum(len(s) for s in stacks.values())
    log.ranges.sort(key=lambda r: r.start_ns)
    return log


MAX_GPU_NVTX_PROBLEM = (
    "MAX 26.7 on a GPU with MODULAR_ENABLE_PROFILING=on resolves NVTX v2 symbols (nvtxRangeStartEx) from "
    "libnvToolsExt.so, which CUDA 13 no longer ships; without it the model worker aborts "
    "('symbol not found: nvtxRangeStartEx', seen on the H200)"
)
NVTX_V2_WHEEL = "nvidia-nvtx-cu12==12.1.105"
"""The pip package that ships CUDA 12's NVTX v2 library (``nvidia/nvtx/lib/libnvToolsExt.so.1``; its 12.9 release ships
only ``libnvtx3interop.so.1``). On the H200 (CUDA 13, MAX 26.7) MAX's profiling mode ran with it on LD_LIBRARY_PATH
(tests/data/gpu/h200_llama180m_op_ranges_cuda13). In the ``nvidia`` extra."""
NVTX_V2_FIX = (
    f"pip install '{NVTX_V2_WHEEL}' (CUDA 12's libnvToolsExt.so.1: max_profile puts it on the model's library path)"
)


@functools.cache
def _system_nvtx_v2() -> bool:
    """Whether the loader finds an NVTX v2 library by itself (a CUDA 12 toolkit, or one the user put on the path).

    Cached: ``find_library`` runs ``ldconfig`` / the compiler, and every profiling process and server start asks."""
    import ctypes.util

    for name in filter(None, (ctypes.util.find_library("nvToolsExt"), "libnvToolsExt.so.1", "libnvToolsExt.so")):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def nvtx_v2_library() -> Path | None:
    """CUDA 12's ``libnvToolsExt.so.1`` from the ``nvidia-nvtx-cu12`` wheel, when it is installed (site-packages, or any
    folder on ``sys.path``: a ``pip install --target`` / PYTHONPATH install)."""
    roots = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *[p for p in sys.path if p]]
    for root in dict.fromkeys(roots):
        lib = Path(root) / "nvidia" / "nvtx" / "lib" / "libnvToolsExt.so.1"
        if lib.is_file():
            return lib
    return None


def nvtx_v2_folder() -> Path | None:
    """A folder to put first on LD_LIBRARY_PATH that holds the wheel's library under both names MAX looks for
    (``libnvToolsExt.so`` and ``.so.1``); None without the wheel."""
    lib = nvtx_v2_library()
    if lib is None:
        return None
    folder = cache_dir() / f"nvtx-v2-{hashlib.sha256(str(lib).encode()).hexdigest()[:8]}"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("libnvToolsExt.so", "libnvToolsExt.so.1"):
        link = folder / name
        if not link.exists():
            tmp = folder / f".{name}.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(lib)
            os.replace(tmp, link)
    return folder


def profiling_library_env(devices: str) -> dict[str, str]:
    """What a process running MAX with profiling on needs in its environment on these devices: on a GPU without a
    system NVTX v2 library, the wheel's folder first on LD_LIBRARY_PATH (nothing on a CPU, or where the loader finds
    one)."""
    if devices.strip().lower().startswith("cpu") or _system_nvtx_v2():
        return {}
    folder = nvtx_v2_folder()
    if folder is None:
        return {}
    current = os.environ.get("LD_LIBRARY_PATH", "")
    return {"LD_LIBRARY_PATH": str(folder) + (os.pathsep + current if current else "")}


def max_profiling_usable(devices: str) -> bool:
    """Whether MAX can run with MODULAR_ENABLE_PROFILING=on on these devices (see MAX_GPU_NVTX_PROBLEM): on a CPU
    always; on a GPU when the loader finds an NVTX v2 library or the ``nvidia-nvtx-cu12`` wheel provides one.
    """
    if devices.strip().lower().startswith("cpu"):
        return True
    return _system_nvtx_v2() or nvtx_v2_library() is not None


def restart_with_nvtx_log(argv: list[str], devices: str, gated: bool = False) -> None:
    """Re-run this process (``os.execve`` of ``argv``) with the NVTX log library loaded, unless it already is.

    MAX's op ranges reach the log only when the library is injected at process start and
    ``MODULAR_ENABLE_PROFILING=on`` is set before the model loads. Scripts call
    :func:`max_profile.restart_with_op_ranges` first thing (which uses this and removes the log at exit), then
    profile with ``kernels="nvtx-log"``. The first run of a model shape with profiling on recompiles it.
    ``gated``: the log holds only the recording being read (see :func:`injection_env`), for scripts that run on.
    """
    if "libmax_profile_nvtx" in os.environ.get("NVTX_INJECTION64_PATH", "") and os.environ.get("MAX_PROFILE_NVTX_LOG"):
        return
    if not max_profiling_usable(devices):
        raise ToolMissingError(
            f"MAX op ranges on {devices}: {MAX_GPU_NVTX_PROBLEM}; fix: {NVTX_V2_FIX}, or use kernels='cupti' "
            "on NVIDIA GPUs"
        )
    env = {
        **os.environ,
        **injection_env(str(cache_dir() / "nvtx-%p.log"), gated=gated),
        **profiling_library_env(devices),
    }
    os.execve(argv[0], argv, env)
