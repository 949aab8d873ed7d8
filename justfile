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
    # An editable install ships no bytecode, and PYTHONDONTWRITEBYTECODE (set on some machines)
    # stops Python writing it: every command would compile the project anew (~40 ms a start).
    .venv/bin/python -m compileall -q -j 0 vibey store workflows actors >/dev/null

# Local stack (services reused or started, migrations, .env, worker fleet), then the demo at its first gate.
up: venv
    ops/local/up.sh

# Stop what `just up` started (the services it found running are left alone).
down:
    ops/local/down.sh

# The worker fleet in the foreground (Ctrl-C drains and stops it); flags as `vibey worker`.
worker *args: venv
    #!/usr/bin/env bash
    set -euo pipefail
    # The engines' workspace as an absolute path: a relative one would be resolved wherever git runs.
    ws=$(.venv/bin/python -c 'from vibey.settings import load_settings; print(load_settings().engine.workspace)')
    [[ $ws == /* ]] || ws=$PWD/$ws
    VIBEY_ENGINE_WORKSPACE=$ws exec .venv/bin/vibey worker {{args}}

# Start the demo workflow (idempotent) and list the gates it waits at.
demo: venv
    .venv/bin/vibey workflow start demo --script ops/demo/demo.toml
    .venv/bin/vibey gate list --project demo

# Apply the migrations to $VIBEY_PG_URL.
migrate: venv
    .venv/bin/vibey migrate

# The whole test suite: parallel tests first, then the real coding CLIs (installed at their
# pinned versions first), then the chaos tests (they kill real processes).
test *args: venv real-cli-install
    #!/usr/bin/env bash
    set -uo pipefail
    # A tier that collects nothing fails the run, unless pytest arguments narrowed it.
    narrowed={{ if args == "" { "0" } else { "1" } }}
    run() {
        .venv/bin/python -m pytest "$@"
        rc=$?
        if [ "$rc" -eq 5 ] && [ "$narrowed" = 1 ]; then return 0; fi
        if [ "$rc" -eq 5 ]; then echo "pytest ran no test: that is a failure" >&2; exit 1; fi
        if [ "$rc" -ne 0 ]; then exit "$rc"; fi
    }
    # Work stealing: a worker that runs dry takes half of another's queue, so the long
    # end-to-end tests do not finish one after another on one worker while the others idle.
    run -n 4 --dist worksteal -m "not chaos and not real_cli" {{args}}
    # The real CLIs mostly wait on their model servers and on the workflows they drive: three
    # at once on two cores, the whole workflows first (tests/real_cli/conftest.py), stolen
    # around by the idle workers.
    run -n 3 --dist worksteal -m real_cli {{args}}
    # The chaos tests: the heavy ones one after another on one worker (tests/chaos/groups.py),
    # the ones that mostly wait (on leases, outages, private servers) on the other three.
    run -m chaos -n 4 --dist loadgroup {{args}}

# Install the four coding CLIs at their pinned versions (ops/real-cli) into .vibey/real-cli.
real-cli-install:
    ops/real-cli/install.sh

# The real-binary tier alone: the pinned CLIs against the local model server.
real-cli *args: venv real-cli-install
    .venv/bin/python -m pytest -m real_cli tests/real_cli {{args}}

# The edit loop: the unit tier alone (no service needed), in parallel; pytest args narrow it.
test-fast *args: venv
    .venv/bin/python -m pytest -n 4 -m unit -q {{args}}

# Format check, lint, types, the import contracts (the layering, and no import circles) and
# every production module used by production code (ops/check/used_modules.py).
check: venv
    .venv/bin/ruff format --check .
    .venv/bin/ruff check .
    .venv/bin/mypy
    .venv/bin/lint-imports
    {{python}} ops/check/used_modules.py

# The capacity model (docs/capacity.md): the step benchmark's figures, sized for 10k-1M steps/day.
capacity *args: venv
    #!/usr/bin/env bash
    set -euo pipefail
    mkdir -p .vibey
    {{python}} ops/bench/steps.py --no-profile | tee .vibey/bench.txt
    {{python}} ops/bench/capacity.py .vibey/bench.txt {{args}}

# Render every Kubernetes overlay (generated/fleet.yaml from fleet.toml and vibey.toml), then
# print each one as `kubectl kustomize` renders it.
kube: venv
    #!/usr/bin/env bash
    set -euo pipefail
    {{python}} ops/kubernetes/render.py
    for overlay in ops/kubernetes/overlays/*/; do
        echo "# --- $overlay"
        kubectl kustomize "$overlay"
    done

# Rewrite formatting and apply safe lint fixes.
fmt: venv
    .venv/bin/ruff format .
    .venv/bin/ruff check --fix .

# DBOS Transact, pinned in ops/bench/dbos.txt, in a venv of its own (.vibey/bench-dbos).
bench-dbos:
    #!/usr/bin/env bash
    set -euo pipefail
    venv=.vibey/bench-dbos
    [ -x $venv/bin/python ] || python3 -m venv $venv
    if [ ! -f $venv/.installed ] || [ ops/bench/dbos.txt -nt $venv/.installed ]; then
        $venv/bin/python -m pip install -q --disable-pip-version-check -r ops/bench/dbos.txt
        touch $venv/.installed
    fi

# Benchmarks: printed figures, not timed tests (PostgreSQL backend, then RabbitMQ dispatch);
# three_steps.py runs the same workload through DBOS Transact right after vibey's, with ratios.
bench: venv bench-dbos
    {{python}} ops/bench/claim_ack.py
    {{python}} ops/bench/steps.py
    {{python}} ops/bench/three_steps.py --dbos-python .vibey/bench-dbos/bin/python --rounds 3
    {{python}} ops/bench/drain.py
    {{python}} ops/bench/protocol.py
    {{python}} ops/bench/protocol.py --no-ledger
    {{python}} ops/bench/ledger.py
    {{python}} ops/bench/inbox.py
    {{python}} ops/bench/priority.py
    ops/bench/cli_start.sh
