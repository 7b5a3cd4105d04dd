//! `stampede verify-draw --url http://host:port --sale N`: checks a draw from what
//! the server publishes and nothing else: the seed against the commitment the
//! sale carried from its creation, the entries against their count, and the
//! winners against the order recomputed from the seed and the entries
//! (`stampede::sale::draw::verify`, over the arithmetic docs/api.md spells out). Prints
//! each check; exits 1 when one fails. `http://` is read by a client of a few
//! lines; `https://` (a shop behind TLS, as the draw page prints its command
//! there) through `curl`, which must be installed: this binary carries no TLS
//! stack.

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

/// `http://host:port/prefix` (read here), or an `https://` URL (read by `curl`).
enum Base {
    Http {
        host: String,
        port: u16,
        prefix: String,
    },
    Https(String),
}

impl Base {
    fn parse(url: &str) -> anyhow::Result<Base> {
        if url.starts_with("https://") {
            return Ok(Base::Https(url.trim_end_matches('/').to_string()));
        }
        let Some(rest) = url.strip_prefix("http://") else {
            bail!("--url must start with http:// or https:// (got {url:?})");
        };
        let (authority, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = host_and_port(authority)?;
        Ok(Base::Http {
            host,
            port,
            prefix: prefix.trim_end_matches('/').to_string(),
        })
    }

    /// The body of `GET path`; an error unless the answer is 200.
    fn get(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        match self {
            Base::Http { host, port, prefix } => http_get(host, *port, prefix, path),
            Base::Https(base) => curl_get(&format!("{base}{path}")),
        }
    }
}

/// An authority's host and port (80 when none): `host`, `host:port`, `[::1]`,
/// `[::1]:8080` (the brackets dropped).
fn host_and_port(authority: &str) -> anyhow::Result<(String, u16)> {
    let port = |p: &str| p.parse::<u16>().context("--url: a bad port");
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .context("--url: an IPv6 address without its closing ]")?;
        let port = match after.strip_prefix(':') {
            Some(p) => port(p)?,
            None if after.is_empty() => 80,
            None => bail!("--url: {authority:?} is not host:port"),
        };
        return Ok((host.to_string(), port));
    }
    Ok(match authority.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), port(p)?),
        None => (authority.to_string(), 80),
    })
}

/// `url`'s body through `curl` (for `https://`); an error unless it answered 200.
fn curl_get(url: &str) -> anyhow::Result<Vec<u8>> {
    let out = std::process::Command::new("curl")
        .args(["--silent", "--show-error", "--fail-with-body", "--max-time", "120", url])
        .output()
        .context("https:// is read with curl, which could not be run: install curl, or give an http:// URL")?;
    if !out.status.success() {
        bail!(
            "GET {url}: {} {}",
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(out.stdout)
}

/// The body of `GET prefix/path` from `host:port` over plain HTTP; an error unless
/// the answer is 200.
fn http_get(host: &str, port: u16, prefix: &str, path: &str) -> anyhow::Result<Vec<u8>> {
    let mut stream = TcpStream::connect((host, port))
        .with_context(|| format!("cannot connect to {host}:{port}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let prefix = if prefix.is_empty() {
        String::new()
    } else {
        format!("/{prefix}")
    };
    write!(
        stream,
        "GET {prefix}{path} HTTP/1.1\r\nHost: {}:{}\r\nAccept-Encoding: identity\r\n\
             Connection: close\r\n\r\n",
        if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        },
        port
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_host_and_port_ipv6_included() {
        let cases = [
            ("example.org", ("example.org", 80)),
            ("127.0.0.1:8080", ("127.0.0.1", 8080)),
            ("[::1]:8080", ("::1", 8080)),
            ("[2001:db8::7]", ("2001:db8::7", 80)),
        ];
        for (authority, (host, port)) in cases {
            assert_eq!(host_and_port(authority).unwrap(), (host.to_string(), port));
        }
        assert!(host_and_port("[::1").is_err());
        assert!(host_and_port("host:http").is_err());
        assert!(
            matches!(Base::parse("https://shop.example/"), Ok(Base::Https(u)) if u == "https://shop.example")
        );
        assert!(Base::parse("ftp://shop.example").is_err());
    }
}
