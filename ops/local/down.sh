#!/usr/bin/env bash
# `just down`: stop exactly what `just up` started, as recorded in $VIBEY_STATE_DIR/pids
# (default .vibey/pids), newest first: the worker fleet (SIGTERM to its process group, SIGKILL
# after VIBEY_DOWN_TIMEOUT seconds, default 30) and the web console (the same way), then any service up started (natively, through
# the machine's service commands, or with Docker compose). Services that were already running
# when `just up` found them were never recorded and are left alone. Running it again is harmless.
#
# The state file has one tab-separated line per thing started:
#   worker      group    PGID                     console   group    PGID
#   loop-service group   PGID ENGINE             notify    group    PGID
#   postgresql  native   DATADIR BINDIR RUNAS     rabbitmq  native   ROOT NODE PGID EPMD_STARTED
#   postgresql  service  VERSION CLUSTER          rabbitmq  service  -
#   postgresql  docker   COMPOSE_FILE             rabbitmq  docker   COMPOSE_FILE
# A line whose thing could not be stopped stays in the file, and down exits 1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
STATE=${VIBEY_STATE_DIR:-$repo/.vibey}
PIDS=$STATE/pids
TIMEOUT=${VIBEY_DOWN_TIMEOUT:-30}

if [ ! -s "$PIDS" ]; then echo "nothing to stop: \`just up\` started nothing that still runs"; exit 0; fi

if command -v flock >/dev/null; then
    exec 9>"$STATE/lock"
    flock -w 300 9 || { echo "another \`just up\` or \`just down\` holds $STATE/lock" >&2; exit 1; }
fi

stop_one() {  # the fields of one line; 0 once that thing is stopped (or was already gone)
    local name=$1 how=$2
    shift 2
    case "$name/$how" in
        worker/group)
            # Only a group that still runs this checkout's Python (a pid can be reused once gone).
            if ! "$here/native.sh" group-has "$1" "$repo/.venv/bin/"; then
                echo "worker: pid $1 had already stopped"
                return 0
            fi
            "$here/native.sh" stop-group "$1" "$TIMEOUT" && echo "stopped the worker fleet (process group $1)"
            ;;
        console/group)
            if ! "$here/native.sh" group-has "$1" "vibey console"; then
                echo "console: pid $1 had already stopped"
                return 0
            fi
            "$here/native.sh" stop-group "$1" "$TIMEOUT" && echo "stopped the web console (process group $1)"
            ;;
        notify/group)
            if ! "$here/native.sh" group-has "$1" "vibey notify"; then
                echo "notify: pid $1 had already stopped"
                return 0
            fi
            "$here/native.sh" stop-group "$1" "$TIMEOUT" && echo "stopped the webhooks' consumer (process group $1)"
            ;;
        loop-service/group)
            if ! "$here/native.sh" group-has "$1" "$repo/.venv/bin/"; then
                echo "loop-service ${2:-}: pid $1 had already stopped"
                return 0
            fi
            "$here/native.sh" stop-group "$1" "$TIMEOUT" && echo "stopped the loop service ${2:-} (process group $1)"
            ;;
        postgresql/native)
            "$here/native.sh" stop-postgresql "$@" && echo "stopped PostgreSQL (native, data $1)"
            ;;
        rabbitmq/native)
            "$here/native.sh" stop-rabbitmq "$@" && echo "stopped RabbitMQ (native node $2, data $1)"
            ;;
        postgresql/service)
            pg_ctlcluster --skip-systemctl-redirect "$1" "$2" stop &&
                echo "stopped PostgreSQL (pg_ctlcluster $1 $2)"
            ;;
        rabbitmq/service)
            rabbitmqctl -q stop && echo "stopped RabbitMQ (rabbitmqctl stop)"
            ;;
        postgresql/docker)
            docker compose -f "$1" stop postgres && echo "stopped PostgreSQL (docker compose)"
            ;;
        rabbitmq/docker)
            docker compose -f "$1" stop rabbitmq && echo "stopped RabbitMQ (docker compose)"
            ;;
        *)
            echo "unknown line in $PIDS: $name $how $*: left there" >&2
            return 1
            ;;
    esac
}

lines=()
while IFS= read -r line || [ -n "$line" ]; do lines+=("$line"); done <"$PIDS"
kept=()
rc=0
for ((i = ${#lines[@]} - 1; i >= 0; i--)); do
    line=${lines[i]}
    [ -n "$line" ] || continue
    IFS=$'\t' read -r -a fields <<<"$line"
    if stop_one "${fields[@]}"; then :; else
        echo "could not stop: $line (kept in $PIDS)" >&2
        kept=("$line" "${kept[@]}")
        rc=1
    fi
done
if [ ${#kept[@]} -gt 0 ]; then printf '%s\n' "${kept[@]}" >"$PIDS"; else rm -f "$PIDS" "$STATE/worker.settings"; fi
exit "$rc"
