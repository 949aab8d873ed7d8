"""Routing by the project routes, message priorities by broker capability, and the settings
doctor reports as inert or contradictory (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import pytest

from actors.capabilities import (
    QUORUM_HIGH_PRIORITY,
    MessagePriorities,
    capabilities_for,
    message_priorities,
)
from actors.relay import Router
from actors.topology import QueueNames, consumer_timeout_problem
from store.routes import StaticRoutes
from store.unit_of_work import OutboxRow
from vibey.setting_checks import setting_checks
from vibey.settings import load_settings
from workflows.dispatch import DEFAULT_WAIT_TIERS
from workflows.protocol.kinds import STEP_KINDS

NOW = datetime(2026, 1, 1, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]


def row(project: str, kind: str, *, priority: int = 0, workflow: bool = True) -> OutboxRow:
    return OutboxRow(
        id=1,
        key="k",
        job_id=uuid4(),
        project_id=project,
        dispatch_seq=1,
        kind=kind,
        not_before=NOW,
        priority=priority,
        workflow_id=uuid4() if workflow else None,
    )


def router(routes: StaticRoutes) -> Router:
    return Router(
        names=QueueNames("v"), tiers=DEFAULT_WAIT_TIERS, dedicated=routes, kinds=STEP_KINDS
    )


def test_a_routed_project_goes_to_its_dedicated_queue_and_the_others_to_the_shared_one() -> None:
    routing = router(StaticRoutes(frozenset({"acme"})))
    assert routing.publication(row("acme", "build.implement"), NOW).routing_key == (
        "dedicated.build.acme"
    )
    assert routing.publication(row("beta", "build.implement"), NOW).routing_key == (
        "shared.build.beta"
    )
    assert routing.queue("design.spec", "acme") == "v.jobs.interactive.p.acme"
    assert routing.queue("design.spec", "beta") == "v.jobs.interactive"


def test_the_router_follows_a_changing_route_set() -> None:
    projects: set[str] = set()
    routing = Router(names=QueueNames("v"), tiers=DEFAULT_WAIT_TIERS, dedicated=projects)
    assert not routing.dedicated("acme")
    projects.add("acme")
    assert routing.dedicated("acme")


def test_a_publication_carries_the_workflow_as_correlation_id_and_the_job_priority() -> None:
    pointer = row("acme", "design.spec", priority=3)
    publication = router(StaticRoutes()).publication(pointer, NOW)
    assert publication.correlation_id == str(pointer.workflow_id)
    assert publication.priority == 3
    plain = row("acme", "design.spec", workflow=False)
    assert router(StaticRoutes()).publication(plain, NOW).correlation_id == str(plain.job_id)


@pytest.mark.parametrize(
    ("version", "arguments", "expected"),
    [
        ("3.10.8", {"x-queue-type": "quorum"}, MessagePriorities()),
        ("3.13.7", {"x-queue-type": "quorum"}, MessagePriorities()),
        ("4.0.5", {"x-queue-type": "quorum"}, MessagePriorities(QUORUM_HIGH_PRIORITY, True)),
        ("unknown", {"x-queue-type": "quorum"}, MessagePriorities()),
        ("3.10.8", {"x-max-priority": 10}, MessagePriorities(10)),
        ("3.10.8", {}, MessagePriorities()),
        ("3.10.8", {"x-max-priority": True}, MessagePriorities()),
    ],
)
def test_message_priorities_are_detected_from_the_queue_and_the_version(
    version: str, arguments: dict[str, object], expected: MessagePriorities
) -> None:
    assert message_priorities(arguments, capabilities_for(version)) == expected


def test_job_priorities_map_to_the_levels_a_queue_has() -> None:
    quorum4 = MessagePriorities(QUORUM_HIGH_PRIORITY, binary=True)
    assert [quorum4.of(p) for p in (-1, 0, 1, 9)] == [None, None, 5, 5]
    assert quorum4.levels == 2
    classic = MessagePriorities(4)
    assert [classic.of(p) for p in (0, 2, 9)] == [None, 2, 4]
    assert classic.levels == 5
    ignored = MessagePriorities()
    assert ignored.of(9) is None and ignored.levels == 1 and not ignored.honoured


def problems(env: dict[str, str], tmp: Path, lease: float | None = 7200) -> list[str]:
    settings = load_settings(env, tmp)
    longest = None if lease is None else timedelta(seconds=lease)
    return [c["detail"] for c in setting_checks(settings, longest) if c["status"] != "ok"]


def test_defaults_raise_nothing(tmp_path: Path) -> None:
    assert problems({}, tmp_path) == []


def test_a_consumer_timeout_not_above_the_longest_lease_is_reported(tmp_path: Path) -> None:
    (found,) = problems({"VIBEY_QUEUE_CONSUMER_TIMEOUT": "3600"}, tmp_path)
    assert "consumer_timeout_seconds (3600 s) is not above the longest lease (7200 s)" in found


def test_the_consumer_timeout_must_be_above_the_longest_lease_not_equal_to_it() -> None:
    hour = timedelta(hours=1)
    assert consumer_timeout_problem(hour + timedelta(milliseconds=1), hour) is None
    found = consumer_timeout_problem(hour, hour)
    assert found is not None
    assert "consumer_timeout_seconds (3600 s) is not above the longest lease (3600 s)" in found


def test_the_poll_interval_is_inert_on_the_rabbitmq_backend(tmp_path: Path) -> None:
    (found,) = problems({"VIBEY_QUEUE_POLL_INTERVAL": "2"}, tmp_path)
    assert "inert" in found
    postgres = {"VIBEY_QUEUE_BACKEND": "postgres", "VIBEY_QUEUE_POLL_INTERVAL": "2"}
    assert problems(postgres, tmp_path) == []


def test_rabbitmq_settings_are_inert_on_the_postgres_backend(tmp_path: Path) -> None:
    env = {"VIBEY_QUEUE_BACKEND": "postgres", "VIBEY_QUEUE_DELIVERY_LIMIT": "3"}
    (found,) = problems(env, tmp_path)
    assert "delivery_limit" in found and "inert on the postgres backend" in found
    env = {"VIBEY_QUEUE_BACKEND": "postgres", "VIBEY_QUEUE_RECONCILE_INTERVAL": "3"}
    assert problems(env, tmp_path) == []  # the postgres backend's reaper reads it


def test_a_prefetch_below_the_threads_is_reported(tmp_path: Path) -> None:
    (found,) = problems({"VIBEY_QUEUE_PREFETCH": "2", "VIBEY_WORKER_THREADS": "8"}, tmp_path)
    assert "prefetch 2 is below the worker's 8 threads" in found


def test_compose_mounts_the_rabbitmq_conf_the_native_start_uses() -> None:
    compose = (REPO / "ops" / "local" / "compose.yaml").read_text()
    native = (REPO / "ops" / "local" / "native.sh").read_text()
    assert "../rabbitmq/rabbitmq.conf:/etc/rabbitmq/conf.d/20-vibey.conf:ro" in compose
    assert 'cat "$repo/ops/rabbitmq/rabbitmq.conf"' in native
    assert (REPO / "ops" / "rabbitmq" / "rabbitmq.conf").is_file()
    assert (REPO / "ops" / "local" / "rabbitmq-compose.conf").is_file()
