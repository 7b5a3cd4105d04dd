# shellcheck shell=bash
# Private Postgres + Redis for Stampede, with all state in <repo>/.data/.
#
#   source scripts/services.sh
#   ensure_services   # installs/initialises/starts what is missing; exports
#                     # DATABASE_URL, REDIS_URL and the STAMPEDE_* secrets
#   stop_services     # stops the private servers, the cluster's too (data is kept)
#   ensure_cluster    # a local three-primary Redis Cluster next to them; exports
#                     # STAMPEDE_CLUSTER_URLS (redis://127.0.0.1:6401,...)
#
# If DATABASE_URL and REDIS_URL are both set already, those services are used
# as they are. Ports: STAMPEDE_PG_PORT (5439), STAMPEDE_REDIS_PORT (6399), and the
# cluster's STAMPEDE_CLUSTER_PORT (6401) and the two after it.
#
# This file is sourced, so it does not flip `set -euo pipefail` on the caller's
# shell (that would close an interactive shell at the first failing command).
# The real work runs in a child `bash` that is strict on its own.

# pwd -P: Redis reports its dir with symlinks resolved, and we compare against it.
STAMPEDE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
STAMPEDE_DATA="$STAMPEDE_ROOT/.data"
# A .data that links elsewhere (a git worktree sharing a checkout's services) is
# named by its target, as Redis reports it.
if [[ -L $STAMPEDE_DATA ]]; then STAMPEDE_DATA="$(readlink -f "$STAMPEDE_DATA")"; fi
STAMPEDE_SERVICES_SH="$STAMPEDE_ROOT/scripts/services.sh"

_say() { printf '==> %s\n' "$*" >&2; }
_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Newest installed server version. The /usr/local/bin links may point elsewhere.
# shellcheck disable=SC2012 # version directories have plain names
_pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

# Postgres refuses to run as root: as root, run its tools as the postgres user.
# `cd /` because that user may not be allowed into the caller's directory.
_as_pg() {
  if ((EUID == 0)); then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

_rand_hex() { # _rand_hex BYTES -> 2*BYTES hex chars
  if command -v openssl >/dev/null; then
    openssl rand -hex "$1"
  else
    head -c "$1" /dev/urandom | od -An -v -tx1 | tr -d ' \n'
  fi
}

_rand_word() { # 16 letters/digits, leaving out look-alikes (0 O 1 l I)
  local s=""
  while ((${#s} < 16)); do
    s+=$(head -c 256 /dev/urandom | LC_ALL=C tr -dc 'A-HJ-NP-Za-km-z2-9')
  done
  printf '%s\n' "${s:0:16}"
}

# Secrets are made once into .data/env (mode 600) and read on every run.
# A name missing from the file (older file) is added, never changed.
_stampede_secrets() {
  local f="$STAMPEDE_DATA/env"
  mkdir -p "$STAMPEDE_DATA" || return 1
  chmod 711 "$STAMPEDE_DATA" # the postgres user must be able to pass through
  # Keep .data out of git even where the repo .gitignore is missing.
  [[ -f "$STAMPEDE_DATA/.gitignore" ]] || echo '*' >"$STAMPEDE_DATA/.gitignore"
  (umask 077 && touch "$f") || return 1
  grep -q '^PG_PASSWORD=' "$f" || echo "PG_PASSWORD=$(_rand_hex 24)" >>"$f"
  grep -q '^STAMPEDE_TOKEN_SECRET=' "$f" || echo "STAMPEDE_TOKEN_SECRET=$(_rand_hex 32)" >>"$f"
  grep -q '^STAMPEDE_DEMO_PASSWORD=' "$f" || echo "STAMPEDE_DEMO_PASSWORD=$(_rand_word)" >>"$f"
  grep -q '^STAMPEDE_ADMIN_PASSWORD=' "$f" || echo "STAMPEDE_ADMIN_PASSWORD=$(_rand_word)" >>"$f"
  chmod 600 "$f"

  # Values the caller set in the environment win over the file. The services'
  # addresses in the file (written by ensure_services, for `set -a; . .data/env`)
  # are never read back here: whether the caller gave DATABASE_URL and REDIS_URL
  # decides which services are used.
  local tok=${STAMPEDE_TOKEN_SECRET:-} demo=${STAMPEDE_DEMO_PASSWORD:-} adm=${STAMPEDE_ADMIN_PASSWORD:-}
  local db=${DATABASE_URL-__unset__} rd=${REDIS_URL-__unset__} cl=${STAMPEDE_REDIS_CLUSTER-__unset__}
  # shellcheck disable=SC1090
  source "$f" || return 1
  if [[ $db == __unset__ ]]; then unset DATABASE_URL; else DATABASE_URL=$db; fi
  if [[ $rd == __unset__ ]]; then unset REDIS_URL; else REDIS_URL=$rd; fi
  if [[ $cl == __unset__ ]]; then unset STAMPEDE_REDIS_CLUSTER; else STAMPEDE_REDIS_CLUSTER=$cl; fi
  export STAMPEDE_TOKEN_SECRET="${tok:-$STAMPEDE_TOKEN_SECRET}"
  export STAMPEDE_DEMO_PASSWORD="${demo:-$STAMPEDE_DEMO_PASSWORD}"
  export STAMPEDE_ADMIN_PASSWORD="${adm:-$STAMPEDE_ADMIN_PASSWORD}"
  # The server creates the admin only when both name and password are set.
  export STAMPEDE_ADMIN_USERNAME="${STAMPEDE_ADMIN_USERNAME:-admin}"
}

ensure_services() {
  local pg_port=${STAMPEDE_PG_PORT:-5439} redis_port=${STAMPEDE_REDIS_PORT:-6399}
  _stampede_secrets || return 1

  if [[ -n "${DATABASE_URL:-}" && -n "${REDIS_URL:-}" ]]; then
    _say "using the DATABASE_URL and REDIS_URL from the environment"
    export STAMPEDE_SERVICES=external
    local pg_isready
    pg_isready=$(command -v pg_isready || echo "$(_pg_bin)/pg_isready")
    if [[ -x "$pg_isready" ]]; then
      "$pg_isready" -q -d "$DATABASE_URL" || { echo "error: no Postgres answers at DATABASE_URL" >&2; return 1; }
    else
      _say "pg_isready not installed; not checking DATABASE_URL"
    fi
    if command -v redis-cli >/dev/null; then
      [[ "$(redis-cli -u "$REDIS_URL" ping 2>/dev/null)" == PONG ]] || { echo "error: no Redis answers at REDIS_URL" >&2; return 1; }
    else
      _say "redis-cli not installed; not checking REDIS_URL"
    fi
    return 0
  fi
  if [[ -n "${DATABASE_URL:-}${REDIS_URL:-}" ]]; then
    _say "only one of DATABASE_URL / REDIS_URL is set: using the private servers for both"
  fi

  # A fresh strict bash, whatever the caller's shell options are (a function
  # called inside `if`/`||` would silently run with `set -e` off).
  STAMPEDE_PG_PORT=$pg_port STAMPEDE_REDIS_PORT=$redis_port PG_PASSWORD=$PG_PASSWORD \
    bash -c 'set -euo pipefail; source "$1"; _stampede_install; _stampede_postgres; _stampede_redis' \
    _ "$STAMPEDE_SERVICES_SH" || return 1

  export STAMPEDE_SERVICES=private # scripts/run says where the data lives
  export DATABASE_URL="postgres://stampede:${PG_PASSWORD}@127.0.0.1:${pg_port}/stampede"
  export REDIS_URL="redis://127.0.0.1:${redis_port}/"
  # So that `set -a; . .data/env` gives a shell (stampede load, psql) this server's
  # services too (docs/operations.md, "Rehearse a sale").
  stampede_env_set DATABASE_URL "$DATABASE_URL"
  stampede_env_set REDIS_URL "$REDIS_URL"
}

# Sets NAME=VALUE in .data/env (replacing an older line); with no VALUE, removes it.
stampede_env_set() {
  local f="$STAMPEDE_DATA/env" name=$1 value=${2-}
  [[ -f $f ]] || return 0
  local rest
  rest=$(grep -v "^${name}=" "$f" || true)
  {
    [[ -z $rest ]] || printf '%s\n' "$rest"
    [[ -z $value ]] || printf '%s=%s\n' "$name" "$value"
  } >"$f.new" && chmod 600 "$f.new" && mv "$f.new" "$f"
}

# Debian packages, only when something is missing (apt-get update only then).
_stampede_install() {
  local pkgs=() sudo=()
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || pkgs+=(redis-server)
  [[ -x "$(_pg_bin)/initdb" ]] || pkgs+=(postgresql)
  ((${#pkgs[@]})) || return 0
  if ((EUID != 0)); then
    command -v sudo >/dev/null || _die "need root or sudo to install: ${pkgs[*]}"
    sudo=(sudo)
  fi
  _say "installing ${pkgs[*]} (apt-get)"
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Dpkg::Use-Pty=0 "${pkgs[@]}" >/dev/null
}

# Is the server of data dir $1 alive? (its postmaster.pid names a live postgres)
_pg_running() {
  local pid
  pid=$(head -1 "$1/postmaster.pid" 2>/dev/null) && [[ -n "$pid" && "$(cat "/proc/$pid/comm" 2>/dev/null)" == postgres ]]
}

_stampede_postgres() {
  local bin port=$STAMPEDE_PG_PORT pgdata="$STAMPEDE_DATA/pg" log="$STAMPEDE_DATA/pg.log"
  local sock="$STAMPEDE_DATA/pgsock"
  bin=$(_pg_bin)
  # A unix socket path must stay under ~107 bytes; deep checkouts fall back to /tmp.
  if ((${#sock} > 90)); then sock="/tmp/stampede-pgsock-$(echo "$STAMPEDE_ROOT" | cksum | cut -d' ' -f1)"; fi
  mkdir -p "$pgdata" "$sock"
  touch "$log"
  if ((EUID == 0)); then
    id -u postgres >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin postgres
    chown -R postgres: "$pgdata" "$sock" "$log"
    # Every directory above .data must be passable (x) for the postgres user,
    # e.g. a clone under /root (mode 700). x alone does not allow listing.
    if ! runuser -u postgres -- test -x "$STAMPEDE_DATA"; then
      local d="$STAMPEDE_DATA"
      while [[ "$d" != / ]]; do
        d=$(dirname "$d")
        [[ "$(stat -c %A "$d")" == *[xt] ]] || { _say "chmod o+x $d (so the postgres user can reach .data)"; chmod o+x "$d"; }
      done
      runuser -u postgres -- test -x "$STAMPEDE_DATA" || _die "the postgres user cannot reach $STAMPEDE_DATA"
    fi
  fi
  chmod 700 "$pgdata"

  if [[ ! -f "$pgdata/PG_VERSION" ]]; then
    _say "initialising Postgres $(basename "$(dirname "$bin")") in .data/pg"
    local pw="$STAMPEDE_DATA/pg.pwfile"
    (umask 077 && printf '%s\n' "$PG_PASSWORD" >"$pw")
    ((EUID != 0)) || chown postgres: "$pw"
    local args=(-D "$pgdata" -U stampede --pwfile="$pw" --auth-host=scram-sha-256 --auth-local=trust -E UTF8)
    if ! _as_pg "$bin/initdb" "${args[@]}" --locale=C.UTF-8 >>"$log" 2>&1; then
      _say "initdb with C.UTF-8 failed; retrying with --no-locale"
      find "$pgdata" -mindepth 1 -delete
      _as_pg "$bin/initdb" "${args[@]}" --no-locale >>"$log" 2>&1 || { rm -f "$pw"; _die "initdb failed, see .data/pg.log"; }
    fi
    rm -f "$pw"
  fi

  if _pg_running "$pgdata"; then
    # Ours is up; it must be on the port we are about to hand out.
    "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" ||
      _die "our Postgres runs, but not on port $port: run scripts/stop, or set STAMPEDE_PG_PORT"
    _say "Postgres already running on 127.0.0.1:$port"
  else
    # Something else on the port would reject our password confusingly.
    if "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"; then
      _die "port $port is used by another Postgres: set STAMPEDE_PG_PORT to a free port"
    fi
    # Left by a killed server. Its PID may now belong to another program, and
    # then Postgres would refuse to start, so remove it (no postgres owns it).
    if [[ -f "$pgdata/postmaster.pid" ]]; then
      _say "removing stale .data/pg/postmaster.pid"
      rm -f "$pgdata/postmaster.pid" "$sock/.s.PGSQL.$port.lock"
    fi
    _say "starting Postgres on 127.0.0.1:$port (data in .data/pg)"
    # authentication_timeout: a client that opens a connection and stops answering
    # mid-authentication (a test's runtime blocked in its teardown) holds up every
    # DROP DATABASE until the server gives up on it; 60 s by default, 5 s here
    # (loopback authentication takes milliseconds).
    # max_wal_size=4GB: a storm's settlement writes WAL fast (full pages after each
    # checkpoint); at the default 1GB Postgres starts a checkpoint mid-storm, and its
    # writes share the disk with Redis's fsync behind every 202 (docs/operations.md,
    # "Redis and Postgres settings"). Checkpoints then come every 5 min (its timeout).
    local opts="-p $port -k '$sock' -c listen_addresses=127.0.0.1 -c max_connections=300 -c shared_buffers=256MB -c fsync=on -c authentication_timeout=5s -c max_wal_size=4GB"
    _as_pg "$bin/pg_ctl" -D "$pgdata" -l "$log" -o "$opts" start -w >/dev/null ||
      { tail -n 20 "$log" >&2; _die "Postgres did not start, see .data/pg.log"; }
  fi

  local psql=("$bin/psql" -h 127.0.0.1 -p "$port" -U stampede -d postgres -v ON_ERROR_STOP=1 -qtA)
  if [[ -z "$(PGPASSWORD=$PG_PASSWORD "${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname = 'stampede'")" ]]; then
    _say "creating database stampede"
    PGPASSWORD=$PG_PASSWORD "${psql[@]}" -c 'CREATE DATABASE stampede'
  fi
}

_stampede_redis() {
  local port=$STAMPEDE_REDIS_PORT dir="$STAMPEDE_DATA/redis"
  mkdir -p "$dir"
  if [[ "$(redis-cli -p "$port" ping 2>/dev/null)" == PONG ]]; then
    # Reuse it only if it is ours (same data directory).
    [[ "$(redis-cli -p "$port" config get dir 2>/dev/null | tail -1)" == "$dir" ]] ||
      _die "port $port is used by another Redis: set STAMPEDE_REDIS_PORT to a free port"
    _say "Redis already running on 127.0.0.1:$port"
    # A server started by an older version of this script may still fsync once a
    # second: a 202 is only durable with every write on disk before the answer.
    redis-cli -p "$port" config set appendfsync always >/dev/null
    _redis_tune "$port"
    return 0
  fi
  _say "starting Redis on 127.0.0.1:$port (data in .data/redis)"
  # appendfsync always: Redis writes every decision to disk before it answers, so a
  # 202 survives a crash of Redis or of the machine (see docs/operations.md, "What a 202 means").
  redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --daemonize yes \
    --pidfile "$STAMPEDE_DATA/redis.pid" --logfile "$STAMPEDE_DATA/redis.log" \
    --appendonly yes --appendfsync always --save "" --maxclients 10000 "${_redis_tuning[@]}"
  _redis_wait "$port" "$STAMPEDE_DATA/redis.log" || _die "Redis did not start, see .data/redis.log"
}

# Settings for latency under a storm (docs/operations.md, "Redis and Postgres
# settings"): a rate-limit bucket (a hash of one field per buyer) that expires after
# a storm is freed off the main thread, not while every purchase waits (a bucket of
# 250,000 fields stalled Redis 94 ms, one of 1,000,000 fields 432 ms); and the AOF
# is rewritten (a fork, and the whole data set written beside the fsyncs of every
# 202) once it grew by 256 MB rather than by 64 MB.
_redis_tuning=(--lazyfree-lazy-expire yes --lazyfree-lazy-eviction yes --lazyfree-lazy-server-del yes
  --auto-aof-rewrite-min-size 256mb)
_redis_tune() { # _redis_tune PORT: the same settings on a Redis started by an earlier version
  local i
  for ((i = 0; i < ${#_redis_tuning[@]}; i += 2)); do
    redis-cli -p "$1" config set "${_redis_tuning[i]#--}" "${_redis_tuning[i + 1]}" >/dev/null
  done
}
_redis_wait() { # _redis_wait PORT LOG: until it answers PONG; while it loads its AOF (a
  # large one takes seconds: 536 MB took 9 s here) up to 5 min, else 10 s
  local i reply
  for ((i = 0; i < 1500; i++)); do
    reply=$(redis-cli -p "$1" ping 2>&1 || true)
    [[ $reply == PONG ]] && return 0
    if [[ $reply != LOADING* ]] && ((i >= 50)); then break; fi
    ((i % 50 != 49)) || [[ $reply != LOADING* ]] || _say "Redis on 127.0.0.1:$1 is loading its data"
    sleep 0.2
  done
  tail -n 20 "$2" >&2
  return 1
}

stop_services() {
  local pg_port=${STAMPEDE_PG_PORT:-5439} redis_port=${STAMPEDE_REDIS_PORT:-6399}
  STAMPEDE_PG_PORT=$pg_port STAMPEDE_REDIS_PORT=$redis_port \
    STAMPEDE_CLUSTER_PORT=${STAMPEDE_CLUSTER_PORT:-6401} \
    bash -c 'set -euo pipefail; source "$1"; _stampede_stop; _stampede_cluster_stop' _ "$STAMPEDE_SERVICES_SH"
}

# A Redis Cluster of three primaries on 127.0.0.1, ports STAMPEDE_CLUSTER_PORT (6401)
# to +2, data in .data/cluster/<port>. Reused when it already runs; created (slots
# spread by `redis-cli --cluster create`) when its nodes are new.
ensure_cluster() {
  local base=${STAMPEDE_CLUSTER_PORT:-6401}
  STAMPEDE_CLUSTER_PORT=$base \
    bash -c 'set -euo pipefail; source "$1"; _stampede_install; _stampede_cluster' _ "$STAMPEDE_SERVICES_SH" || return 1
  export STAMPEDE_CLUSTER_URLS="redis://127.0.0.1:$base/,redis://127.0.0.1:$((base + 1))/,redis://127.0.0.1:$((base + 2))/"
}

_stampede_cluster() {
  local base=$STAMPEDE_CLUSTER_PORT port dir nodes=()
  for port in $base $((base + 1)) $((base + 2)); do
    dir="$STAMPEDE_DATA/cluster/$port"
    nodes+=("127.0.0.1:$port")
    mkdir -p "$dir"
    if [[ "$(redis-cli -p "$port" ping 2>/dev/null)" == PONG ]]; then
      [[ "$(redis-cli -p "$port" config get dir 2>/dev/null | tail -1)" == "$dir" ]] ||
        _die "port $port is used by another Redis: set STAMPEDE_CLUSTER_PORT to a free range"
      _redis_tune "$port"
      continue
    fi
    redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --daemonize yes \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
      --appendonly yes --appendfsync always --save "" --maxclients 10000 "${_redis_tuning[@]}"
  done
  for port in $base $((base + 1)) $((base + 2)); do
    _redis_wait "$port" "$STAMPEDE_DATA/cluster/$port/redis.log" ||
      _die "cluster node $port did not start, see .data/cluster/$port/redis.log"
  done
  if [[ "$(redis-cli -p "$base" cluster info | tr -d '\r' | grep '^cluster_slots_assigned:')" != "cluster_slots_assigned:16384" ]]; then
    _say "creating a Redis Cluster of three primaries on ${nodes[*]} (data in .data/cluster)"
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
  else
    _say "Redis Cluster already running on ${nodes[*]}"
  fi
  for _ in $(seq 100); do
    local ok=0
    for port in $base $((base + 1)) $((base + 2)); do
      redis-cli -p "$port" cluster info | tr -d '\r' | grep -qx 'cluster_state:ok' && ok=$((ok + 1))
    done
    ((ok == 3)) && return 0
    sleep 0.2
  done
  _die "the Redis Cluster on ${nodes[*]} did not reach cluster_state:ok"
}

_stampede_cluster_stop() {
  local base=$STAMPEDE_CLUSTER_PORT port dir
  for port in $base $((base + 1)) $((base + 2)); do
    dir="$STAMPEDE_DATA/cluster/$port"
    if [[ "$(redis-cli -p "$port" config get dir 2>/dev/null | tail -1)" == "$dir" ]]; then
      _say "stopping the Redis Cluster node on 127.0.0.1:$port"
      redis-cli -p "$port" shutdown >/dev/null 2>&1 || true
    fi
  done
}

_stampede_stop() {
  local bin port=$STAMPEDE_REDIS_PORT
  bin=$(_pg_bin)
  if _pg_running "$STAMPEDE_DATA/pg"; then
    _say "stopping Postgres (.data/pg)"
    _as_pg "$bin/pg_ctl" -D "$STAMPEDE_DATA/pg" stop -m fast -w >/dev/null
  else
    _say "Postgres (.data/pg) is not running"
  fi
  # The Redis that .data/ started, on whatever port it was started on: its pidfile
  # names it, and it is ours if it runs in .data/redis (Redis chdirs to its dir).
  local pid
  pid=$(cat "$STAMPEDE_DATA/redis.pid" 2>/dev/null) || pid=
  if [[ -n "$pid" && "$(cat "/proc/$pid/comm" 2>/dev/null)" == redis-server &&
    "$(readlink "/proc/$pid/cwd" 2>/dev/null)" == "$STAMPEDE_DATA/redis" ]]; then
    _say "stopping Redis (.data/redis, pid $pid)"
    kill -TERM "$pid" # Redis shuts down as on SHUTDOWN: the AOF is flushed first
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || return 0
      sleep 0.2
    done
    _die "Redis (pid $pid) did not stop"
  fi
  # No pidfile (removed by hand): the Redis on our port, if it is ours.
  if [[ "$(redis-cli -p "$port" config get dir 2>/dev/null | tail -1)" == "$STAMPEDE_DATA/redis" ]]; then
    _say "stopping Redis on 127.0.0.1:$port"
    redis-cli -p "$port" shutdown >/dev/null 2>&1 || true # the connection drops on success
    for _ in $(seq 50); do
      redis-cli -p "$port" ping >/dev/null 2>&1 || return 0
      sleep 0.2
    done
    _die "Redis on port $port did not stop"
  else
    _say "Redis (.data/redis) is not running on port $port"
  fi
}
