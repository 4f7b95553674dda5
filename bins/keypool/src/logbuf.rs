//! Batched writing of the per-request log lines to stderr.
//!
//! Every request ends with one `keypool::request` line. Written one by one, each costs
//! a `write` system call and a turn on stderr's lock on the thread that served the
//! request (at 30,000 requests a second, a sixth of keypool's system-call time and most
//! of its lock waits). Request lines are therefore appended to a buffer that a
//! background thread writes out every [`FLUSH_EVERY`] (or at once past
//! [`FLUSH_BYTES`]); every other event (start-up, reloads, warnings, errors, shutdown)
//! is written at once, after whatever request lines are pending, so the order of the
//! log is kept. The buffer is written out when [`FlushGuard`] drops (the end of
//! `main`) and before a panic message. A process killed outright loses at most the
//! request lines of the last [`FLUSH_EVERY`].

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::Metadata;
use tracing_subscriber::fmt::MakeWriter;

/// How often pending request lines are written out.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// Pending bytes that are written out at once, without waiting for the flusher.
pub const FLUSH_BYTES: usize = 64 * 1024;
/// The `tracing` target of the per-request line (`keypool-proxy`'s `RequestLog`).
const REQUEST_TARGET: &str = "keypool::request";

/// Where the lines go: stderr in production, a buffer in tests.
trait Sink: Send + 'static {
    fn write_all(&mut self, bytes: &[u8]);
}

impl Sink for io::Stderr {
    fn write_all(&mut self, bytes: &[u8]) {
        // Nowhere to report a failed write to stderr.
        let _ = Write::write_all(self, bytes);
    }
}

struct State {
    pending: Vec<u8>,
    sink: Box<dyn Sink>,
}

impl State {
    fn flush(&mut self) {
        if !self.pending.is_empty() {
            self.sink.write_all(&self.pending);
            self.pending.clear();
        }
    }
}

struct Shared {
    state: Mutex<State>,
    stop: AtomicBool,
}

impl Shared {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The [`MakeWriter`] of the subscriber: batches request lines, writes the rest at once.
#[derive(Clone)]
pub struct BatchedStderr {
    shared: Arc<Shared>,
}

/// Stops the flusher thread and writes out what is pending, when dropped.
pub struct FlushGuard {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
}

impl BatchedStderr {
    /// A writer to stderr with its flusher thread, and the guard that stops it.
    pub fn start() -> (Self, FlushGuard) {
        Self::start_with(Box::new(io::stderr()), FLUSH_EVERY)
    }

    fn start_with(sink: Box<dyn Sink>, every: Duration) -> (Self, FlushGuard) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: Vec::with_capacity(FLUSH_BYTES),
                sink,
            }),
            stop: AtomicBool::new(false),
        });
        let flusher = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("keypool-log".into())
                .spawn(move || {
                    while !shared.stop.load(Ordering::Acquire) {
                        std::thread::park_timeout(every);
                        shared.with(State::flush);
                    }
                })
                .ok()
        };
        let writer = Self {
            shared: Arc::clone(&shared),
        };
        // Without a flusher thread (none could be started) every line goes out at once.
        let batching = flusher.is_some();
        (
            if batching { writer } else { writer.unbatched() },
            FlushGuard { shared, flusher },
        )
    }

    fn unbatched(self) -> Self {
        self.shared.stop.store(true, Ordering::Release);
        self
    }

    /// Writes out what is pending (before a panic message, say).
    pub fn flush(&self) {
        self.shared.with(State::flush);
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(flusher) = self.flusher.take() {
            flusher.thread().unpark();
            let _ = flusher.join();
        }
        self.shared.with(State::flush);
    }
}

/// One event's writer: `batched` for request lines while the flusher runs.
pub struct EventWriter<'a> {
    shared: &'a Shared,
    batched: bool,
}

impl Write for EventWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.shared.with(|state| {
            state.pending.extend_from_slice(buf);
            if !self.batched || state.pending.len() >= FLUSH_BYTES {
                state.flush();
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchedStderr {
    type Writer = EventWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        EventWriter {
            shared: &self.shared,
            batched: false,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        EventWriter {
            shared: &self.shared,
            batched: meta.target() == REQUEST_TARGET && !self.shared.stop.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Sink for Capture {
        fn write_all(&mut self, bytes: &[u8]) {
            self.0.lock().unwrap().push(bytes.to_vec());
        }
    }

    impl Capture {
        fn writes(&self) -> Vec<String> {
            let writes = self.0.lock().unwrap();
            writes
                .iter()
                .map(|w| String::from_utf8(w.clone()).unwrap())
                .collect()
        }
    }

    fn emit(writer: &BatchedStderr, emit: impl Fn()) {
        let subscriber = tracing_subscriber::fmt()
            .without_time()
            .with_ansi(false)
            .with_writer(writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
    }

    #[test]
    fn request_lines_wait_for_the_flusher_and_other_events_keep_the_order() {
        let capture = Capture::default();
        // A flusher that never comes round during the test.
        let (writer, guard) =
            BatchedStderr::start_with(Box::new(capture.clone()), Duration::from_secs(3600));
        emit(&writer, || {
            tracing::info!(target: "keypool::request", status = 200, "request");
            tracing::info!(target: "keypool::request", status = 201, "request");
        });
        assert!(capture.writes().is_empty(), "request lines are batched");
        emit(&writer, || {
            tracing::info!("configuration reloaded");
        });
        // The reload line went out at once, after the two pending request lines, in
        // one write.
        let writes = capture.writes();
        assert_eq!(writes.len(), 1, "{writes:?}");
        let lines: Vec<&str> = writes[0].lines().collect();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].ends_with("request status=200"), "{lines:?}");
        assert!(lines[1].ends_with("request status=201"), "{lines:?}");
        assert!(lines[2].ends_with("configuration reloaded"), "{lines:?}");
        emit(&writer, || {
            tracing::info!(target: "keypool::request", status = 202, "request");
        });
        drop(guard);
        let writes = capture.writes();
        assert_eq!(writes.len(), 2, "the guard writes out what is pending");
        assert!(writes[1].contains("status=202"));
        // After the guard, nothing is batched any more.
        emit(&writer, || {
            tracing::info!(target: "keypool::request", status = 203, "request");
        });
        assert_eq!(capture.writes().len(), 3);
    }

    #[test]
    fn the_flusher_writes_pending_lines_out() {
        let capture = Capture::default();
        let (writer, _guard) =
            BatchedStderr::start_with(Box::new(capture.clone()), Duration::from_millis(1));
        emit(&writer, || {
            tracing::info!(target: "keypool::request", status = 200, "request");
        });
        // The flusher runs every millisecond; wait for it, bounded.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while capture.writes().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never flushed");
            std::thread::yield_now();
        }
        assert!(capture.writes()[0].contains("status=200"));
    }

    #[test]
    fn a_large_backlog_is_written_without_waiting() {
        let capture = Capture::default();
        let (writer, _guard) =
            BatchedStderr::start_with(Box::new(capture.clone()), Duration::from_secs(3600));
        emit(&writer, || {
            for _ in 0..(FLUSH_BYTES / 40) {
                tracing::info!(target: "keypool::request", status = 200, "request");
            }
        });
        assert!(
            !capture.writes().is_empty(),
            "64 KiB of lines are written at once"
        );
    }
}
