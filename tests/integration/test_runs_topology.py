"""The loop services' RabbitMQ objects: names and arguments (pure), then on the real broker."""

from __future__ import annotations

import pika
import pytest

from actors.capabilities import capabilities_for, detect
from actors.runs_topology import RunsTopology, declare_reply_queue
from tests.amqp_fixtures import Amqp


def test_names_and_arguments_follow_the_broker_version() -> None:
    topology = RunsTopology("vibey", ("claude",))
    assert topology.queue("claude") == "vibey.runs.claude"
    assert topology.probe_queue("claude") == "vibey.runs.claude.probe"
    on_310 = {q.name: dict(q.arguments) for q in topology.queues(capabilities_for("3.10.8"))}
    on_4 = {q.name: dict(q.arguments) for q in topology.queues(capabilities_for("4.1.0"))}
    run = on_310["vibey.runs.claude"]
    assert run["x-queue-type"] == "quorum"
    assert run["x-delivery-limit"] == 3
    assert run["x-dead-letter-exchange"] == "vibey.runs.dlx"
    assert "x-consumer-timeout" not in run  # 3.10 takes it and ignores it
    assert "x-consumer-timeout" in on_4["vibey.runs.claude"]
    assert "x-queue-type" not in on_310["vibey.runs.claude.probe"]  # classic: never behind a run
    assert on_4["vibey.runs.dead"]["x-delivery-limit"] == -1


def test_a_bad_engine_id_is_refused() -> None:
    with pytest.raises(ValueError, match="engine id"):
        RunsTopology("vibey", ("a.b",))


def test_declared_twice_and_routed(amqp: Amqp) -> None:
    topology = RunsTopology(amqp.prefix, ("eng",))
    connection = amqp.connect()
    channel = amqp.channel(connection)
    caps = detect(connection)
    topology.declare(channel, caps)
    topology.declare(channel, caps)  # idempotent
    if amqp.ctl is not None:
        queues = amqp.list_queues()
        assert queues[topology.queue("eng")]["type"] == "quorum"
        assert queues[topology.dead_queue]["type"] == "quorum"
    reply = declare_reply_queue(channel)
    channel.basic_publish(topology.exchange, "eng", b"run")
    channel.basic_publish(topology.exchange, "eng.probe", b"probe")
    channel.basic_publish(topology.control_exchange, "eng", b"stop")
    control = topology.declare_control_queue(channel, "eng")
    channel.basic_publish(topology.control_exchange, "eng", b"stop")
    channel.basic_publish("", reply, b"reply")
    bodies = {}
    for queue in (topology.queue("eng"), topology.probe_queue("eng"), control, reply):
        for _ in range(50):
            method, _props, body = channel.basic_get(queue, auto_ack=True)
            if method is not None:
                bodies[queue] = body
                break
            connection.sleep(0.05)
    assert bodies == {
        topology.queue("eng"): b"run",
        topology.probe_queue("eng"): b"probe",
        control: b"stop",
        reply: b"reply",
    }
    assert isinstance(connection, pika.BlockingConnection)
