#!/usr/bin/env bash
# Make sure PostgreSQL and RabbitMQ answer at the configured loopback addresses; start them if
# they do not. Used by `just up` (ops/local/up.sh) and by .ci/run.
#
# Where: the host and port of VIBEY_PG_URL (else VIBEY_TEST_PG_URL, else 127.0.0.1:5432) and of
# VIBEY_AMQP_URL (else VIBEY_TEST_AMQP_URL, else 127.0.0.1:5672); VIBEY_LOCAL_PG_HOST,
# VIBEY_LOCAL_PG_PORT and VIBEY_LOCAL_AMQP_PORT override them.
#
# Order, per service: reuse what answers (and record nothing); else Docker compose
# (ops/local/compose.yaml) where a Docker engine answers; else the machine's own service
# commands (Debian's pg_ctlcluster, rabbitmq-server -detached as root); else the native
# binaries in a project-local data folder (ops/local/native.sh). VIBEY_LOCAL_SERVICES=
# auto (default) | docker | service | native | none chooses one way (none: never start).
#
# What it starts it records, one tab-separated line each, in $VIBEY_STATE_DIR/pids (default
# .vibey/pids), for ops/local/down.sh: only what it started, never what it found running.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
STATE=${VIBEY_STATE_DIR:-$repo/.vibey}
PIDS=$STATE/pids
WAY=${VIBEY_LOCAL_SERVICES:-auto}

case "$WAY" in auto | docker | service | native | none) ;; *)
    echo "VIBEY_LOCAL_SERVICES=$WAY: choose auto, docker, service, native or none" >&2; exit 2 ;;
esac

url_host() {  # URL: its host (127.0.0.1 when it names none)
    local rest=${1#*://}
    rest=${rest%%/*}; rest=${rest%%\?*}; rest=${rest##*@}
    case "$rest" in
        \[*\]*) rest=${rest#\[}; rest=${rest%%\]*} ;;  # [::1]:5432
        *:*) rest=${rest%:*} ;;
    esac
    echo "${rest:-127.0.0.1}"
}

url_port() {  # URL DEFAULT: its port
    local rest=${1#*://}
    rest=${rest%%/*}; rest=${rest%%\?*}; rest=${rest##*@}; rest=${rest##*\]}
    case "$rest" in *:*) echo "${rest##*:}" ;; *) echo "$2" ;; esac
}

PG_URL=${VIBEY_PG_URL:-${VIBEY_TEST_PG_URL:-postgresql://postgres@127.0.0.1:5432/postgres}}
AMQP_URL=${VIBEY_AMQP_URL:-${VIBEY_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}}
PG_HOST=${VIBEY_LOCAL_PG_HOST:-$(url_host "$PG_URL")}
PG_PORT=${VIBEY_LOCAL_PG_PORT:-$(url_port "$PG_URL" 5432)}
PG_USER=${PG_URL#*://}
case "$PG_USER" in *@*) PG_USER=${PG_USER%%@*}; PG_USER=${PG_USER%%:*} ;; *) PG_USER=postgres ;; esac
AMQP_HOST=$(url_host "$AMQP_URL")
AMQP_PORT=${VIBEY_LOCAL_AMQP_PORT:-$(url_port "$AMQP_URL" 5672)}

is_loopback() { case "$1" in 127.* | localhost | ::1) return 0 ;; *) return 1 ;; esac; }

tcp_answers() {  # HOST PORT
    local host=$1 port=$2
    if command -v timeout >/dev/null; then
        timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null
    else
        (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
    fi
}

pg_answers() {
    if command -v pg_isready >/dev/null; then
        pg_isready -q -t 3 -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null
    else
        tcp_answers "$PG_HOST" "$PG_PORT"
    fi
}
amqp_answers() { tcp_answers "$AMQP_HOST" "$AMQP_PORT"; }

wait_for() {  # NAME CHECK SECONDS
    local name=$1 check=$2 limit=$3 i
    for ((i = 0; i < limit; i++)); do
        if "$check"; then echo "$name: up"; return 0; fi
        sleep 1
    done
    echo "$name did not come up within ${limit}s" >&2
    return 1
}

record() {  # FIELDS...: one tab-separated line in the state file
    mkdir -p "$STATE"
    local IFS=$'\t'
    echo "$*" >>"$PIDS"
}

wants() { [ "$WAY" = auto ] || [ "$WAY" = "$1" ]; }

docker_works() { command -v docker >/dev/null && docker info >/dev/null 2>&1; }

# The Debian cluster that listens on PG_PORT: "VERSION NAME", or nothing.
debian_cluster() {
    local conf port version name
    for conf in /etc/postgresql/*/*/postgresql.conf; do
        [ -f "$conf" ] || continue
        port=$(sed -nE 's/^[[:space:]]*port[[:space:]]*=[[:space:]]*([0-9]+).*/\1/p' "$conf" | tail -n 1)
        if [ "${port:-5432}" = "$PG_PORT" ]; then
            name=$(basename "$(dirname "$conf")")
            version=$(basename "$(dirname "$(dirname "$conf")")")
            echo "$version $name"
            return 0
        fi
    done
    return 1
}

start_pg() {
    local cluster record_line
    if wants docker && [ "$PG_PORT" = 5432 ] && docker_works; then
        docker compose -f "$here/compose.yaml" up -d postgres
        record postgresql docker "$here/compose.yaml"
        return 0
    fi
    if wants service && command -v pg_ctlcluster >/dev/null && cluster=$(debian_cluster); then
        # shellcheck disable=SC2086 # "VERSION NAME": two words on purpose
        if pg_ctlcluster --skip-systemctl-redirect $cluster start; then
            record postgresql service $cluster
            return 0
        fi
        echo "PostgreSQL: pg_ctlcluster $cluster start failed" >&2
    fi
    if wants native; then
        record_line=$("$here/native.sh" start-postgresql "$PG_HOST" "$PG_PORT" "$PG_USER")
        mkdir -p "$STATE"; echo "$record_line" >>"$PIDS"
        return 0
    fi
    echo "PostgreSQL is not running and cannot be started here ($WAY): install PostgreSQL 15+ or Docker" >&2
    return 1
}

# The machine's RabbitMQ service listens on the port its rabbitmq.conf names (5672 by default).
service_amqp_port() {
    local port=""
    if [ -f /etc/rabbitmq/rabbitmq.conf ]; then
        port=$(sed -nE 's/^[[:space:]]*listeners\.tcp\.[^=]*=[[:space:]]*([^[:space:]]*:)?([0-9]+).*/\2/p' \
            /etc/rabbitmq/rabbitmq.conf | head -n 1)
    fi
    echo "${port:-5672}"
}

start_rabbit() {
    local record_line
    if wants docker && [ "$AMQP_PORT" = 5672 ] && docker_works; then
        docker compose -f "$here/compose.yaml" up -d rabbitmq
        record rabbitmq docker "$here/compose.yaml"
        return 0
    fi
    if wants service && [ "$(id -u)" = 0 ] && [ -d /etc/rabbitmq ] && command -v rabbitmq-server >/dev/null &&
        [ "$(service_amqp_port)" = "$AMQP_PORT" ]; then
        if rabbitmq-server -detached; then
            record rabbitmq service -
            return 0
        fi
        echo "RabbitMQ: rabbitmq-server -detached failed" >&2
    fi
    if wants native; then
        record_line=$("$here/native.sh" start-rabbitmq "$AMQP_PORT")
        mkdir -p "$STATE"; echo "$record_line" >>"$PIDS"
        return 0
    fi
    echo "RabbitMQ is not running and cannot be started here ($WAY): install RabbitMQ 3.10+ or Docker" >&2
    return 1
}

cannot_start_remote() {  # NAME HOST
    echo "$1 at $2 does not answer, and only a loopback service is started here: start it, or fix the URL" >&2
    exit 3
}

if pg_answers; then echo "PostgreSQL: answering on $PG_HOST:$PG_PORT"; else
    is_loopback "$PG_HOST" || cannot_start_remote PostgreSQL "$PG_HOST:$PG_PORT"
    [ "$WAY" != none ] || { echo "PostgreSQL does not answer on $PG_HOST:$PG_PORT (VIBEY_LOCAL_SERVICES=none)" >&2; exit 3; }
    echo "PostgreSQL: not answering on $PG_HOST:$PG_PORT, starting it"
    start_pg
    wait_for PostgreSQL pg_answers 60
fi
if amqp_answers; then echo "RabbitMQ: answering on $AMQP_HOST:$AMQP_PORT"; else
    is_loopback "$AMQP_HOST" || cannot_start_remote RabbitMQ "$AMQP_HOST:$AMQP_PORT"
    [ "$WAY" != none ] || { echo "RabbitMQ does not answer on $AMQP_HOST:$AMQP_PORT (VIBEY_LOCAL_SERVICES=none)" >&2; exit 3; }
    echo "RabbitMQ: not answering on $AMQP_HOST:$AMQP_PORT, starting it"
    start_rabbit
    wait_for RabbitMQ amqp_answers 90
fi
