"""docs/rules.md and docs/cli.md are generated from the code (the rules registry, the thresholds, the CLI's parser):
each must read exactly as ``python docs/generate.py`` writes it now."""

from __future__ import annotations

import subprocess
import sys

from ..conftest import REPO


def test_the_generated_docs_match_the_code() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "docs" / "generate.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_every_finding_and_threshold_and_verb_is_in_the_docs() -> None:
    from max_profile.analyze.rules import RULES
    from max_profile.analyze.thresholds import Thresholds
    from max_profile.flags import build_parser

    rules = (REPO / "docs" / "rules.md").read_text()
    cli = (REPO / "docs" / "cli.md").read_text()
    assert all(f"| `{fid}` |" in rules for spec in RULES for fid in spec.emits)
    assert all(f"| `{name}` |" in rules for name in Thresholds.__dataclass_fields__ if any(
        name in spec.thresholds for spec in RULES))  # fmt: skip
    verbs = next(a for a in build_parser()._actions if a.dest == "verb").choices
    assert verbs and all(f"## `max-profile {v}`" in cli for v in verbs)
