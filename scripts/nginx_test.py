"""The checks of scripts/nginx-test, through nginx (Python standard library only).

Usage: nginx_test.py --url http://127.0.0.1:PORT --stop-pid PID
  (admin and demo passwords from STAMPEDE_ADMIN_PASSWORD, STAMPEDE_DEMO_PASSWORD)

Prints what it measured; exits 1 with every failed check listed.
"""

import argparse
import http.client
import json
import os
import queue
import secrets
import signal
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

failures = []
SOURCES = (f"127.0.1.{n}" for n in range(1, 255))


def check(ok, what):
    print(f"    {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        failures.append(what)


class Answer:
    def __init__(self, status, headers, body, secs):
        self.status, self.headers, self.body, self.secs = status, headers, body, secs

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return {}

    def header(self, name):
        return self.headers.get(name.lower())


def call(method, path, body=None, token=None, source="127.0.0.1", headers=None, timeout=15):
    """One request on a connection of its own from `source` (a loopback address)."""
    h = {"content-type": "application/json"} if body is not None else {}
    if token:
        h["authorization"] = f"Bearer {token}"
    h.update(headers or {})
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn = http.client.HTTPConnection(HOST, PORT, timeout=timeout, source_address=(source, 0))
    started = time.monotonic()
    try:
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        raw = r.read()
        hdrs = {}
        for k, v in r.getheaders():
            if k.lower() == "set-cookie":
                hdrs.setdefault("set-cookie", []).append(v)
            else:
                hdrs.setdefault(k.lower(), v)
        return Answer(r.status, hdrs, raw.decode(errors="replace"), time.monotonic() - started)
    finally:
        conn.close()


def signin(username, password):
    a = call("POST", "/api/auth/signin", {"username": username, "password": password})
    if a.status != 200:
        sys.exit(f"nginx_test.py: sign-in of {username} answered {a.status}: {a.body[:200]}")
    return a


def new_sale(admin, stock):
    now = datetime.now(timezone.utc)
    sale = {
        "name": "nginx test",
        "price_cents": 500,
        "stock": stock,
        "starts_at": (now - timedelta(minutes=1)).isoformat(),
        "ends_at": (now + timedelta(hours=1)).isoformat(),
        "requires_ticket": False,
    }
    a = call("POST", "/api/admin/sales", sale, token=admin)
    if a.status != 201:
        sys.exit(f"nginx_test.py: creating a sale answered {a.status}: {a.body[:200]}")
    return a.json()["id"]


def events(path, out, stop):
    """Reads an event stream, putting (arrival time, JSON) of each `data:` line on `out`."""
    conn = http.client.HTTPConnection(HOST, PORT, timeout=10)
    conn.request("GET", path, headers={"accept": "text/event-stream"})
    r = conn.getresponse()
    out.put((time.monotonic(), {"status": r.status, "type": r.getheader("content-type")}))
    while not stop.is_set():
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data:"):
            out.put((time.monotonic(), json.loads(line[5:])))
    conn.close()


def burst(plan, buyers, sale):
    """Starts the requests of `plan` ("G" a GET of the sale, "P" a purchase by the
    next of `buyers`, with an Idempotency-Key) 50 ms apart, each on its own thread;
    answers [(kind, Answer, (token, key))] in plan order."""
    results = [None] * len(plan)
    tokens = [next(buyers) if kind == "P" else None for kind in plan]
    # Each purchase from an address of its own: the per-address limit of this
    # run (3 a minute) is not what the bursts test.
    sources = [next(SOURCES) for _ in plan]

    def one(i, kind):
        if kind == "G":
            results[i] = ("GET", call("GET", f"/api/sales/{sale}"), None)
        else:
            key = secrets.token_hex(8)
            a = call("POST", f"/api/sales/{sale}/purchase", token=tokens[i], source=sources[i], headers={"idempotency-key": key})
            results[i] = ("POST", a, (tokens[i], key))

    threads = []
    for i, kind in enumerate(plan):
        t = threading.Thread(target=one, args=(i, kind))
        t.start()
        threads.append(t)
        time.sleep(0.05)
    for t in threads:
        t.join()
    return results


def summary(results):
    by = {}
    for kind, a, _ in results:
        by.setdefault(f"{kind} {a.status}", []).append(a.secs)
    return ", ".join(f"{k}: {len(v)} (slowest {max(v) * 1000:.0f} ms)" for k, v in sorted(by.items()))


def main():
    global HOST, PORT
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--stop-pid", type=int, required=True, help="the upstream server to stop, then kill")
    p.add_argument("--static", required=True, help="the static directory nginx serves")
    p.add_argument("--read-timeout", type=float, default=5.0)
    args = p.parse_args()
    HOST, PORT = args.url.removeprefix("http://").split(":")
    PORT = int(PORT)
    admin = signin("admin", os.environ["STAMPEDE_ADMIN_PASSWORD"]).json()["token"]
    alice = signin("alice", os.environ["STAMPEDE_DEMO_PASSWORD"]).json()["token"]
    bob = signin("bob", os.environ["STAMPEDE_DEMO_PASSWORD"]).json()["token"]
    stock = 20
    sale = new_sale(admin, stock)

    print("==> a purchase, a vote and an event stream, through nginx", flush=True)
    got, stop = queue.Queue(), threading.Event()
    threading.Thread(target=events, args=(f"/api/sales/{sale}/events", got, stop), daemon=True).start()
    _, head = got.get(timeout=5)
    check(head["status"] == 200 and "text/event-stream" in (head["type"] or ""), f"event stream opens: {head}")
    _, first = got.get(timeout=5)
    bought_at = time.monotonic()
    a = call("POST", f"/api/sales/{sale}/purchase", token=alice)
    check(a.status == 202, f"purchase: {a.status} {a.body[:120]}")
    seen = None
    while seen is None:
        try:
            at, view = got.get(timeout=3)
        except queue.Empty:
            break
        if view.get("stock_left") == first["stock_left"] - 1:
            seen = at - bought_at
    stop.set()
    check(seen is not None and seen < 1.0, f"the stream delivered the purchase's change in {seen if seen is None else round(seen, 3)} s (< 1 s)")
    # A CSV download goes through its own location (longer timeouts, streamed).
    csv = call("GET", f"/api/admin/sales/{sale}/orders.csv", token=admin)
    check(
        csv.status == 200 and (csv.header("content-type") or "").startswith("text/csv") and csv.body.count("\n") >= 1,
        f"the sale's orders as CSV through nginx: {csv.status} {csv.header('content-type')}",
    )
    polls = call("GET", "/api/polls").json()
    poll = next((q for q in polls if "(demo)" in q.get("question", "")), None)
    check(poll is not None, "the demo poll is listed")
    if poll:
        full = call("GET", f"/api/polls/{poll['id']}").json()
        v = call("POST", f"/api/polls/{poll['id']}/votes", {"option_id": full["options"][0]["id"]}, token=bob)
        check(v.status == 202, f"vote: {v.status} {v.body[:120]}")

    # Buyers: a new user per purchase (a repeat buyer may be answered from the
    # process's memory, before the limits count it).
    password = secrets.token_hex(12)
    tokens = []
    for n in range(21):
        name = f"ng{secrets.token_hex(4)}{n}"
        u = call("POST", "/api/auth/signup", {"username": name, "password": password})
        if u.status != 201:
            sys.exit(f"nginx_test.py: sign-up answered {u.status}: {u.body[:200]}")
        tokens.append(signin(name, password).json()["token"])
    buyers = iter(tokens)

    print("==> the client's address as the limits see it (buy-ip: 3 a minute per address and sale)", flush=True)
    limited = new_sale(admin, 100)
    path = f"/api/sales/{limited}/purchase"
    own = [call("POST", path, token=next(buyers), source="127.0.0.2").status for _ in range(3)]
    check(own == [202, 202, 202], f"client 127.0.0.2, its first 3: {own}")
    forged = []
    for n in range(4):
        fake = "127.0.0.3" if n % 2 else f"198.51.100.{n + 1}"
        forged.append(call("POST", path, token=next(buyers), source="127.0.0.2", headers={"x-forwarded-for": fake}).status)
    check(forged == [429] * 4, f"client 127.0.0.2 writing X-Forwarded-For (198.51.100.x, 127.0.0.3): {forged}")
    other = call("POST", path, token=next(buyers), source="127.0.0.3").status
    check(other == 202, f"client 127.0.0.3 has its own count: {other}")

    print("==> sign-in, pages and CSRF", flush=True)
    s = signin("bob", os.environ["STAMPEDE_DEMO_PASSWORD"])
    cookies = "; ".join(c.split(";", 1)[0] for c in s.header("set-cookie") or [])
    csrf = s.json()["csrf_token"]
    check("stampede_session=" in cookies and "stampede_csrf=" in cookies, "sign-in sets the session and CSRF cookies through nginx")
    page = call("GET", "/me/orders", headers={"cookie": cookies})
    check(page.status == 200 and "bob" in page.body and page.header("content-security-policy"), f"/me/orders signed in: {page.status}")
    no_csrf = call("POST", "/api/auth/signout", headers={"cookie": cookies})
    check(no_csrf.status == 403 and no_csrf.json().get("error") == "csrf_failed", f"a cookie POST without X-CSRF-Token: {no_csrf.status} {no_csrf.body[:80]}")
    still = call("GET", "/api/me", headers={"cookie": cookies})
    out = call("POST", "/api/auth/signout", headers={"cookie": cookies, "x-csrf-token": csrf})
    # The other server learns of the sign-out through Redis within moments.
    signed_out, deadline = time.monotonic(), time.monotonic() + 2
    while (gone := call("GET", "/api/me", headers={"cookie": cookies})).status == 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    check((still.status, out.status, gone.status) == (200, 204, 401),
          f"/api/me, sign-out with the token, /api/me on both servers within {time.monotonic() - signed_out:.2f} s: {still.status} {out.status} {gone.status}")
    js = call("GET", "/static/app.js")
    with open(os.path.join(args.static, "app.js"), "rb") as f:
        same = js.body.encode() == f.read()
    check(js.status == 200 and same and js.header("cache-control") == "no-cache" and "javascript" in (js.header("content-type") or ""),
          f"/static/app.js from disk: {js.status} {js.header('content-type')} {js.header('cache-control')}")
    big = call("POST", "/api/auth/signin", b"{" + b" " * 20000 + b"}", headers={"content-type": "application/json"})
    check(big.status == 413 and big.json().get("error") == "payload_too_large", f"a 20 KB body: {big.status} {big.body[:80]}")
    huge = call("GET", "/api/sales", headers={"x-padding": "a" * 20000})
    check(huge.status == 431 and huge.json().get("error") == "headers_too_large", f"a 20 KB header: {huge.status} {huge.body[:80]}")
    long_line = call("GET", "/api/sales?" + "a" * 20000)
    check(long_line.status == 414 and long_line.json().get("error") == "uri_too_long", f"a 20 KB request line: {long_line.status} {long_line.body[:80]}")

    plan = "GGPPGGPP"  # round robin: each kind meets both servers

    print(f"==> one upstream stopped (kill -STOP {args.stop_pid})", flush=True)
    os.kill(args.stop_pid, signal.SIGSTOP)
    try:
        stopped = burst(plan, buyers, sale)
        print(f"    first burst: {summary(stopped)}", flush=True)
        after = burst(plan, buyers, sale)
        print(f"    right after (the stopped one left out): {summary(after)}", flush=True)
    finally:
        os.kill(args.stop_pid, signal.SIGCONT)
    print(f"==> the same upstream killed (kill -KILL {args.stop_pid})", flush=True)
    os.kill(args.stop_pid, signal.SIGKILL)
    time.sleep(5.2)  # past fail_timeout: nginx tries the dead server again
    killed = burst(plan, buyers, sale)
    print(f"    burst: {summary(killed)}", flush=True)
    every = stopped + after + killed
    bound = args.read_timeout + 1.0
    check(all(a.status == 200 for k, a, _ in every if k == "GET"), "every GET answered 200 (no 502)")
    check(all(a.status in (202, 503) for k, a, _ in every if k == "POST"), "every purchase answered 202 or 503")
    check(all(a.header("retry-after") and a.json().get("error") for _, a, _ in every if a.status == 503), "every 503 has Retry-After and the JSON error body")
    check(max(a.secs for _, a, _ in every) <= bound, f"slowest answer {max(a.secs for _, a, _ in every):.2f} s <= {bound} s")
    check(any(k == "GET" and a.secs >= args.read_timeout - 0.5 for k, a, _ in stopped), "a GET met the stopped server (and was passed on)")
    check(any(k == "POST" and a.status == 503 for k, a, _ in stopped), "a purchase met the stopped server (503, not passed on)")
    check(all(a.secs < 1.0 for _, a, _ in after + killed), f"left out / refused at once: slowest {max(a.secs for _, a, _ in after + killed):.2f} s")
    retried = []
    for k, a, tk in every:
        if k == "POST" and a.status == 503:
            r = call("POST", f"/api/sales/{sale}/purchase", token=tk[0], source=next(SOURCES), headers={"idempotency-key": tk[1]})
            retried.append((r.status, r.header("idempotent-replayed")))
    check(all(s == 202 for s, _ in retried), f"each 503 retried with its Idempotency-Key: {retried}")
    left = call("GET", f"/api/sales/{sale}").json().get("stock_left")
    check(left == stock - 1 - 12, f"stock left {left} = {stock} - 13 buyers: no unit sold twice")

    if failures:
        print(f"nginx_test.py: {len(failures)} check(s) failed", file=sys.stderr)
        for f in failures:
            print(f"  - {f}", file=sys.stderr)
        sys.exit(1)
    print("nginx_test.py: every check passed")


if __name__ == "__main__":
    main()
