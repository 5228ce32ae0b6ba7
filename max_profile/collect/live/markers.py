"""Phase ranges around each pipeline step, visible to nsys, CUPTI, rocprofv3 and ncu's NVTX filters.

NVIDIA: the ``nvtx`` package in the *named* domain ``max_profile`` (CUPTI records only
named-domain ranges when injected; nsys prints them as ``max_profile:prefill``).
AMD: ``roctxRangePushA`` / ``roctxRangePop`` from ``libroctx64.so`` through ctypes.
Without either, MAX's own ``Tracer`` (default NVTX domain, only when MAX profiling is on),
else nothing: phases are then known from host step times alone.

Equivalent to wrapping each step in ``nvtx.push_range("prefill", domain="max_profile")``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Protocol

DOMAIN = "max_profile"


class PhaseMarker(Protocol):
    kind: str

    def push(self, name: str) -> None: ...

    def pop(self) -> None: ...


class NullMarker:
    """No ranges: the host step records still carry the phases."""

    kind = "host-only"

    def push(self, name: str) -> None:
        return None

    def pop(self) -> None:
        return None


class NvtxMarker:
    """Push/pop ranges in the named NVTX domain ``max_profile`` (``nvtx`` package)."""

    def __init__(self) -> None:
        import nvtx  # type: ignore[import-not-found,import-untyped,unused-ignore]

        self._domain = nvtx.get_domain(DOMAIN)
        self._attrs: dict[str, Any] = {}
        self.kind = f"nvtx:{DOMAIN}"

    def push(self, name: str) -> None:
        attrs = self._attrs.get(name)
        if attrs is None:
            attrs = self._attrs[name] = self._domain.get_event_attributes(message=name)
        self._domain.push_range(attrs)

    def pop(self) -> None:
        self._domain.pop_range()


class RoctxMarker:
    """roctx ranges (AMD); rocprofv3 ``--marker-trace`` records them."""

    kind = "roctx"

    def __init__(self) -> None:
        path = ctypes.util.find_library("roctx64") or "/opt/rocm/lib/libroctx64.so"
        lib = ctypes.CDLL(path)
        self._push = lib.roctxRangePushA
        self._push.argtypes = [ctypes.c_char_p]
        self._pop = lib.roctxRangePop
        self._names: dict[str, bytes] = {}

    def push(self, name: str) -> None:
        encoded = self._names.setdefault(name, f"{DOMAIN}:{name}".encode())
        self._push(encoded)

    def pop(self) -> None:
        self._pop()


class MaxTracerMarker:
    """MAX's ``Tracer`` (default NVTX domain); emits only when MAX profiling is on."""

    kind = "nvtx:default"

    def __init__(self) -> None:
        from max.profiler import Tracer

        self._tracer_cls = Tracer
        self._stack: list[Any] = []

    def push(self, name: str) -> None:
        tracer = self._tracer_cls(f"{DOMAIN}/{name}")
        tracer.__enter__()
        self._stack.append(tracer)

    def pop(self) -> None:
        if self._stack:
            self._stack.pop().__exit__(None, None, None)


def make_marker(vendor: str, enabled: bool = True) -> tuple[PhaseMarker, str | None]:
    """The best marker for this vendor, and a note when we had to fall back."""
    if not enabled:
        return NullMarker(), None
    if vendor == "amd":
        try:
            return RoctxMarker(), None
        except OSError as exc:
            return NullMarker(), f"roctx not found ({exc}); phases come from host step times only"
    try:
        return NvtxMarker(), None
    except ImportError:
        pass
    try:
        from max.profiler import is_profiling_enabled

        if is_profiling_enabled():
            return MaxTracerMarker(), "nvtx package missing: phase ranges use MAX's Tracer (default domain)"
    except ImportError:
        pass
    return NullMarker(), "nvtx package missing (pip install nvtx): no phase ranges in nsys / CUPTI traces"
