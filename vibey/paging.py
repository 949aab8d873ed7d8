"""How every list command pages: the shared flags, cursors, ages, the footer and NDJSON.

``gate list``, ``workflow list``, ``workflow history`` and ``ledger show`` take the same
:class:`Paging` flags: ``--limit N`` (default 50), ``--all``, ``--after CURSOR``,
``--order oldest|newest``. A page that is not the whole list ends with one line,
``50 of 10,000 shown — `--limit N`, `--all`, `--after <cursor>` (next page)``; with ``--json``
the object carries ``total`` and ``next_cursor`` (null on the last page); ``--all --json``
prints one JSON object a line (NDJSON), streamed, instead of one array.

A cursor names the last row shown. For history and ledger events it is that row's seq (so
``--after 40`` continues past seq 40 in the order asked for); for gates and workflows it is
an opaque token that also records the list, the order and the filters it was made with, and
is refused with other ones (paging must keep them). No module here touches the database.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal
from uuid import UUID

from cyclopts import Parameter

from vibey.render import CommandError, ExitCode

if TYPE_CHECKING:
    from store.listings import Page, PageSpec

DEFAULT_LIMIT = 50  # store.listings.DEFAULT_LIMIT; the test of the flags checks they agree
Order = Literal["oldest", "newest"]
Key = tuple[Any, ...]

_AGE = re.compile(r"(\d+)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@Parameter(name="*")
@dataclass(frozen=True, slots=True)
class Paging:
    """The flags every list command shares."""

    limit: int = DEFAULT_LIMIT
    """At most this many rows on the page."""
    all: Annotated[bool, Parameter(name="--all", negative=())] = False
    """Every row (with --json: one JSON object a line, streamed)."""
    after: str | None = None
    """Continue after this cursor (from the last page's footer, or its next_cursor)."""
    order: Order | None = None
    """oldest or newest first (each list's default is in its help)."""

    def check(self) -> None:
        if self.limit < 1:
            raise CommandError(f"--limit must be at least 1, got {self.limit}", ExitCode.USAGE)
        if self.all and self.after is not None:
            raise CommandError("--all lists every row: it takes no --after", ExitCode.USAGE)

    def newest_first(self, default: Order) -> bool:
        return (self.order or default) == "newest"

    def page_limit(self) -> int | None:
        return None if self.all else self.limit


FIRST_PAGE = Paging()  # the flags' defaults: the first DEFAULT_LIMIT rows in the list's order


def parse_age(text: str, flag: str) -> timedelta:
    """``45s``, ``90m``, ``2h30m``, ``3d``, ``1w``: a duration of whole units."""
    flat = text.strip().lower()
    parts = _AGE.findall(flat)
    if not parts or "".join(n + u for n, u in parts) != flat:
        raise CommandError(
            f"{flag} {text!r} is not a duration: write it as 45s, 90m, 2h30m, 3d or 1w",
            ExitCode.USAGE,
        )
    return timedelta(seconds=sum(int(n) * _UNIT_SECONDS[u] for n, u in parts))


def optional_age(text: str | None, flag: str) -> timedelta | None:
    return None if text is None else parse_age(text, flag)


def filters_of(where: Any) -> dict[str, Any]:
    """A filter dataclass as the mapping a cursor is made with (the same on every page)."""
    return {f.name: getattr(where, f.name) for f in fields(where)}


def _fingerprint(listing: str, order: Order, filters: Mapping[str, Any]) -> str:
    text = json.dumps([listing, order, sorted(filters.items())], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def moment_cursor(listing: str, order: Order, filters: Mapping[str, Any], key: Key) -> str:
    """The opaque cursor after a gate or workflow whose key is ``(moment, id)``."""
    at, id_ = key
    body = json.dumps([_fingerprint(listing, order, filters), at.isoformat(), str(id_)])
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def moment_key(cursor: str, listing: str, order: Order, filters: Mapping[str, Any]) -> Key:
    """The key a :func:`moment_cursor` names; a usage error for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        fingerprint, at, id_ = json.loads(raw)
        key = (datetime.fromisoformat(at), UUID(id_))
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise CommandError(
            f"--after {cursor!r} is not a cursor of `vibey {listing}`: copy it from the last "
            "page's footer (or next_cursor in its JSON)",
            ExitCode.USAGE,
        ) from None
    if fingerprint != _fingerprint(listing, order, filters):
        raise CommandError(
            f"--after: that cursor was made with another --order or other filters; page "
            f"`vibey {listing}` with the ones it was made with",
            ExitCode.USAGE,
        )
    return key


def seq_key(cursor: str) -> Key:
    """The key of a history or ledger cursor: a seq, 0 or more."""
    if not cursor.isdigit():
        raise CommandError(f"--after must be 0 or more (a seq), got {cursor!r}", ExitCode.USAGE)
    return (int(cursor),)


def footer(
    shown: int, total: int, next_cursor: str | None, *, noun: str, capped: bool = False
) -> str | None:
    """The line under a page that is not the whole list (None when it is). ``capped``: more
    than ``total`` match (the count stopped there)."""
    if shown >= total and next_cursor is None and not capped:
        return None
    of = f"more than {total:,}" if capped else f"{total:,}"
    line = f"{shown:,} of {of} {noun} shown — `--limit N`, `--all`"
    if next_cursor is None:
        return line + " (this was the last page)"
    return line + f", `--after {next_cursor}` (next page)"


def ndjson(objects: Iterable[Any]) -> None:
    """One JSON object a line, written as each arrives."""
    write = sys.stdout.write
    for value in objects:
        write(json.dumps(value, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


@dataclass(frozen=True, slots=True)
class Listing:
    """One run of a list command: its name, its default order, the flags and filters given."""

    command: str  # "gate list"
    noun: str  # "gates"
    default_order: Order
    paging: Paging
    filters: Mapping[str, Any] = field(default_factory=dict)
    by_seq: bool = False  # keyed by seq: the cursor is the seq itself

    @property
    def order(self) -> Order:
        return self.paging.order or self.default_order

    @property
    def newest_first(self) -> bool:
        return self.order == "newest"

    def spec(self) -> PageSpec:
        from store.listings import PageSpec

        self.paging.check()
        after = self.paging.after
        key = None
        if after is not None:
            key = seq_key(after) if self.by_seq else self._moment_key(after)
        return PageSpec(limit=self.paging.page_limit(), newest_first=self.newest_first, after=key)

    def cursor(self, key: Key | None) -> str | None:
        """The ``--after`` that shows the page after the row whose key is ``key``."""
        if key is None:
            return None
        if self.by_seq:
            return str(key[0])
        return moment_cursor(self.command, self.order, self.filters, key)

    def print_footer(self, page: Page[Any]) -> None:
        line = footer(
            len(page.items),
            page.total,
            self.cursor(page.next_after),
            noun=self.noun,
            capped=page.total_capped,
        )
        if line is not None:
            print(line)

    def json_tail(self, page: Page[Any]) -> dict[str, Any]:
        """What a page's JSON object carries besides its rows."""
        return {
            "total": page.total,
            "total_capped": page.total_capped,
            "next_cursor": self.cursor(page.next_after),
        }

    def _moment_key(self, cursor: str) -> Key:
        return moment_key(cursor, self.command, self.order, self.filters)
