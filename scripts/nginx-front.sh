# shellcheck shell=bash
# What scripts/nginx-test and scripts/rolling-restart share (sourced, not run):
# Debian's nginx, installed with apt-get when absent, and started in the
# foreground on a loopback port with the shipped deploy/nginx/stampede.conf, its
# upstream servers, listen address and static directory swapped for the test's.

# Installs nginx when absent; sets nginx_bin.
ensure_nginx() {
  if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then
    local sudo=()
    if ((EUID != 0)); then
      command -v sudo >/dev/null || { echo "need root or sudo to install nginx (apt-get install nginx)" >&2; return 1; }
      sudo=(sudo)
    fi
    echo "==> installing nginx with apt-get" >&2
    "${sudo[@]}" apt-get update -qq
    # Debian starts the packaged service on port 80 where it can; the tests run their own.
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Dpkg::Use-Pty=0 \
      --no-install-recommends nginx >/dev/null
  fi
  nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
}

# A loopback port nobody listens on, below the kernel's range for outgoing connections.
free_port() {
  local low p
  low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
  while p=$((10000 + RANDOM % (low - 10000))) && (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do :; done
  echo "$p"
}

# start_nginx WORK PORT UPSTREAM_PORT...: the shipped config with the given
# upstreams (127.0.0.1), listening on 127.0.0.1:PORT, serving ./static/; nginx
# runs in the foreground in the background of this shell, its pid appended to
# the caller's `pids`, its files under WORK. Returns once it answers on PORT
# (whatever it answers: its upstreams need not be up yet).
start_nginx() {
  local work=$1 port=$2
  shift 2
  python3 - deploy/nginx/stampede.conf "$work/stampede.conf" "$port" "$PWD/static/" "$@" <<'PY'
import re, sys
src, dst, port, static, *ups = sys.argv[1:]
text = open(src).read()
servers = re.findall(r"^    server 10\.0\.0\.\d+:8080 (.*);$", text, re.M)
assert servers, "no upstream server lines in " + src
first = True
def swap(m):
    global first
    if not first:
        return ""
    first = False
    return "".join(f"    server 127.0.0.1:{p} {m.group(1)};\n" for p in ups)
text = re.sub(r"^    server 10\.0\.0\.\d+:8080 (.*);\n", swap, text, flags=re.M)
for old, new in [("    listen 80;", f"    listen 127.0.0.1:{port};"), ("/srv/stampede/static/", static)]:
    assert text.count(old) == 1, f"expected one {old!r} in {src}"
    text = text.replace(old, new)
open(dst, "w").write(text)
PY
  mkdir -p "$work/temp"
  cat >"$work/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
events { worker_connections 1024; }
http {
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log $work/nginx-access.log;
    client_body_temp_path $work/temp/body;
    proxy_temp_path $work/temp/proxy;
    fastcgi_temp_path $work/temp/fastcgi;
    uwsgi_temp_path $work/temp/uwsgi;
    scgi_temp_path $work/temp/scgi;
    include $work/stampede.conf;
}
CONF
  "$nginx_bin" -t -q -p "$work" -e "$work/nginx-error.log" -c "$work/nginx.conf"
  "$nginx_bin" -p "$work" -e "$work/nginx-error.log" -c "$work/nginx.conf" &
  pids+=($!)
  local _
  for _ in $(seq 50); do
    curl -s -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "error: nginx did not answer on 127.0.0.1:$port" >&2
  return 1
}
