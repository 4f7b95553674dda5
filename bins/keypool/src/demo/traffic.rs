//! The demo's client: requests at a constant rate, half of them streamed, each timed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::pool::{CALLERS, caller_of};

/// Longest the demo waits for one answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Most requests in flight at once (a slow account cannot make the demo pile up).
const MAX_IN_FLIGHT: u64 = 256;

/// What the client saw of one request.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Status, `0` when the connection failed or timed out.
    pub status: u16,
    /// Whether it asked for a stream.
    pub stream: bool,
    /// Streams: time to the first body bytes (keypool sends the head and first frames
    /// at its commit point, once content arrived).
    pub ttft: Option<Duration>,
}

/// Live counters and the finished outcomes.
#[derive(Debug, Default)]
pub struct Traffic {
    /// Requests sent.
    pub sent: AtomicU64,
    /// Answers received (any status).
    pub done: AtomicU64,
    /// `2xx` answers.
    pub ok: AtomicU64,
    outcomes: Mutex<Vec<Outcome>>,
}

impl Traffic {
    /// Requests sent but not answered yet.
    pub fn in_flight(&self) -> u64 {
        self.sent
            .load(Ordering::Relaxed)
            .saturating_sub(self.done.load(Ordering::Relaxed))
    }

    /// Every finished outcome so far.
    pub fn outcomes(&self) -> Vec<Outcome> {
        self.outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn finish(&self, outcome: Outcome) {
        if (200..300).contains(&outcome.status) {
            self.ok.fetch_add(1, Ordering::Relaxed);
        }
        self.outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(outcome);
        self.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sends `rps` requests per second to `url` with the [`CALLERS`]' `keys` until `deadline`, then waits for
/// the answers in flight (at most [`REQUEST_TIMEOUT`]).
pub async fn drive(
    url: String,
    keys: Vec<String>,
    rps: u32,
    deadline: Instant,
    traffic: Arc<Traffic>,
) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let period = Duration::from_secs_f64(1.0 / f64::from(rps.max(1)));
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = tokio::task::JoinSet::new();
    let mut n: u64 = 0;
    while Instant::now() < deadline {
        ticks.tick().await;
        if traffic.in_flight() >= MAX_IN_FLIGHT {
            continue;
        }
        // Every other request streams; one in eight is long enough to show chunking.
        let stream = !n.is_multiple_of(2);
        let caller = caller_of(n);
        let key = &keys[caller];
        n += 1;
        let body = serde_json::json!({
            "model": CALLERS[caller].model,
            "max_tokens": if n.is_multiple_of(8) { 512 } else { 64 },
            "stream": stream,
            "messages": [{"role": "user", "content": "Say hello to the keypool demo."}],
        });
        let request = Request::builder()
            .method(Method::POST)
            .uri(&url)
            .header("x-api-key", key.as_str())
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .body(Full::new(Bytes::from(body.to_string())));
        let Ok(request) = request else { continue };
        traffic.sent.fetch_add(1, Ordering::Relaxed);
        let client = client.clone();
        let traffic = traffic.clone();
        tasks.spawn(async move {
            let started = Instant::now();
            let result = tokio::time::timeout(REQUEST_TIMEOUT, async {
                let response = client.request(request).await.ok()?;
                let status = response.status().as_u16();
                let mut body = response.into_body();
                let mut ttft = None;
                while let Some(frame) = body.frame().await {
                    let Ok(frame) = frame else { break };
                    if ttft.is_none() && frame.data_ref().is_some_and(|d| !d.is_empty()) {
                        ttft = Some(started.elapsed());
                    }
                }
                Some((status, ttft))
            })
            .await;
            let (status, ttft) = result.ok().flatten().unwrap_or((0, None));
            traffic.finish(Outcome {
                status,
                stream,
                ttft: if stream && status == 200 { ttft } else { None },
            });
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// The `q` quantile (0–1, nearest rank) of `values`, which it sorts.
pub fn quantile(values: &mut [Duration], q: f64) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values.get(rank - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&mut v, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(quantile(&mut v, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(quantile(&mut v, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(quantile(&mut [], 0.5), None);
        let mut one = [Duration::from_millis(7)];
        assert_eq!(quantile(&mut one, 0.99), Some(Duration::from_millis(7)));
    }
}
