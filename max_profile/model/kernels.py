"""The kernel table: every kernel a trace recorded, as columns (what collectors fill and analyses read)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import msgspec
import numpy as np

from max_profile.errors import TraceFormatError
from max_profile.model.serialization import _encode, _validated


def _dim3(column: np.ndarray | None, i: int) -> tuple[int, int, int] | None:
    """Row ``i`` of an (n, 3) grid / block column as (x, y, z) ints, None without the column."""
    if column is None:
        return None
    x, y, z = (int(v) for v in column[i])
    return x, y, z


class KernelRecord(msgspec.Struct, frozen=True, array_like=True):
    """One kernel execution on a GPU, as any tracer reports it: the per-record view of a :class:`KernelTable`."""

    name: str
    start_ns: int
    end_ns: int
    device: int = 0
    stream: int = 0
    correlation_id: int = 0
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    registers: int | None = None
    graph_id: int | None = None
    launch_tid: int | None = None
    launch_ns: int | None = None
    """Start of the launching API call (same clock as start_ns), when known."""
    graph_node_id: int | None = None


_INT64_COLUMNS = ("start_ns", "end_ns")


def _int_column(value: object, dtype: type, name: str, flat: bool = True) -> np.ndarray:
    """An integer column of a kernel table; anything else (floats, text, out-of-range numbers) is a format error."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise TraceFormatError(f"kernel table column {name} is not a numeric array ({exc})") from exc
    if array.size and array.dtype.kind not in "iub":
        raise TraceFormatError(f"kernel table column {name} holds {array.dtype} values, not integers")
    if array.dtype == dtype:  # already the column's type (a selection of a table): no range pass, no copy
        return array.reshape(-1) if flat else array
    info = np.iinfo(dtype)  # type: ignore[type-var]
    if array.size and (int(array.min()) < info.min or int(array.max()) > info.max):
        raise TraceFormatError(f"kernel table column {name} holds values beyond {np.dtype(dtype).name}")
    out: np.ndarray = array.astype(dtype)
    return out.reshape(-1) if flat else out


_OPTIONAL_INT64 = ("launch_ns", "launch_tid", "stream", "correlation_id", "graph_id", "graph_node_id")


def merged_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Time spans in order with overlapping or touching ones merged (empty ones dropped)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in spans if b > a):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class KernelTable(msgspec.Struct):
    """Every kernel of a capture as columns, one entry per kernel (a million kernels stay numpy arrays).

    ``names`` holds each distinct name once; ``name_idx`` points into it. Optional columns are
    None when the source does not record them; inside a column ``-1`` means "not known for this
    kernel" (``launch_ns``, ``launch_tid``) and ``0`` means "not in a graph" (``graph_id``).
    Times are nanoseconds on the clock named by :attr:`RawCapture.kernel_clock`.
    """

    names: list[str]
    name_idx: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    device: np.ndarray
    launch_ns: np.ndarray | None = None
    launch_tid: np.ndarray | None = None
    stream: np.ndarray | None = None
    correlation_id: np.ndarray | None = None
    graph_id: np.ndarray | None = None
    graph_node_id: np.ndarray | None = None
    grid: np.ndarray | None = None
    """(n, 3) int32 grid dimensions."""
    block: np.ndarray | None = None
    """(n, 3) int32 block dimensions."""
    registers: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = int(np.asarray(self.start_ns).size)
        self.name_idx = _int_column(self.name_idx, np.int32, "name_idx")
        for col in _INT64_COLUMNS:
            setattr(self, col, _int_column(getattr(self, col), np.int64, col))
        self.device = _int_column(self.device, np.int32, "device")
        for col in _OPTIONAL_INT64:
            value = getattr(self, col)
            if value is not None:
                setattr(self, col, _int_column(value, np.int64, col))
        for col in ("grid", "block"):
            value = getattr(self, col)
            if value is not None:
                column = _int_column(value, np.int32, col, flat=False)
                if column.size % 3:
                    raise TraceFormatError(f"kernel table column {col} is not (x, y, z) triples")
                setattr(self, col, column.reshape(-1, 3))
        if self.registers is not None:
            self.registers = _int_column(self.registers, np.int32, "registers")
        if not all(isinstance(nm, str) for nm in self.names):
            raise TraceFormatError("kernel table names must be text")
        for col in ("name_idx", "end_ns", "device", *_OPTIONAL_INT64, "grid", "block", "registers"):
            value = getattr(self, col)
            if value is not None and len(value) != n:
                raise TraceFormatError(f"kernel table column {col} has {len(value)} entries for {n} kernels")
        if n and (int(self.name_idx.min()) < 0 or int(self.name_idx.max()) >= len(self.names)):
            raise TraceFormatError(f"kernel table name index out of range (0..{len(self.names) - 1})")

    def __len__(self) -> int:
        return int(self.start_ns.size)

    @classmethod
    def empty(cls) -> KernelTable:
        z = np.zeros(0, dtype=np.int64)
        return cls(names=[], name_idx=z, start_ns=z, end_ns=z, device=z)

    @classmethod
    def from_records(cls, kernels: Sequence[KernelRecord]) -> KernelTable:
        index: dict[str, int] = {}
        n = len(kernels)

        def col(get: Callable[[KernelRecord], int | None], missing: int) -> np.ndarray | None:
            values = [get(k) for k in kernels]
            if all(v is None for v in values):
                return None
            return np.fromiter((missing if v is None else v for v in values), dtype=np.int64, count=n)

        grids = [k.grid for k in kernels]
        blocks = [k.block for k in kernels]
        regs = [k.registers for k in kernels]
        name_idx = np.fromiter((index.setdefault(k.name, len(index)) for k in kernels), dtype=np.int32, count=n)
        return cls(
            names=list(index),
            name_idx=name_idx,
            start_ns=np.fromiter((k.start_ns for k in kernels), dtype=np.int64, count=n),
            end_ns=np.fromiter((k.end_ns for k in kernels), dtype=np.int64, count=n),
            device=np.fromiter((k.device for k in kernels), dtype=np.int32, count=n),
            launch_ns=col(lambda k: k.launch_ns, -1),
            launch_tid=col(lambda k: k.launch_tid, -1),
            stream=col(lambda k: k.stream, 0),
            correlation_id=col(lambda k: k.correlation_id, 0),
            graph_id=col(lambda k: k.graph_id, 0),
            graph_node_id=col(lambda k: k.graph_node_id, 0),
            grid=None
            if all(g is None for g in grids)
            else np.array([g or (0, 0, 0) for g in grids], dtype=np.int32).reshape(-1, 3),
            block=None
            if all(b is None for b in blocks)
            else np.array([b or (0, 0, 0) for b in blocks], dtype=np.int32).reshape(-1, 3),
            registers=None if all(r is None for r in regs) else np.array([r or 0 for r in regs], dtype=np.int32),
        )

    def records(self) -> list[KernelRecord]:
        """Per-kernel records (slow for millions of kernels: analysis works on the columns)."""

        def opt(col: np.ndarray | None, i: int, missing: int = -1) -> int | None:
            if col is None or int(col[i]) == missing:
                return None
            return int(col[i])

        out = []
        for i in range(len(self)):
            out.append(
                KernelRecord(
                    name=self.names[int(self.name_idx[i])],
                    start_ns=int(self.start_ns[i]),
                    end_ns=int(self.end_ns[i]),
                    device=int(self.device[i]),
                    stream=int(self.stream[i]) if self.stream is not None else 0,
                    correlation_id=int(self.correlation_id[i]) if self.correlation_id is not None else 0,
                    grid=_dim3(self.grid, i),
                    block=_dim3(self.block, i),
                    registers=int(self.registers[i]) if self.registers is not None else None,
                    graph_id=opt(self.graph_id, i, 0),
                    launch_tid=opt(self.launch_tid, i),
                    launch_ns=opt(self.launch_ns, i),
                    graph_node_id=opt(self.graph_node_id, i, 0),
                )
            )
        return out

    def name_of(self, i: int) -> str:
        return self.names[int(self.name_idx[i])]

    def attribution_time(self) -> np.ndarray:
        """When each kernel was asked for: its launch call's start where recorded, else its own start."""
        if self.launch_ns is None:
            return self.start_ns
        if not self.launch_ns.size or int(self.launch_ns.min()) >= 0:  # every launch known: the column itself
            return self.launch_ns
        return np.where(self.launch_ns >= 0, self.launch_ns, self.start_ns)

    def across_pauses(self, slices: Sequence[tuple[int, int]], until: int | None = None) -> np.ndarray:
        """Mask of the kernels of a sampled recording whose end lies past the middle of the pause after the slice they
        started in; ``until``: when the recording stopped (or the window closed), the end of a pause after the last
        slice. CUPTI stamps a kernel still running when the recording paused with the time it resumed (or stopped): on
        the H200 graph kernels launched as the recorder paused came back 1.5 s long, ending ~0.4 ms before the next
        slice's first timestamp, and 0.6 s long after the last slice, ending at the stop (459 of 191,348 in one
        window). A served model's kernel does not outlast half a pause."""
        ordered = merged_spans(slices)  # several recording processes: their slices overlap
        if len(ordered) < 2 or not len(self):
            return np.zeros(len(self), dtype=bool)
        starts = np.array([a for a, _ in ordered], dtype=np.int64)
        ends = np.array([b for _, b in ordered], dtype=np.int64)
        # after the last slice: paused until ``until`` when that is later, else no pause (nothing past it is cut)
        last = until if until is not None and until > ordered[-1][1] else np.iinfo(np.int64).max
        following = np.append(starts[1:], last)
        middle = ends + (following - ends) // 2
        k = np.searchsorted(starts, self.start_ns, side="right") - 1
        inside = k >= 0
        out = np.zeros(len(self), dtype=bool)
        out[inside] = self.end_ns[inside] > middle[k[inside]]
        return out

    def per_slice(
        self,
        slices: Sequence[tuple[int, int]],
        before_ns: int = 10_000_000,
        after_ns: int = 250_000_000,
        by_start: bool = False,
    ) -> tuple[list[int], np.ndarray]:
        """The kernels of a sampled recording counted by the slice they were asked for in (:meth:`attribution_time`
        from ``before_ns`` before a slice starts to ``after_ns`` after it ends: a kernel queued in a slice starts after
        it), and the mask of those asked for in none: CUPTI records work only while a slice runs, so such a record
        carries a time that cannot be right. Slices in the order given; a kernel near two counts for the first.
        ``by_start``: by the kernels' own start instead (where the two disagree, the launch joins are wrong)."""
        t = self.start_ns if by_start else self.attribution_time()
        outside = np.ones(len(self), dtype=bool)
        counts: list[int] = []
        for a, b in slices:
            near = outside & (t >= a - before_ns) & (t <= b + after_ns)
            counts.append(int(near.sum()))
            outside &= ~near
        return counts, outside

    def select(self, mask: np.ndarray | slice) -> KernelTable:
        """The kernels ``mask`` picks (a boolean mask, indices or a slice; names kept as they are); the table itself
        when a mask keeps all of them."""
        if isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == (len(self),) and bool(mask.all()):
            return self  # tables are never changed in place: nothing to copy

        def pick(col: np.ndarray | None) -> np.ndarray | None:
            return None if col is None else col[mask]

        return KernelTable(
            names=self.names,
            name_idx=self.name_idx[mask],
            start_ns=self.start_ns[mask],
            end_ns=self.end_ns[mask],
            device=self.device[mask],
            launch_ns=pick(self.launch_ns),
            launch_tid=pick(self.launch_tid),
            stream=pick(self.stream),
            correlation_id=pick(self.correlation_id),
            graph_id=pick(self.graph_id),
            graph_node_id=pick(self.graph_node_id),
            grid=pick(self.grid),
            block=pick(self.block),
            registers=pick(self.registers),
        )

    def within(self, window: tuple[int, int] | None) -> KernelTable:
        """Kernels asked for inside ``window`` (launch time, else start time; both ends included)."""
        if window is None or not len(self):
            return self
        t = self.attribution_time()
        return self.select((t >= window[0]) & (t <= window[1]))

    def to_json(self) -> bytes:
        return _encode(self)

    @classmethod
    def from_json(cls, data: bytes, path: str = "<kernel table>") -> KernelTable:
        return _validated(data, cls, path)  # type: ignore[no-any-return]

    @classmethod
    def concat(cls, tables: Iterable[KernelTable]) -> KernelTable:
        parts = [t for t in tables if len(t)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        names: dict[str, int] = {}
        idx = []
        for t in parts:
            remap = np.array([names.setdefault(nm, len(names)) for nm in t.names] or [0], dtype=np.int32)
            idx.append(remap[t.name_idx])

        def cat(col: str, missing: int, width: int = 0) -> np.ndarray | None:
            cols = [getattr(t, col) for t in parts]
            if all(c is None for c in cols):
                return None
            filled = [
                c if c is not None else np.full((len(t), width) if width else len(t), missing)
                for c, t in zip(cols, parts, strict=True)
            ]
            return np.concatenate(filled)

        return cls(
            names=list(names),
            name_idx=np.concatenate(idx),
            start_ns=np.concatenate([t.start_ns for t in parts]),
            end_ns=np.concatenate([t.end_ns for t in parts]),
            device=np.concatenate([t.device for t in parts]),
            launch_ns=cat("launch_ns", -1),
            launch_tid=cat("launch_tid", -1),
            stream=cat("stream", 0),
            correlation_id=cat("correlation_id", 0),
            graph_id=cat("graph_id", 0),
            graph_node_id=cat("graph_node_id", 0),
            grid=cat("grid", 0, 3),
            block=cat("block", 0, 3),
            registers=cat("registers", 0),
        )


class KernelTotal(msgspec.Struct, frozen=True):
    """A kernel name's totals from a summary-only source (``nsys stats --report cuda_gpu_kern_sum``)."""

    name: str
    count: int
    total_ns: int
