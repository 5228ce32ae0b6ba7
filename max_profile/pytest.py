"""pytest plugin: profile a block inside a test, and fail the test on a significant regression against a saved baseline.

    def test_decode_speed(max_profile, pipeline):
        with max_profile.profile(pipeline) as prof:
            generate(pipeline, ...)
        max_profile.check(prof, "baselines/decode.json.gz", fail_above=5)

``check`` compares the run with the baseline raw capture through ``max-profile diff`` (Mann-Whitney U over
per-step times: one noisy step never fails a test) and fails with the verdict lines when a significant
slowdown exceeds ``fail_above`` percent, or when the runs are not comparable (another model, GPU, MAX
version...). A missing baseline is written and the test passes, saying so; ``pytest
--max-profile-update-baselines`` rewrites every baseline a test checks. Registered through the
``pytest11`` entry point when max-profile is installed.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--max-profile-update-baselines",
        action="store_true",
        default=False,
        help="max_profile: write the current run as the baseline of every check() instead of comparing",
    )


class MaxProfileFixture:
    """What the ``max_profile`` fixture gives a test: ``profile(...)`` and ``check(...)``."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self.update = bool(request.config.getoption("--max-profile-update-baselines"))

    def profile(self, target: Any, **kwargs: Any) -> Any:
        """``max_profile.profile(target, **kwargs)``: use it as ``with max_profile.profile(p) as prof:``."""
        from max_profile.session import profile  # lazy: the plugin loads in every pytest run

        return profile(target, **kwargs)

    def _path(self, baseline: str | Path) -> Path:
        path = Path(baseline)
        return path if path.is_absolute() else Path(str(self._request.path)).parent / path

    def check(
        self,
        run: Any,
        baseline: str | Path,
        *,
        fail_above: float = 5.0,
        alpha: float = 0.01,
        force: bool = False,
        inconclusive: str = "skip",
    ) -> Any:
        """Compare ``run`` (a profile session, a RawCapture or a saved capture's path) with the baseline; fail on a
        regression. A comparison that could not judge (other load on the host, too few steps) skips the test with why
        (``inconclusive="fail"``: fails it; ``"pass"``: lets it pass)."""
        return assert_no_regression(
            run,
            self._path(baseline),
            fail_above=fail_above,
            alpha=alpha,
            force=force,
            update=self.update,
            inconclusive=inconclusive,
        )


def _raw(run: Any) -> Any:
    from max_profile.model import RawCapture  # lazy: the plugin loads in every pytest run

    if isinstance(run, RawCapture):
        return run
    if isinstance(run, (str, Path)):
        return RawCapture.load(str(run))
    raw = getattr(run, "raw_capture", None)
    if raw is None:
        raise TypeError(f"check() needs a profile() session, a RawCapture or a path; got {type(run).__name__}")
    return raw


def assert_no_regression(
    run: Any,
    baseline: str | Path,
    *,
    fail_above: float = 5.0,
    alpha: float = 0.01,
    force: bool = False,
    update: bool = False,
    inconclusive: str = "skip",
) -> Any:
    """The diff of ``run`` against ``baseline``; ``pytest.fail`` with its verdicts on a regression or an incomparable
    pair; an inconclusive comparison (nothing could be judged, or a figure that could not be judged got worse past the
    threshold) is ``pytest.skip`` with why by default, ``pytest.fail`` with ``inconclusive="fail"``, nothing with
    ``"pass"``.

    Returns the :class:`~max_profile.analyze.diff.DiffResult`, or None when the baseline was (re)written.
    """
    from max_profile.analyze.diff import diff_reports  # lazy: the plugin loads in every pytest run
    from max_profile.analyze.report import build_report  # lazy: the plugin loads in every pytest run
    from max_profile.model import RawCapture  # lazy: the plugin loads in every pytest run

    if inconclusive not in ("skip", "fail", "pass"):
        raise ValueError(f"inconclusive={inconclusive!r}: skip, fail or pass")
    current = _raw(run)
    path = Path(baseline)
    if update or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        current.save(str(path))
        warnings.warn(f"max_profile: baseline {'updated' if update else 'written'}: {path}", stacklevel=2)
        return None
    base = RawCapture.load(str(path))
    result = diff_reports(
        build_report(base),
        build_report(current),
        a_label=str(path),
        b_label="this run",
        fail_above_pct=fail_above,
        alpha=alpha,
        force=force,
        a_raw=base,
        b_raw=current,
    )
    if not result.comparable and not force:
        pytest.fail(
            "max_profile: the run is not comparable with its baseline: " + "; ".join(result.reasons), pytrace=False
        )
    if result.regression:
        pytest.fail(
            "max_profile: significant regression against " + str(path) + "\n" + "\n".join(result.verdicts),
            pytrace=False,
        )
    if result.outcome == "inconclusive" and inconclusive != "pass":
        said = f"max_profile: inconclusive against {path}: " + "; ".join(result.inconclusive)
        if inconclusive == "fail":
            pytest.fail(said, pytrace=False)
        pytest.skip(said)
    return result


@pytest.fixture
def max_profile(request: pytest.FixtureRequest) -> MaxProfileFixture:
    return MaxProfileFixture(request)
