#!/usr/bin/env bash
# Make sure PostgreSQL and RabbitMQ answer on loopback; start them if they do not.
# Order: reuse what answers; else Docker compose where a Docker engine runs; else the
# machine's own service commands (Debian packages). Used by `just up` and by .ci/run.
set -euo pipefail

PG_HOST=${VIBEY_LOCAL_PG_HOST:-127.0.0.1}
PG_PORT=${VIBEY_LOCAL_PG_PORT:-5432}
AMQP_PORT=${VIBEY_LOCAL_AMQP_PORT:-5672}
here=$(cd "$(dirname "$0")" && pwd)

pg_answers() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null; }
amqp_answers() { (exec 3<>"/dev/tcp/127.0.0.1/$AMQP_PORT") 2>/dev/null; }

wait_for() {  # name, check function, seconds
    local name=$1 check=$2 limit=$3
    for _ in $(seq "$limit"); do
        if "$check"; then echo "$name: up"; return 0; fi
        sleep 1
    done
    echo "$name did not come up within ${limit}s" >&2
    return 1
}

docker_works() { command -v docker >/dev/null && docker info >/dev/null 2>&1; }

start_pg() {
    if docker_works; then
        docker compose -f "$here/compose.yaml" up -d postgres
    elif command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | tail -n 1)" main start || true
    else
        echo "PostgreSQL is not running and cannot be started here: install PostgreSQL 15+ or Docker" >&2
        return 1
    fi
}

start_rabbit() {
    if docker_works; then
        docker compose -f "$here/compose.yaml" up -d rabbitmq
    elif command -v rabbitmq-server >/dev/null; then
        rabbitmq-server -detached || true
    else
        echo "RabbitMQ is not running and cannot be started here: install RabbitMQ 3.10+ or Docker" >&2
        return 1
    fi
}

if pg_answers; then echo "PostgreSQL: answering on $PG_HOST:$PG_PORT"; else
    echo "PostgreSQL: not answering, starting it"; start_pg; wait_for PostgreSQL pg_answers 60
fi
if amqp_answers; then echo "RabbitMQ: answering on 127.0.0.1:$AMQP_PORT"; else
    echo "RabbitMQ: not answering, starting it"; start_rabbit; wait_for RabbitMQ amqp_answers 90
fi
