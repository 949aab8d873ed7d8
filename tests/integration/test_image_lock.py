"""The locks install as the image installs them, into fresh venvs, every file checked against
its hash: requirements-build.lock (the build backend), then requirements.lock (--no-deps: the
lock must be complete, which `pip check` confirms), then the vibey wheel built from this
checkout with that backend; the installed `vibey` then answers `--help`. Needs the package
index (PyPI) or a local mirror of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=900, cwd=cwd
    )
    assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-3000:])
    return done.stdout


def test_the_locks_install_with_their_hashes_into_a_fresh_venv(tmp_path: Path) -> None:
    build, runtime = tmp_path / "build", tmp_path / "vibey"
    for venv in (build, runtime):
        run(sys.executable, "-m", "venv", venv)
    # pip's cache is kept (every file is still checked against the lock's hash, cached or
    # not), and installs compile no bytecode: neither is what this test checks.
    pip = ("--disable-pip-version-check",)
    lock = ("--no-compile", "--require-hashes", "--no-deps", "-r")
    run(build / "bin" / "pip", "install", *pip, *lock, ROOT / "requirements-build.lock")
    run(runtime / "bin" / "pip", "install", *pip, *lock, ROOT / "requirements.lock")
    run(runtime / "bin" / "pip", "check")
    wheels = tmp_path / "wheels"
    run(
        build / "bin" / "pip", "wheel", *pip, "--no-deps", "--no-build-isolation",
        "--wheel-dir", wheels, ROOT,
    )  # fmt: skip
    (wheel,) = wheels.glob("vibey-*.whl")
    run(runtime / "bin" / "pip", "install", *pip, "--no-compile", "--no-deps", wheel)
    run(runtime / "bin" / "pip", "check")
    assert "worker" in run(runtime / "bin" / "vibey", "--help", cwd=tmp_path)
    installed = run(runtime / "bin" / "pip", "list", "--format=freeze")
    for dev_only in ("pytest", "mypy", "ruff", "hypothesis", "alembic", "kubernetes-validate"):
        assert f"\n{dev_only}==" not in f"\n{installed.lower()}", dev_only
