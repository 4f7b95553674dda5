//! [`FakeUpstream`]: an upstream that answers with exactly the bytes a test scripts, for
//! the careless or hostile upstreams `keypool-sim` (a correct HTTP server) cannot play:
//! a body shorter than its `content-length`, a gzip body, a `204`, an event stream to
//! a request that did not ask for one, an error body that arrives seconds after its
//! head, an error message echoing the request it was sent.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One step of a scripted answer.
#[derive(Debug, Clone)]
pub enum Part {
    /// Write these bytes.
    Bytes(Vec<u8>),
    /// Wait this long.
    Pause(Duration),
    /// Close the connection (FIN) and stop.
    Close,
}

impl Part {
    /// Write `text`.
    pub fn text(text: impl Into<String>) -> Self {
        Part::Bytes(text.into().into_bytes())
    }
}

/// A request as the fake upstream received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The request head, as text (request line and header lines).
    pub head: String,
    /// The body.
    pub body: Vec<u8>,
}

type Responder = dyn Fn(&Received) -> Vec<Part> + Send + Sync;

/// A raw HTTP/1.1 upstream on `127.0.0.1:0`: reads each request (head and
/// `content-length` body), records it, and writes what the responder returns for it.
/// Connections are kept alive unless the answer ends with [`Part::Close`]. Stopped when
/// dropped.
pub struct FakeUpstream {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for FakeUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeUpstream")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl FakeUpstream {
    /// Starts one whose answers `respond` writes.
    ///
    /// # Panics
    /// When `127.0.0.1:0` cannot be bound.
    pub async fn start(respond: impl Fn(&Received) -> Vec<Part> + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let received = Arc::new(Mutex::new(Vec::new()));
        let respond: Arc<Responder> = Arc::new(respond);
        let log = Arc::clone(&received);
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, Arc::clone(&respond), Arc::clone(&log)));
            }
        });
        Self {
            addr,
            received,
            task,
        }
    }

    /// `http://127.0.0.1:<port>`: an account's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far.
    pub fn received(&self) -> Vec<Received> {
        self.received
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut socket: TcpStream, respond: Arc<Responder>, log: Arc<Mutex<Vec<Received>>>) {
    let mut buffer = Vec::new();
    loop {
        let Some(request) = read_request(&mut socket, &mut buffer).await else {
            return;
        };
        let parts = respond(&request);
        log.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(request);
        for part in parts {
            match part {
                Part::Bytes(bytes) => {
                    if socket.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
                Part::Pause(d) => tokio::time::sleep(d).await,
                Part::Close => {
                    let _ = socket.shutdown().await;
                    return;
                }
            }
        }
    }
}

async fn read_request(socket: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Received> {
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = socket.read(&mut chunk).await.ok().filter(|&n| n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let n = socket.read(&mut chunk).await.ok().filter(|&n| n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[head_end..head_end + length].to_vec();
    buffer.drain(..head_end + length);
    Some(Received { head, body })
}

/// A `200` JSON Messages answer, as Anthropic writes it.
pub fn messages_answer() -> Vec<u8> {
    let body = r#"{"id":"msg_fake","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"fake"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}"#;
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The frames of a complete, valid Messages stream (`message_start` … `message_stop`).
pub fn stream_frames() -> String {
    [
        r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_fake","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}}"#,
        r#"event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"fake"}}"#,
        r#"event: content_block_stop
data: {"type":"content_block_stop","index":0}"#,
        r#"event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":1}}"#,
        r#"event: message_stop
data: {"type":"message_stop"}"#,
    ]
    .iter()
    .map(|f| format!("{f}\n\n"))
    .collect()
}
