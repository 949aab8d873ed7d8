#!/usr/bin/env bash
# Process mechanics for the local stack: start and stop PostgreSQL and RabbitMQ from the
# machine's own binaries in a project-local data folder, and run or stop a background process
# in a process group of its own. Used by services.sh, up.sh and down.sh; every wait is bounded.
#
#   native.sh start-postgresql HOST PORT USER   initdb (once) + pg_ctl start in $DATA/postgres
#   native.sh stop-postgresql DATADIR BINDIR RUNAS
#   native.sh start-rabbitmq PORT               rabbitmq-server in $DATA/rabbitmq, own node name
#   native.sh stop-rabbitmq ROOT NODE PGID EPMD_STARTED
#   native.sh spawn LOG CMD [ARGS...]           CMD in a new session (its own process group),
#                                               stdout+stderr appended to LOG; prints its pid
#   native.sh group-alive PGID                  exit 0 while a live (non-zombie) process is in it
#   native.sh group-has PGID TEXT               exit 0 if a live process of it has TEXT in its args
#   native.sh stop-group PGID SECONDS           SIGTERM the group, SIGKILL what is left after SECONDS
#
# start-* print one tab-separated record line on stdout (what stop-* needs) for the state file:
#   postgresql<TAB>native<TAB>DATADIR<TAB>BINDIR<TAB>RUNAS
#   rabbitmq<TAB>native<TAB>ROOT<TAB>NODE<TAB>PGID<TAB>EPMD_STARTED
#
# Environment: VIBEY_STATE_DIR (default .vibey in the repository), data in $VIBEY_STATE_DIR/data,
# logs in $VIBEY_STATE_DIR/logs; VIBEY_PG_BINDIR (where initdb and pg_ctl are; default: found);
# VIBEY_RABBITMQ_BINDIR (where rabbitmq-server and rabbitmqctl are; default: found);
# VIBEY_RABBITMQ_NODENAME (default vibey-PORT@localhost).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
STATE=${VIBEY_STATE_DIR:-$repo/.vibey}
[[ $STATE == /* ]] || STATE=$PWD/$STATE
DATA=$STATE/data
LOGS=$STATE/logs
PYTHON=${VIBEY_PYTHON:-python3}

die() { echo "$*" >&2; exit 1; }

# --- process groups ---------------------------------------------------------------------------

spawn() {  # LOG CMD ARGS...: start CMD in a new session; print its pid (= its process group)
    local log=$1; shift
    mkdir -p "$(dirname "$log")"
    "$PYTHON" - "$log" "$@" <<'PY'
import subprocess
import sys

with open(sys.argv[1], "ab") as log:
    child = subprocess.Popen(
        sys.argv[2:],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own session and process group; no terminal to hang up
        close_fds=True,
    )
print(child.pid)
PY
}

group_alive() {  # PGID: a process of the group that is not a zombie exists
    local pgid=$1
    [[ $pgid =~ ^[0-9]+$ ]] && [ "$pgid" -gt 1 ] || return 1
    ps -eo pgid=,stat= | awk -v g="$pgid" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

group_has() {  # PGID TEXT: a live process of the group has TEXT in its command line
    local pgid=$1 text=$2
    [[ $pgid =~ ^[0-9]+$ ]] && [ "$pgid" -gt 1 ] || return 1
    ps -ww -eo pgid=,stat=,args= |
        awk -v g="$pgid" -v t="$text" '$1 == g && $2 !~ /^Z/ && index($0, t) { found = 1 } END { exit !found }'
}

pid_alive() {  # PID [TEXT]: the process exists, is not a zombie (and has TEXT in its args)
    local stat
    [[ $1 =~ ^[0-9]+$ ]] || return 1
    stat=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
    [ -n "$stat" ] && [[ $stat != Z* ]] || return 1
    [ -z "${2:-}" ] || ps -ww -o args= -p "$1" 2>/dev/null | grep -qF -- "$2"
}

stop_group() {  # PGID SECONDS: SIGTERM the group; SIGKILL it after SECONDS; 0 once it is gone
    local pgid=$1 limit=$2 i
    group_alive "$pgid" || return 0
    kill -TERM -- "-$pgid" 2>/dev/null || true
    for ((i = 0; i < limit * 5; i++)); do
        group_alive "$pgid" || return 0
        sleep 0.2
    done
    echo "process group $pgid did not stop within ${limit}s of SIGTERM: SIGKILL" >&2
    kill -KILL -- "-$pgid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        group_alive "$pgid" || return 0
        sleep 0.2
    done
    return 1
}

# --- PostgreSQL -------------------------------------------------------------------------------

pg_bindir() {
    local dir
    if [ -n "${VIBEY_PG_BINDIR:-}" ]; then echo "$VIBEY_PG_BINDIR"; return; fi
    if command -v pg_config >/dev/null; then
        dir=$(pg_config --bindir 2>/dev/null || true)
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then echo "$dir"; return; fi
    fi
    if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
        dirname "$(command -v initdb)"; return
    fi
    # Debian and Ubuntu keep the server binaries off PATH, one folder per major version.
    while IFS= read -r dir; do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then echo "$dir"; return; fi
    done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -t/ -k5 -V -r)
    return 1
}

as_user() {  # USER CMD ARGS...: run as USER ("-" for the current user)
    local user=$1; shift
    if [ "$user" = - ]; then "$@"
    elif command -v runuser >/dev/null; then runuser -u "$user" -- "$@"
    else su "$user" -s /bin/sh -c "$(printf '%q ' "$@")"
    fi
}

start_postgresql() {  # HOST PORT USER
    local host=$1 port=$2 superuser=$3 bindir pgdata log runas=-
    bindir=$(pg_bindir) || die "PostgreSQL: no initdb/pg_ctl found: install PostgreSQL 15+ (or set VIBEY_PG_BINDIR)"
    pgdata=$DATA/postgres
    log=$LOGS/postgresql.log
    mkdir -p "$pgdata" "$LOGS"
    touch "$log"
    if [ "$(id -u)" = 0 ]; then
        # initdb and postgres refuse to run as root: run them as the postgres account.
        id postgres >/dev/null 2>&1 || die "PostgreSQL: running as root and no 'postgres' account to run the server as"
        runas=postgres
        chown "$runas" "$pgdata" "$log"
        chmod 700 "$pgdata"
    fi
    if [ ! -s "$pgdata/PG_VERSION" ]; then
        echo "PostgreSQL: initdb in $pgdata (superuser $superuser, trust on loopback)" >&2
        as_user "$runas" "$bindir/initdb" -D "$pgdata" -U "$superuser" -A trust -E UTF8 >>"$log" 2>&1 ||
            die "PostgreSQL: initdb failed; see $log"
    fi
    echo "PostgreSQL: starting $bindir/postgres on $host:$port (data $pgdata, log $log)" >&2
    as_user "$runas" "$bindir/pg_ctl" -D "$pgdata" -l "$log" -w -t 60 \
        -o "-c listen_addresses=$host -p $port -c unix_socket_directories=''" start >/dev/null ||
        die "PostgreSQL: pg_ctl start failed; see $log"
    printf 'postgresql\tnative\t%s\t%s\t%s\n' "$pgdata" "$bindir" "$runas"
}

stop_postgresql() {  # DATADIR BINDIR RUNAS
    local pgdata=$1 bindir=$2 runas=$3 pid
    [ -f "$pgdata/postmaster.pid" ] || return 0
    if as_user "$runas" "$bindir/pg_ctl" -D "$pgdata" -m fast -w -t 30 stop >/dev/null 2>&1; then
        return 0
    fi
    pid=$(head -n 1 "$pgdata/postmaster.pid" 2>/dev/null || true)
    if pid_alive "$pid" "$pgdata"; then
        echo "PostgreSQL: pg_ctl stop failed; SIGQUIT to postmaster $pid" >&2
        kill -QUIT "$pid" 2>/dev/null || true
        local i
        for ((i = 0; i < 50; i++)); do pid_alive "$pid" "$pgdata" || return 0; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    ! pid_alive "$pid" "$pgdata"
}

# --- RabbitMQ ---------------------------------------------------------------------------------

rabbit_script() {  # NAME: the unwrapped script (no `su rabbitmq`) where there is one
    local name=$1 dir
    for dir in "${VIBEY_RABBITMQ_BINDIR:-}" /usr/lib/rabbitmq/bin; do
        if [ -n "$dir" ] && [ -x "$dir/$name" ]; then echo "$dir/$name"; return; fi
    done
    command -v "$name" || return 1
}

rabbit_env() {  # ROOT NODE [PORT]: the environment of the node and of rabbitmqctl for it
    local root=$1 node=$2 port=${3:-}
    local -a env=(env) name
    # Nothing of the caller's RabbitMQ or Erlang settings: they may name another node.
    for name in $(compgen -e); do
        case "$name" in RABBITMQ_* | ERL_*) env+=(-u "$name") ;; esac
    done
    env+=(
        "HOME=$root"  # the Erlang cookie lives here, for the node and for rabbitmqctl
        "RABBITMQ_NODENAME=$node"
        "RABBITMQ_CONF_ENV_FILE=$root/rabbitmq-env.conf"
        "RABBITMQ_CONFIG_FILE=$root/rabbitmq.conf"
        "RABBITMQ_ENABLED_PLUGINS_FILE=$root/enabled_plugins"
        "RABBITMQ_MNESIA_BASE=$root/mnesia"
        "RABBITMQ_LOG_BASE=$root/log"
        "RABBITMQ_LOGS=$root/log/node.log"
        "RABBITMQ_PID_FILE=$root/node.pid"
        "ERL_EPMD_ADDRESS=127.0.0.1"
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}"
    )
    if [ -n "$port" ]; then
        local dist=$((port + 20000))
        if [ "$dist" -gt 65535 ]; then dist=$((port - 20000)); fi
        env+=("RABBITMQ_NODE_IP_ADDRESS=127.0.0.1" "RABBITMQ_NODE_PORT=$port" "RABBITMQ_DIST_PORT=$dist")
    fi
    printf '%s\0' "${env[@]}"
}

epmd_running() { command -v epmd >/dev/null && ERL_EPMD_ADDRESS=127.0.0.1 epmd -names >/dev/null 2>&1; }

start_rabbitmq() {  # PORT
    local port=$1 server root node pgid item epmd_started=0
    server=$(rabbit_script rabbitmq-server) ||
        die "RabbitMQ: no rabbitmq-server found: install RabbitMQ 3.10+ (or set VIBEY_RABBITMQ_BINDIR)"
    root=$DATA/rabbitmq
    node=${VIBEY_RABBITMQ_NODENAME:-vibey-$port@localhost}
    mkdir -p "$root/mnesia" "$root/log" "$LOGS"
    # vibey's shipped node settings, then this node's listener and log.
    {
        cat "$repo/ops/rabbitmq/rabbitmq.conf"
        echo
        echo "## --- written by ops/local/native.sh for the local node ---"
        echo "listeners.tcp.local = 127.0.0.1:$port"
        echo "log.file.level = info"
        echo "log.console = false"
    } >"$root/rabbitmq.conf"
    echo "[]." >"$root/enabled_plugins"
    : >"$root/rabbitmq-env.conf"  # the machine's names another node
    epmd_running || epmd_started=1
    local -a env=()
    while IFS= read -r -d '' item; do env+=("$item"); done < <(rabbit_env "$root" "$node" "$port")
    echo "RabbitMQ: starting $server as node $node on 127.0.0.1:$port (data $root, log $root/log/node.log)" >&2
    pgid=$(cd "$root" && spawn "$LOGS/rabbitmq.log" "${env[@]}" "$server")
    printf 'rabbitmq\tnative\t%s\t%s\t%s\t%s\n' "$root" "$node" "$pgid" "$epmd_started"
}

stop_rabbitmq() {  # ROOT NODE PGID EPMD_STARTED
    local root=$1 node=$2 pgid=$3 epmd_started=$4 ctl beam="" item i
    beam=$(cat "$root/node.pid" 2>/dev/null || true)
    if ctl=$(rabbit_script rabbitmqctl); then
        local -a env=()
        while IFS= read -r -d '' item; do env+=("$item"); done < <(rabbit_env "$root" "$node")
        if command -v timeout >/dev/null; then
            timeout 60 "${env[@]}" "$ctl" -q -n "$node" stop >/dev/null 2>&1 || true
        else
            "${env[@]}" "$ctl" -q -n "$node" stop >/dev/null 2>&1 || true
        fi
    fi
    # The recorded group, if it still runs this node (a pid can be reused once it is gone).
    if group_has "$pgid" "$root"; then stop_group "$pgid" 20 || true; fi
    if pid_alive "$beam" "$root"; then
        kill -KILL "$beam" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do pid_alive "$beam" "$root" || break; sleep 0.2; done
    fi
    # The Erlang port mapper this node started, once no node is registered with it any more.
    if [ "$epmd_started" = 1 ] && epmd_running; then
        if ! ERL_EPMD_ADDRESS=127.0.0.1 epmd -names 2>/dev/null | grep -q '^name '; then
            ERL_EPMD_ADDRESS=127.0.0.1 epmd -kill >/dev/null 2>&1 || true
        fi
    fi
    ! group_has "$pgid" "$root" && ! pid_alive "$beam" "$root"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    start-postgresql) start_postgresql "$@" ;;
    stop-postgresql) stop_postgresql "$@" ;;
    start-rabbitmq) start_rabbitmq "$@" ;;
    stop-rabbitmq) stop_rabbitmq "$@" ;;
    spawn) spawn "$@" ;;
    group-alive) group_alive "$@" ;;
    group-has) group_has "$@" ;;
    stop-group) stop_group "$@" ;;
    *) die "usage: $0 start-postgresql|stop-postgresql|start-rabbitmq|stop-rabbitmq|spawn|group-alive|group-has|stop-group ARGS" ;;
esac
