#!/usr/bin/env bash
# `just up`: the local stack, then the demo waiting at its first gate.
#
#  1. PostgreSQL and RabbitMQ: reused if they answer, else started (ops/local/services.sh).
#  2. The database of VIBEY_PG_URL (created if missing) and its migrations; .env if missing.
#  3. The worker fleet (`vibey worker`, with the reconciler) in the background, in a process
#     group of its own, logging to $VIBEY_STATE_DIR/logs/worker.log. A fleet a previous
#     `just up` started is reused while it runs with the same settings. Beside it, one
#     `vibey loop-service --engine <id>` per engine with invocation = "service" (its log:
#     $VIBEY_STATE_DIR/logs/loop-<id>.log), and `vibey notify` (the webhooks' consumer) when a
#     [notify.webhooks.<name>] table is configured (its log: $VIBEY_STATE_DIR/logs/notify.log).
#  4. The web console (`vibey console`) in the background, in a process group of its own, logging
#     to $VIBEY_STATE_DIR/logs/console.log; its URL is printed. With no [console] password_hash
#     or token_hash configured, up makes a token (kept in $VIBEY_STATE_DIR/console.token) and
#     starts the console with its hash. A console a previous `just up` started is reused.
#  5. `vibey workflow start demo --script ops/demo/demo.toml` (idempotent), then it waits for
#     the demo's first open gate and prints the `vibey gate answer` commands that continue it.
#
# Everything it starts is recorded in $VIBEY_STATE_DIR/pids, for ops/local/down.sh. Running it
# again is harmless. Settings: the VIBEY_* variables (those in .env fill what is unset), plus
#   VIBEY_STATE_DIR          state, logs and native data (default .vibey)
#   VIBEY_ENV_FILE           the settings file it reads and writes when missing (default .env)
#   VIBEY_LOCAL_SERVICES     auto | docker | service | native | none (see services.sh)
#   VIBEY_UP_DEMO            1 (default): start the demo; 0: the stack only
#   VIBEY_UP_WORKER_TIMEOUT  seconds for the worker to be consuming (default 60)
#   VIBEY_UP_DEMO_TIMEOUT    seconds for the demo to reach a gate (default 60)
#   VIBEY_UP_CONSOLE         1 (default): start the web console; 0: do not
#   VIBEY_CONSOLE_PORT       the console's port (default 8377; see [console] in vibey.toml)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

STATE=${VIBEY_STATE_DIR:-$repo/.vibey}
mkdir -p "$STATE/logs"
STATE=$(cd "$STATE" && pwd)
export VIBEY_STATE_DIR=$STATE
PIDS=$STATE/pids
WORKER_LOG=$STATE/logs/worker.log
ENV_FILE=${VIBEY_ENV_FILE:-.env}
VIBEY=$repo/.venv/bin/vibey
PY=$repo/.venv/bin/python
export VIBEY_PYTHON=$PY
DEMO_PROJECT=demo
DEMO_SCRIPT=ops/demo/demo.toml
WORKER_TIMEOUT=${VIBEY_UP_WORKER_TIMEOUT:-60}
DEMO_TIMEOUT=${VIBEY_UP_DEMO_TIMEOUT:-60}

[ -x "$VIBEY" ] || { echo "no $VIBEY: run \`just up\` (it creates the virtualenv), or \`just venv\`" >&2; exit 2; }

# One `up` or `down` at a time on a state folder (where flock exists).
if command -v flock >/dev/null; then
    exec 9>"$STATE/lock"
    flock -w 300 9 || { echo "another \`just up\` or \`just down\` holds $STATE/lock" >&2; exit 1; }
fi

# What .env says fills what the environment leaves unset (as `just` does with dotenv-load).
if [ -f "$ENV_FILE" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
        [[ $line =~ ^[[:space:]]*(export[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || continue
        name=${BASH_REMATCH[2]} value=${BASH_REMATCH[3]}
        [[ $value =~ ^\"(.*)\"$ || $value =~ ^\'(.*)\'$ ]] && value=${BASH_REMATCH[1]}
        [ -n "${!name:-}" ] || export "$name=$value"
    done <"$ENV_FILE"
fi

PG_URL=${VIBEY_PG_URL:-postgresql://postgres@127.0.0.1:5432/vibey}
AMQP_URL=${VIBEY_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
export VIBEY_PG_URL=$PG_URL VIBEY_AMQP_URL=$AMQP_URL

# 1. Services ----------------------------------------------------------------------------------
# (9>&-: what it starts must not inherit the lock, or it would hold it for its whole life.)
ops/local/services.sh 9>&-

# 2. Database, migrations, .env ----------------------------------------------------------------
db=${PG_URL##*/}; db=${db%%\?*}
PG_ADMIN_URL=${VIBEY_TEST_PG_URL:-${PG_URL%/*}/postgres}
"$PY" - "$PG_ADMIN_URL" "$db" <<'PY'
import sys

import psycopg
from psycopg import sql

admin_url, name = sys.argv[1], sys.argv[2]
try:
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as admin:
        found = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        if found.fetchone() is None:
            try:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                print(f"created database {name}")
            except psycopg.errors.DuplicateDatabase:
                pass  # created meanwhile by another `just up`
except psycopg.Error as exc:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
    sys.exit(f"cannot create the database {name} through {admin_url.split('@')[-1]}: {detail}")
PY

"$VIBEY" migrate

if [ ! -f "$ENV_FILE" ]; then
    cat >"$ENV_FILE" <<ENV
# Written by \`just up\`; edit freely. Loaded by every just recipe.
VIBEY_PG_URL=$PG_URL
VIBEY_AMQP_URL=$AMQP_URL
VIBEY_TEST_PG_URL=$PG_ADMIN_URL
VIBEY_TEST_AMQP_URL=$AMQP_URL
ENV
    echo "wrote $ENV_FILE"
fi

if ! doctor=$("$VIBEY" doctor 2>&1); then
    echo "$doctor" >&2
    echo "vibey doctor is not healthy (above): fix that, then run \`just up\` again" >&2
    exit 1
fi

# 3. The worker fleet --------------------------------------------------------------------------
# The engines' workspace (git repositories and worktrees), as an absolute path: a relative one
# would be resolved against whatever directory git runs in. Default: $VIBEY_STATE_DIR/work.
workspace=$("$PY" -c 'from vibey.settings import load_settings; print(load_settings().engine.workspace)')
if [ -z "${VIBEY_ENGINE_WORKSPACE:-}" ] && [ "$workspace" = .vibey/work ]; then workspace=$STATE/work; fi
[[ $workspace == /* ]] || workspace=$repo/$workspace
export VIBEY_ENGINE_WORKSPACE=$workspace

# The settings a running fleet was started with; a change means a new fleet.
fingerprint=$(env | grep -E '^VIBEY_(PG_URL|AMQP_URL|QUEUE_|BUS_|WORKER_|ENGINE_|WORKFLOW_|CONFIG)' | sort | cksum | cut -d' ' -f1)
recorded_worker() {  # the pid of the fleet recorded in the state file, or nothing
    [ -f "$PIDS" ] && awk -F'\t' '$1 == "worker" && $2 == "group" { pid = $3 } END { if (pid) print pid }' "$PIDS"
}
is_our_worker() {  # PID: alive, leads its group, and runs `vibey worker`
    local pid=$1 args
    ops/local/native.sh group-alive "$pid" || return 1
    args=$(ps -ww -o args= -p "$pid" 2>/dev/null) || return 1
    [[ $args == *vibey*worker* ]]
}
forget_worker() {  # PID: drop its line from the state file
    local kept
    kept=$(awk -F'\t' -v p="$1" '!($1 == "worker" && $3 == p)' "$PIDS")
    if [ -n "$kept" ]; then printf '%s\n' "$kept" >"$PIDS"; else rm -f "$PIDS"; fi
}

worker_pid=$(recorded_worker || true)
if [ -n "$worker_pid" ]; then
    if ! is_our_worker "$worker_pid"; then
        echo "worker: the fleet of a previous \`just up\` ($worker_pid) is gone; starting a new one"
        forget_worker "$worker_pid"
        worker_pid=""
    elif [ "$(cat "$STATE/worker.settings" 2>/dev/null || true)" != "$fingerprint" ]; then
        echo "worker: the settings changed since pid $worker_pid started; restarting the fleet"
        ops/local/native.sh stop-group "$worker_pid" "${VIBEY_DOWN_TIMEOUT:-30}"
        forget_worker "$worker_pid"
        worker_pid=""
    else
        echo "worker: reusing the fleet a previous \`just up\` started (pid $worker_pid)"
    fi
fi
if [ -z "$worker_pid" ]; then
    echo "--- $(date '+%Y-%m-%d %H:%M:%S') started by ops/local/up.sh ---" >>"$WORKER_LOG"
    worker_pid=$(ops/local/native.sh spawn "$WORKER_LOG" "$VIBEY" worker 9>&-)
    printf 'worker\tgroup\t%s\n' "$worker_pid" >>"$PIDS"
    echo "$fingerprint" >"$STATE/worker.settings"
    echo "worker: started \`vibey worker\` (pid $worker_pid, log $WORKER_LOG)"
fi

# 4. The web console (started now, so that it starts while the fleet does) -----------------
CONSOLE_LOG=$STATE/logs/console.log
console_line="not started (VIBEY_UP_CONSOLE=0)"
console_answers_as() {  # PID: the console answering on its URL says it is that process
    "$PY" - "$console_url" "$1" <<'PY'
import sys
import urllib.request

url, pid = sys.argv[1], sys.argv[2]
try:
    with urllib.request.urlopen(url + "healthz", timeout=2) as answer:
        sys.exit(0 if answer.headers.get("X-Vibey-Pid") == pid else 1)
except OSError:
    sys.exit(1)
PY
}
recorded_console() {
    [ -f "$PIDS" ] && awk -F'\t' '$1 == "console" && $2 == "group" { pid = $3 } END { if (pid) print pid }' "$PIDS"
}
read -r console_url signs_in < <("$PY" -c 'from vibey.settings import load_settings as s; c = s().console; h = f"[{c.host}]" if ":" in c.host else c.host; print(f"http://{h}:{c.port}/", int(c.signs_in))')
if [ "${VIBEY_UP_CONSOLE:-1}" != 0 ]; then
    sign_in="sign in with your [console] password or token"
    if [ "$signs_in" = 0 ]; then
        if [ ! -s "$STATE/console.token" ] || [ ! -s "$STATE/console.token_hash" ]; then
            (umask 077 && "$VIBEY" console hash --token >"$STATE/console.made")
            awk '$1 == "token:" { print $2 }' "$STATE/console.made" >"$STATE/console.token"
            awk '$1 == "token_hash:" { print $2 }' "$STATE/console.made" >"$STATE/console.token_hash"
            rm -f "$STATE/console.made"
        fi
        export VIBEY_CONSOLE_TOKEN_HASH
        VIBEY_CONSOLE_TOKEN_HASH=$(cat "$STATE/console.token_hash")
        sign_in="sign in with the token in $STATE/console.token (no username)"
    fi
    console_pid=$(recorded_console || true)
    if [ -n "$console_pid" ] && { ops/local/native.sh group-has "$console_pid" "bin/vibey console" ||
        console_answers_as "$console_pid"; }; then
        echo "console: reusing the console a previous \`just up\` started (pid $console_pid)"
    else
        if [ -n "$console_pid" ]; then
            kept=$(awk -F'\t' -v p="$console_pid" '!($1 == "console" && $3 == p)' "$PIDS")
            if [ -n "$kept" ]; then printf '%s\n' "$kept" >"$PIDS"; else rm -f "$PIDS"; fi
        fi
        echo "--- $(date '+%Y-%m-%d %H:%M:%S') started by ops/local/up.sh ---" >>"$CONSOLE_LOG"
        console_pid=$(ops/local/native.sh spawn "$CONSOLE_LOG" "$VIBEY" console 9>&-)
        printf 'console\tgroup\t%s\n' "$console_pid" >>"$PIDS"
    fi
fi

# Ready: the fleet said what it runs and every queue it serves has a consumer.
if ! "$PY" - "$worker_pid" "$WORKER_TIMEOUT" <<'PY'; then
import os
import sys
import time

import pika
import pika.exceptions

from actors.topology import QueueNames
from vibey.settings import SettingsError, load_settings

pid, timeout = int(sys.argv[1]), float(sys.argv[2])
try:
    settings = load_settings()
    names = QueueNames(settings.bus.prefix)
    queues = [names.work_queue(lane) for lane in settings.worker.lanes]
except (SettingsError, ValueError) as exc:
    sys.exit(f"worker: {exc}")
params = pika.URLParameters(settings.require_amqp_url())
params.connection_attempts, params.socket_timeout = 1, 5


def alive() -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def consumed() -> bool:
    connection = pika.BlockingConnection(params)
    try:
        for queue in queues:
            try:
                frame = connection.channel().queue_declare(queue, passive=True)
            except pika.exceptions.ChannelClosedByBroker:
                return False  # not declared yet
            if frame.method.consumer_count < 1:
                return False
        return True
    finally:
        connection.close()


deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    if not alive():
        print(f"worker: pid {pid} exited", file=sys.stderr)
        sys.exit(1)
    try:
        if consumed():
            print(f"worker: consuming {', '.join(queues)}")
            sys.exit(0)
    except (pika.exceptions.AMQPError, OSError):
        pass
    time.sleep(0.5)
print(f"worker: not consuming {', '.join(queues)} within {timeout:.0f}s", file=sys.stderr)
sys.exit(1)
PY
    echo "the worker fleet did not become ready; its log ends:" >&2
    tail -n 30 "$WORKER_LOG" >&2 || true
    exit 1
fi

# The console started above (in the meantime): it answers, as itself, or it says why not.
if [ "${VIBEY_UP_CONSOLE:-1}" != 0 ]; then
    if "$PY" - "$console_url" "$console_pid" <<'PY'; then
import os
import sys
import time
import urllib.request

url, pid = sys.argv[1], int(sys.argv[2])
# Ours: the console that answers names its pid (another one may hold the port).
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(1)
    try:
        with urllib.request.urlopen(url + "healthz", timeout=2) as answer:
            if answer.read() == b"ok" and answer.headers.get("X-Vibey-Pid") == str(pid):
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.3)
sys.exit(1)
PY
        console_line="$console_url  (pid $console_pid, log $CONSOLE_LOG; $sign_in)"
        echo "console: serving $console_url"
    else
        console_line="did not start: see $CONSOLE_LOG (is port ${console_url##*:} taken? set VIBEY_CONSOLE_PORT)"
        echo "console: $console_line; its log ends:" >&2
        tail -n 5 "$CONSOLE_LOG" >&2 || true
    fi
fi

# 3. (beside the fleet) One loop service per engine with invocation = "service" (docs/engines.md)
service_engines=$("$PY" -c 'from vibey.settings import load_settings
print(" ".join(s.id for s in load_settings().engines if s.as_service))')
for engine in $service_engines; do
    loop_log=$STATE/logs/loop-$engine.log
    loop_pid=$([ -f "$PIDS" ] && awk -F'\t' -v e="$engine" '$1 == "loop-service" && $4 == e { p = $3 } END { if (p) print p }' "$PIDS" || true)
    if [ -n "$loop_pid" ] && ops/local/native.sh group-alive "$loop_pid" &&
        [[ $(ps -ww -o args= -p "$loop_pid" 2>/dev/null) == *loop-service* ]]; then
        echo "loop-service $engine: reusing pid $loop_pid"
        continue
    fi
    echo "--- $(date '+%Y-%m-%d %H:%M:%S') started by ops/local/up.sh ---" >>"$loop_log"
    loop_pid=$(ops/local/native.sh spawn "$loop_log" "$VIBEY" loop-service --engine "$engine" 9>&-)
    printf 'loop-service\tgroup\t%s\t%s\n' "$loop_pid" "$engine" >>"$PIDS"
    echo "loop-service $engine: started (pid $loop_pid, log $loop_log)"
done

# (beside the fleet) The webhooks' consumer, `vibey notify`, when [notify.webhooks.<name>] has one.
notify_line="not started (no [notify.webhooks.<name>] configured)"
if [ "$("$PY" -c 'from vibey.settings import load_settings; print(len(load_settings().webhooks))')" != 0 ]; then
    NOTIFY_LOG=$STATE/logs/notify.log
    notify_pid=$([ -f "$PIDS" ] && awk -F'\t' '$1 == "notify" && $2 == "group" { p = $3 } END { if (p) print p }' "$PIDS" || true)
    if [ -n "$notify_pid" ] && ops/local/native.sh group-has "$notify_pid" "bin/vibey notify"; then
        echo "notify: reusing pid $notify_pid"
    else
        echo "--- $(date '+%Y-%m-%d %H:%M:%S') started by ops/local/up.sh ---" >>"$NOTIFY_LOG"
        notify_pid=$(ops/local/native.sh spawn "$NOTIFY_LOG" "$VIBEY" notify 9>&-)
        printf 'notify\tgroup\t%s\n' "$notify_pid" >>"$PIDS"
        echo "notify: started (pid $notify_pid, log $NOTIFY_LOG)"
    fi
    notify_line="pid $notify_pid, log $NOTIFY_LOG"
fi

stack_summary() {
    local env_shown=$ENV_FILE
    [[ $env_shown == /* ]] || env_shown=./$env_shown
    cat <<MSG

vibey's local stack:
  PostgreSQL  $PG_URL  (migrated)
  RabbitMQ    $AMQP_URL
  worker      pid $worker_pid, log $WORKER_LOG  (\`just down\` stops it)
  console     $console_line
  webhooks    $notify_line
  settings    $ENV_FILE (loaded by just); to use vibey in a shell:
              source .venv/bin/activate; set -a; . $env_shown; set +a
MSG
}

stack_summary
if [ "${VIBEY_UP_DEMO:-1}" = 0 ]; then exit 0; fi

# 5. The demo ----------------------------------------------------------------------------------
if [ ! -f "$DEMO_SCRIPT" ]; then
    echo "the demo script $DEMO_SCRIPT is missing: the demo was not started" >&2
    exit 1
fi
if ! started=$("$VIBEY" workflow start "$DEMO_PROJECT" --script "$DEMO_SCRIPT" --json); then
    echo "\`vibey workflow start $DEMO_PROJECT --script $DEMO_SCRIPT\` failed (above)" >&2
    exit 1
fi

# Wait for the demo's first open gate (or its end), then say where it stopped and what to type.
"$PY" - "$VIBEY" "$DEMO_PROJECT" "$DEMO_TIMEOUT" "$started" <<'PY' && demo_rc=0 || demo_rc=$?
import json
import shlex
import subprocess
import sys
import time

vibey, project, timeout, started = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
TERMINAL = {"done", "completed", "succeeded", "failed", "cancelled", "canceled", "terminated"}


def run_json(*args: str) -> dict:
    done = subprocess.run([vibey, *args, "--json"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"vibey {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return json.loads(done.stdout)


def ended(workflow: dict) -> bool:
    status = str(workflow.get("status", "")).lower()
    return status in TERMINAL or str(workflow.get("phase", "")).upper() == "DONE"


try:
    workflow = json.loads(started)["workflow"]
    created = json.loads(started).get("created")
except (ValueError, KeyError, TypeError) as exc:
    sys.exit(f"demo: `vibey workflow start --json` printed no workflow ({exc!r}): {started[:300]}")
print(
    f"\ndemo: workflow {workflow.get('id')} {'started' if created else 'already there'} "
    f"(phase {workflow.get('phase')}, status {workflow.get('status')})"
)
deadline = time.monotonic() + timeout
gates: list = []
while True:
    try:
        gates = run_json("gate", "list", "--project", project)["gates"]
    except RuntimeError as exc:
        sys.exit(f"demo: {exc}")
    if gates:
        break
    try:
        workflow = run_json("workflow", "status", project).get("workflow", workflow)
    except RuntimeError as exc:
        sys.exit(f"demo: {exc}")
    if ended(workflow):
        print(
            f"demo: the workflow has ended (phase {workflow.get('phase')}, status "
            f"{workflow.get('status')}); it has no open gate"
        )
        sys.exit(10)
    if time.monotonic() >= deadline:
        print(
            f"demo: no open gate within {timeout:.0f}s (phase {workflow.get('phase')}, status "
            f"{workflow.get('status')}); follow it with `vibey workflow status {project}`",
            file=sys.stderr,
        )
        sys.exit(1)
    time.sleep(1)

try:
    workflow = run_json("workflow", "status", project).get("workflow", workflow)
except RuntimeError:
    pass  # the gates say enough
print(f"demo: waiting at a gate in phase {workflow.get('phase')} (status {workflow.get('status')})")
for gate in gates:
    answers = [str(a) for a in gate.get("answers") or []]
    name = gate.get("name") or gate.get("kind")
    print(f"\n  gate {name} ({gate.get('kind')}): {gate.get('question')}")
    if answers:
        print(f"  answers: {', '.join(answers)}")
        answer = shlex.quote(answers[0])
    else:
        print("  answers: any text")
        answer = shlex.quote("your answer, in your own words")
    print(f"  continue it with:\n    vibey gate answer {gate['id']} {answer}")
PY
if [ "$demo_rc" -eq 10 ]; then
    echo "Its history: \`vibey workflow history $DEMO_PROJECT\`. \`just down\` stops the worker."
    exit 0
fi
if [ "$demo_rc" -ne 0 ]; then exit "$demo_rc"; fi
cat <<MSG

Follow it in the web console ($console_url), or in a shell with the settings above:
  vibey workflow status $DEMO_PROJECT      the phase, what it waits on, the gates and their answer commands
  vibey workflow history $DEMO_PROJECT     every event so far
  vibey gate list                  every gate waiting for an answer
  tail -f $WORKER_LOG
Answer each gate as it opens, until \`vibey workflow status $DEMO_PROJECT\` says completed; then \`just down\`.
MSG
