"""Every production module is used by production code: `just check` fails naming each module of
workflows/, store/, actors/ and vibey/ that no entry point reaches through the import graph
(only the tests import it).

The graph is grimp's (import-linter's own): every import counts, inside functions and under
TYPE_CHECKING too. The walk starts at the entry points:

- the console scripts of pyproject.toml's ``[project.scripts]``;
- every module a production module names as ``"module:attribute"`` (what is loaded by name:
  the CLI's lazy command groups, the settings' default handlers and definitions);
- every module run as ``-m module`` (its ``__main__``) or by the Dramatiq CLI
  (``dramatiq module``) in production code, the Kubernetes manifests, the Dockerfile or the
  local stack's scripts under ops/;
- :data:`ENTRIES`: the few modules started in another way, each with the reason.

A module reached reaches its packages too (Python imports them first). An entry of
:data:`ENTRIES` that is reached anyway, or names no module, fails the check as well, so the list
stays short and true.

Run as ``python ops/check/used_modules.py`` (the repository is the script's grandparent).
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

PACKAGES = ("workflows", "store", "actors", "vibey")

# Production modules that no import and no name above reaches, each with why it is an entry.
ENTRIES: dict[str, str] = {
    "actors.agents.supervise": (
        "run as a script by path (actors.agents.process.SUPERVISOR), never imported"
    ),
    "vibey.kube": "the manifests' renderer, run by ops/kubernetes/render.py (`just kube`)",
    "store.models": (
        "the schema's typed rows, held to migrations/ by the drift test "
        "(CONVENTIONS: migrations compared with the SQLModel metadata)"
    ),
}

# Where the processes are started outside Python: the manifests, the image, the local stack.
OPS_GLOBS = ("ops/kubernetes/**/*.yaml", "ops/kubernetes/Dockerfile", "ops/local/*.sh")

_ROOTS = "(?:" + "|".join(PACKAGES) + ")"
_NAMED = re.compile(r"""["'](""" + _ROOTS + r"""(?:\.\w+)+):\w+["']""")  # "package.module:name"
_AFTER = r"""["']?[\s,]+["']?(""" + _ROOTS + r"""(?:\.\w+)*)(?=["'\s]|$)"""  # a module argument
_DASH_M = re.compile(r"-m" + _AFTER, re.MULTILINE)
_DRAMATIQ = re.compile(r"\bdramatiq" + _AFTER, re.MULTILINE)


class ImportGraph(Protocol):
    """The part of grimp's ``ImportGraph`` the walk reads."""

    @property
    def modules(self) -> set[str]: ...

    def find_modules_directly_imported_by(self, module: str) -> set[str]: ...


def unused(graph: ImportGraph, entries: Iterable[str]) -> list[str]:
    """The modules of ``graph`` no entry reaches, sorted."""
    reached: set[str] = set()
    todo = list(entries)
    while todo:
        module = todo.pop()
        if module in reached or module not in graph.modules:
            continue
        reached.add(module)
        todo.extend(_packages_of(module))
        todo.extend(graph.find_modules_directly_imported_by(module))
    return sorted(graph.modules - reached)


def _packages_of(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def found_entries(root: Path, modules: set[str]) -> dict[str, str]:
    """Each entry point found in the project at ``root``, with where it was found."""
    found: dict[str, str] = {}
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        found[target.partition(":")[0]] = f"pyproject.toml [project.scripts] {name}"
    sources = [path for package in PACKAGES for path in sorted((root / package).rglob("*.py"))]
    ops = [path for pattern in OPS_GLOBS for path in sorted(root.glob(pattern))]
    for path in [*sources, *ops]:
        text, where = path.read_text(), str(path.relative_to(root))
        for module in _NAMED.findall(text) if path in sources else []:
            found.setdefault(module, f"{where} (loaded by name)")
        for module in _DASH_M.findall(text):
            main = f"{module}.__main__"
            found.setdefault(main if main in modules else module, f"{where} (-m {module})")
        for module in _DRAMATIQ.findall(text):
            found.setdefault(module, f"{where} (dramatiq {module})")
    return found


def problems(graph: ImportGraph, found: Mapping[str, str], entries: Mapping[str, str]) -> list[str]:
    """What fails the check: each module only the tests use, each stale entry of ``entries``."""
    lines = [
        f"{module}: no production module or entry point imports it (only the tests do): "
        "delete it, make it the path, or list it in ENTRIES with the reason"
        for module in unused(graph, [*found, *entries])
    ]
    for module in sorted(entries):
        if module not in graph.modules:
            lines.append(f"ENTRIES names {module}, which is no module: remove it")
        elif module in found or module not in unused(graph, found):
            lines.append(f"ENTRIES names {module}, which is reached anyway: remove it")
    return lines


def main() -> int:
    import grimp

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    lines = problems(graph, found_entries(root, graph.modules), ENTRIES)
    for line in lines:
        print(line, file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
