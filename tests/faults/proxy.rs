//! A TCP fault proxy (issue 53): listens on a free loopback port and forwards each
//! connection to a target (a Redis, a Postgres), doing to the bytes what the test
//! says, in each direction:
//!
//! - latency: every chunk read is written `latency + random(0..jitter)` after it
//!   was read (pipelined, like a network's delay: chunks stay in order, and a
//!   busy connection is not slowed to one chunk per delay);
//! - stall: bytes stop flowing both ways and the connections stay open (what a
//!   dropped route or a full conntrack table does); the held bytes go on after
//!   healing, as TCP's retransmissions would deliver them;
//! - reset: every connection is closed now with an RST, a chunk being written cut
//!   in half (mid-reply); or so every `period` until healed;
//! - blackhole: new connections are accepted but never forwarded (until healed),
//!   existing ones stalled;
//! - sever: the connections open now go silent for good, both ways (what a peer
//!   that vanished without a reset does: a failover, a VM gone, a dropped route
//!   that never comes back): their bytes are swallowed, they never close (until
//!   the other side closes them); connections made after it flow;
//! - heal: all of it undone.
//!
//! One proxy per (server, dependency), so one app server can be cut off alone.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What the proxy does to the bytes now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    pub latency: Duration,
    pub jitter: Duration,
    pub stalled: bool,
    pub blackhole: bool,
}

impl Faults {
    fn holds_bytes(&self) -> bool {
        self.stalled || self.blackhole
    }
}

/// Counters of a proxy's life.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted.
    pub accepted: AtomicUsize,
    /// Connections open now (accepted, not yet closed).
    pub open: AtomicUsize,
    /// Connections closed by a reset.
    pub reset: AtomicUsize,
    /// Replies cut: a chunk half written when its connection was reset.
    pub cut: AtomicUsize,
    /// Bytes forwarded, both ways.
    pub bytes: AtomicU64,
    /// Directions of connections severed (two a connection, see [`Proxy::sever`]),
    /// and of them those still open.
    pub severed: AtomicUsize,
    pub severed_open: AtomicUsize,
}

struct Shared {
    target: SocketAddr,
    faults: watch::Sender<Faults>,
    /// Bumped by every reset: a connection born under an older value closes.
    resets: watch::Sender<u64>,
    /// Bumped by every sever: a connection born under an older value goes silent.
    severs: watch::Sender<u64>,
    stats: Stats,
}

/// One proxy: dropping it stops accepting and closes every connection.
pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
    resetter: Mutex<Option<JoinHandle<()>>>,
}

impl Proxy {
    /// A proxy on a free loopback port to `127.0.0.1:target_port`.
    pub async fn start(target_port: u16) -> Proxy {
        let port = crate::harness::free_port();
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the fault proxy");
        let shared = Arc::new(Shared {
            target: SocketAddr::from(([127, 0, 0, 1], target_port)),
            faults: watch::channel(Faults::default()).0,
            resets: watch::channel(0).0,
            severs: watch::channel(0).0,
            stats: Stats::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Proxy {
            port,
            shared,
            accept,
            resetter: Mutex::new(None),
        }
    }

    /// `redis://` URL through this proxy.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `postgres://` URL (the harness's user and database) through this proxy.
    pub fn postgres_url(&self) -> String {
        format!("postgres://stampede@127.0.0.1:{}/stampede", self.port)
    }

    pub fn faults(&self) -> Faults {
        *self.shared.faults.borrow()
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Every chunk, each way, `fixed + random(0..jitter)` late.
    pub fn latency(&self, fixed: Duration, jitter: Duration) {
        self.shared.faults.send_modify(|f| {
            f.latency = fixed;
            f.jitter = jitter;
        });
    }

    /// Bytes stop flowing both ways; connections stay open.
    pub fn stall(&self) {
        self.shared.faults.send_modify(|f| f.stalled = true);
    }

    /// New connections accepted but not forwarded, existing ones stalled.
    pub fn blackhole(&self) {
        self.shared.faults.send_modify(|f| f.blackhole = true);
    }

    /// Every connection open now goes silent for good: what it is sent, either
    /// way, is swallowed; it is never closed by the proxy. Connections made after
    /// this flow (no heal needed).
    pub fn sever(&self) {
        self.shared.severs.send_modify(|n| *n += 1);
    }

    /// Directions of severed connections still open (their sender has not closed
    /// them; two a connection).
    pub fn severed_open(&self) -> usize {
        self.shared.stats.severed_open.load(Ordering::Relaxed)
    }

    /// Closes every open connection now (RST; a chunk being written is cut).
    pub fn reset_all(&self) {
        self.shared.resets.send_modify(|n| *n += 1);
    }

    /// [`Proxy::reset_all`] every `period` until [`Proxy::heal`].
    pub fn reset_every(&self, period: Duration) {
        let shared = self.shared.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(Instant::now() + period, period);
            loop {
                tick.tick().await;
                shared.resets.send_modify(|n| *n += 1);
            }
        });
        if let Some(old) = self.resetter.lock().unwrap().replace(task) {
            old.abort();
        }
    }

    /// No more faults: held bytes flow, held connections are forwarded.
    pub fn heal(&self) {
        if let Some(task) = self.resetter.lock().unwrap().take() {
            task.abort();
        }
        self.shared.faults.send_replace(Faults::default());
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        if let Some(task) = self.resetter.lock().unwrap().take() {
            task.abort();
        }
        // Every connection task watches `resets`: this closes them all.
        self.shared.resets.send_modify(|n| *n += 1);
    }
}

/// The fault proxies of one server: to Redis and to Postgres.
pub struct Links {
    pub redis: Proxy,
    pub pg: Proxy,
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
        shared.stats.open.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        tokio::spawn(async move {
            serve(client, &shared).await;
            shared.stats.open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Resolves when a reset newer than `born` is asked for.
async fn reset_after(resets: &mut watch::Receiver<u64>, born: u64) {
    let _ = resets.wait_for(|n| *n != born).await;
    // The proxy was dropped (sender gone) or a reset came: close either way.
}

/// Resolves when a sever newer than `at` is asked for.
async fn severed_after(severs: &mut watch::Receiver<u64>, at: u64) {
    if severs.wait_for(|n| *n != at).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves when the faults let bytes (or a held connection) through.
async fn flowing(faults: &mut watch::Receiver<Faults>) {
    if faults.wait_for(|f| !f.holds_bytes()).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Closes with an RST rather than a FIN.
fn abort(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

async fn serve(client: TcpStream, shared: &Arc<Shared>) {
    let mut resets = shared.resets.subscribe();
    let born = *resets.borrow_and_update();
    let severed_at = *shared.severs.borrow();
    let _ = client.set_nodelay(true);
    // Blackholed: accepted, never forwarded, until healed (or reset).
    let mut faults = shared.faults.subscribe();
    let connected = tokio::select! {
        _ = reset_after(&mut resets, born) => None,
        _ = flowing(&mut faults) => TcpStream::connect(shared.target).await.ok(),
    };
    let Some(upstream) = connected else {
        abort(&client);
        shared.stats.reset.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let severed = (born, severed_at);
    let up = pump(client_read, upstream_write, shared.clone(), severed);
    let down = pump(upstream_read, client_write, shared.clone(), severed);
    // Each direction ends on its reader's EOF (then shuts its writer: a FIN) or
    // on a reset; the halves drop here, with linger 0 (an RST if not closed).
    let (a, b) = tokio::join!(up, down);
    if a == End::Reset || b == End::Reset {
        shared.stats.reset.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Eof,
    Reset,
    Failed,
}

/// Forwards one direction: a reader task stamps each chunk with the time it was
/// read; this writes it when its delay has passed and the faults let it through.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: Arc<Shared>,
    (born, severed_at): (u64, u64),
) -> End {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let end = forward(&mut rx, &mut to, &shared, (born, severed_at)).await;
    reader.abort();
    if end == End::Eof {
        let _ = to.shutdown().await;
    }
    end
}

async fn forward(
    rx: &mut mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    to: &mut OwnedWriteHalf,
    shared: &Shared,
    (born, severed_at): (u64, u64),
) -> End {
    let mut resets = shared.resets.subscribe();
    let mut faults = shared.faults.subscribe();
    let mut severs = shared.severs.subscribe();
    let mut last_due = Instant::now();
    loop {
        let (read_at, chunk) = tokio::select! {
            c = rx.recv() => match c {
                Some(c) => c,
                None => return End::Eof,
            },
            _ = reset_after(&mut resets, born) => {
                abort(to.as_ref());
                return End::Reset;
            }
            () = severed_after(&mut severs, severed_at) => {
                return swallow(rx, to, shared, born).await;
            }
        };
        let f = *faults.borrow_and_update();
        let jitter = match f.jitter.as_micros() as u64 {
            0 => Duration::ZERO,
            j => Duration::from_micros(rand::rng().random_range(0..j)),
        };
        // In order: never before the chunk ahead of it.
        let due = (read_at + f.latency + jitter).max(last_due);
        last_due = due;
        let held = async {
            tokio::time::sleep_until(due).await;
            flowing(&mut faults).await;
        };
        tokio::select! {
            _ = held => {}
            () = severed_after(&mut severs, severed_at) => {
                return swallow(rx, to, shared, born).await;
            }
            _ = reset_after(&mut resets, born) => {
                // Mid-reply: half the chunk goes out, then the RST.
                let _ = to.write_all(&chunk[..chunk.len() / 2]).await;
                shared.stats.cut.fetch_add(1, Ordering::Relaxed);
                abort(to.as_ref());
                return End::Reset;
            }
        }
        if to.write_all(&chunk).await.is_err() {
            return End::Failed;
        }
        shared
            .stats
            .bytes
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
}

/// A severed direction: everything read from then on is dropped, and the
/// connection stays open until its sender closes it (EOF: shut down onward) or a
/// reset (the proxy dropped).
async fn swallow(
    rx: &mut mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    to: &mut OwnedWriteHalf,
    shared: &Shared,
    born: u64,
) -> End {
    shared.stats.severed.fetch_add(1, Ordering::Relaxed);
    shared.stats.severed_open.fetch_add(1, Ordering::Relaxed);
    let mut resets = shared.resets.subscribe();
    let end = loop {
        tokio::select! {
            c = rx.recv() => if c.is_none() {
                break End::Eof;
            },
            _ = reset_after(&mut resets, born) => {
                abort(to.as_ref());
                break End::Reset;
            }
        }
    };
    shared.stats.severed_open.fetch_sub(1, Ordering::Relaxed);
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port; returns the port.
    async fn echo() -> u16 {
        let port = crate::harness::free_port();
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        port
    }

    /// Sends `msg` and reads it back: the time it took, or the error / timeout.
    async fn round_trip(
        s: &mut TcpStream,
        msg: &[u8],
        within: Duration,
    ) -> Result<Duration, String> {
        let at = Instant::now();
        s.write_all(msg).await.map_err(|e| e.to_string())?;
        let mut got = vec![0u8; msg.len()];
        match tokio::time::timeout(within, s.read_exact(&mut got)).await {
            Err(_) => Err("timeout".into()),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(_)) => {
                assert_eq!(got, msg, "the echo came back changed");
                Ok(at.elapsed())
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn proxy_adds_latency_stalls_heals_resets_blackholes_and_severs() {
        let proxy = Proxy::start(echo().await).await;
        let mut s = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        let second = Duration::from_secs(1);
        let fast = round_trip(&mut s, b"ping", second).await.unwrap();
        assert!(fast < Duration::from_millis(100), "no fault, yet {fast:?}");

        // 100 ms each way: at least 200 ms a round trip.
        proxy.latency(Duration::from_millis(100), Duration::from_millis(20));
        let slow = round_trip(&mut s, b"slow", second).await.unwrap();
        assert!(
            slow >= Duration::from_millis(200),
            "latency 2x100 ms, yet {slow:?}"
        );

        // Stalled: nothing comes back, the connection stays open; healed, the held
        // bytes arrive.
        proxy.heal();
        proxy.stall();
        let held = round_trip(&mut s, b"held", Duration::from_millis(300)).await;
        assert_eq!(held, Err("timeout".to_string()));
        proxy.heal();
        let mut got = [0u8; 4];
        tokio::time::timeout(second, s.read_exact(&mut got))
            .await
            .expect("the stalled bytes arrive after healing")
            .unwrap();
        assert_eq!(&got, b"held");
        assert_eq!(proxy.stats().reset.load(Ordering::Relaxed), 0);

        // Reset: the connection dies (an RST, or EOF), a new one works.
        proxy.reset_all();
        let after = round_trip(&mut s, b"gone", second).await;
        assert!(after.is_err(), "a reset connection still echoed");
        let mut s = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        round_trip(&mut s, b"anew", second).await.unwrap();
        assert_eq!(proxy.stats().reset.load(Ordering::Relaxed), 1);

        // Blackhole: a new connection is accepted but gets nothing, the old one
        // stalls; healed, both carry their bytes.
        proxy.blackhole();
        let mut new = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        let quiet = Duration::from_millis(300);
        assert!(round_trip(&mut new, b"new!", quiet).await.is_err());
        assert!(round_trip(&mut s, b"old!", quiet).await.is_err());
        proxy.heal();
        for (stream, msg) in [(&mut new, b"new!"), (&mut s, b"old!")] {
            let mut got = [0u8; 4];
            tokio::time::timeout(second, stream.read_exact(&mut got))
                .await
                .expect("held bytes arrive after healing")
                .unwrap();
            assert_eq!(&got, msg);
        }

        // Mid-reply: a reset while a chunk waits out its latency writes half of it.
        proxy.latency(Duration::from_millis(300), Duration::ZERO);
        s.write_all(b"abcd").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        proxy.reset_all();
        let deadline = Instant::now() + second;
        while proxy.stats().cut.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "no chunk cut by the reset");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        proxy.heal();

        // Periodic resets close every connection made, again and again, until healed.
        proxy.reset_every(Duration::from_millis(100));
        for _ in 0..3 {
            let mut s = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert!(round_trip(&mut s, b"late", second).await.is_err());
        }
        proxy.heal();
        let mut s = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        round_trip(&mut s, b"calm", second).await.unwrap();
        let resets = proxy.stats().reset.load(Ordering::Relaxed);
        assert!(resets >= 5, "{resets} resets");

        // Severed: the old connection goes silent for good and stays open, even
        // after a heal; a new one flows at once; closing the old one is seen.
        drop(new);
        proxy.sever();
        let quiet = Duration::from_millis(300);
        assert_eq!(
            round_trip(&mut s, b"lost", quiet).await,
            Err("timeout".to_string())
        );
        proxy.heal();
        assert_eq!(
            round_trip(&mut s, b"lost", quiet).await,
            Err("timeout".to_string()),
            "a severed connection carried bytes after a heal"
        );
        let mut fresh = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        round_trip(&mut fresh, b"next", second).await.unwrap();
        assert_eq!(proxy.severed_open(), 2, "both directions of `s` held open");
        drop(s);
        let deadline = Instant::now() + second;
        while proxy.severed_open() > 0 {
            assert!(
                Instant::now() < deadline,
                "a severed connection closed by its client stayed open"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(fresh);
        // Every connection closed: nothing left open (no leak per reset).
        let deadline = Instant::now() + second;
        while proxy.stats().open.load(Ordering::Relaxed) > 0 {
            assert!(Instant::now() < deadline, "connections left open");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
