//! [`EgressProxy`]: a small outbound proxy on `127.0.0.1` for the egress tests, HTTP
//! `CONNECT` or SOCKS5, with or without a username and password. It records every
//! tunnel it was asked for, and resolves names under `.keypool.test` (a reserved
//! top-level domain nothing else resolves) to `127.0.0.1`, so that a test can name an
//! upstream only the proxy can reach: an answer then proves the call went through it.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Which protocol the proxy speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyKind {
    /// HTTP `CONNECT host:port` (RFC 9110, 9.3.6).
    Connect,
    /// SOCKS5 (RFC 1928), username/password auth (RFC 1929) when the proxy has one.
    Socks5,
}

/// One tunnel the proxy was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tunnel {
    /// The destination as the client named it (`host:port`; a SOCKS5 IPv4 address as
    /// `a.b.c.d:port`).
    pub target: String,
    /// Whether the client's credentials matched (always true without credentials).
    pub authorized: bool,
}

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct EgressProxy {
    port: u16,
    kind: ProxyKind,
    credentials: Option<(String, String)>,
    tunnels: Arc<Mutex<Vec<Tunnel>>>,
    task: tokio::task::AbortHandle,
}

impl EgressProxy {
    /// Starts a proxy of `kind` on `127.0.0.1:0`, asking for `credentials` if given.
    ///
    /// # Panics
    /// When it cannot listen.
    pub async fn start(kind: ProxyKind, credentials: Option<(&str, &str)>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let credentials = credentials.map(|(u, p)| (u.to_owned(), p.to_owned()));
        let tunnels = Arc::new(Mutex::new(Vec::new()));
        let state = Shared {
            kind,
            credentials: credentials.clone(),
            tunnels: tunnels.clone(),
        };
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let state = state.clone();
                tokio::spawn(async move {
                    let _ = state.serve(client).await;
                });
            }
        })
        .abort_handle();
        Self {
            port,
            kind,
            credentials,
            tunnels,
            task,
        }
    }

    /// The proxy's URL for `proxy_url` / `HTTPS_PROXY`: `http://` or `socks5h://`
    /// (`socks5` when `local_dns`), with the credentials.
    pub fn url(&self, local_dns: bool) -> String {
        let scheme = match (self.kind, local_dns) {
            (ProxyKind::Connect, _) => "http",
            (ProxyKind::Socks5, true) => "socks5",
            (ProxyKind::Socks5, false) => "socks5h",
        };
        let auth = self
            .credentials
            .as_ref()
            .map_or_else(String::new, |(u, p)| format!("{u}:{p}@"));
        format!("{scheme}://{auth}127.0.0.1:{}", self.port)
    }

    /// Every tunnel asked for so far, in order.
    pub fn tunnels(&self) -> Vec<Tunnel> {
        self.tunnels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Shared {
    kind: ProxyKind,
    credentials: Option<(String, String)>,
    tunnels: Arc<Mutex<Vec<Tunnel>>>,
}

impl Shared {
    async fn serve(self, mut client: TcpStream) -> std::io::Result<()> {
        let (target, authorized) = match self.kind {
            ProxyKind::Connect => self.connect_head(&mut client).await?,
            ProxyKind::Socks5 => self.socks_handshake(&mut client).await?,
        };
        self.tunnels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Tunnel {
                target: target.clone(),
                authorized,
            });
        if !authorized {
            return Ok(());
        }
        let upstream = TcpStream::connect(resolve(&target)).await;
        let reply_ok = upstream.is_ok();
        match self.kind {
            ProxyKind::Connect if reply_ok => {
                client
                    .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    .await?;
            }
            ProxyKind::Connect => {
                client
                    .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
                    .await?;
            }
            ProxyKind::Socks5 => {
                let code = if reply_ok { 0 } else { 5 };
                client.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
            }
        }
        if let Ok(mut upstream) = upstream {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        }
        Ok(())
    }

    /// Reads a `CONNECT` request head: its target and whether its credentials match.
    async fn connect_head(&self, client: &mut TcpStream) -> std::io::Result<(String, bool)> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
            if client.read(&mut byte).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            head.push(byte[0]);
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.split("\r\n");
        let target = lines
            .next()
            .and_then(|l| l.strip_prefix("CONNECT "))
            .and_then(|l| l.split(' ').next())
            .unwrap_or("")
            .to_owned();
        let authorized = match &self.credentials {
            None => true,
            Some((user, password)) => {
                let expected = format!("basic {}", base64(format!("{user}:{password}").as_bytes()));
                lines.any(|l| {
                    l.split_once(':').is_some_and(|(name, value)| {
                        name.eq_ignore_ascii_case("proxy-authorization")
                            && value.trim().eq_ignore_ascii_case(&expected)
                    })
                })
            }
        };
        if !authorized {
            client
                .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\nproxy-authenticate: Basic\r\ncontent-length: 0\r\n\r\n")
                .await?;
        }
        Ok((target, authorized))
    }

    /// The SOCKS5 greeting, authentication and request: the target and whether the
    /// credentials matched.
    async fn socks_handshake(&self, client: &mut TcpStream) -> std::io::Result<(String, bool)> {
        let mut greeting = [0u8; 2];
        client.read_exact(&mut greeting).await?;
        let mut methods = vec![0u8; usize::from(greeting[1])];
        client.read_exact(&mut methods).await?;
        let mut authorized = true;
        match &self.credentials {
            None => client.write_all(&[5, 0]).await?,
            Some((user, password)) => {
                client.write_all(&[5, 2]).await?;
                let mut version = [0u8; 2];
                client.read_exact(&mut version).await?;
                let mut name = vec![0u8; usize::from(version[1])];
                client.read_exact(&mut name).await?;
                let mut length = [0u8; 1];
                client.read_exact(&mut length).await?;
                let mut pass = vec![0u8; usize::from(length[0])];
                client.read_exact(&mut pass).await?;
                authorized = name == user.as_bytes() && pass == password.as_bytes();
                client.write_all(&[1, u8::from(!authorized)]).await?;
            }
        }
        if !authorized {
            return Ok((String::new(), false));
        }
        let mut request = [0u8; 4];
        client.read_exact(&mut request).await?;
        let host = match request[3] {
            1 => {
                let mut ip = [0u8; 4];
                client.read_exact(&mut ip).await?;
                std::net::Ipv4Addr::from(ip).to_string()
            }
            3 => {
                let mut length = [0u8; 1];
                client.read_exact(&mut length).await?;
                let mut name = vec![0u8; usize::from(length[0])];
                client.read_exact(&mut name).await?;
                String::from_utf8_lossy(&name).into_owned()
            }
            _ => {
                let mut ip = [0u8; 16];
                client.read_exact(&mut ip).await?;
                format!("[{}]", std::net::Ipv6Addr::from(ip))
            }
        };
        let mut port = [0u8; 2];
        client.read_exact(&mut port).await?;
        Ok((format!("{host}:{}", u16::from_be_bytes(port)), true))
    }
}

/// `host:port` with a `.keypool.test` host mapped to `127.0.0.1`.
fn resolve(target: &str) -> String {
    match target.rsplit_once(':') {
        Some((host, port)) if host.ends_with(".keypool.test") => format!("127.0.0.1:{port}"),
        _ => target.to_owned(),
    }
}

/// Standard base64 with padding (for the expected `Proxy-Authorization`).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc_4648() {
        assert_eq!(
            super::base64(b"Aladdin:open sesame"),
            "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(super::base64(b"ab"), "YWI=");
        assert_eq!(super::base64(b"abc"), "YWJj");
    }
}
