"""A run's output read as progress lines, and a job's abandoned runs counted once each."""

from __future__ import annotations

import uuid
from pathlib import Path

from actors.agents.run_client import record_abandoned
from actors.agents.service import _new_lines


def test_whole_lines_only_until_the_run_ends(tmp_path: Path) -> None:
    out = tmp_path / "run.stdout"
    assert _new_lines(out, 0, b"", False) == ([], 0, b"")  # not written yet
    out.write_bytes(b'{"a": 1}\n\n{"b"')
    lines, offset, partial = _new_lines(out, 0, b"", False)
    assert lines == ['{"a": 1}'] and partial == b'{"b"'
    with out.open("ab") as more:
        more.write(b': 2}\n{"c": 3}')
    lines, offset, partial = _new_lines(out, offset, partial, False)
    assert lines == ['{"b": 2}'] and partial == b'{"c": 3}'
    lines, offset, partial = _new_lines(out, offset, partial, True)  # ended: the rest too
    assert lines == ['{"c": 3}'] and partial == b""
    assert _new_lines(out, offset, partial, True)[0] == []


def test_a_job_s_abandoned_runs_are_counted_once_each(tmp_path: Path) -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    assert record_abandoned(tmp_path, "job-1", first, "gone") == 1
    assert record_abandoned(tmp_path, "job-1", first, "gone") == 1  # the same run again
    assert record_abandoned(tmp_path, "job-2", second, "gone") == 1  # another job's
    assert record_abandoned(tmp_path, "job-1", second, "drained") == 2
