"""The RabbitMQ topology: names and arguments (pure), then declarations on a real broker."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pika
import pika.exceptions
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.capabilities import BrokerCapabilities, capabilities_for, detect, parse_version
from actors.topology import QueueNames, Topology, TopologyMismatch
from tests.amqp_fixtures import Amqp

TIERS = {"w1s": timedelta(seconds=1), "w5s": timedelta(seconds=5)}
ON_310 = capabilities_for("3.10.8")
ON_43 = capabilities_for("4.3.0")


def topology(names: QueueNames, **kwargs: Any) -> Topology:
    kwargs.setdefault("dedicated_projects", ("vip",))
    return Topology(names, TIERS, ("build", "review"), **kwargs)


# -- names and arguments (no broker) --------------------------------------------------------------


def test_names_under_the_default_prefix() -> None:
    names = QueueNames()
    assert names.work_exchange == "vibey.jobs"
    assert names.work_queue("build") == "vibey.jobs.build"
    assert names.work_queue("build", "demo") == "vibey.jobs.build.p.demo"
    assert names.routing_key("build", "demo", dedicated=False) == "shared.build.demo"
    assert names.routing_key("build", "demo", dedicated=True) == "dedicated.build.demo"
    assert names.binding_key("build") == "shared.build.*"
    assert names.binding_key("build", "demo") == "dedicated.build.demo"
    assert names.tier_exchange("w1s") == names.tier_queue("w1s") == "vibey.wait.w1s"
    assert (names.dead_exchange, names.dead_queue) == ("vibey.jobs.dlx", "vibey.jobs.dead")
    assert QueueNames("acme.v2").work_queue("build") == "acme.v2.jobs.build"


@pytest.mark.parametrize("project", ["a.b", "a*", "#", "a b", "tab\there", ""])
def test_project_ids_that_would_break_routing_are_refused(project: str) -> None:
    names = QueueNames()
    with pytest.raises(ValueError, match=r"project id .* no '\.', '\*', '#' or whitespace"):
        names.routing_key("build", project, dedicated=False)
    with pytest.raises(ValueError, match="project id"):
        names.work_queue("build", project)
    with pytest.raises(ValueError, match="project id"):
        Topology(names, {}, ("build",), dedicated_projects=(project,))


@given(st.text(min_size=1, max_size=40))
def test_a_project_id_is_accepted_exactly_when_it_is_one_routing_word(project: str) -> None:
    one_word = not any(c in ".*#" or c.isspace() for c in project)
    try:
        key = QueueNames().routing_key("build", project, dedicated=True)
    except ValueError:
        assert not one_word
    else:
        assert one_word
        assert key.split(".") == ["dedicated", "build", project]


def test_bad_lanes_tiers_and_settings_are_refused() -> None:
    names = QueueNames()
    with pytest.raises(ValueError, match="lane 'dead' is reserved"):
        names.work_queue("dead")
    with pytest.raises(ValueError, match=r"lane 'a\.b'"):
        Topology(names, {}, ("a.b",))
    with pytest.raises(ValueError, match="wait tier name 'w 1'"):
        Topology(names, {"w 1": timedelta(seconds=1)}, ("build",))
    with pytest.raises(ValueError, match="at least 1 ms"):
        Topology(names, {"w0": timedelta(microseconds=999)}, ("build",))
    with pytest.raises(ValueError, match="delivery_limit"):
        Topology(names, {}, ("build",), delivery_limit=-1)
    with pytest.raises(ValueError, match="at least one lane"):
        Topology(names, {}, ())
    with pytest.raises(ValueError, match="bus prefix"):
        QueueNames("")
    with pytest.raises(ValueError, match="unknown lane 'ops'"):
        topology(names).dedicated_queue(ON_310, "ops", "demo")


def test_work_queue_arguments_are_gated_on_the_broker() -> None:
    topo = topology(QueueNames(), delivery_limit=7, consumer_timeout=timedelta(minutes=90))
    on_310 = topo.queue_arguments("vibey.jobs.build", ON_310)
    assert on_310 == {
        "x-queue-type": "quorum",
        "x-delivery-limit": 7,
        "x-dead-letter-exchange": "vibey.jobs.dlx",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    assert topo.queue_arguments("vibey.jobs.build", ON_43) == {
        **on_310,
        "x-consumer-timeout": 5_400_000,
    }
    # A dedicated queue of any project, listed or not, has the work-queue arguments.
    assert topo.queue_arguments("vibey.jobs.review.p.other", ON_310) == on_310
    assert topo.queue_arguments("vibey.jobs.build.p.vip", BrokerCapabilities()) == on_310


def test_tier_and_dead_queue_arguments() -> None:
    topo = topology(QueueNames(), max_tier_length=50)
    tier = topo.queue_arguments("vibey.wait.w5s", ON_43)
    assert tier == {
        "x-queue-type": "quorum",
        "x-message-ttl": 5000,
        "x-dead-letter-exchange": "vibey.jobs",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-max-length": 50,
    }
    assert "x-dead-letter-routing-key" not in tier
    assert topo.queue_arguments("vibey.jobs.dead", ON_310) == {"x-queue-type": "quorum"}
    assert topo.queue_arguments("vibey.jobs.dead", ON_43) == {
        "x-queue-type": "quorum",
        "x-delivery-limit": -1,
    }
    with pytest.raises(ValueError, match="not a queue of this topology"):
        topo.queue_arguments("vibey.jobs.deploy", ON_310)


def test_every_queue_and_exchange_is_planned_in_a_safe_order() -> None:
    topo = topology(QueueNames())
    queues = [q.name for q in topo.queues(ON_310)]
    assert queues == [
        "vibey.jobs.dead",
        "vibey.jobs.build",
        "vibey.jobs.review",
        "vibey.jobs.build.p.vip",
        "vibey.jobs.review.p.vip",
        "vibey.wait.w1s",
        "vibey.wait.w5s",
    ]
    assert [(e.name, e.type) for e in topo.exchanges()] == [
        ("vibey.jobs", "topic"),
        ("vibey.jobs.dlx", "fanout"),
        ("vibey.wait.w1s", "fanout"),
        ("vibey.wait.w5s", "fanout"),
    ]


# -- on the broker ---------------------------------------------------------------------------------


def _get(channel: Any, queue: str, *, ack: bool = True) -> tuple[Any, Any, bytes] | None:
    method, properties, body = channel.basic_get(queue, auto_ack=ack)
    return None if method is None else (method, properties, body)


def _wait_for(
    channel: Any, queue: str, timeout: float, *, ack: bool = True
) -> tuple[Any, Any, bytes, float] | None:
    """The first message of ``queue`` within ``timeout`` seconds, with the seconds it took."""
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < timeout:
        got = _get(channel, queue, ack=ack)
        if got is not None:
            return (*got, elapsed)
        time.sleep(0.01)
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _death(properties: Any) -> dict[str, Any]:
    deaths = (properties.headers or {}).get("x-death") or []
    assert deaths, f"no x-death header in {properties.headers}"
    return {_text(k): v for k, v in deaths[0].items()}


def _publish(channel: Any, exchange: str, key: str, body: bytes) -> None:
    channel.basic_publish(
        exchange, key, body, pika.BasicProperties(delivery_mode=2), mandatory=True
    )


def test_detect_reads_the_live_broker_version(amqp: Amqp) -> None:
    caps = detect(amqp.connect())
    assert caps.known
    parsed = parse_version(caps.version)
    assert parsed is not None
    assert caps.per_queue_consumer_timeout is (parsed >= (3, 12, 0))
    assert caps == capabilities_for(caps.version)
    if amqp.ctl is not None:  # the server's own word, not the handshake's
        assert caps.version == amqp.ctl("eval", "rabbit_misc:version().").strip().strip('"')


def test_declare_twice_gives_quorum_queues_with_the_planned_arguments(amqp: Amqp) -> None:
    channel = amqp.channel()
    caps = detect(channel.connection)
    topo = topology(amqp.names)
    topo.declare(channel, caps)
    topo.declare(channel, caps)  # idempotent: the same arguments raise nothing
    topo.declare_dedicated(channel, caps, "build", "extra")
    assert channel.is_open
    planned = {q.name: q for q in topo.queues(caps)}
    planned[amqp.names.work_queue("build", "extra")] = topo.dedicated_queue(caps, "build", "extra")
    if amqp.ctl is None:  # no rabbitmqctl: at least show that none is a classic queue
        for name, spec in planned.items():
            classic = {**spec.arguments, "x-queue-type": "classic"}
            with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="'x-queue-type'"):
                amqp.channel().queue_declare(name, durable=True, arguments=classic)
        return
    seen = amqp.list_queues()
    assert set(seen) == set(planned)
    for name, spec in planned.items():
        assert seen[name]["type"] == "quorum", name
        assert seen[name]["arguments"] == dict(spec.arguments), name
    if not caps.per_queue_consumer_timeout:
        assert all("x-consumer-timeout" not in q["arguments"] for q in seen.values())


def _arrivals(channel: Any, queues: list[str], timeout: float) -> dict[str, tuple[Any, ...]]:
    """The first message of each queue and the seconds after the call it arrived."""
    start, found = time.monotonic(), dict[str, Any]()
    while len(found) < len(queues) and time.monotonic() - start < timeout:
        for queue in set(queues) - set(found):
            got = _get(channel, queue)
            if got is not None:
                found[queue] = (*got, time.monotonic() - start)
        time.sleep(0.01)
    return found


def test_wait_tier_returns_pointers_to_their_own_queue_after_the_ttl(amqp: Amqp) -> None:
    channel = amqp.channel()
    caps = detect(channel.connection)
    names = amqp.names
    topology(names).declare(channel, caps)
    channel.confirm_delivery()
    shared, dedicated = names.work_queue("build"), names.work_queue("build", "vip")

    _publish(channel, names.tier_exchange("w1s"), "shared.build.demo", b"shared")
    _publish(channel, names.tier_exchange("w1s"), "dedicated.build.vip", b"dedicated")
    arrived = _arrivals(channel, [shared, dedicated], timeout=3.0)

    assert set(arrived) == {shared, dedicated}, f"still waiting after 3 s: {arrived.keys()}"
    for queue, key, body in [
        (shared, "shared.build.demo", b"shared"),
        (dedicated, "dedicated.build.vip", b"dedicated"),
    ]:
        method, properties, got, after = arrived[queue]
        assert 0.9 <= after < 3.0, (queue, after)
        assert (got, method.routing_key, method.exchange) == (body, key, names.work_exchange)
        death = _death(properties)
        assert (_text(death["reason"]), _text(death["queue"])) == (
            "expired",
            names.tier_queue("w1s"),
        )
    # Each pointer landed once, in its own queue only.
    assert _get(channel, shared) is None and _get(channel, dedicated) is None


def _bodies(channel: Any, queue: str) -> list[bytes]:
    """Everything in ``queue``: waits a little for the first message only."""
    first = _wait_for(channel, queue, timeout=2.0)
    found = [] if first is None else [first[2]]
    while found and (got := _get(channel, queue)) is not None:
        found.append(got[2])
    return found


def test_routing_keeps_dedicated_projects_out_of_the_shared_queue(amqp: Amqp) -> None:
    channel = amqp.channel()
    names = amqp.names
    caps = detect(channel.connection)
    topo = topology(names)
    topo.declare(channel, caps)
    channel.confirm_delivery()
    _publish(channel, names.work_exchange, names.routing_key("build", "demo"), b"shared")
    _publish(
        channel, names.work_exchange, names.routing_key("build", "vip", dedicated=True), b"vip"
    )
    with pytest.raises(pika.exceptions.UnroutableError):  # "demo" has no dedicated queue yet
        _publish(channel, names.work_exchange, names.routing_key("build", "demo", True), b"lost")
    topo.declare_dedicated(channel, caps, "build", "demo")
    _publish(channel, names.work_exchange, names.routing_key("build", "demo", True), b"demo")

    assert _bodies(channel, names.work_queue("build")) == [b"shared"]
    assert _bodies(channel, names.work_queue("build", "vip")) == [b"vip"]
    assert _bodies(channel, names.work_queue("build", "demo")) == [b"demo"]
    assert _get(channel, names.work_queue("review")) is None


def test_a_rejected_pointer_is_parked_in_the_dead_queue(amqp: Amqp) -> None:
    channel = amqp.channel()
    names = amqp.names
    topology(names).declare(channel, detect(channel.connection))
    channel.confirm_delivery()
    _publish(channel, names.work_exchange, "shared.review.demo", b"poison")
    got = _wait_for(channel, names.work_queue("review"), timeout=5.0, ack=False)
    assert got is not None
    method, _, body, _ = got
    assert body == b"poison"
    channel.basic_reject(method.delivery_tag, requeue=False)

    parked = _wait_for(channel, names.dead_queue, timeout=5.0)
    assert parked is not None, "the rejected pointer never reached the dead queue"
    death = _death(parked[1])
    assert parked[2] == b"poison"
    assert (_text(death["reason"]), _text(death["queue"])) == (
        "rejected",
        names.work_queue("review"),
    )
    assert _get(channel, names.work_queue("review")) is None


def test_delivery_limit_counts_closed_channels_then_parks(amqp: Amqp) -> None:
    connection = amqp.connect()
    channel = amqp.channel(connection)
    names = amqp.names
    topology(names, delivery_limit=2).declare(channel, detect(connection))
    queue = names.work_queue("build")
    channel.confirm_delivery()
    _publish(channel, names.work_exchange, "shared.build.demo", b"crasher")

    seen: list[Any] = []
    for _ in range(3):  # a consumer takes it and dies without an ack, three times
        holder = connection.channel()
        got = _wait_for(holder, queue, timeout=5.0, ack=False)
        assert got is not None, f"delivery {len(seen) + 1} did not come back"
        method, properties, body, _ = got
        assert body == b"crasher"
        seen.append((method.redelivered, (properties.headers or {}).get("x-delivery-count")))
        holder.close()

    assert [redelivered for redelivered, _ in seen] == [False, True, True]
    parked = _wait_for(channel, names.dead_queue, timeout=5.0)
    assert parked is not None, "the pointer was not parked after 1 + 2 deliveries"
    assert _text(_death(parked[1])["reason"]) == "delivery_limit"
    assert _get(channel, queue) is None


def test_redeclaring_with_another_delivery_limit_is_a_mismatch(amqp: Amqp) -> None:
    connection = amqp.connect()
    caps = detect(connection)
    topology(amqp.names, delivery_limit=20).declare(amqp.channel(connection), caps)

    channel = amqp.channel(connection)
    with pytest.raises(TopologyMismatch) as caught:
        topology(amqp.names, delivery_limit=3).declare(channel, caps)

    queue = amqp.names.work_queue("build")
    assert caught.value.name == queue
    assert caught.value.reply_code == 406
    message = str(caught.value)
    assert f"queue '{queue}'" in message and "x-delivery-limit" in message
    assert "drain it and delete it" in message and "new prefix" in message
    assert channel.is_closed
    # The queue kept its arguments: the old declaration still matches.
    topology(amqp.names, delivery_limit=20).declare(amqp.channel(connection), caps)
