"""The controller side of the worker hook (``collect/server/worker_hook/sitecustomize.py``): CUPTI inside ``max
serve``'s model worker, driven through files in one folder (no socket, nothing the server itself has to know).

    hook = WorkerHook(folder)                     # the server starts with hook.env() in its environment
    line = hook.prepare(server_alive)             # after /health: the worker imports CUPTI now, not in the window
    hook.start(1); hook.wait_started(1, alive)    # one window (several per server: 2, 3, ...): open it once it records
    hook.start(2, WindowRecording(share=0.25))    # or: slices of 0.5 s, a quarter of the window
    ...; hook.stop(1)
    kernels, coverage = hook.read(1, window)      # its kernels (host clock), how much of it was recorded
    hook.quit()                                   # the hook threads end
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from max_profile.model import KernelTable, Step

HOOK_DIR = Path(__file__).parent / "worker_hook"


@dataclass(frozen=True)
class WindowRecording:
    """What the model worker records in one server window."""

    share: float = 1.0
    """The share of the window recorded, in slices of ``slice_s`` with the recorder paused between them (1: all)."""
    slice_s: float = 0.5
    kernels: bool = True
    """CUPTI's kernels (False: the steps only, the hook's own cost)."""
    options: tuple[str, ...] = ()
    """Recorder options for measurements (``zeroed-buffers``)."""
    lead_s: float = 0.0
    """The first slice this much longer: the controller's settle before its window opens, so the window starts with a
    whole recorded slice (a window shorter than the pause between slices would otherwise record nothing)."""

    def message(self) -> dict[str, object]:
        """The start request as the hook reads it (only what differs from recording everything)."""
        out: dict[str, object] = {}
        if self.share < 1:
            out.update(share=self.share, slice_s=self.slice_s)
            if self.lead_s > 0:
                out["lead_s"] = self.lead_s
        if not self.kernels:
            out["kernels"] = False
        if self.options:
            out["options"] = list(self.options)
        return out


@dataclass(frozen=True)
class WindowCoverage:
    """What the worker recorded of one window: the part of it covered, dropped records, CUPTI callback time, notes."""

    covered_s: float
    window_s: float
    dropped: int
    callback_s: float | None
    api_records: int
    collector: str
    notes: tuple[str, ...] = ()
    start_s: float | None = None
    """Seconds CUPTI's enable took in the worker (subscribe, activity on), spent before the window opened."""
    slices: tuple[tuple[int, int], ...] = ()
    """The spans (host perf_counter ns, inside the window) in which kernels were recorded."""
    sampled: bool = False
    """Whether recording ran in slices (a share of the window), paused between them."""
    recorded_kernels: int | None = None
    """The kernels the worker kept from its whole recording, inside the window or not (the first slice runs before
    the window opens); None from an older hook."""
    per_slice: tuple[int, ...] = ()
    """Those kernels by the recorded slice they were asked for in (every slice of the recording, in order)."""
    outside_slices: int = 0
    """Kernel records the worker left out for a time outside every recorded slice (see ``KernelTable.per_slice``)."""
    per_slice_by_start: tuple[int, ...] = ()
    """The same kernels by the slice their own start falls in: unlike ``per_slice`` where launch joins were wrong."""

    def describe(self) -> str:
        text = f", recorded {self.covered_s:.1f} of {self.window_s:.1f} s"
        if self.sampled:
            text += f" in {len(self.slices)} slice(s)"
        if self.dropped:
            text += f", {self.dropped} dropped"
        if self.outside_slices:
            text += f", {self.outside_slices} left out for a time outside every slice"
        if self.collector == "CuptiKernelCollector":
            text += ", cupti-python per-record callbacks"
        if self.callback_s is not None:
            text += f", {self.callback_s:.2f} s in CUPTI callbacks for {self.api_records} API records"
        if self.start_s is not None:
            text += f", CUPTI enable {1000 * self.start_s:.0f} ms before the window"
        return text


def _hook_path() -> list[str]:
    """The hook's folder, and the folder max_profile itself is imported from where that is not a site-packages (an
    editable install: the server's worker, spawned by MAX, does not always run the installer's import hook)."""
    root = Path(__file__).resolve().parents[3]
    return [str(HOOK_DIR)] + ([] if root.name in ("site-packages", "dist-packages") else [str(root)])


def _ready_doc(path: Path) -> dict[str, object]:
    """What a ``ready-<pid>`` file says the process records (an older hook wrote it empty: CUPTI only)."""
    try:
        doc = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


class WorkerHook:
    """One server's hook folder (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def env(self, library: str | None, launches: bool, kernels: bool = True) -> dict[str, str]:
        """What the server's environment needs: the folder, the hook on PYTHONPATH, the C recorder built here once;
        ``kernels`` False: the worker stamps its steps only (no CUPTI)."""
        env = {
            "MAX_PROFILE_WORKER_CUPTI_DIR": str(self.folder),
            "PYTHONPATH": os.pathsep.join([*_hook_path(), os.environ.get("PYTHONPATH", "")]),
            # launch records tie kernels to the steps that launched them (the worker's stamped steps, MAX's scheduler
            # ranges)
            "MAX_PROFILE_WORKER_CUPTI_LAUNCHES": "1" if launches else "0",
            "MAX_PROFILE_WORKER_KERNELS": "1" if kernels else "0",
        }
        if library:
            env["MAX_PROFILE_CUPTI_RING_LIB"] = library
        return env

    def prepare(self, alive: Callable[[], bool], timeout_s: float = 30.0) -> str:
        """Ask the hooks to import CUPTI now and wait for one to be ready; the answer is a progress line.

        Processes without the CUDA driver loaded (API server, metrics worker) skip; the model worker answers.
        """
        (self.folder / "prepare").touch()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and alive():
            ready = sorted(self.folder.glob("ready-*"))
            if ready:
                said = []
                for path in ready:
                    what = _ready_doc(path)
                    parts = [
                        p
                        for p, on in (
                            ("CUPTI", what.get("kernels", True)),
                            (f"{what.get('pipeline') or 'pipeline'} steps", what.get("steps")),
                        )
                        if on
                    ]
                    said.append(f"process {path.name.removeprefix('ready-')}: {' and '.join(parts) or 'nothing'}")
                return "worker hook ready (" + "; ".join(said) + ")"
            failed = list(self.folder.glob("unavailable-*.txt"))
            if failed:
                return (
                    f"CUPTI unavailable in the model worker ({failed[0].read_text().strip()}); kernels will be missing"
                )
            time.sleep(0.05)
        skipped = len(list(self.folder.glob("skipped-*.txt")))
        return (
            f"no process answered as CUPTI-ready within {timeout_s:g} s ({skipped} without the CUDA driver "
            "skipped); kernels may be missing"
        )

    def ready(self) -> bool:
        return any(self.folder.glob("ready-*"))

    def read_steps(
        self, window: int, span: tuple[int, int], alive: Callable[[], bool] = lambda: True, timeout_s: float = 20.0
    ) -> list[Step]:
        """The steps the hooked pipeline(s) ran in window ``window`` that began inside ``span`` (host clock), in time
        order. Waits (up to ``timeout_s``, while the server lives) for the file of every process that said it records
        steps: each writes it after the window's stop, before its kernels."""
        expected = {p.name.removeprefix("ready-") for p in self.folder.glob("ready-*") if _ready_doc(p).get("steps")}
        deadline = time.monotonic() + timeout_s
        while expected and time.monotonic() < deadline and alive():
            if expected <= {p.name.split("-")[1] for p in self.folder.glob(f"steps-*-{window}.json")}:
                break
            time.sleep(0.05)
        steps: list[Step] = []
        for path in sorted(self.folder.glob(f"steps-*-{window}.json")):
            try:
                steps += msgspec.json.decode(path.read_bytes(), type=list[Step])
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                continue
        inside = sorted((s for s in steps if span[0] <= s.start_ns <= span[1]), key=lambda s: s.start_ns)
        return [msgspec.structs.replace(s, index=i) for i, s in enumerate(inside)]

    def start(self, window: int, recording: WindowRecording = WindowRecording()) -> None:
        """Ask for window ``window``'s recording."""
        target = self.folder / f"start-{window}"
        tmp = self.folder / f".start-{window}"
        tmp.write_text(json.dumps(recording.message()))
        os.replace(tmp, target)  # whole or not at all: the hook reads it as soon as it exists

    def wait_started(self, window: int, alive: Callable[[], bool], timeout_s: float = 10.0) -> bool:
        """Wait until every process that answered ready has started recording window ``window`` (or said it cannot);
        False when one had not within ``timeout_s`` (or the server died): the window then opens without waiting
        longer."""
        ready = {p.name.removeprefix("ready-") for p in self.folder.glob("ready-*")}
        deadline = time.monotonic() + timeout_s
        while ready and alive():
            answered = {p.name.split("-")[1] for p in self.folder.glob(f"started-*-{window}")}
            answered |= {p.name.split("-")[1].removesuffix(".txt") for p in self.folder.glob("unavailable-*.txt")}
            if ready <= answered:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return not ready

    def stop(self, window: int) -> None:
        (self.folder / f"stop-{window}").touch()

    def quit(self) -> None:
        (self.folder / "quit").touch()

    def read(
        self, window: int, span: tuple[int, int], alive: Callable[[], bool], timeout_s: float = 20.0
    ) -> tuple[KernelTable | None, WindowCoverage | None]:
        """The kernels of window ``window`` inside ``span`` (host clock) from every recording process, and the coverage
        of the one that recorded the most; (None, None) when no process wrote them within ``timeout_s`` (or the server
        died).

        Every process that answered ready writes its file (the API server can have the CUDA driver loaded and record
        nothing): the read waits for all of them, not for the first."""
        deadline = time.monotonic() + timeout_s
        ready = {p.name.removeprefix("ready-") for p in self.folder.glob("ready-*")}

        ready = {
            pid for pid in ready if _ready_doc(self.folder / f"ready-{pid}").get("kernels", True)
        }  # steps-only processes write no kernels

        def written() -> set[str]:
            return {p.name.split("-")[1] for p in self.folder.glob(f"kernels-*-{window}.json")}

        while time.monotonic() < deadline and alive() and ready and not ready <= written():
            time.sleep(0.1)
        dumps = sorted(self.folder.glob(f"kernels-*-{window}.json"))
        if not dumps:
            return None, None
        whole = {p.name.split("-")[1]: KernelTable.from_json(p.read_bytes(), str(p)) for p in dumps}
        tables = {pid: t.within(span) for pid, t in whole.items()}
        # the model worker, also where none of its kernels fell inside the window (not the API server's empty file)
        busiest = max(tables, key=lambda pid: (len(tables[pid]), len(whole[pid])))
        return KernelTable.concat(tables.values()), self._coverage(window, span, busiest)

    def _coverage(self, window: int, span: tuple[int, int], pid: str = "*") -> WindowCoverage | None:
        for path in sorted(self.folder.glob(f"coverage-{pid}-{window}.json")):
            try:
                c = json.loads(path.read_text())
                recorded = (
                    [(int(a), int(b)) for a, b in c.get("slices") or [(c["started_ns"], c["stopped_ns"])]]
                    if c.get("kernels_recorded", True)
                    else []
                )  # steps only: no kernels recorded at all
            except (OSError, ValueError, KeyError, TypeError):
                continue
            inside = tuple((max(a, span[0]), min(b, span[1])) for a, b in recorded if min(b, span[1]) > max(a, span[0]))
            callback, start = c.get("callback_s"), c.get("start_s")
            return WindowCoverage(
                start_s=float(start) if isinstance(start, (int, float)) else None,
                slices=inside,
                sampled=float(c.get("share") or 1.0) < 1,
                covered_s=sum(b - a for a, b in inside) / 1e9,
                window_s=(span[1] - span[0]) / 1e9,
                dropped=int(c.get("dropped") or 0),
                callback_s=float(callback) if isinstance(callback, (int, float)) else None,
                api_records=int(c.get("api_records") or 0),
                collector=str(c.get("collector", "")),
                notes=tuple(str(n) for n in c.get("notes", [])),
                recorded_kernels=int(c["kernels"]) if isinstance(c.get("kernels"), int) else None,
                per_slice=tuple(int(n) for n in c.get("per_slice") or ()),
                outside_slices=int(c.get("outside_slices") or 0),
                per_slice_by_start=tuple(int(n) for n in c.get("per_slice_by_start") or ()),
            )
        return None
