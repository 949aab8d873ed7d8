"""The ``vibey`` console script: ``vibey --version`` is answered before anything is imported;
every other command line goes to :func:`vibey.cli.main`."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        from vibey import __version__

        print(__version__)
        return 0
    from vibey.cli import main as run

    return run(args)
