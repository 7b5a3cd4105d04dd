//! Benchmark: what open sale pages cost the server and Redis, with the live event
//! stream (`GET /api/sales/{id}/events`, see `src/live.rs`) or with the polling it
//! replaces (`GET /api/sales/{id}` every 2 s, what a page does without the stream).
//!
//!   live_viewers --url http://127.0.0.1:8080 --sale 1 --server-pid PID \
//!     [--viewers 1000] [--seconds 20] [--mode sse|poll] [--buy-tokens FILE]
//!
//! With --buy-tokens (a file of `stampede load repeat --prepare-only`: the purchase path, then
//! one fresh buyer's token a line), one of those buyers buys every 500 ms, so the
//! sale changes while it is watched.
//! REDIS_URL names the server's Redis (its CPU and commands are read from INFO).
//! Every viewer comes from loopback: start the server with
//! `STAMPEDE_MAX_STREAMS_PER_CLIENT=0` (else it takes 64 streams from one address).
//! Loopback only: it refuses any other host. Prints viewers, events or answers
//! received, and the server's and Redis's CPU and Redis commands per second over
//! the window (after every viewer is connected).

use std::time::{Duration, Instant};

use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    #[arg(long)]
    sale: i64,
    #[arg(long)]
    server_pid: u32,
    #[arg(long, default_value_t = 1000)]
    viewers: usize,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    #[arg(long, default_value = "sse")]
    mode: String,
    #[arg(long)]
    buy_tokens: Option<std::path::PathBuf>,
}

const POLL_EVERY: Duration = Duration::from_secs(2);

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let addr = args
        .url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("--url must be http://host:port"))?
        .trim_end_matches('/')
        .to_string();
    let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
    anyhow::ensure!(
        matches!(host, "127.0.0.1" | "localhost" | "[::1]"),
        "--url must be a loopback address (this sends {} connections' worth of traffic)",
        args.viewers
    );
    let sse = match args.mode.as_str() {
        "sse" => true,
        "poll" => false,
        other => anyhow::bail!("--mode must be sse or poll, not {other}"),
    };
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let redis = redis::Client::open(std::env::var("REDIS_URL")?)?;
    let mut redis = redis.get_multiplexed_async_connection().await?;

    let path = if sse {
        format!("/api/sales/{}/events", args.sale)
    } else {
        format!("/api/sales/{}", args.sale)
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut viewers = tokio::task::JoinSet::new();
    for i in 0..args.viewers {
        let stream = TcpStream::connect(&addr).await?;
        let request = request.clone();
        let stopped = stopped.clone();
        // Polling pages are spread over the interval, as real pages are.
        let offset = POLL_EVERY.mul_f64(i as f64 / args.viewers as f64);
        viewers.spawn(async move {
            if sse {
                watch(stream, request, stopped).await
            } else {
                poll(stream, request, offset, stopped).await
            }
        });
    }
    if let Some(file) = &args.buy_tokens {
        let text = std::fs::read_to_string(file)?;
        let mut lines = text.lines();
        let path = lines.next().unwrap_or_default().to_string();
        let tokens: Vec<String> = lines.map(str::to_string).collect();
        let (addr, stopped) = (addr.clone(), stopped.clone());
        tokio::spawn(buy_now_and_then(addr, path, tokens, stopped));
    }
    eprintln!("{} viewers connected; settling for 2 s", args.viewers);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (cpu0, redis0, cmds0) = (
        process_cpu_secs(args.server_pid)?,
        redis_cpu_secs(&mut redis).await?,
        redis_commands(&mut redis).await?,
    );
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let secs = started.elapsed().as_secs_f64();
    let (cpu1, redis1, cmds1) = (
        process_cpu_secs(args.server_pid)?,
        redis_cpu_secs(&mut redis).await?,
        redis_commands(&mut redis).await?,
    );
    let _ = stop.send(true);
    let mut received = 0u64;
    let mut failed = 0usize;
    while let Some(r) = viewers.join_next().await {
        match r? {
            Ok(n) => received += n,
            Err(_) => failed += 1,
        }
    }
    println!(
        "{} viewers ({}), {:.0} s: {} {} received, {} viewers failed",
        args.viewers,
        if sse {
            "event stream"
        } else {
            "polling every 2 s"
        },
        secs,
        received,
        if sse { "events" } else { "answers" },
        failed
    );
    println!(
        "server CPU {:.1}% of one core, Redis CPU {:.1}% of one core, Redis {:.1} commands/s",
        (cpu1 - cpu0) * 100.0 / secs,
        (redis1 - redis0) * 100.0 / secs,
        (cmds1 - cmds0) as f64 / secs
    );
    Ok(())
}

/// One purchase every 500 ms, each by the next token's user, until `stopped`.
async fn buy_now_and_then(
    addr: String,
    path: String,
    tokens: Vec<String>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    for token in tokens {
        let mut stream = TcpStream::connect(&addr).await?;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        tokio::select! {
            _ = stopped.changed() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
    Ok(())
}

/// An event stream held open until `stopped`: the number of `data:` events received.
async fn watch(
    mut stream: TcpStream,
    request: String,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<u64> {
    stream.write_all(request.as_bytes()).await?;
    let mut buf = vec![0u8; 16 * 1024];
    let mut events = 0u64;
    let mut head_seen = false;
    loop {
        let n = tokio::select! {
            _ = stopped.changed() => return Ok(events),
            r = stream.read(&mut buf) => r?,
        };
        anyhow::ensure!(n > 0, "the stream closed");
        let chunk = &buf[..n];
        if !head_seen {
            anyhow::ensure!(chunk.starts_with(b"HTTP/1.1 200"), "not a 200 stream");
            head_seen = true;
        }
        events += chunk.windows(6).filter(|w| w == b"data: ").count() as u64;
    }
}

/// A page polling every 2 s on one keep-alive connection: the answers received.
async fn poll(
    mut stream: TcpStream,
    request: String,
    offset: Duration,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<u64> {
    tokio::time::sleep(offset).await;
    let mut answers = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    let mut next = Instant::now();
    loop {
        stream.write_all(request.as_bytes()).await?;
        let mut have = Vec::new();
        loop {
            let n = stream.read(&mut buf).await?;
            anyhow::ensure!(n > 0, "the connection closed");
            have.extend_from_slice(&buf[..n]);
            if let Some(head_end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&have[..head_end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if have.len() >= head_end + 4 + length {
                    break;
                }
            }
        }
        answers += 1;
        next += POLL_EVERY;
        tokio::select! {
            _ = stopped.changed() => return Ok(answers),
            _ = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

fn process_cpu_secs(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): utime is the 14th
    // field, stime the 15th, in clock ticks (100 a second on Linux).
    let rest = stat
        .rsplit_once(')')
        .ok_or_else(|| anyhow::anyhow!("unreadable /proc/{pid}/stat"))?
        .1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

async fn redis_info(
    redis: &mut redis::aio::MultiplexedConnection,
    section: &str,
) -> anyhow::Result<String> {
    Ok(redis::cmd("INFO").arg(section).query_async(redis).await?)
}

async fn redis_cpu_secs(redis: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<f64> {
    let info = redis_info(redis, "cpu").await?;
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Ok(field("used_cpu_sys:") + field("used_cpu_user:"))
}

async fn redis_commands(redis: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let info = redis_info(redis, "stats").await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0))
}
