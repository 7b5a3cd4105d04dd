"""The run of scripts/rolling-restart (Python standard library only): three
Stampede servers behind nginx, a storm of purchases with Idempotency-Keys, and
each server restarted in turn during it (SIGTERM, wait for the exit, start it
again, wait for its /readyz). Then the checks and the figures.

Usage: rolling_restart.py --url http://127.0.0.1:NGINX --server-bin PATH --work DIR
                          --ports P1 P2 P3 [--buyers N] [--rate R] [--drain-ms MS]
  Environment: DATABASE_URL, REDIS_URL, STAMPEDE_REDIS_NAMESPACE,
  STAMPEDE_TOKEN_SECRET, STAMPEDE_ADMIN_PASSWORD (and what the servers read).
  --kill (SIGKILL instead of SIGTERM) and --no-retry (a 503 is final) exist to
  see the run fail (docs/operations.md, "Rolling restarts").

Exits 1 with every failed check listed.
"""

import argparse
import base64
import hashlib
import hmac
import http.client
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

failures = []
T0 = time.monotonic()


def check(ok, what):
    print(f"    {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        failures.append(what)


def now():
    return time.monotonic() - T0


def call(host, port, method, path, body=None, token=None, headers=None, timeout=15):
    """One request on a connection of its own: (status, headers, body text), or
    (None, {}, error) when the connection failed or was cut."""
    h = {"content-type": "application/json"} if body is not None else {}
    if token:
        h["authorization"] = f"Bearer {token}"
    h.update(headers or {})
    data = None if body is None else json.dumps(body).encode()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:
        return None, {}, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def psql(sql):
    out = subprocess.run(["psql", os.environ["DATABASE_URL"], "-qtAX", "-v", "ON_ERROR_STOP=1", "-c", sql],
                         check=True, capture_output=True, text=True).stdout
    return [line.split("|") for line in out.splitlines() if line]


def redis(*args):
    return subprocess.run(["redis-cli", "-u", os.environ["REDIS_URL"], "--no-raw", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def b64(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def mint(secret, user, created):
    """A session token as src/auth/token.rs issues it (v3), for a user made in SQL:
    no sign-in (and no Argon2 hash) per buyer."""
    payload = f"v3:{user}:0:{int(time.time()) + 3600}:0:{secrets.randbits(64):016x}:{created}"
    mac = hmac.new(secret.encode(), payload.encode(), hashlib.sha256).digest()
    return f"{b64(payload.encode())}.{b64(mac)}"


class Server:
    """One `stampede serve` on a fixed port, started again after each stop."""

    def __init__(self, name, binary, port, work):
        self.name, self.binary, self.port, self.work = name, binary, port, work
        self.proc, self.starts = None, 0

    def start(self):
        self.starts += 1
        log = open(os.path.join(self.work, f"server-{self.name}-{self.starts}.log"), "w")
        env = dict(os.environ, STAMPEDE_LISTEN=f"127.0.0.1:{self.port}")
        self.proc = subprocess.Popen([self.binary, "serve"], env=env, stdout=log, stderr=log)
        with open(os.path.join(self.work, f"server-{self.name}.pid"), "w") as f:
            f.write(f"{self.proc.pid}\n")

    def ready(self, deadline):
        while time.monotonic() < deadline:
            status, _, _ = call("127.0.0.1", self.port, "GET", "/readyz", timeout=2)
            if status == 200:
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False


class Storm:
    """Purchases started at `rate` a second, each by a buyer of its own with a key
    of its own, sent again with that key after every 503 (and, counted as a
    failure, after a 502, a 504 or a cut connection)."""

    def __init__(self, host, port, sale, tokens, rate, retry):
        self.host, self.port, self.sale, self.tokens = host, port, sale, tokens
        self.rate, self.retry = rate, retry
        self.attempts = []  # (answered at, status or None, secs, headers, body)
        self.purchases = []  # (token index, final status, order id, started, answered, attempts)
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def one(self, i):
        key = secrets.token_hex(12)
        started = now()
        tries = 0
        while True:
            tries += 1
            sent = now()
            status, headers, body = call(self.host, self.port, "POST", f"/api/sales/{self.sale}/purchase",
                                         token=self.tokens[i], headers={"idempotency-key": key}, timeout=10)
            with self.lock:
                self.attempts.append((now(), status, now() - sent, headers, body[:200]))
            if status == 202 or not self.retry or status not in (None, 502, 503, 504) or tries >= 200:
                break
            time.sleep(min(float(headers.get("retry-after", "1")), 0.1))
        order = json.loads(body).get("order_id") if status == 202 else None
        with self.lock:
            self.purchases.append((i, status, order, started, now(), tries))

    def run(self, deadline):
        with ThreadPoolExecutor(max_workers=64) as pool:
            n = 0
            while not self.stop.is_set() and n < len(self.tokens) and now() < deadline:
                pool.submit(self.one, n)
                n += 1
                time.sleep(max(0.0, T0 + self.begun + n / self.rate - time.monotonic()))
        return n


def restart_all(servers, drain_s, kill, pause, storm, log):
    time.sleep(2.0)  # the storm's steady state first
    for s in servers:
        r = {"server": s.name, "term": now()}
        s.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        if not kill:
            while now() - r["term"] < 0.5:
                status, _, body = call("127.0.0.1", s.port, "GET", "/readyz", timeout=1)
                if status == 503:
                    r["not_ready_after"] = now() - r["term"]
                    break
                time.sleep(0.02)
        try:
            r["code"] = s.proc.wait(timeout=drain_s + 15 + 5)
        except subprocess.TimeoutExpired:
            r["code"] = "still running"
            s.proc.kill()
            s.proc.wait()
        r["exited"] = now()
        s.start()
        r["up"] = s.ready(time.monotonic() + 30)
        r["ready"] = now()
        log.append(r)
        print(f"    {s.name}: {'SIGKILL' if kill else 'SIGTERM'} at {r['term']:.2f} s, exited "
              f"{r['exited'] - r['term']:.2f} s later (code {r['code']}), ready again "
              f"{r['ready'] - r['exited']:.2f} s after that", flush=True)
        # nginx leaves a server out for 5 s (fail_timeout) after a refused
        # connection: the next stop comes once it is back in.
        time.sleep(pause)
    time.sleep(1.0)
    storm.stop.set()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--server-bin", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--ports", type=int, nargs=3, required=True)
    p.add_argument("--buyers", type=int, default=6000)
    p.add_argument("--rate", type=float, default=150.0, help="purchases started a second")
    p.add_argument("--max-secs", type=float, default=60.0, help="the storm's longest run")
    p.add_argument("--drain-ms", type=int, default=int(os.environ.get("STAMPEDE_DRAIN_MS", "1000")))
    p.add_argument("--pause", type=float, default=5.0,
                   help="seconds from a server's /readyz to the next one's stop (nginx's fail_timeout)")
    p.add_argument("--kill", action="store_true", help="SIGKILL instead of SIGTERM (to see it fail)")
    p.add_argument("--no-retry", action="store_true", help="no retry of a 503 (to see it fail)")
    args = p.parse_args()
    host, port = args.url.removeprefix("http://").split(":")
    port = int(port)
    secret = os.environ["STAMPEDE_TOKEN_SECRET"]

    print("==> three servers", flush=True)
    servers = [Server(n, args.server_bin, pt, args.work) for n, pt in zip("abc", args.ports)]
    try:
        for s in servers:
            s.start()
        for s in servers:
            if not s.ready(time.monotonic() + 60):
                sys.exit(f"rolling_restart.py: server {s.name} on {s.port} did not become ready")
        run(args, host, port, secret, servers)
    finally:
        for s in servers:
            if s.proc and s.proc.poll() is None:
                s.proc.terminate()
        for s in servers:
            if s.proc:
                try:
                    s.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    s.proc.kill()


def run(args, host, port, secret, servers):
    status, _, body = call(host, port, "POST", "/api/auth/signin",
                           {"username": "admin", "password": os.environ["STAMPEDE_ADMIN_PASSWORD"]})
    if status != 200:
        sys.exit(f"rolling_restart.py: admin sign-in answered {status}: {body[:200]}")
    admin = json.loads(body)["token"]
    stock = args.buyers + 100
    t = datetime.now(timezone.utc)
    status, _, body = call(host, port, "POST", "/api/admin/sales", {
        "name": "rolling restart", "price_cents": 100, "stock": stock, "requires_ticket": False,
        "starts_at": (t - timedelta(minutes=1)).isoformat(), "ends_at": (t + timedelta(hours=1)).isoformat(),
    }, token=admin)
    if status != 201:
        sys.exit(f"rolling_restart.py: creating the sale answered {status}: {body[:200]}")
    sale = json.loads(body)["id"]
    prefix = f"roll{secrets.token_hex(4)}"
    rows = psql(f"INSERT INTO users (username, password_hash) SELECT '{prefix}-' || g, 'no password' "
                f"FROM generate_series(1, {args.buyers}) g ORDER BY g "
                f"RETURNING id, extract(epoch FROM created_at)::bigint")
    users = [int(r[0]) for r in rows]
    tokens = [mint(secret, u, int(c)) for u, c in (r[:2] for r in rows)]

    print(f"==> a storm of purchases through nginx ({args.rate:.0f} a second, each buyer once, "
          f"Idempotency-Keys), each server restarted in turn", flush=True)
    storm = Storm(host, port, sale, tokens, args.rate, retry=not args.no_retry)
    restarts = []
    storm.begun = now()
    restarter = threading.Thread(target=restart_all,
                                 args=(servers, args.drain_ms / 1000, args.kill, args.pause, storm, restarts))
    restarter.start()
    sent = storm.run(T0 + storm.begun + args.max_secs)
    ran_out = not storm.stop.is_set()
    storm.stop.set()
    restarter.join()
    ended = now()

    report(args, storm, restarts, sent, ended)
    print("==> checks", flush=True)
    check(not ran_out, f"the storm lasted through every restart ({sent} purchases started)")
    verify(args, storm, restarts, sale, stock, set(users))
    if failures:
        print(f"rolling_restart.py: {len(failures)} check(s) failed", file=sys.stderr)
        for f in failures:
            print(f"  - {f}", file=sys.stderr)
        sys.exit(1)
    print("rolling_restart.py: every check passed")


def report(args, storm, restarts, sent, ended):
    print("==> figures", flush=True)
    by = {}
    for _, status, secs, _, _ in storm.attempts:
        by.setdefault(status or "cut", []).append(secs)
    print("    attempts by answer: " + ", ".join(
        f"{k}: {len(v)} (slowest {max(v) * 1000:.0f} ms)" for k, v in sorted(by.items(), key=str)))
    final = {}
    for p in storm.purchases:
        final[p[1] or "cut"] = final.get(p[1] or "cut", 0) + 1
    retried = sum(1 for p in storm.purchases if p[5] > 1)
    slowest = max((p[4] - p[3] for p in storm.purchases), default=0)
    print(f"    purchases: {sent} started, final answers {final}, {retried} sent more than once; "
          f"slowest purchase (its retries included) {slowest * 1000:.0f} ms")
    step = 0.25
    answered = sorted(a[0] for a in storm.attempts if a[1] == 202)
    first, last = storm.begun, ended
    buckets = [0] * (int((last - first) / step) + 1)
    for at in answered:
        buckets[min(int((at - first) / step), len(buckets) - 1)] += 1
    windows = [(r["term"] - step, r["ready"] + 1.0) for r in restarts]

    def inside(i):
        mid = first + (i + 0.5) * step
        return any(a <= mid <= b for a, b in windows)

    calm = [b / step for i, b in enumerate(buckets) if not inside(i)] or [0]
    print(f"    throughput (202 a second, {step * 1000:.0f} ms buckets): median {statistics.median(calm):.0f} "
          f"away from the restarts")
    for r in restarts:
        a, b = r["term"] - step, r["ready"] + 1.0
        near = [x for x in answered if a <= x <= b]
        inner = [buckets[i] / step for i in range(len(buckets)) if a <= first + (i + 0.5) * step <= b]
        gaps = [y - x for x, y in zip([a] + near, near + [b])]
        print(f"    restart of {r['server']}: lowest {min(inner, default=0):.0f} a second "
              f"from its SIGTERM to a second after it was ready again, longest time without a 202 "
              f"{max(gaps) * 1000:.0f} ms")
    print(f"    the storm and the restarts took {ended - storm.begun:.1f} s")


def verify(args, storm, restarts, sale, stock, users):
    bad = [(s, b) for _, s, _, _, b in storm.attempts if s not in (202, 503)]
    check(not bad, f"every answer a 202 or a retryable 503 (others: {len(bad)}; first {bad[:3]})")
    check(all("retry-after" in h for _, s, _, h, _ in storm.attempts if s == 503),
          "every 503 carries Retry-After")
    not_202 = [p for p in storm.purchases if p[1] != 202]
    check(not not_202, f"every purchase answered 202 in the end ({len(not_202)} not)")
    orders = [p[2] for p in storm.purchases if p[1] == 202]
    accepted = len(orders)
    check(len(set(orders)) == accepted, f"{accepted} accepted purchases, as many distinct order ids")
    for r in restarts:
        check(r["code"] == 0 or args.kill, f"server {r['server']} exited with code 0 ({r['code']})")
        bound = args.drain_ms / 1000 + 15
        check(r["exited"] - r["term"] <= bound, f"server {r['server']} exited within drain + 15 s = {bound:.0f} s "
              f"({r['exited'] - r['term']:.2f} s)")
        check(args.kill or r.get("not_ready_after") is not None,
              f"server {r['server']}: /readyz 503 within 0.5 s of SIGTERM ({r.get('not_ready_after')})")
        check(r["up"], f"server {r['server']} ready again")
        near = [a for a in storm.attempts if r["term"] <= a[0] <= r["exited"] + 0.5]
        check(bool(near), f"purchases were answered while {r['server']} stopped ({len(near)})")

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        (n,), = psql(f"SELECT count(*) FROM orders WHERE sale_id = {sale}")
        if int(n) >= accepted:
            break
        time.sleep(0.2)
    rows = psql(f"SELECT id, user_id FROM orders WHERE sale_id = {sale}")
    ids = [r[0] for r in rows]
    check(len(ids) == accepted and set(ids) == set(orders),
          f"every 202 in Postgres exactly once: {len(ids)} rows, {len(set(ids))} distinct, "
          f"{len(set(ids) - set(orders))} not answered 202, {len(set(orders) - set(ids))} missing")
    buyers = [int(r[1]) for r in rows]
    check(len(set(buyers)) == len(buyers) and set(buyers) <= users,
          f"one order per buyer, all of them the storm's ({len(set(buyers))} buyers)")
    ns = os.environ["STAMPEDE_REDIS_NAMESPACE"]
    base = f"{ns}:{{sale:{sale}}}"
    left = int(redis("GET", f"{base}:stock").strip('"'))
    sold = int(redis("HLEN", f"{base}:held").split()[-1])
    check(left == stock - accepted and sold == accepted,
          f"Redis: {left} units left = {stock} - {accepted}, {sold} buyers")
    (total, pg_left), = psql(f"SELECT stock_total, stock_total - (SELECT count(*) FROM orders "
                             f"WHERE sale_id = {sale}) FROM sales WHERE id = {sale}")
    check(int(pg_left) == stock - accepted and int(total) == stock,
          f"Postgres: stock_total {total} - orders = {pg_left} = {stock} - {accepted}")
    host, port = args.url.removeprefix("http://").split(":")
    status, _, body = call(host, int(port), "GET", f"/api/sales/{sale}")
    view = json.loads(body) if status == 200 else {}
    check(view.get("stock_left") == stock - accepted, f"the sale's view: stock_left {view.get('stock_left')}")
    deadline = time.monotonic() + 10
    while True:
        pel = redis("XPENDING", f"{base}:accepted", "settle").splitlines()
        held = int(pel[0].split()[-1]) if pel else 0
        if held == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    check(held == 0, f"no stream entry left pending (read and not acknowledged): {held}")


if __name__ == "__main__":
    main()
