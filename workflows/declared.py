"""A read-only set of declarations by name: what step kinds and gate kinds share."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Declarations(Mapping[str, T], Generic[T]):
    """Declarations by name; a subclass fills ``_kinds`` (and checks conflicts) as it builds."""

    def __init__(self) -> None:
        self._kinds: dict[str, T] = {}

    def __getitem__(self, name: str) -> T:
        return self._kinds[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({sorted(self._kinds)})"
