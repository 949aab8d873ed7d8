# vibey's tasks. Every recipe makes sure the project's virtualenv exists and is current.
# Prerequisites: Python 3.11+ and `pip install rust-just`.

set dotenv-load := true
set shell := ["bash", "-euo", "pipefail", "-c"]

python := ".venv/bin/python"

# List the recipes.
default:
    @just --list

# Create or refresh the project's virtualenv (.venv) when pyproject.toml changed.
venv:
    #!/usr/bin/env bash
    set -euo pipefail
    if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
    if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
        .venv/bin/python -m pip install -q --upgrade pip
        .venv/bin/python -m pip install -q -e '.[dev]'
        touch .venv/.installed
    fi

# Bring up the local stack: PostgreSQL and RabbitMQ (reused if they answer), migrations, .env.
up: venv
    ops/local/up.sh

# Stop what `just up` started (the services it found running are left alone).
down:
    ops/local/down.sh

# Apply the migrations to $VIBEY_PG_URL.
migrate: venv
    .venv/bin/vibey migrate

# The whole test suite: parallel tests first, then the chaos tests (they kill real processes).
test *args: venv
    #!/usr/bin/env bash
    set -uo pipefail
    run() {
        .venv/bin/python -m pytest "$@"
        rc=$?
        if [ "$rc" -eq 5 ]; then echo "pytest ran no test: that is a failure" >&2; exit 1; fi
        if [ "$rc" -ne 0 ]; then exit "$rc"; fi
    }
    run -n 4 -m "not chaos" {{args}}
    run -m chaos -s {{args}}

# Format check, lint, types and the import-layering contract.
check: venv
    .venv/bin/ruff format --check .
    .venv/bin/ruff check .
    .venv/bin/mypy
    .venv/bin/lint-imports

# Rewrite formatting and apply safe lint fixes.
fmt: venv
    .venv/bin/ruff format .
    .venv/bin/ruff check --fix .

# Benchmarks: printed figures, not timed tests (PostgreSQL backend, then RabbitMQ dispatch).
bench: venv
    {{python}} ops/bench/claim_ack.py
    {{python}} ops/bench/steps.py
