"""Run the command a report printed, as printed: its argv, with only output flags appended.

    python3 benchmarks/gpu/run_printed.py REPORT.json VERB[@FINDING_ID] [extra flags...]

Takes the first finding whose command has verb VERB (the findings are ranked: the biggest lever's), or with @FINDING_ID
the first such finding of that id, prints it, and runs ``python3 -m max_profile`` with those arguments plus the extra
flags (--json, --output-dir). Exit code: the command's.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from max_profile.model import Report  # noqa: E402
from max_profile.model.command_text import cli  # noqa: E402


def main() -> int:
    report_path, (verb, _, finding_id), extra = sys.argv[1], sys.argv[2].partition("@"), sys.argv[3:]
    report = Report.load(report_path)
    cmd = next(
        (
            f.command
            for f in report.findings
            if f.command is not None and f.command.verb == verb and finding_id in ("", f.id)
        ),
        None,
    )
    if cmd is None:
        which = f"{finding_id} finding" if finding_id else "finding"
        print(f"no {which} of {report_path} prints a `{verb}` command", file=sys.stderr)
        return 2
    line = cli(cmd).split("   # ")[0]
    print("as printed:", line, file=sys.stderr)
    print(json.dumps({"printed": line}), file=sys.stderr)
    words = shlex.split(line)
    return subprocess.call([sys.executable, "-m", "max_profile", *words[1:], *extra])


if __name__ == "__main__":
    raise SystemExit(main())
