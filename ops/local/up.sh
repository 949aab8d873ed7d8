#!/usr/bin/env bash
# `just up`: the local stack. Services first, then the vibey database, migrations and .env.
set -euo pipefail
cd "$(dirname "$0")/../.."

ops/local/services.sh

PG_ADMIN_URL=${VIBEY_TEST_PG_URL:-postgresql://postgres@127.0.0.1:5432/postgres}
PG_URL=${VIBEY_PG_URL:-postgresql://postgres@127.0.0.1:5432/vibey}
AMQP_URL=${VIBEY_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
db=${PG_URL##*/}; db=${db%%\?*}

if ! psql "$PG_ADMIN_URL" -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1; then
    psql "$PG_ADMIN_URL" -qc "CREATE DATABASE \"$db\"" && echo "created database $db"
fi

VIBEY_PG_URL=$PG_URL .venv/bin/vibey migrate

if [ ! -f .env ]; then
    cat > .env <<ENV
# Written by \`just up\`; edit freely. Loaded by every just recipe.
VIBEY_PG_URL=$PG_URL
VIBEY_AMQP_URL=$AMQP_URL
VIBEY_TEST_PG_URL=$PG_ADMIN_URL
VIBEY_TEST_AMQP_URL=$AMQP_URL
ENV
    echo "wrote .env"
fi

cat <<MSG

vibey's local stack:
  PostgreSQL  $PG_URL  (migrated)
  RabbitMQ    $AMQP_URL
  settings    .env (loaded by just); export them to use \`.venv/bin/vibey\` directly:
              set -a; . ./.env; set +a
MSG
