"""`vibey migrate` works from a built wheel, not only from a checkout.

The wheel is built without its dependencies (they are the test environment's) and unpacked
into a folder that is put first on ``sys.path``, in a working directory outside the checkout,
so every vibey module and every migration file is read from the wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RUN_FROM = """
import sys
sys.path.insert(0, sys.argv[1])
import store, migrations
assert store.__file__.startswith(sys.argv[1]), store.__file__
assert migrations.__file__.startswith(sys.argv[1]), migrations.__file__
from vibey.cli import main
sys.argv = ["vibey", "migrate"]
main()
"""


def test_the_wheel_ships_the_sql_and_migrates_an_empty_database(
    tmp_path: Path, empty_pg_url: str
) -> None:
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("vibey-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    shipped = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("migrations/*.sql")}
    assert shipped and shipped <= names
    assert "store/sql/jobs.sql" in names
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")}
    env["VIBEY_PG_URL"] = empty_pg_url
    runs = [
        subprocess.run(
            [sys.executable, "-c", RUN_FROM, str(tmp_path / "site")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert "applied 0001_job_queue" in runs[0].stdout
    assert "applied 0001" not in runs[1].stdout and "up to date" in runs[1].stdout
