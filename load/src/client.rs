//! A minimal HTTP/1.1 client for `stampede load`: one keep-alive connection per task,
//! a request written in one buffer, an answer read up to its `Content-Length`. No
//! pool, no redirects, no TLS: it measures a server on this machine (or one the
//! operator names on purpose), and must cost far less than the server it measures
//! (a general client such as reqwest took most of the CPU it was measuring).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where requests go: the address to connect to and the `Host` header.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub host: String,
}

impl Target {
    /// `http://host:port` (a trailing `/` is fine). Loopback only unless `remote`.
    pub fn parse(url: &str, remote: bool) -> anyhow::Result<Target> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow::anyhow!("--url must start with http:// (got {url:?})"))?;
        let host = rest.trim_end_matches('/');
        anyhow::ensure!(
            !host.contains('/'),
            "--url is a server's base URL, without a path (got {url:?})"
        );
        let with_port = if host
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            host.to_string()
        } else {
            format!("{host}:80")
        };
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&with_port)
            .map_err(|e| anyhow::anyhow!("cannot resolve {host}: {e}"))?
            .next()
            .ok_or_else(|| anyhow::anyhow!("{host} has no address"))?;
        anyhow::ensure!(
            remote || addr.ip().is_loopback(),
            "{url} is not on this machine: a load test sends thousands of requests; \
             pass --allow-remote to drive another host on purpose"
        );
        Ok(Target {
            addr,
            host: host.to_string(),
        })
    }
}

/// One request: method, path, bearer token, extra header, JSON body.
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub token: Option<&'a str>,
    pub forwarded_for: Option<&'a str>,
    /// `Idempotency-Key` (a purchase's).
    pub idempotency_key: Option<&'a str>,
    pub body: Option<&'a [u8]>,
}

impl Request<'static> {
    /// `GET /healthz`.
    pub const HEALTHZ: Request<'static> = Request {
        method: "GET",
        path: "/healthz",
        token: None,
        forwarded_for: None,
        idempotency_key: None,
        body: None,
    };
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

pub struct Conn {
    target: Target,
    stream: Option<TcpStream>,
    out: Vec<u8>,
    buf: Vec<u8>,
    timeout: Duration,
}

impl Conn {
    pub fn new(target: Target, timeout: Duration) -> Conn {
        Conn {
            target,
            stream: None,
            out: Vec::with_capacity(512),
            buf: Vec::with_capacity(4096),
            timeout,
        }
    }

    /// Sends `req` and reads its answer; reconnects when the server closed the
    /// connection. An error means no (complete) answer: the request may have run.
    pub async fn send(&mut self, req: &Request<'_>) -> anyhow::Result<Response> {
        match tokio::time::timeout(self.timeout, self.exchange(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => {
                self.stream = None;
                Err(e)
            }
            Err(_) => {
                self.stream = None;
                anyhow::bail!("no answer within {:?}", self.timeout)
            }
        }
    }

    async fn exchange(&mut self, req: &Request<'_>) -> anyhow::Result<Response> {
        if self.stream.is_none() {
            let stream = TcpStream::connect(self.target.addr).await?;
            stream.set_nodelay(true)?;
            self.stream = Some(stream);
            self.buf.clear();
        }
        self.out.clear();
        let out = &mut self.out;
        out.extend_from_slice(req.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(req.path.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        out.extend_from_slice(self.target.host.as_bytes());
        out.extend_from_slice(b"\r\nAccept: application/json\r\n");
        if let Some(token) = req.token {
            out.extend_from_slice(b"Authorization: Bearer ");
            out.extend_from_slice(token.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let Some(ip) = req.forwarded_for {
            out.extend_from_slice(b"X-Forwarded-For: ");
            out.extend_from_slice(ip.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let Some(key) = req.idempotency_key {
            out.extend_from_slice(b"Idempotency-Key: ");
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        match req.body {
            Some(body) => {
                out.extend_from_slice(b"Content-Type: application/json\r\nContent-Length: ");
                out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
                out.extend_from_slice(b"\r\n\r\n");
                out.extend_from_slice(body);
            }
            None if req.method == "POST" => out.extend_from_slice(b"Content-Length: 0\r\n\r\n"),
            None => out.extend_from_slice(b"\r\n"),
        }
        let stream = self.stream.as_mut().expect("connected above");
        stream.write_all(&self.out).await?;
        read_response(stream, &mut self.buf).await
    }
}

/// Reads one answer: the head, then `Content-Length` bytes (chunked bodies are read
/// to their end too). What follows stays in `buf` for the next answer.
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> anyhow::Result<Response> {
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        read_more(stream, buf).await?;
    };
    let head = std::str::from_utf8(&buf[..head_end])?;
    let status: u16 = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("not an HTTP answer: {:?}", &head[..head.len().min(40)]))?;
    let mut length = None;
    let mut chunked = false;
    for line in head.split("\r\n").skip(1) {
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.to_ascii_lowercase().contains("chunked");
            }
        }
    }
    buf.drain(..head_end);
    let body = if chunked {
        read_chunked(stream, buf).await?
    } else {
        let length = length.unwrap_or(0);
        while buf.len() < length {
            read_more(stream, buf).await?;
        }
        buf.drain(..length).collect()
    };
    Ok(Response { status, body })
}

async fn read_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(i) = find(buf, b"\r\n") {
                break i;
            }
            read_more(stream, buf).await?;
        };
        let size_text = std::str::from_utf8(&buf[..line_end])?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)?;
        buf.drain(..line_end + 2);
        while buf.len() < size + 2 {
            read_more(stream, buf).await?;
        }
        body.extend(buf.drain(..size));
        buf.drain(..2);
        if size == 0 {
            return Ok(body);
        }
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> anyhow::Result<()> {
    let mut chunk = [0u8; 4096];
    let n = stream.read(&mut chunk).await?;
    anyhow::ensure!(n > 0, "the server closed the connection");
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_unless_asked() {
        assert!(Target::parse("http://127.0.0.1:8080", false).is_ok());
        assert!(Target::parse("http://127.0.0.1:8080/", false).is_ok());
        assert!(Target::parse("http://[::1]:8080", false).is_ok());
        let err = Target::parse("http://192.0.2.1:8080", false).unwrap_err();
        assert!(err.to_string().contains("--allow-remote"), "{err}");
        assert!(Target::parse("http://192.0.2.1:8080", true).is_ok());
        let err = Target::parse("https://127.0.0.1", false).unwrap_err();
        assert!(err.to_string().contains("must start with http://"), "{err}");
        let err = Target::parse("http://127.0.0.1:8080/api", false).unwrap_err();
        assert!(err.to_string().contains("without a path"), "{err}");
    }
}
