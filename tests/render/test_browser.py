"""The HTML report in a real browser: Debian's Chromium driven headless by Playwright (its own browser download is
not used). For reports from every source: no console error, no network request, every section present, a drawn
plot (canvas, not blank) in each section that has data. .ci/run installs chromium and sets
MAX_PROFILE_REQUIRE_BROWSER=1, so there a missing browser fails instead of skipping."""

from __future__ import annotations

import gzip
import io
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from max_profile.analyze.report import build_report
from max_profile.collect.readers.ncu import ncu_capture
from max_profile.collect.readers.sources import import_trace
from max_profile.model import KernelBreakdown, RawCapture, Report
from max_profile.render.html import SECTIONS, render_html

from ..conftest import DATA, run_cli

H200 = DATA / "gpu"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = Path(os.environ.get("MAX_PROFILE_SCREENSHOTS", "")) if os.environ.get("MAX_PROFILE_SCREENSHOTS") else None

if not CHROMIUM and not os.environ.get("MAX_PROFILE_REQUIRE_BROWSER"):
    pytest.skip("no chromium on this machine (apt-get install chromium); CI installs it", allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Any:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM, "chromium is required here (MAX_PROFILE_REQUIRE_BROWSER=1): apt-get install -y chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield b
        b.close()


def _expected_plots(report: Report) -> set[str]:
    want = set()
    if any(s.batch_size for s in report.steps):
        want.add("steps")
    if report.utilization is not None and getattr(report.utilization, "samples", None):
        want.add("utilization")
    if isinstance(report.kernels, KernelBreakdown):
        want |= {"families", "kernels"}
    if report.kernel_analyses:
        want.add("ncu")
    if report.serve is not None and report.serve.itl_histogram is not None:
        want.add("serve")
    return want


def _check_page(browser: Any, html: str, tmp_path: Path, name: str, want: set[str]) -> None:
    from PIL import Image, ImageStat

    path = tmp_path / f"{name}.html"
    path.write_text(html)
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    for section in want - {"kernels"}:
        page.locator(f"section#{section} canvas").first.wait_for(state="attached", timeout=20_000)
    page.wait_for_timeout(500)
    assert errors == [], errors
    assert [u for u in requests if not u.startswith("file:")] == []
    for section in SECTIONS:
        assert page.locator(f"section#{section}").count() == 1, section
    # the first screen (900 px) holds the top verdict: its title, what it buys and its command
    first = page.locator("section#verdicts .finding").first
    if first.count():
        box = first.bounding_box()
        assert box is not None and box["y"] < 900, box
        assert page.locator("section#verdicts").evaluate("e => e.getBoundingClientRect().top") < 200
    for section in want:
        element = page.locator(f"section#{section}")
        if section == "kernels":  # a Bokeh DataTable: rows of text, sortable
            assert page.locator("section#kernels .slick-row").count() > 3
            continue
        assert page.locator(f"section#{section} canvas").count() > 0, section
        image = Image.open(io.BytesIO(element.screenshot()))
        assert max(ImageStat.Stat(image.convert("L")).stddev) > 10, f"{name}: section {section} looks blank"
    if SHOTS:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    page.close()


def test_cpu_in_process_report(browser: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    """`max-profile run --html` on the CPU (a subprocess: Playwright's event loop owns this one)."""
    res = run_cli(
        "run",
        "--model-path",
        str(tiny_model_dir),
        "--devices",
        "cpu",
        "--max-new-tokens",
        "24",
        "--kernels",
        "off",
        "--json",
        str(tmp_path / "r.json"),
        "--html",
        str(tmp_path / "r.html"),
    )
    assert res.returncode == 0, res.stderr[-2000:]
    report = Report.load(str(tmp_path / "r.json"))
    assert "steps" in _expected_plots(report)
    _check_page(browser, (tmp_path / "r.html").read_text(), tmp_path, "cpu_in_process", _expected_plots(report))


@pytest.mark.parametrize(
    "name",
    [
        "h200_llama1.75b_custom_architectures/arch_c_raw.json.gz",
        "h200_llama5b_cupti_recorder/serve_util_raw.json.gz",
        "h200_llama5b_cupti_recorder/run_graphs_raw.json.gz",
    ],
)
def test_h200_reports(browser: Any, tmp_path: Path, name: str) -> None:
    report = build_report(RawCapture.load(str(H200 / name)))
    want = _expected_plots(report)
    assert want >= ({"serve"} if "serve" in name else {"steps", "utilization", "families", "kernels"})
    _check_page(browser, render_html(report), tmp_path, name.replace("/", "_").split(".")[0], want)


def test_nsys_import_report(browser: Any, tmp_path: Path) -> None:
    db = tmp_path / "small.sqlite"
    db.write_bytes(gzip.decompress((H200 / "h200_llama180m_host_bound/small_nsys.sqlite.gz").read_bytes()))
    report = build_report(import_trace(str(db)))
    _check_page(browser, render_html(report), tmp_path, "nsys_import", _expected_plots(report))


def test_ncu_report(browser: Any, tmp_path: Path) -> None:
    report = build_report(
        ncu_capture(
            str(H200 / "h200_llama180m_host_bound/small_ncu_mha_details.csv"),
            str(H200 / "h200_llama180m_host_bound/small_ncu_mha_raw.csv.gz"),
        )
    )
    assert "ncu" in _expected_plots(report)
    _check_page(browser, render_html(report), tmp_path, "ncu", _expected_plots(report))


def test_diff_page(browser: Any, tmp_path: Path) -> None:
    from max_profile.analyze.diff import diff_reports
    from max_profile.render.diff_html import render_diff_html

    a = build_report(RawCapture.load(str(H200 / "h200_llama1.75b_custom_architectures/arch_a_raw.json.gz")))
    c = build_report(RawCapture.load(str(H200 / "h200_llama1.75b_custom_architectures/arch_c_raw.json.gz")))
    page = render_diff_html(diff_reports(a, c, force=True))
    path = tmp_path / "diff.html"
    path.write_text(page)
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.goto(path.as_uri())
    tab.locator("section#chart canvas").first.wait_for(state="attached", timeout=20_000)
    assert errors == [] and tab.locator("section#verdicts li").count() > 3
    tab.close()
