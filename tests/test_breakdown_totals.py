"""Families and top kernels from per-name totals (nsys stats, rocprofv3 stats: no timeline), against a truth summed
here by plain Python: builds of one kernel (hash suffixes) merged under its base name, shares of the whole, the top N
by time, mean duration per launch, unknown names listed by time."""

from __future__ import annotations

from collections import defaultdict

import pytest

from max_profile.analyze.breakdown import breakdown_from_totals
from max_profile.analyze.families import base_name, classify_kernel
from max_profile.model import KernelTotal

TOTALS = [
    KernelTotal(name="gemv_split_k_bf16_128_0123456789abcdef", count=700, total_ns=31_234_567),
    KernelTotal(name="gemv_split_k_bf16_128_fedcba9876543210", count=300, total_ns=12_345_678),  # another build
    KernelTotal(name="sm90_mha_depth128_0123456789abcdef", count=640, total_ns=9_876_543),
    KernelTotal(name="rms_norm_fused_residual_0123456789abcdef", count=1300, total_ns=2_345_678),
    KernelTotal(name="my_custom_thing", count=7, total_ns=1_111_111),
    KernelTotal(name="another_unknown_op", count=3, total_ns=2_222_222),
    KernelTotal(name="zero_time_unknown", count=2, total_ns=0),
]


def test_breakdown_from_totals_every_figure() -> None:
    k = breakdown_from_totals(TOTALS, source="nsys stats")
    total_ns = sum(t.total_ns for t in TOTALS)
    assert (k.source, k.attribution, k.phases) == ("nsys stats", "totals only", [])
    assert k.kernels == sum(t.count for t in TOTALS) and k.kernel_ms == pytest.approx(total_ns / 1e6, rel=1e-12)
    fam_ns: dict[str, float] = defaultdict(float)
    fam_n: dict[str, int] = defaultdict(int)
    for t in TOTALS:
        fam_ns[classify_kernel(t.name)] += t.total_ns
        fam_n[classify_kernel(t.name)] += t.count
    want = sorted(fam_ns, key=lambda f: -fam_ns[f])
    assert [r.family for r in k.families] == want
    for r in k.families:
        assert r.kernels == fam_n[r.family]
        assert r.total_ms == pytest.approx(fam_ns[r.family] / 1e6, rel=1e-12)
        assert r.share_pct == pytest.approx(100 * fam_ns[r.family] / total_ns, rel=1e-12)
    base_ns: dict[str, float] = defaultdict(float)
    base_n: dict[str, int] = defaultdict(int)
    for t in TOTALS:
        base_ns[base_name(t.name)] += t.total_ns
        base_n[base_name(t.name)] += t.count
    assert [r.name for r in k.top_kernels] == sorted(base_ns, key=lambda b: -base_ns[b])
    gemv = k.top_kernels[0]
    assert gemv.name == "gemv_split_k_bf16_128" and gemv.count == 1000 and gemv.family == "gemv"
    for r in k.top_kernels:
        assert r.count == base_n[r.name]
        assert r.total_ms == pytest.approx(base_ns[r.name] / 1e6, rel=1e-12)
        assert r.mean_us == pytest.approx(base_ns[r.name] / base_n[r.name] / 1e3, rel=1e-12)
        assert r.share_pct == pytest.approx(100 * base_ns[r.name] / total_ns, rel=1e-12)
    assert k.unknown_kernel_names == ["another_unknown_op", "my_custom_thing"]  # by time; none of no time


def test_top_n_and_empty_totals() -> None:
    k = breakdown_from_totals(TOTALS, source="rocprofv3 stats", top=2)
    assert [r.name for r in k.top_kernels] == ["gemv_split_k_bf16_128", "mha_depth128"]
    empty = breakdown_from_totals([], source="nsys stats")
    assert (empty.kernels, empty.kernel_ms, empty.families, empty.top_kernels, empty.unknown_kernel_names) == (
        0,
        0.0,
        [],
        [],
        [],
    )
    nothing = breakdown_from_totals([KernelTotal(name="gemv_x", count=4, total_ns=0)], source="nsys stats")
    assert [(r.family, r.kernels, r.share_pct) for r in nothing.families] == [("gemv", 4, 0.0)]
    assert [(r.count, r.share_pct) for r in nothing.top_kernels] == [(4, 0.0)]
