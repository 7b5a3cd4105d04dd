//! `stampede verify-draw --url http://host:port --sale N`: checks a draw from what
//! the server publishes and nothing else: the seed against the commitment the
//! sale carried from its creation, the entries against their count, and the
//! winners against the order recomputed from the seed and the entries
//! (`stampede::sale::draw::verify`, over the arithmetic docs/api.md spells out). Prints
//! each check; exits 1 when one fails. Plain `http://` only (a client of a
//! few lines, not a TLS stack): put a local proxy in front for `https://`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use stampede::sale::draw::verify;

#[derive(clap::Args)]
pub struct Args {
    /// The server's address, e.g. `http://127.0.0.1:8080`.
    #[arg(long)]
    url: String,
    /// The sale's id.
    #[arg(long)]
    sale: u64,
}

/// Runs the checks, printing each; the exit status says whether all passed.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let base = Base::parse(&args.url)?;
    let sale: Value = serde_json::from_slice(&base.get(&format!("/api/sales/{}", args.sale))?)?;
    let draw: Value =
        serde_json::from_slice(&base.get(&format!("/api/sales/{}/draw", args.sale))?)?;
    let csv = base.get(&format!("/api/sales/{}/draw/entries.csv", args.sale))?;
    let mut failed = 0;
    for found in verify::check(&sale, &draw, &csv)? {
        println!(
            "{} {}",
            if found.ok { "ok      " } else { "MISMATCH" },
            found.what
        );
        failed += usize::from(!found.ok);
    }
    println!(
        "{}",
        if failed == 0 {
            "the draw checks out"
        } else {
            "the draw does NOT check out"
        }
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `http://host:port/prefix`.
struct Base {
    host: String,
    port: u16,
    prefix: String,
}

impl Base {
    fn parse(url: &str) -> anyhow::Result<Base> {
        let Some(rest) = url.strip_prefix("http://") else {
            bail!("--url must start with http:// (got {url:?})");
        };
        let (authority, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().context("--url: a bad port")?),
            None => (authority, 80),
        };
        Ok(Base {
            host: host.to_string(),
            port,
            prefix: prefix.trim_end_matches('/').to_string(),
        })
    }

    /// The body of `GET path`; an error unless the answer is 200.
    fn get(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let mut stream = TcpStream::connect((self.host.as_str(), self.port))
            .with_context(|| format!("cannot connect to {}:{}", self.host, self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        let prefix = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("/{}", self.prefix)
        };
        write!(
            stream,
            "GET {prefix}{path} HTTP/1.1\r\nHost: {}:{}\r\nAccept-Encoding: identity\r\n\
             Connection: close\r\n\r\n",
            self.host, self.port
        )?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .context("an answer without a head")?;
        let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
        let body = &raw[end + 4..];
        let body = if head.contains("transfer-encoding: chunked") {
            dechunk(body)?
        } else {
            body.to_vec()
        };
        let status = head
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        if status != "200" {
            bail!("GET {path}: {status} {}", String::from_utf8_lossy(&body));
        }
        Ok(body)
    }
}

/// A chunked body's bytes.
fn dechunk(mut body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("a cut chunk")?;
        let size = std::str::from_utf8(&body[..line])?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)?;
        body = &body[line + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size + 2 {
            bail!("a cut chunk");
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}
