"""The store seam's connection policy without a server: which failures are lost connections,
how the phase of a call names them, and what ``store.retry`` repeats."""

from __future__ import annotations

import logging

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout
from tenacity import wait_none

from store.errors import (
    CommitUnknown,
    ConnectionLost,
    DatabaseUnavailable,
    connection_level,
    translated,
)
from store.retry import STORE_ATTEMPTS, retried, retrying


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("store.retry.STORE_WAIT", wait_none())
    monkeypatch.setattr("store.retry.FIRST_WAIT_S", 0.0)


@pytest.mark.parametrize(
    ("exc", "lost"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (pg_errors.AdminShutdown("terminating connection due to administrator command"), True),
        (pg_errors.CannotConnectNow("the database system is starting up"), True),
        (pg_errors.ConnectionFailure("connection failure"), True),
        (PoolTimeout("couldn't get a connection after 3.00 sec"), True),
        (pg_errors.QueryCanceled("canceling statement due to statement timeout"), False),
        (pg_errors.DeadlockDetected("deadlock detected"), False),
        (ValueError("not a database error"), False),
    ],
)
def test_only_a_failed_session_counts_as_a_lost_connection(exc: Exception, lost: bool) -> None:
    assert connection_level(exc) is lost


def test_a_loss_is_unknown_until_the_scope_says_nothing_can_have_committed() -> None:
    with pytest.raises(CommitUnknown, match="may have landed"), translated():
        raise psycopg.OperationalError("server closed the connection unexpectedly")
    with pytest.raises(ConnectionLost), translated() as phase:
        phase.quiet()  # inside a transaction, before its COMMIT
        raise psycopg.OperationalError("server closed the connection unexpectedly")
    with pytest.raises(CommitUnknown), translated() as phase:
        phase.quiet()
        phase.committing()  # the COMMIT is in flight
        raise psycopg.OperationalError("server closed the connection unexpectedly")
    with pytest.raises(ConnectionLost), translated():
        raise PoolTimeout("couldn't get a connection")  # nothing was sent
    with pytest.raises(DatabaseUnavailable) as refused, translated() as phase:
        phase.quiet()
        raise pg_errors.QueryCanceled("canceling statement due to statement timeout")
    assert type(refused.value) is DatabaseUnavailable  # refused by the server: not retried


class Flaky:
    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


def test_a_connection_lost_before_the_commit_is_retried_and_each_retry_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call = Flaky(ConnectionLost("a"), ConnectionLost("b"))
    caplog.set_level(logging.WARNING, logger="store.retry")
    assert retrying(call, what="claim a pointer", idempotent=False) == "done"
    assert call.calls == 3
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split(" failed")[0] for m in messages] == [
        f"claim a pointer: attempt 1/{STORE_ATTEMPTS}",
        f"claim a pointer: attempt 2/{STORE_ATTEMPTS}",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_an_unknown_commit_is_handed_back_unless_the_call_is_idempotent() -> None:
    write = Flaky(CommitUnknown("cut off"))
    with pytest.raises(CommitUnknown):
        retrying(write, what="settle", idempotent=False)
    assert write.calls == 1
    read = Flaky(CommitUnknown("cut off"))
    assert retrying(read, what="read", idempotent=True) == "done"
    assert read.calls == 2


def test_past_the_attempts_it_says_so_and_other_errors_are_not_retried() -> None:
    gone = Flaky(*[ConnectionLost("refused")] * STORE_ATTEMPTS)
    with pytest.raises(
        DatabaseUnavailable, match=f"did not answer after {STORE_ATTEMPTS} attempts"
    ):
        retrying(gone, what="read a job", idempotent=True)
    assert gone.calls == STORE_ATTEMPTS
    for error in (ValueError("a bug"), DatabaseUnavailable("refused by the server")):
        once = Flaky(error)
        with pytest.raises(type(error)):
            retrying(once, what="x", idempotent=True)
        assert once.calls == 1


def test_the_decorator_keeps_the_function_and_its_policy() -> None:
    calls: list[int] = []

    @retried("add", idempotent=True)
    def add(a: int, *, b: int) -> int:
        """Adds."""
        calls.append(1)
        if len(calls) == 1:
            raise CommitUnknown("cut off")
        return a + b

    assert add(1, b=2) == 3 and len(calls) == 2
    assert add.__name__ == "add" and add.__doc__ == "Adds."
