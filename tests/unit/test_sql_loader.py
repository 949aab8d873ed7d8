"""store.sql.parse: ``-- name: x`` headers split a file into named queries.

Only ``parse`` is exercised; ``load`` reads shipped files (``jobs.sql`` among them) that are
written elsewhere, so it is not called here.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from store.sql import parse

LOWER = "abcdefghijklmnopqrstuvwxyz_"
names = st.builds(
    str.__add__, st.sampled_from(LOWER), st.text(alphabet=LOWER + "0123456789", max_size=12)
)
# Body lines never start with "--" followed by a name header: no '-' at all, or a plain comment.
BODY_ALPHABET = "".join(sorted(set(string.printable) - set("-\n"))) + "\u00e9\u20ac\u2028"
plain_lines = st.text(alphabet=BODY_ALPHABET, max_size=20) | st.sampled_from(
    ["SELECT 1;", "  WHERE id = %(id)s", "", "\t", "RETURNING *; -- trailing"]
)
comment_lines = st.sampled_from(
    ["-- a comment", "--comment: not a header", "-- name is a word here", "-- $1 is the id"]
)
# The first line starts with a visible character, so a body is never blank after strip().
first_lines = st.builds(
    str.__add__,
    st.sampled_from(["SELECT", "UPDATE", "WITH", "INSERT", "(", "x", "\u00e9", "-- lead"]),
    st.text(alphabet=BODY_ALPHABET, max_size=20),
)
bodies = st.builds(
    lambda first, rest: "\n".join([first, *rest]).strip(),
    first_lines,
    st.lists(plain_lines | comment_lines, max_size=3),
)
header_gaps = st.sampled_from(["", " ", "  ", "\t"])


@st.composite
def sql_files(draw: st.DrawFn) -> tuple[dict[str, str], str]:
    queries = draw(st.dictionaries(names, bodies, max_size=5))
    chunks = []
    for name, body in queries.items():
        before, after, trailing = draw(header_gaps), draw(header_gaps), draw(header_gaps)
        blank = draw(st.sampled_from(["", "\n", "\n\n"]))
        chunks.append(f"--{before}name:{after}{name}{trailing}\n{blank}{body}\n{blank}")
    return queries, "\n".join(chunks)


@given(sql_files())
def test_parse_round_trips_a_rendered_file(file: tuple[dict[str, str], str]) -> None:
    queries, text = file
    parsed = parse(text)
    assert dict(parsed) == queries
    assert list(parsed) == list(queries)


def test_parse_example() -> None:
    text = (
        "-- name: claim_job\n"
        "WITH c AS (SELECT id FROM job FOR UPDATE SKIP LOCKED LIMIT %(n)s)\n"
        "UPDATE job SET state = 'leased' FROM c WHERE job.id = c.id RETURNING job.*;\n"
        "\n"
        "-- name: reap\n"
        "-- returns expired leases to ready\n"
        "UPDATE job SET state = 'ready';\n"
    )
    assert dict(parse(text)) == {
        "claim_job": (
            "WITH c AS (SELECT id FROM job FOR UPDATE SKIP LOCKED LIMIT %(n)s)\n"
            "UPDATE job SET state = 'leased' FROM c WHERE job.id = c.id RETURNING job.*;"
        ),
        "reap": "-- returns expired leases to ready\nUPDATE job SET state = 'ready';",
    }


def test_parse_of_a_file_without_headers_is_empty() -> None:
    assert dict(parse("")) == {}
    assert dict(parse("SELECT 1;\n-- just a comment\n")) == {}


def test_parse_result_is_read_only() -> None:
    parsed = parse("-- name: one\nSELECT 1;\n")
    with pytest.raises(TypeError):
        parsed["two"] = "SELECT 2;"  # type: ignore[index]
    assert dict(parsed) == {"one": "SELECT 1;"}


@given(
    st.lists(st.tuples(names, bodies), min_size=1, max_size=5, unique_by=lambda q: q[0]),
    st.data(),
)
def test_a_name_defined_twice_is_an_error(
    queries: list[tuple[str, str]], data: st.DataObject
) -> None:
    duplicate_name, _ = data.draw(st.sampled_from(queries))
    body = data.draw(bodies)
    at = data.draw(st.integers(min_value=0, max_value=len(queries)))
    queries = [*queries[:at], (duplicate_name, body), *queries[at:]]
    text = "\n".join(f"-- name: {name}\n{body}\n" for name, body in queries)
    with pytest.raises(ValueError, match=f"'{duplicate_name}' is defined twice"):
        parse(text)


@given(
    st.lists(st.tuples(names, bodies), min_size=0, max_size=4, unique_by=lambda q: q[0]),
    names,
    st.sampled_from(["", "\n", "   \n\t\n", "\n\n\n"]),
    st.data(),
)
def test_a_query_with_an_empty_body_is_an_error(
    queries: list[tuple[str, str]], empty_name: str, blank: str, data: st.DataObject
) -> None:
    assume(empty_name not in {name for name, _ in queries})
    at = data.draw(st.integers(min_value=0, max_value=len(queries)))
    rendered = [f"-- name: {name}\n{body}\n" for name, body in queries]
    rendered.insert(at, f"-- name: {empty_name}\n{blank}")
    with pytest.raises(ValueError, match=f"'{empty_name}' is empty"):
        parse("".join(rendered))


def test_a_misnamed_header_is_an_error_not_body_text() -> None:
    with pytest.raises(ValueError, match="lower_snake_case"):
        parse("-- name: good\nSELECT 1\n-- name: claimJob\nSELECT 2\n")


def test_a_header_name_never_spans_lines() -> None:
    with pytest.raises(ValueError, match=r"lower_snake_case|empty"):
        parse("-- name:\nfoo\nSELECT 1\n")
