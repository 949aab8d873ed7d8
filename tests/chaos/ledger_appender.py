"""A chaos-test ledger appender: a real process appending in small transactions, killed at will.

It appends 1-5 events a transaction (``Ledger.append_on``) to projects chosen at random
among those not full, until ``--lifetime`` transactions committed or every project holds
``--target`` events. A project is full when an append would pass the target: the transaction
that would pass it rolls back (taking its seqs with it) and the appender caps that project at
what is left. Every event's payload carries the transaction's token (``<pid>-<n>``), so the
test can tell which transactions committed.

Protocol on stdout, one line each:
  ``DONE <project> <first> <last> <token>``  a transaction committed seqs first..last
  ``HELD <project> <first> <last> <token>``  (the ``--hold-at``-th transaction) inserted,
      not committed, the project's head row locked; the appender then waits on stdin for
      ``go`` and the test SIGKILLs it here
  ``FULL``  every project is full (then it exits 0); ``BYE``  its lifetime is over (exit 0)
"""

from __future__ import annotations

import argparse
import os
import random
import sys

from psycopg_pool import ConnectionPool

from store.db import transaction
from store.ledger import Ledger
from workflows.ledger import EventKind, NewEvent

KINDS = list(EventKind)


class WouldPassTarget(Exception):
    def __init__(self, left: int) -> None:
        self.left = left


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def batch(rng: random.Random, n: int, token: str) -> list[NewEvent]:
    return [
        NewEvent(
            rng.choice(KINDS),
            {"token": token, "i": i, "text": f"événement {rng.random():.6f}", "n": rng.random()},
        )
        for i in range(n)
    ]


def append_once(
    ledger: Ledger,
    pool: ConnectionPool,
    project: str,
    events: list[NewEvent],
    *,
    target: int,
    token: str,
    hold: bool,
) -> tuple[int, int]:
    """One transaction: append, and commit unless it would pass the target (or is held)."""
    with transaction(pool) as conn:
        written = ledger.append_on(
            conn, project, events, causation_id=token, correlation_id=f"chaos-{project}"
        )
        first, last = written[0].seq, written[-1].seq
        if last > target:
            raise WouldPassTarget(target - first + 1)
        if hold:
            say(f"HELD {project} {first} {last} {token}")
            sys.stdin.readline()  # SIGKILLed here, with the head locked and rows inserted
    return first, last


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--projects", required=True)
    parser.add_argument("--target", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--lifetime", type=int, required=True)
    parser.add_argument("--hold-at", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    cap = {p: 5 for p in args.projects.split(",")}
    pid = os.getpid()
    with ConnectionPool(args.url, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
        ledger = Ledger(pool)
        committed = tried = 0
        while committed < args.lifetime:
            open_projects = sorted(p for p, left in cap.items() if left > 0)
            if not open_projects:
                say("FULL")
                return 0
            project = rng.choice(open_projects)
            n = rng.randint(1, cap[project])
            tried += 1
            token = f"{pid}-{tried}"
            try:
                first, last = append_once(
                    ledger,
                    pool,
                    project,
                    batch(rng, n, token),
                    target=args.target,
                    token=token,
                    hold=committed + 1 == args.hold_at,
                )
            except WouldPassTarget as full:
                cap[project] = min(cap[project], max(full.left, 0))
                continue
            committed += 1
            say(f"DONE {project} {first} {last} {token}")
    say("BYE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
