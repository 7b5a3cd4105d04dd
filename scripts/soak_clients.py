#!/usr/bin/env python3
"""Clients for scripts/soak and scripts/idle-catalog (Python 3 standard library only).

  soak_clients.py clients --url URL --sales 1,2,3 --streams 1000 --seconds 150
      Holds STREAMS server-sent event streams (GET /api/sales/{id}/events, spread
      over the given sales) open for SECONDS, reading every event, and meanwhile
      signs in and out a few times a second (--signins-per-s, 3): sign-in (argon2 on
      the server, about 22 ms), GET /api/me (200), sign-out (204), GET /api/me again
      (401: the session ended). The users (--users, 5) sign up first. A stream the
      server closes is opened again. Stops at the deadline or on SIGTERM, then
      prints one JSON line: streams open at the end, the fewest open after the
      start, events, reconnects, sign-ins and anything unexpected.

  soak_clients.py create-sales --url URL --token ADMIN_TOKEN --count 1000
      Creates COUNT live sales (open from a minute ago for 30 days) through
      POST /api/admin/sales on one keep-alive connection; prints their ids, one a line.

Loopback only: both refuse a URL whose host is not 127.0.0.1 or localhost.
"""

import argparse
import asyncio
import datetime
import http.client
import json
import secrets
import signal
import sys
import time
import urllib.parse


def loopback(url):
    u = urllib.parse.urlsplit(url)
    if u.hostname not in ("127.0.0.1", "localhost"):
        sys.exit(f"soak_clients.py: {url}: loopback addresses only")
    return u.hostname, u.port or 80


# ---------------------------------------------------------------- clients


async def request(host, port, method, path, body=None, token=None, timeout=10.0):
    """One request on a connection of its own: (status, body bytes)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        data = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
        if token:
            head.append(f"Authorization: Bearer {token}")
        if body is not None:
            head.append("Content-Type: application/json")
        head.append(f"Content-Length: {len(data)}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)  # to EOF (Connection: close)
    finally:
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        payload = dechunk(payload)
    return status, payload


def dechunk(data):
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out += rest[:n]
        data = rest[n + 2 :]
    return out


class Tally:
    def __init__(self):
        self.counts = {}

    def add(self, what, n=1):
        self.counts[what] = self.counts.get(what, 0) + n


async def stream(host, port, path, stop, tally, state):
    """Holds one event stream open until `stop`, counting its events; reopens it
    (at most 100 times) when the server closes it."""
    for attempt in range(101):
        if stop.is_set():
            return
        if attempt:
            tally.add("stream reconnects")
            await asyncio.sleep(1)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
        except (OSError, asyncio.TimeoutError):
            tally.add("stream connect errors")
            continue
        try:
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                tally.add(f"stream answered {status}")
                continue
            state["open"] += 1
            try:
                tail = b""
                while not stop.is_set():
                    read = asyncio.ensure_future(reader.read(65536))
                    stopped = asyncio.ensure_future(stop.wait())
                    done, _ = await asyncio.wait({read, stopped}, return_when=asyncio.FIRST_COMPLETED)
                    if read not in done:
                        read.cancel()
                        return
                    stopped.cancel()
                    chunk = read.result()
                    if not chunk:
                        tally.add("streams closed by the server")
                        break
                    tally.add("events", (tail + chunk).count(b"data:"))
                    tail = chunk[-4:]
            finally:
                state["open"] -= 1
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            tally.add("stream errors")
        finally:
            writer.close()


async def sign_in_and_out(host, port, users, password, per_s, stop, tally):
    """Sign-in, /api/me, sign-out, /api/me, `per_s` times a second, users in turn."""
    i = 0
    next_at = time.monotonic()
    while not stop.is_set():
        user = users[i % len(users)]
        i += 1
        try:
            status, body = await request(
                host, port, "POST", "/api/auth/signin", {"username": user, "password": password}
            )
            if status != 200:
                tally.add(f"sign-in answered {status}")
            else:
                tally.add("sign-ins")
                token = json.loads(body)["token"]
                me, _ = await request(host, port, "GET", "/api/me", token=token)
                out, _ = await request(host, port, "POST", "/api/auth/signout", token=token)
                after, _ = await request(host, port, "GET", "/api/me", token=token)
                if (me, out, after) == (200, 204, 401):
                    tally.add("sign-outs")
                else:
                    tally.add(f"me/sign-out/me answered {me}/{out}/{after}")
        except (OSError, asyncio.TimeoutError, ValueError, IndexError, KeyError):
            tally.add("sign-in errors")
        next_at += 1.0 / per_s
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))
        except asyncio.TimeoutError:
            pass


async def clients(args):
    host, port = loopback(args.url)
    sales = [int(s) for s in args.sales.split(",")]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    tally, state = Tally(), {"open": 0}

    password = secrets.token_hex(12)
    prefix = "soak" + secrets.token_hex(4)
    users = []
    for n in range(args.users):
        status, body = await request(
            host, port, "POST", "/api/auth/signup", {"username": f"{prefix}{n}", "password": password}
        )
        if status != 201:
            sys.exit(f"soak_clients.py: sign-up answered {status}: {body[:200]!r}")
        users.append(f"{prefix}{n}")

    tasks = []
    for n in range(args.streams):  # in steps of 100: no burst of 1,000 handshakes
        path = f"/api/sales/{sales[n % len(sales)]}/events"
        tasks.append(asyncio.ensure_future(stream(host, port, path, stop, tally, state)))
        if n % 100 == 99:
            await asyncio.sleep(0.05)
    for _ in range(100):  # until all are open (at most 10 s)
        if state["open"] >= args.streams:
            break
        await asyncio.sleep(0.1)
    print(f"    {state['open']} event streams open", file=sys.stderr, flush=True)
    if args.ready:
        with open(args.ready, "w") as f:
            f.write(f"{state['open']}\n")

    tasks.append(
        asyncio.ensure_future(sign_in_and_out(host, port, users, password, args.signins_per_s, stop, tally))
    )
    # Counted every half second while running: once `stop` is set the streams close.
    fewest = open_at_end = state["open"]
    deadline = time.monotonic() + args.seconds
    while not stop.is_set() and time.monotonic() < deadline:
        fewest = min(fewest, state["open"])
        open_at_end = state["open"]
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except asyncio.TimeoutError:
            pass
    stop.set()
    await asyncio.wait(tasks, timeout=15)
    report = {"streams_open_at_end": open_at_end, "streams_fewest_open": fewest, **tally.counts}
    # (at the end: the last count before the stop, at most half a second old)
    print(json.dumps(report), flush=True)


# ---------------------------------------------------------------- create-sales


def create_sales(args):
    host, port = loopback(args.url)
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    starts = (now - datetime.timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    ends = (now + datetime.timedelta(days=30)).isoformat().replace("+00:00", "Z")
    conn = http.client.HTTPConnection(host, port, timeout=15)
    for n in range(args.count):
        body = json.dumps(
            {
                "name": f"Idle catalog live sale {n + 1}",
                "description": "Made by scripts/idle-catalog.",
                "price_cents": 100,
                "stock": args.stock,
                "starts_at": starts,
                "ends_at": ends,
                "requires_ticket": False,
            }
        )
        headers = {"Authorization": f"Bearer {args.token}", "Content-Type": "application/json"}
        for attempt in range(3):  # the server closes a keep-alive connection idle 5 s
            try:
                conn.request("POST", "/api/admin/sales", body, headers)
                resp = conn.getresponse()
                answer = resp.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                if attempt == 2:
                    raise
        if resp.status != 201:
            sys.exit(f"soak_clients.py: POST /api/admin/sales answered {resp.status}: {answer[:200]!r}")
        print(json.loads(answer)["id"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("clients")
    c.add_argument("--url", required=True)
    c.add_argument("--sales", required=True, help="comma-separated sale ids")
    c.add_argument("--streams", type=int, default=1000)
    c.add_argument("--seconds", type=float, required=True)
    c.add_argument("--users", type=int, default=5)
    c.add_argument("--signins-per-s", type=float, default=3.0)
    c.add_argument("--ready", help="file written once the streams are open")
    s = sub.add_parser("create-sales")
    s.add_argument("--url", required=True)
    s.add_argument("--token", required=True)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--stock", type=int, default=100)
    args = parser.parse_args()
    if args.command == "clients":
        asyncio.run(clients(args))
    else:
        create_sales(args)


if __name__ == "__main__":
    main()
