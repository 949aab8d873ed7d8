"""What a run request means for a worktree's active run (actors.agents.run_host.admit), and
the roster's service keys."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.agents.roster import RosterError, parse_roster
from actors.agents.run_host import Admission, admit
from workflows.runs import Purpose, RunRequest, Supersedes

NOW = datetime(2026, 12, 1, tzinfo=UTC)
owners = st.none() | st.builds(Supersedes, st.sampled_from(["job-a", "job-b"]), st.integers(0, 4))


def request(owner: Supersedes | None) -> RunRequest:
    return RunRequest(
        uuid.uuid4(), "claude", Purpose.RUN, ("-p", "x"), "/work/wt", owner, 60, NOW, NOW, "r"
    )


@given(owners)
def test_a_free_worktree_starts(owner: Supersedes | None) -> None:
    assert admit(None, request(owner)) is Admission.START


@given(owners, owners)
def test_at_most_one_run_per_worktree(
    active: Supersedes | None, incoming: Supersedes | None
) -> None:
    decision = admit(request(active), request(incoming))
    assert decision is not Admission.START  # never a second run beside the active one
    same_key = active is not None and incoming is not None and active.key == incoming.key
    if not same_key:
        assert decision is Admission.BUSY
    elif incoming is not None and active is not None:
        higher = incoming.attempt > active.attempt
        assert decision is (Admission.SUPERSEDE if higher else Admission.STALE)


def test_the_same_run_attaches() -> None:
    one = request(Supersedes("job-a", 1))
    assert admit(one, one) is Admission.ATTACH


def test_the_roster_takes_the_service_keys() -> None:
    table = {"adapter": "claude-code", "invocation": "service", "prefetch": 4, "local": True}
    (spec,) = parse_roster({"c": table}, "vibey.toml")
    assert spec.as_service and spec.prefetch == 4 and spec.queue_wait_seconds == 300


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"adapter": "claude-code", "invocation": "daemon"}, "invocation must be"),
        ({"adapter": "claude-code", "prefetch": 0}, "prefetch must be 1-64"),
        ({"adapter": "claude-code", "prefetch": 65}, "prefetch must be 1-64"),
        ({"adapter": "claude-code", "prefetch": True}, "prefetch must be a whole number"),
        ({"adapter": "scripted", "invocation": "service"}, "a loop service hosts"),
    ],
)
def test_bad_service_keys_are_refused(table: dict[str, object], message: str) -> None:
    with pytest.raises(RosterError, match=message):
        parse_roster({"c": table}, "vibey.toml")
