"""The chaos tests' figures (seeds, tallies, curves), printed at the end of the run.

A chaos test hands each figure to :func:`figure`, which prints it (live under ``-s``) and keeps
it for the test's report. The chaos tier runs in parallel (pytest-xdist), where a worker's
output does not reach the terminal: the report carries the figures to the controller
(``user_properties`` travel with it), and :func:`pytest_terminal_summary` prints them all in a
``chaos figures`` section, test by test, whatever the outcome. ``tests/conftest.py`` imports
the two hooks, so the controller has them too.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

KEY = "chaos figures"
_kept: list[str] = []


def figure(text: str) -> None:
    """Print ``text`` and keep it for this test's report."""
    print(text)
    _kept.append(text.strip("\n"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if _kept:
        report.user_properties.append((KEY, "\n".join(_kept)))
        _kept.clear()
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    shown = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, text in getattr(report, "user_properties", ()):
                if key == KEY:
                    shown.append((report.nodeid, text))
    if not shown:
        return
    terminalreporter.section(KEY)
    for nodeid, text in sorted(shown):
        terminalreporter.write_line(nodeid)
        for line in text.splitlines():
            terminalreporter.write_line(f"  {line}")
