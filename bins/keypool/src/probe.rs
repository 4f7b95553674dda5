//! `keypool probe`: the health probe of a container image that has no `curl` (the
//! Dockerfile's `HEALTHCHECK`): one `GET` over plain HTTP/1.1 to keypool's own
//! `/readyz` (or `/healthz`, or any URL given), exit 0 on `200`, 1 otherwise.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context as _, bail};

/// How long the probe waits for the connection and for the answer.
const TIMEOUT: Duration = Duration::from_secs(3);

/// The URL a probe of `config` asks: the admin listener when there is one (it is plain
/// HTTP even when `listen` has TLS), else `listen`; an unspecified address
/// (`0.0.0.0`, `[::]`) becomes loopback.
pub fn url_for(listen: SocketAddr, admin: Option<SocketAddr>, path: &str) -> String {
    let mut addr = admin.unwrap_or(listen);
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{addr}{path}")
}

/// `GET url`: the status and the body.
///
/// # Errors
/// When the URL is not `http://host:port/path`, or nothing answers within 3 s.
pub fn get(url: &str) -> anyhow::Result<(u16, String)> {
    request("GET", url, &[], None)
}

/// `method url` with `headers` and a JSON `body` over plain HTTP/1.1 (the probe, and
/// the commands that talk to the admin API): the status and the body (at most 1 MiB).
///
/// # Errors
/// When the URL is not `http://host:port/path`, or nothing answers within 3 s.
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let rest = url.strip_prefix("http://").context(
        "only plain http:// is spoken here (use the admin listener when listen has TLS)",
    )?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let addr = authority
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {authority}"))?
        .next()
        .with_context(|| format!("{authority} has no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)
        .with_context(|| format!("cannot connect to {authority}"))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {authority}\r\nuser-agent: keypool-cli\r\nconnection: close\r\n"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() || method != "GET" {
        head.push_str(&format!(
            "content-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut answer = Vec::new();
    stream.take(1024 * 1024).read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok());
    match status {
        Some(status) => Ok((status, body.to_owned())),
        None => bail!("{authority} did not answer HTTP"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_url_prefers_the_admin_listener_and_loopback() {
        let listen: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let admin: SocketAddr = "[::]:9090".parse().unwrap();
        assert_eq!(
            url_for(listen, None, "/readyz"),
            "http://127.0.0.1:8080/readyz"
        );
        assert_eq!(
            url_for(listen, Some(admin), "/readyz"),
            "http://[::1]:9090/readyz"
        );
        let own: SocketAddr = "10.1.2.3:8080".parse().unwrap();
        assert_eq!(
            url_for(own, None, "/healthz"),
            "http://10.1.2.3:8080/healthz"
        );
    }

    #[test]
    fn a_url_that_is_not_plain_http_is_refused() {
        assert!(get("https://127.0.0.1:1/readyz").is_err());
    }
}
