"""The list commands' shared paging: durations, cursors, the footer line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store.listings import DEFAULT_LIMIT as STORE_LIMIT
from vibey.paging import (
    DEFAULT_LIMIT,
    Listing,
    Paging,
    footer,
    moment_cursor,
    moment_key,
    parse_age,
    seq_key,
)
from vibey.render import CommandError, ExitCode

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def test_the_cli_and_the_store_default_to_the_same_page_size() -> None:
    assert DEFAULT_LIMIT == STORE_LIMIT == Paging().limit == 50


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(sorted(UNITS))), min_size=1))
def test_a_duration_is_the_sum_of_its_parts(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    seconds = sum(n * UNITS[unit] for n, unit in parts)
    assert parse_age(text, "--older-than") == timedelta(seconds=seconds)


@pytest.mark.parametrize("bad", ["", "1", "h", "1x", "1h 2m", "-1h", "1.5h", "2h30"])
def test_a_malformed_duration_is_a_usage_error(bad: str) -> None:
    with pytest.raises(CommandError) as caught:
        parse_age(bad, "--older-than")
    assert caught.value.code is ExitCode.USAGE
    assert "--older-than" in str(caught.value) and "2h30m" in str(caught.value)


@given(
    st.datetimes(timezones=st.just(UTC)),
    st.uuids(),
    st.sampled_from(["oldest", "newest"]),
    st.dictionaries(st.text(max_size=5), st.one_of(st.none(), st.text(max_size=5))),
)
def test_a_cursor_names_its_key_exactly(
    at: datetime, id_: UUID, order: str, filters: dict[str, str | None]
) -> None:
    cursor = moment_cursor("gate list", order, filters, (at, id_))  # type: ignore[arg-type]
    assert cursor.isascii() and " " not in cursor
    assert moment_key(cursor, "gate list", order, filters) == (at, id_)  # type: ignore[arg-type]


def test_a_cursor_is_refused_with_another_order_filters_or_list() -> None:
    key = (datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), uuid4())
    cursor = moment_cursor("gate list", "oldest", {"kind": None}, key)
    for order, filters, listing in [
        ("newest", {"kind": None}, "gate list"),
        ("oldest", {"kind": "approval"}, "gate list"),
        ("oldest", {"kind": None}, "workflow list"),
    ]:
        with pytest.raises(CommandError, match="another --order or other filters") as caught:
            moment_key(cursor, listing, order, filters)  # type: ignore[arg-type]
        assert caught.value.code is ExitCode.USAGE
    for garbage in ("nonsense", "e30", "!!", cursor[:-3]):
        with pytest.raises(CommandError, match="is not a cursor of `vibey gate list`"):
            moment_key(garbage, "gate list", "oldest", {"kind": None})


def test_a_seq_cursor_is_a_seq() -> None:
    assert seq_key("0") == (0,) and seq_key("41") == (41,)
    for bad in ("-1", "x", "1.5", ""):
        with pytest.raises(CommandError, match="--after must be 0 or more"):
            seq_key(bad)


def test_the_footer_says_what_is_shown_and_how_to_see_more() -> None:
    assert footer(3, 3, None, noun="gates") is None
    line = footer(50, 10_000, "abc", noun="gates")
    assert line == "50 of 10,000 gates shown — `--limit N`, `--all`, `--after abc` (next page)"
    assert footer(50, 10_000, "abc", noun="gates", capped=True) == (
        "50 of more than 10,000 gates shown — `--limit N`, `--all`, `--after abc` (next page)"
    )
    assert footer(7, 57, None, noun="gates") == (
        "7 of 57 gates shown — `--limit N`, `--all` (this was the last page)"
    )


def test_paging_flags_are_checked_before_any_query() -> None:
    with pytest.raises(CommandError, match="--limit must be at least 1"):
        Listing("gate list", "gates", "oldest", Paging(limit=0)).spec()
    with pytest.raises(CommandError, match="--all lists every row"):
        Listing("gate list", "gates", "oldest", Paging(all=True, after="x")).spec()
    spec = Listing(
        "ledger show", "events", "oldest", Paging(after="7", order="newest"), by_seq=True
    )
    assert (spec.spec().after, spec.spec().newest_first, spec.spec().limit) == ((7,), True, 50)
    assert Listing("x", "y", "newest", Paging(all=True)).spec().limit is None
