#!/usr/bin/env bash
# `just down`: stop the processes `just up` started (recorded in .vibey/pids), by pid.
# Services that were already running when `just up` found them are left alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
pids=.vibey/pids
if [ ! -s "$pids" ]; then echo "nothing to stop"; exit 0; fi
while read -r pid name; do
    if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" && echo "stopped $name ($pid)"; fi
done < "$pids"
rm -f "$pids"
