"""Lost connections retried at the store seam, where that is safe (tenacity).

A call that opens its own connection (a repository's public method) runs under
:func:`retrying` with a bounded, jittered policy and a WARNING per retry,
``<what>: attempt n/N failed (...); retrying``. What is retried depends on where the
connection broke (``store.errors.Phase``):

=====================  ==============================  ==========================================
failure                what may have happened           retried
=====================  ==============================  ==========================================
``ConnectionLost``     nothing committed                always, on a fresh pooled connection
``CommitUnknown``      it may have committed            only for ``idempotent`` calls (reads, and
                                                        writes their constraints or fences make
                                                        harmless to repeat); otherwise raised at
                                                        once, for the caller to read what is true
=====================  ==============================  ==========================================

Past the attempts the call raises :class:`~store.errors.DatabaseUnavailable`, "PostgreSQL did
not answer after N attempts: ...". This is for connections only: a failed *step* is a job
attempt recorded in PostgreSQL, never a retry here.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from store.errors import CommitUnknown, ConnectionLost, DatabaseUnavailable

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

STORE_ATTEMPTS = 5
# 0.05 s, then 0.1 s, 0.2 s, 0.4 s (+ up to 0.1 s of jitter each): under a second of waiting in
# all; each attempt may also wait for the pool to hand out a live connection (``store.pool``).
FIRST_WAIT_S = 0.05
STORE_WAIT = wait_exponential_jitter(multiplier=0.1, max=1.0, jitter=0.1)


def _retryable(idempotent: bool) -> Callable[[BaseException], bool]:
    def check(exc: BaseException) -> bool:
        if isinstance(exc, CommitUnknown):
            return idempotent
        return isinstance(exc, ConnectionLost)

    return check


def _log(what: str, attempts: int) -> Callable[[RetryCallState], None]:
    """The WARNING before each retry; the policy's attempt 1 is the call's attempt 2."""

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        number = state.attempt_number + 1
        log.warning("%s: attempt %d/%d failed (%s); retrying", what, number, attempts, exc)

    return before_sleep


def retrying(
    call: Callable[[], R],
    *,
    what: str,
    idempotent: bool,
    attempts: int = STORE_ATTEMPTS,
) -> R:
    """``call()`` with lost connections retried (see the module docstring). The first attempt
    runs bare: a policy object is built only once it failed."""
    retryable = _retryable(idempotent)
    try:
        return call()
    except (CommitUnknown, ConnectionLost) as exc:
        if not retryable(exc):
            raise  # a commit cut off: the caller resolves it by reading what is true
        log.warning("%s: attempt 1/%d failed (%s); retrying", what, attempts, exc)
        time.sleep(FIRST_WAIT_S)
    policy = Retrying(
        retry=retry_if_exception(retryable),
        stop=stop_after_attempt(attempts - 1),
        wait=STORE_WAIT,
        before_sleep=_log(what, attempts),
        reraise=True,
    )
    try:
        return policy(call)
    except (CommitUnknown, ConnectionLost) as exc:
        if isinstance(exc, CommitUnknown) and not idempotent:
            raise
        cause = exc.__cause__ or exc
        raise DatabaseUnavailable(
            f"PostgreSQL did not answer after {attempts} attempts ({what}): {_first_line(cause)}"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def retried(
    what: str, *, idempotent: bool, attempts: int = STORE_ATTEMPTS
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """The decorator form of :func:`retrying`, for a method that opens its own connection."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            return retrying(
                lambda: fn(*args, **kwargs), what=what, idempotent=idempotent, attempts=attempts
            )

        return wrapper

    return decorate
