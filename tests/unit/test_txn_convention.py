"""A store call's suffix says what it joins (the convention: the ``store`` package docstring).

``*_txn`` takes the caller's :class:`store.unit_of_work.UnitOfWork` and no bare connection;
``*_on`` takes the caller's connection first. Read from the source (no module is imported),
over every package and the tests' helpers, so a fake or a wrapper is held to it too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("store", "actors", "vibey", "workflows", "examples", "tests")
UNIT = "UnitOfWork"
CONNECTIONS = {"Conn", "Connection", "AsyncConnection"}

Defined = ast.FunctionDef | ast.AsyncFunctionDef


def _type_name(annotation: ast.expr | None) -> str:
    """The annotation's type, without module nor subscript: ``psycopg.Connection[Row]`` →
    ``Connection``; a string annotation is parsed first; ``None`` when there is none."""
    if annotation is None:
        return ""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _type_name(ast.parse(annotation.value, mode="eval").body)
    if isinstance(annotation, ast.Subscript):
        return _type_name(annotation.value)
    if isinstance(annotation, ast.Attribute):
        return annotation.attr
    if isinstance(annotation, ast.Name):
        return annotation.id
    return ast.unparse(annotation)


def _parameters(fn: Defined) -> list[ast.arg]:
    """The parameters a caller passes (``self``/``cls`` left out)."""
    args = [*fn.args.posonlyargs, *fn.args.args]
    if args and args[0].arg in ("self", "cls"):
        args = args[1:]
    return [*args, *fn.args.kwonlyargs]


def _top_level(tree: ast.Module) -> Iterator[Defined]:
    """Module functions and class methods (a nested function is a local, not a store call)."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (
                n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            )


def violations(source: str, where: str) -> list[str]:
    """Every ``*_txn`` or ``*_on`` callable in ``source`` that breaks the convention."""
    found = []
    for fn in _top_level(ast.parse(source)):
        if fn.name.startswith("test_"):
            continue
        types = [_type_name(a.annotation) for a in _parameters(fn)]
        if fn.name.endswith("_txn"):
            if UNIT not in types:
                found.append(f"{where}:{fn.lineno} {fn.name} takes no {UNIT}")
            if CONNECTIONS.intersection(types):
                found.append(f"{where}:{fn.lineno} {fn.name} takes a bare connection")
        elif fn.name.endswith("_on") and (not types or types[0] not in CONNECTIONS):
            found.append(f"{where}:{fn.lineno} {fn.name} does not take a connection first")
    return found


def _sources() -> Iterator[Path]:
    """The packages' modules; of the tests, their helpers and fakes (not the test modules)."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if package != "tests" or not path.name.startswith("test_"):
                yield path


def test_every_txn_takes_a_unit_of_work_and_every_on_a_connection() -> None:
    scanned = list(_sources())
    assert len(scanned) > 100  # the packages were found
    broken = [v for path in scanned for v in violations(path.read_text(), str(path))]
    assert broken == []


def test_the_project_has_both_forms_so_the_scan_reads_its_annotations() -> None:
    """The scan sees the real forms (else a rename of ``UnitOfWork`` would pass it vacuously)."""
    jobs = ast.parse((ROOT / "store" / "jobs.py").read_text())
    names = {fn.name: fn for fn in _top_level(jobs)}
    assert _type_name(_parameters(names["ack_txn"])[0].annotation) == UNIT
    assert _type_name(_parameters(names["heartbeat_on"])[0].annotation) == "Conn"


def test_a_txn_that_takes_a_bare_connection_is_refused() -> None:
    source = (
        "class Repo:\n"
        "    def claim_txn(self, conn: Conn, job_id: UUID) -> None: ...\n"
        "def append_txn(conn: psycopg.Connection[TupleRow]) -> None: ...\n"
        "def mixed_txn(unit: UnitOfWork, conn: 'Conn') -> None: ...\n"
    )
    assert violations(source, "m.py") == [
        "m.py:2 claim_txn takes no UnitOfWork",
        "m.py:2 claim_txn takes a bare connection",
        "m.py:3 append_txn takes no UnitOfWork",
        "m.py:3 append_txn takes a bare connection",
        "m.py:4 mixed_txn takes a bare connection",
    ]


def test_an_on_that_takes_no_connection_first_is_refused() -> None:
    source = (
        "def emit_on(unit: UnitOfWork) -> None: ...\n"
        "def append_on(conn: Conn, project_id: str) -> None: ...\n"
        "def outer() -> None:\n"
        "    def pass_on(signum: int) -> None: ...\n"
    )
    assert violations(source, "m.py") == ["m.py:1 emit_on does not take a connection first"]


def test_a_txn_with_its_unit_after_a_collaborator_passes() -> None:
    """``store.settle.settle_txn(jobs, unit, ...)``: the repository it writes through comes
    first; what counts is that the transaction is the unit."""
    source = "def settle_txn(jobs: Jobs, unit: UnitOfWork, job: Job) -> None: ...\n"
    assert violations(source, "m.py") == []
