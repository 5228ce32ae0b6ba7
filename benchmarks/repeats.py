"""Every repeat and its spread, and the host's load while the repeats ran: what a benchmark prints beside a median.

A median ratio hides outlier repeats (an H200 once gave 0.79 for one arm with repeats at 315 and 270 tok/s against
~355 in every arm); these helpers print each repeat, the spread of each arm, the per-repeat ratio to the baseline arm of
the same repeat (paired: a slow moment hits both arms of one repeat), and which repeats ran while other processes used
the CPU (max_profile's HostLoadProbe around each repeat).
"""

from __future__ import annotations

import statistics
from typing import Any

from max_profile.collect.live.host_load import HostLoadProbe
from max_profile.model import HostLoad

BUSY_OTHER_CORES = 0.75
"""A repeat during which other processes used this many cores or more is marked (its numbers are suspect)."""


def spread(values: list[float]) -> dict[str, float]:
    """median, min, max and (max - min) / median in % of one arm's repeats."""
    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "spread_pct": 100.0 * (max(values) - min(values)) / med if med else float("nan"),
    }


def paired_ratios(arm: list[float], base: list[float]) -> list[float]:
    """arm / base within each repeat (the two ran back to back)."""
    return [a / b if b else float("nan") for a, b in zip(arm, base, strict=True)]


class RepeatLoad:
    """Host load around each repeat: ``with load.repeat(i): ...``; ``busy`` lists the repeats run on a busy host."""

    def __init__(self) -> None:
        self.loads: dict[int, HostLoad | None] = {}

    def repeat(self, i: int) -> Any:
        owner = self

        class _Ctx:
            def __enter__(self) -> None:
                self.probe = HostLoadProbe()
                self.probe.start()

            def __exit__(self, *exc: object) -> None:
                owner.loads[i] = self.probe.stop()

        return _Ctx()

    def busy(self) -> list[int]:
        return [i for i, load in self.loads.items() if load is not None and load.other_cores >= BUSY_OTHER_CORES]

    def describe(self, i: int) -> str:
        load = self.loads.get(i)
        if load is None:
            return "host load n/a"
        mark = "  BUSY HOST" if load.other_cores >= BUSY_OTHER_CORES else ""
        return f"others {load.other_cores:.2f} of {load.cores} cores{mark}"


def report_arms(tps: dict[str, list[float]], base_of: dict[str, str], load: RepeatLoad) -> dict[str, Any]:
    """Print every arm's repeats, spread and paired ratios; return them for --json."""
    out: dict[str, Any] = {}
    for arm, values in tps.items():
        s = spread(values)
        base = base_of.get(arm)
        line = (
            f"{arm:14s} median {s['median']:8.1f}  min {s['min']:8.1f}  max {s['max']:8.1f}  spread "
            f"{s['spread_pct']:5.1f} %"
        )
        entry: dict[str, Any] = {"all": values, **s}
        if base and base != arm and base in tps:
            ratios = paired_ratios(values, tps[base])
            r = spread(ratios)
            entry.update(
                {
                    "ratio_to_" + base: s["median"] / statistics.median(tps[base]),
                    "paired_ratios": ratios,
                    "paired_ratio_median": r["median"],
                    "paired_ratio_min": r["min"],
                    "paired_ratio_max": r["max"],
                }
            )
            line += (
                f"  ratio to {base}: {entry['ratio_to_' + base]:.4f} (paired per repeat: median "
                f"{r['median']:.4f}, "
                f"{r['min']:.4f}..{r['max']:.4f})"
            )
        print(line, flush=True)
        out[arm] = entry
    busy = load.busy()
    print(f"repeats on a busy host (other processes >= {BUSY_OTHER_CORES} cores): {busy or 'none'}", flush=True)
    out["_busy_repeats"] = busy
    return out
