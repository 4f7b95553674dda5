//! A webhook receiver on loopback for the alert suites (SPEC 15): answers 200 and
//! records each JSON body, answers 500, or accepts and never answers, as told.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Answer 200 and record the body.
pub const ANSWER: u8 = 0;
/// Answer 500.
pub const FAIL: u8 = 1;
/// Accept and never answer.
pub const HANG: u8 = 2;

/// A webhook receiver on loopback that answers 200 (recording the body), answers 500,
/// or accepts and never answers, as told.
#[derive(Clone)]
pub struct Receiver {
    port: u16,
    mode: Arc<AtomicU8>,
    bodies: Arc<Mutex<Vec<Value>>>,
    attempts: Arc<AtomicU64>,
}

impl Receiver {
    /// Starts it, answering 200.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = Receiver {
            port: listener.local_addr().unwrap().port(),
            mode: Arc::new(AtomicU8::new(ANSWER)),
            bodies: Arc::default(),
            attempts: Arc::default(),
        };
        let server = r.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(server.clone().serve(socket));
            }
        });
        r
    }

    /// One request per connection (answers close it).
    async fn serve(self, mut socket: tokio::net::TcpStream) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let (head_end, length) = loop {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                break (end + 4, length);
            }
        };
        while buf.len() < head_end + length {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let status = match self.mode.load(Ordering::SeqCst) {
            ANSWER => {
                let body = serde_json::from_slice(&buf[head_end..head_end + length]).unwrap();
                self.bodies.lock().unwrap().push(body);
                "200 OK"
            }
            FAIL => "500 Internal Server Error",
            _ => {
                // accepted and never answered: wait until the sender gives up
                while !matches!(socket.read(&mut chunk).await, Ok(0) | Err(_)) {}
                return;
            }
        };
        let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        let _ = socket.write_all(answer.as_bytes()).await;
        let _ = socket.shutdown().await;
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Answers as `mode` says from now on ([`ANSWER`], [`FAIL`], [`HANG`]).
    pub fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    /// How many requests reached it (whatever it answered).
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::SeqCst)
    }

    /// The bodies received so far.
    pub fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }

    /// The bodies received, once `done` holds for them (at most `within`).
    pub async fn wait_for(&self, within: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + within;
        loop {
            let bodies = self.bodies();
            if done(&bodies) {
                return bodies;
            }
            assert!(
                Instant::now() < deadline,
                "alerts not received within {within:?}; got {bodies:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
