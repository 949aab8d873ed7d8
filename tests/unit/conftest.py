"""Fixtures the unit tests share: the step runner's harness and an in-memory span exporter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.step_harness import Harness, harness


@pytest.fixture
def h() -> Harness:
    return harness()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()
