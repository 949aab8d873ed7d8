#!/usr/bin/env bash
# The CLI's start-up with hyperfine: `vibey --version`, `vibey --help`, and `vibey gate list`
# (its first page) when VIBEY_PG_URL names a migrated database. Installs hyperfine from
# Debian's packages when it can (root and apt-get); otherwise says so and skips: the start-up
# figures of ops/bench/inbox.py (a subprocess per run, timed in Python) stand without it.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v hyperfine >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "cli_start: installing hyperfine (apt-get install -y hyperfine)"
        apt-get install -y -qq hyperfine >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq hyperfine >/dev/null 2>&1; } \
            || true
    fi
fi
if ! command -v hyperfine >/dev/null; then
    echo "cli_start: hyperfine is not installed (apt-get install -y hyperfine); skipped"
    exit 0
fi

vibey=.venv/bin/vibey
commands=("$vibey --version" "$vibey --help" ".venv/bin/python -c pass")
if [ -n "${VIBEY_PG_URL:-}" ]; then
    commands+=("$vibey gate list")
fi
hyperfine --shell=none --warmup 2 --runs "${CLI_START_RUNS:-20}" --style basic "${commands[@]}"
