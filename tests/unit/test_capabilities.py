"""The RabbitMQ version -> capability map (pure; the live check is in tests/integration)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.capabilities import BrokerCapabilities, capabilities_for, detect, parse_version

FLAGS = [f.name for f in dataclasses.fields(BrokerCapabilities) if f.name != "version"]

# version, per_queue_consumer_timeout, quorum_priorities, default_delivery_limit_20,
# consumer_timeout_quorum_only, xdeath_count_reliable
TABLE = [
    ("3.8.35", False, False, False, False, True),
    ("3.10.8", False, False, False, False, True),
    ("3.11.28", False, False, False, False, True),
    ("3.12.0", True, False, False, False, True),
    ("3.13.7", True, False, False, False, True),
    ("4.0.0-rc.1", True, True, True, False, False),
    ("4.0.0", True, True, True, False, False),
    ("4.0", True, True, True, False, False),
    ("4.2.9", True, True, True, False, False),
    ("4.3.0", True, True, True, True, False),
    ("4.3.0+build.7", True, True, True, True, False),
    ("5.1.2", True, True, True, True, False),
    (" 3.12.14\n", True, False, False, False, True),
]


@pytest.mark.parametrize(("version", "flags"), [(row[0], row[1:]) for row in TABLE])
def test_thresholds(version: str, flags: tuple[bool, ...]) -> None:
    caps = capabilities_for(version)
    assert caps.version == version.strip()
    assert {name: getattr(caps, name) for name in FLAGS} == dict(zip(FLAGS, flags, strict=True))


@pytest.mark.parametrize(
    "garbled", ["", "unknown", "3", "3.x", "v4.0.0", "4.0.0 beta", "0.0.0", "2.8.7", "4..0", "-4.0"]
)
def test_garbled_versions_are_conservative(garbled: str) -> None:
    caps = capabilities_for(garbled)
    assert caps == BrokerCapabilities()
    assert caps.version == "unknown" and not caps.known
    assert not any(getattr(caps, name) for name in FLAGS)


def _oracle(version: tuple[int, int, int]) -> dict[str, bool]:
    return {
        "per_queue_consumer_timeout": version >= (3, 12, 0),
        "quorum_priorities": version >= (4, 0, 0),
        "default_delivery_limit_20": version >= (4, 0, 0),
        "consumer_timeout_quorum_only": version >= (4, 3, 0),
        "xdeath_count_reliable": version < (4, 0, 0),
    }


versions = st.tuples(
    st.integers(3, 9), st.integers(0, 40), st.integers(0, 99), st.sampled_from(["", "-rc.2", "+b1"])
)


@given(versions)
def test_any_release_matches_the_thresholds(v: tuple[int, int, int, str]) -> None:
    text = f"{v[0]}.{v[1]}.{v[2]}{v[3]}"
    caps = capabilities_for(text)
    assert parse_version(text) == v[:3]
    assert {name: getattr(caps, name) for name in FLAGS} == _oracle(v[:3])


@given(versions, versions)
def test_a_newer_broker_never_loses_a_forward_capability(
    a: tuple[int, int, int, str], b: tuple[int, int, int, str]
) -> None:
    old, new = sorted([a[:3], b[:3]])
    before = capabilities_for("{}.{}.{}".format(*old))
    after = capabilities_for("{}.{}.{}".format(*new))
    for name in FLAGS:
        if name != "xdeath_count_reliable":
            assert getattr(after, name) >= getattr(before, name), name
    assert after.xdeath_count_reliable <= before.xdeath_count_reliable


@given(st.text(max_size=30))
def test_any_text_gives_known_or_conservative(text: str) -> None:
    caps = capabilities_for(text)
    assert caps == BrokerCapabilities() or caps.version == text.strip()


@pytest.mark.parametrize("raw", [b"3.10.8", "3.10.8"])
def test_detect_reads_the_handshake_of_a_blocking_connection(raw: bytes | str) -> None:
    connection = SimpleNamespace(_impl=SimpleNamespace(server_properties={"version": raw}))
    assert detect(connection) == capabilities_for("3.10.8")


@pytest.mark.parametrize(
    "impl",
    [
        SimpleNamespace(server_properties={}),
        SimpleNamespace(server_properties=None),
        SimpleNamespace(server_properties={"version": 4}),
        SimpleNamespace(),
    ],
)
def test_detect_without_a_readable_version_is_conservative(impl: SimpleNamespace) -> None:
    assert detect(SimpleNamespace(_impl=impl)) == BrokerCapabilities()


def test_table_for_doctor_lists_the_version_then_every_capability() -> None:
    rows = capabilities_for("4.0.1").as_table()
    assert rows[0] == ("RabbitMQ version", "4.0.1")
    assert len(rows) == 1 + len(FLAGS)
    for name, (label, answer) in zip(FLAGS, rows[1:], strict=True):
        assert label.startswith(name + " (")
        assert answer == ("yes" if getattr(capabilities_for("4.0.1"), name) else "no")
    assert (
        dict(rows)[
            "per_queue_consumer_timeout (x-consumer-timeout queue argument honoured, >= 3.12)"
        ]
        == "yes"
    )
    assert capabilities_for("nonsense").as_table()[0] == ("RabbitMQ version", "unknown")
