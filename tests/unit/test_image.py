"""The image's recipe, checked offline (no Docker engine here): ops/kubernetes/Dockerfile is
multi-stage on a base pinned by digest, copies only what exists and what .dockerignore lets
through, runs as a non-root user, and installs requirements.lock, which pins every production
dependency with hashes and nothing of the dev extra. tests/integration/test_image_lock.py
installs the locks into fresh venvs as the Dockerfile does."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "ops" / "kubernetes" / "Dockerfile"
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def stages() -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            current = []
            out[rest.split(" AS ")[-1].strip() if " AS " in rest else rest] = current
        current.append((keyword, rest))
    return out


def args() -> dict[str, str]:
    return dict(
        rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG" and "=" in rest
    )


def ignored(path: str) -> bool:
    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if p.strip() and not p.startswith("#")
    ]
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    return any(fnmatch.fnmatch(prefix, p) for p in patterns for prefix in prefixes)


def test_the_image_is_multi_stage_on_a_base_pinned_by_digest() -> None:
    built = stages()
    assert {"build", "runtime", "loop-service"} <= set(built)
    base = args()["PYTHON_IMAGE"]
    assert base.startswith("python:3.11-slim@") and _DIGEST.search(base), base
    for name, body in built.items():
        source = body[0][1].split(" AS ")[0].strip()
        assert source == "${PYTHON_IMAGE}" or source in built, (name, source)


def test_every_copy_source_exists_and_passes_the_dockerignore() -> None:
    copies = [rest for keyword, rest in instructions() if keyword == "COPY"]
    assert copies
    for rest in copies:
        words = rest.split()
        if any(w.startswith("--from=") for w in words):
            continue
        sources = [w for w in words if not w.startswith("--")][:-1]
        assert sources, rest
        for source in sources:
            assert source not in {".", "./"}, "the whole context is never copied"
            assert (ROOT / source).exists(), source
            assert not ignored(source), source


def test_the_dockerignore_keeps_a_developers_machine_out() -> None:
    for path in (".git", ".venv", ".vibey", ".mypy_cache", ".pytest_cache", "store/__pycache__"):
        assert ignored(path), path
    assert not ignored("store/migrate.py")


def test_the_runtime_runs_as_a_non_root_user() -> None:
    for name in ("runtime", "loop-service"):
        users = [rest for keyword, rest in stages()[name] if keyword == "USER"]
        assert users and users[-1] == "10001:10001", (name, users)


def test_the_runtime_installs_the_lock_with_hashes_and_no_dev_extra() -> None:
    text = " ".join(rest for keyword, rest in stages()["build"] if keyword == "RUN")
    assert "--require-hashes --no-deps -r /locks/requirements.lock" in text
    assert "--require-hashes --no-deps -r /locks/requirements-build.lock" in text
    assert "[dev]" not in DOCKERFILE.read_text(encoding="utf-8")


def locked(path: Path) -> dict[str, str]:
    """name → the requirement's text (with its hashes) for every pin in ``path``."""
    text = re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8"))
    pins = {}
    for line in text.splitlines():
        match = _NAME.match(line)
        if match and "==" in line:
            pins[match.group(1).lower().replace("_", "-")] = line
    return pins


def test_the_lock_pins_every_production_dependency_with_hashes_and_no_dev_one() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = locked(ROOT / "requirements.lock")
    for requirement in project["dependencies"]:
        name = _NAME.match(requirement)
        assert name is not None
        assert name.group(1).lower() in pins, requirement
    for line in pins.values():
        assert "--hash=sha256:" in line, line
    dev_only = {
        _NAME.match(r).group(1).lower()  # type: ignore[union-attr]
        for r in project["optional-dependencies"]["dev"]
    } - {_NAME.match(r).group(1).lower() for r in project["dependencies"]}  # type: ignore[union-attr]
    dev_only -= {"opentelemetry-api"}
    assert not dev_only & set(pins), dev_only & set(pins)
    build = locked(ROOT / "requirements-build.lock")
    assert "hatchling" in build and all("--hash=sha256:" in line for line in build.values())
