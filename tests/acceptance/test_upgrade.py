"""An upgrade by the book: two checkouts, one database.

The previous release's code (this branch's base on ``main``, or the commit before ``HEAD``
once merged; ``VIBEY_TEST_PREVIOUS_RELEASE`` names another) is unpacked with ``git archive``
into a directory of its own and run with ``PYTHONPATH`` pointing at it: it migrates an empty
database and runs a worker fleet. While that fleet completes workflows, this release's
``vibey migrate`` runs against the same database, then this release's worker joins the old
one (a rollout's overlap); the workflows started before and after all complete, and ``vibey
doctor --probe`` (the pods' readiness) stays green for both releases throughout.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.stack import VIBEY, Stack, declare_topology, stack
from tests.amqp_fixtures import Amqp

REPO = Path(__file__).resolve().parents[2]
THREE_STEPS = {
    "VIBEY_WORKFLOW_DEFINITIONS": "tests.tiny_definition:THREE_STEPS",
    "VIBEY_WORKER_HANDLERS": "tests.tiny_definition:THREE_STEP_HANDLERS",
}


def git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else ""


def previous_release() -> str:
    named = os.environ.get("VIBEY_TEST_PREVIOUS_RELEASE")
    if named:
        return named
    head = git("rev-parse", "HEAD")
    base = git("merge-base", "HEAD", "main")
    return base if base and base != head else git("rev-parse", "HEAD~1")


RELEASED = ("actors", "store", "workflows", "vibey", "migrations", "tests", "examples", "ops")


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not git("rev-parse", "HEAD"):
        pytest.fail("needs a git checkout to unpack the previous release from", pytrace=False)
    rev = previous_release()
    assert rev, "no previous release: set VIBEY_TEST_PREVIOUS_RELEASE"
    archive = subprocess.run(
        # The code and what it reads (not the checkout's stray files, a link among them).
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, *RELEASED],
        capture_output=True,
        check=True,
    ).stdout
    target = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
            tar.extractall(target, filter="data")
        else:  # an archive git just wrote of this repository's own tree
            tar.extractall(target)
    where = subprocess.run(
        [sys.executable, "-c", "import store.migrate; print(store.migrate.__file__)"],
        env={**os.environ, "PYTHONPATH": str(target)},
        cwd=target.parent,  # not this checkout: the current directory comes first
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(target)), where  # the previous release's code, not this one
    return target


def count(pg_url: str, query: str) -> int:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(query.encode()).fetchone()
    return int(row[0]) if row else 0


class TwoReleases:
    def __init__(self, e2e: Stack, previous: Path) -> None:
        self.e2e = e2e
        self.previous = previous

    def run(self, *args: str, old: bool) -> subprocess.CompletedProcess[str]:
        env = self.e2e.env | THREE_STEPS
        env.pop("PYTHONPATH", None)
        if old:
            env["PYTHONPATH"] = str(self.previous)
        return subprocess.run(
            [VIBEY, *args],
            env=env,
            cwd=self.e2e.workspace.parent,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def ready(self) -> dict[str, int]:
        """Each release's readiness probe exit code."""
        return {
            release: self.run("doctor", "--probe", old=release == "previous").returncode
            for release in ("previous", "this")
        }

    def start(self, names: list[str]) -> None:
        for name in names:
            done = self.run("workflow", "start", name, "--definition", "three-steps", old=True)
            assert done.returncode == 0, done.stderr


@pytest.fixture
def releases(
    empty_pg_url: str, amqp: Amqp, tmp_path: Path, previous: Path
) -> Iterator[TwoReleases]:
    declare_topology(empty_pg_url, amqp)
    with stack(empty_pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        yield TwoReleases(running, previous)


def test_this_releases_migrations_apply_under_a_previous_release_fleet(
    releases: TwoReleases, empty_pg_url: str
) -> None:
    e2e = releases.e2e
    done = releases.run("migrate", old=True)
    assert done.returncode == 0, done.stderr
    e2e.extra_env.update(THREE_STEPS, PYTHONPATH=str(releases.previous))
    fleet = e2e.start_worker(processes=1, threads=4)
    releases.start([f"before{n}" for n in range(4)])
    # This release's pods are ready once its migrations are applied: before, only when it
    # ships none the previous release lacks (its probe says the schema is behind).
    behind = {m.name for m in (REPO / "migrations").glob("*.sql")} - {
        m.name for m in (releases.previous / "migrations").glob("*.sql")
    }
    assert releases.ready() == {"previous": 0, "this": 1 if behind else 0}

    done = releases.run("migrate", old=False)  # this release's Job, mid-rollout
    assert done.returncode == 0, done.stderr
    assert (
        count(
            empty_pg_url,
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'schema_migrations' AND column_name = 'serves_from'",
        )
        == 1
    )  # the schema did change under the running fleet

    e2e.extra_env.pop("PYTHONPATH")
    rolled_in = e2e.start_worker(processes=1, threads=2)  # this release's pods roll in beside
    releases.start([f"after{n}" for n in range(4)])
    probes = [releases.ready()]
    deadline = time.monotonic() + 120
    completed = "SELECT count(*) FROM workflow WHERE status = 'completed'"
    while count(empty_pg_url, completed) < 8:
        assert fleet.poll() is None, e2e.worker_log()
        assert time.monotonic() < deadline, e2e.worker_log()
        probes.append(releases.ready())
        time.sleep(0.5)
    assert all(p == {"previous": 0, "this": 0} for p in probes), probes
    assert count(empty_pg_url, "SELECT count(*) FROM workflow") == 8
    assert count(empty_pg_url, "SELECT count(*) FROM job WHERE state = 'leased'") == 0
    for worker in (fleet, rolled_in):  # the old fleet drains out, as a rollout ends
        assert worker.poll() is None, e2e.worker_log()
        e2e.kill_worker(worker, signal.SIGTERM)
        assert worker.returncode == 0, e2e.worker_log()
