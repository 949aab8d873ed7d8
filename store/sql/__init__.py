"""Named SQL: ``-- name: x`` headers in ``*.sql`` files, loaded once."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from types import MappingProxyType

_HEADER = re.compile(r"^--[ \t]*name:[ \t]*(\S*)[ \t]*$", re.MULTILINE)
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def parse(text: str) -> Mapping[str, str]:
    """Split a file into its named queries. Text before the first header is a file comment.
    A misnamed header, a name used twice or an empty query is an error."""
    queries: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        name = match.group(1)
        if not _NAME.match(name):
            raise ValueError(f"query name {name!r} is not lower_snake_case")
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        body = text[match.end() : end].strip()
        if not body:
            raise ValueError(f"query {name!r} is empty")
        queries[name] = body
    return MappingProxyType(queries)


@cache
def load(filename: str) -> Mapping[str, str]:
    """The named queries of ``store/sql/<filename>``."""
    return parse(resources.files(__package__).joinpath(filename).read_text(encoding="utf-8"))
