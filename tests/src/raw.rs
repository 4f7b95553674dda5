//! Raw HTTP/1.1 over TCP, for tests that send what no well-behaved client would: bodies
//! that stall or trickle, heads that lie about their length, pipelined requests.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connects to `addr` (`host:port`), sends `request` (raw bytes, which should say
/// `connection: close`) and reads the answer to its end (at most 10 s). Returns the
/// status and the whole answer text.
///
/// # Panics
/// When the connection fails or no answer ends within 10 s.
pub async fn exchange(addr: &str, request: &[u8]) -> (u16, String) {
    let mut socket = TcpStream::connect(addr).await.expect("connect to keypool");
    // the server may answer and close before it read everything: a failed write is fine
    let _ = socket.write_all(request).await;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("an answer within 10 s");
    let text = String::from_utf8_lossy(&answer).into_owned();
    (status_of(&text), text)
}

/// Reads from `read` until a whole response head (`\r\n\r\n`) arrived, the peer closed,
/// or `within` passed; returns what arrived (the head and any body bytes after it).
pub async fn read_head(read: &mut (impl AsyncRead + Unpin), within: Duration) -> String {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(within, async {
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Reads one whole answer whose body has a `content-length` from a connection that
/// stays open (a keep-alive exchange), within `within`; returns its text.
///
/// # Panics
/// When the answer does not end within `within`.
pub async fn read_answer(read: &mut (impl AsyncRead + Unpin), within: Duration) -> String {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&answer[..end + 4]).into_owned();
                let length = header_of(&head, "content-length")
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if answer.len() >= end + 4 + length {
                    break;
                }
            }
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("a whole answer in time");
    String::from_utf8_lossy(&answer).into_owned()
}

/// The status of a raw HTTP/1.1 answer (0 when there is none).
pub fn status_of(answer: &str) -> u16 {
    answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The value of header `name` (lower case) in a raw answer's head.
pub fn header_of<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    let head = answer.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A `POST` with `connection: close`, `x-api-key: key`, JSON content type, the right
/// `content-length`, `extra_headers` (each ending in `\r\n`) and `body`.
pub fn post(path: &str, key: &str, extra_headers: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: keypool\r\nconnection: close\r\nx-api-key: {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n{extra_headers}\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}
