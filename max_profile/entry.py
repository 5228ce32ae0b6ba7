"""The ``max-profile`` command's entry: help is answered from the parser alone, before any verb's code is imported
(``max-profile --help`` and ``max-profile VERB --help`` load argparse, the flag registries and their defaults); every
other command runs :func:`max_profile.cli.main`."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def wants_help(argv: Sequence[str]) -> bool:
    """``-h`` / ``--help`` among the arguments before a ``--`` (after it they are ``max serve``'s own flags)."""
    head = list(argv[: list(argv).index("--")] if "--" in argv else argv)
    return "-h" in head or "--help" in head


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if wants_help(args):
        from max_profile.errors import MaxProfileError
        from max_profile.flags import build_parser

        try:
            build_parser().parse_args(args)  # prints the help and exits 0
        except MaxProfileError as exc:  # an unknown verb or flag beside --help: one line, as without it
            from max_profile.render.terminal import error_lines

            print(error_lines(" ".join(str(exc).split())), file=sys.stderr)
            return exc.exit_code
    from max_profile.cli import main as run

    return run(args)
