//! Batched writing of the per-request log lines to stderr.
//!
//! Every request ends with one `keypool::request` line. Written one by one, each costs
//! a `write` system call and a turn on stderr's lock on the thread that served the
//! request (at 30,000 requests a second, a sixth of keypool's system-call time and most
//! of its lock waits). Request lines are therefore appended to a buffer that a
//! background thread writes out every [`FLUSH_EVERY`], or as soon as a request thread
//! that took it past [`FLUSH_BYTES`] wakes it. A request thread writes a batch itself
//! only past [`BACKLOG_BYTES`], when stderr is slower than the lines come (a full pipe,
//! a stalled disk): that bounds the buffer, and below it a write to stderr, which may
//! block, never holds up the connections of the thread serving them. Every other
//! event (start-up, reloads, warnings, errors, shutdown) is written at once, after
//! whatever request lines are pending, so the order of the log is kept (and such an
//! event waits for a write in progress). The buffer is written out when [`FlushGuard`]
//! drops (the end of `main`) and before a panic message. A process killed outright
//! loses the request lines of its last [`FLUSH_EVERY`], or, when stderr was behind,
//! the backlog.
//!
//! The `write` itself happens outside the lock of the buffer: the batch is swapped out
//! under it, so a thread appending its line never waits for a system call (nor for a
//! writer that lost its CPU in the middle of one). A second lock, around the sink,
//! keeps the batches in order. Below [`BACKLOG_BYTES`] a request thread never takes
//! it; past it, the thread waits for the write in progress and writes the backlog.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use tracing::Metadata;
use tracing_subscriber::fmt::MakeWriter;

/// How often pending request lines are written out.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// Pending bytes past which the request thread that appended them wakes the flusher.
pub const FLUSH_BYTES: usize = 64 * 1024;
/// Pending bytes past which a request thread writes them out itself, after the write in
/// progress: the buffer's bound when stderr cannot keep up.
pub const BACKLOG_BYTES: usize = 8 * 1024 * 1024;
/// The room a written batch's buffer keeps for the next one (more than a batch takes
/// while the flusher wakes; less than a backlog's).
const SPARE_BYTES: usize = 4 * FLUSH_BYTES;
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
    /// The buffer of the last batch written, cleared: the next swap's replacement.
    spare: Vec<u8>,
}

struct Shared {
    state: Mutex<State>,
    /// Held while a batch is written: batches go out in the order they were taken.
    sink: Mutex<Box<dyn Sink>>,
    stop: AtomicBool,
    /// The flusher thread, once started.
    flusher: OnceLock<Thread>,
}

impl Shared {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Writes out what is pending, waiting for a write in progress first.
    fn flush(&self) {
        let sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        self.write_pending(sink);
    }

    /// What a request thread does once its line took the pending bytes from `before`
    /// to `after`: nothing, mostly; wake the flusher when they just passed
    /// [`FLUSH_BYTES`]; write them out itself past [`BACKLOG_BYTES`], or when there is
    /// no flusher (stopped, or never started).
    fn appended(&self, before: usize, after: usize) {
        if after >= BACKLOG_BYTES || self.stop.load(Ordering::Relaxed) {
            self.flush();
        } else if before < FLUSH_BYTES && after >= FLUSH_BYTES {
            match self.flusher.get() {
                Some(flusher) => flusher.unpark(),
                None => self.flush(),
            }
        }
    }

    fn write_pending(&self, mut sink: std::sync::MutexGuard<'_, Box<dyn Sink>>) {
        let mut batch = self.with(|state| {
            let spare = std::mem::take(&mut state.spare);
            std::mem::replace(&mut state.pending, spare)
        });
        if !batch.is_empty() {
            sink.write_all(&batch);
        }
        drop(sink);
        batch.clear();
        // A backlog's room is not kept: the spare becomes the next pending buffer.
        batch.shrink_to(SPARE_BYTES);
        self.with(|state| {
            if state.spare.capacity() < batch.capacity() {
                state.spare = batch;
            }
        });
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
                spare: Vec::with_capacity(FLUSH_BYTES),
            }),
            sink: Mutex::new(sink),
            stop: AtomicBool::new(false),
            flusher: OnceLock::new(),
        });
        let flusher = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("keypool-log".into())
                .spawn(move || {
                    while !shared.stop.load(Ordering::Acquire) {
                        std::thread::park_timeout(every);
                        shared.flush();
                    }
                })
                .ok()
        };
        if let Some(flusher) = &flusher {
            let _ = shared.flusher.set(flusher.thread().clone());
        }
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
        self.shared.flush();
    }

    /// Appends a request line (`fields` as `keypool-proxy` writes them, see
    /// `keypool_proxy::log::write_request_lines_to`) with the plain format's timestamp,
    /// level and target: the line [`crate::logfmt::PlainFormat`] would write for its
    /// event, batched as request lines are.
    pub fn write_request_line(&self, fields: &[u8]) {
        let stamp = crate::logfmt::timestamp();
        let label = crate::logfmt::level_label(tracing::Level::INFO);
        let (before, after) = self.shared.with(|state| {
            let line = &mut state.pending;
            let before = line.len();
            line.reserve(stamp.len() + label.len() + REQUEST_TARGET.len() + fields.len() + 3);
            line.extend_from_slice(&stamp);
            line.extend_from_slice(label.as_bytes());
            line.extend_from_slice(REQUEST_TARGET.as_bytes());
            line.extend_from_slice(b": ");
            line.extend_from_slice(fields);
            line.push(b'\n');
            (before, line.len())
        });
        self.shared.appended(before, after);
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(flusher) = self.flusher.take() {
            flusher.thread().unpark();
            let _ = flusher.join();
        }
        self.shared.flush();
    }
}

/// One event's writer: `batched` for request lines while the flusher runs.
pub struct EventWriter<'a> {
    shared: &'a Shared,
    batched: bool,
}

impl Write for EventWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let (before, after) = self.shared.with(|state| {
            let before = state.pending.len();
            state.pending.extend_from_slice(buf);
            (before, state.pending.len())
        });
        if self.batched {
            self.shared.appended(before, after);
        } else {
            self.shared.flush();
        }
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

    /// A request line written by `write_request_line` is the line the plain format
    /// writes for its event, timestamp aside, and is batched with the others in order.
    #[test]
    fn request_lines_written_directly_are_the_plain_formats_and_keep_the_order() {
        let capture = Capture::default();
        let (writer, guard) =
            BatchedStderr::start_with(Box::new(capture.clone()), Duration::from_secs(3600));
        let fields = r#"request request_id="req_kp_1" org="acme" status=200"#;
        writer.write_request_line(fields.as_bytes());
        assert!(capture.writes().is_empty(), "request lines are batched");
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(writer.clone())
            .event_format(crate::logfmt::PlainFormat)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                target: "keypool::request",
                request_id = "req_kp_1",
                org = "acme",
                status = 200,
                "request"
            );
            tracing::warn!("configuration reload refused");
        });
        let writes = capture.writes();
        assert_eq!(writes.len(), 1, "{writes:?}");
        let lines: Vec<&str> = writes[0].lines().collect();
        assert_eq!(lines.len(), 3, "{lines:?}");
        // `2026-11-30T00:18:12.970542Z` then the rest, the same for both.
        assert_eq!(lines[0][27..], lines[1][27..], "{lines:?}");
        assert_eq!(
            &lines[0][27..],
            format!("  INFO keypool::request: {fields}"),
            "{lines:?}"
        );
        assert!(lines[2].ends_with("configuration reload refused"));
        drop(guard);
        // Without the flusher, a line goes out at once.
        writer.write_request_line(fields.as_bytes());
        assert_eq!(capture.writes().len(), 2);
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

    /// A sink whose `write_all` waits until the test lets it go: a write in progress.
    struct Gate {
        entered: std::sync::mpsc::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
        capture: Capture,
    }

    impl Sink for Gate {
        fn write_all(&mut self, bytes: &[u8]) {
            let _ = self.entered.send(());
            let _ = self.release.recv();
            self.capture.write_all(bytes);
        }
    }

    /// A writer (its flusher's period an hour) into a [`Gate`]: what it let through, the
    /// signal that a write began, and the sender that lets one write finish.
    fn gated() -> (
        BatchedStderr,
        FlushGuard,
        Capture,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let capture = Capture::default();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let gate = Gate {
            entered: entered_tx,
            release: release_rx,
            capture: capture.clone(),
        };
        let (writer, guard) = BatchedStderr::start_with(Box::new(gate), Duration::from_secs(3600));
        (writer, guard, capture, entered, release)
    }

    #[test]
    fn request_lines_do_not_wait_for_a_write_in_progress() {
        let (writer, guard, capture, entered, release) = gated();
        // Another thread writes an event at once and is held inside the write.
        let other = {
            let writer = writer.clone();
            std::thread::spawn(move || {
                emit(&writer, || tracing::info!("configuration reloaded"));
            })
        };
        entered.recv().unwrap();
        // Meanwhile this thread fills the buffer past FLUSH_BYTES: it must not wait for
        // the write in progress (before the change it blocked on the buffer's lock,
        // and this test would hang here).
        emit(&writer, || {
            for i in 0..(FLUSH_BYTES / 40 + 10) {
                tracing::info!(target: "keypool::request", status = 200, i, "request");
            }
        });
        for _ in 0..8 {
            release.send(()).unwrap();
        }
        other.join().unwrap();
        drop(guard);
        let text = capture.writes().concat();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].ends_with("configuration reloaded"),
            "{:?}",
            &lines[..2]
        );
        assert_eq!(lines.len(), 1 + FLUSH_BYTES / 40 + 10);
        // Every request line, in order, after the held write.
        for (n, line) in lines[1..].iter().enumerate() {
            assert!(line.ends_with(&format!("i={n}")), "{line}");
        }
    }

    /// A sink that notes which thread made each write, and how long it was.
    #[derive(Clone, Default)]
    struct Writers(Arc<Mutex<Vec<(std::thread::ThreadId, usize)>>>);

    impl Sink for Writers {
        fn write_all(&mut self, bytes: &[u8]) {
            let me = std::thread::current().id();
            self.0.lock().unwrap().push((me, bytes.len()));
        }
    }

    impl Writers {
        /// Waits (bounded) until `bytes` were written in all.
        fn wait_for(&self, bytes: usize) -> Vec<(std::thread::ThreadId, usize)> {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let writes = self.0.lock().unwrap().clone();
                if writes.iter().map(|w| w.1).sum::<usize>() >= bytes {
                    return writes;
                }
                assert!(std::time::Instant::now() < deadline, "{writes:?}");
                std::thread::yield_now();
            }
        }
    }

    /// The length of a request line of `fields` bytes: timestamp, level, target, the
    /// fields and the newline.
    fn line_len(fields: usize) -> usize {
        let label = crate::logfmt::level_label(tracing::Level::INFO);
        27 + label.len() + REQUEST_TARGET.len() + 2 + fields + 1
    }

    /// Waits (bounded) for the gated sink to be entered.
    fn entered_within(entered: &std::sync::mpsc::Receiver<()>) {
        entered
            .recv_timeout(Duration::from_secs(10))
            .expect("the sink was not written to");
    }

    /// 64 KiB of request lines wake the flusher at once (its period is an hour here),
    /// and the request thread never writes them itself.
    #[test]
    fn a_full_buffer_is_written_by_the_flusher_not_the_request_thread() {
        let writers = Writers::default();
        let (writer, _guard) =
            BatchedStderr::start_with(Box::new(writers.clone()), Duration::from_secs(3600));
        let fields = [b'x'; 100];
        let line = line_len(fields.len());
        writer.write_request_line(&fields);
        let mut total = line;
        while total < FLUSH_BYTES {
            writer.write_request_line(&fields);
            total += line;
        }
        let writes = writers.wait_for(total);
        let me = std::thread::current().id();
        assert!(writes.iter().all(|(thread, _)| *thread != me), "{writes:?}");
        assert_eq!(writes.iter().map(|w| w.1).sum::<usize>(), total);
    }

    /// With the flusher stuck in a write (stderr not read), request threads keep
    /// appending without writing until the backlog reaches its bound; the thread that
    /// passes it waits for the stuck write and writes the backlog itself, in order.
    #[test]
    fn past_the_backlog_bound_a_request_thread_waits_for_the_stuck_write() {
        let (writer, guard, capture, entered, release) = gated();
        let line = |n: usize| format!("request n={n:08} {}", "y".repeat(984));
        let len = line_len(line(0).len());
        writer.write_request_line(line(0).as_bytes());
        let mut n = 1;
        // The first 64 KiB wake the flusher, which is then held inside its write.
        while n * len < FLUSH_BYTES {
            writer.write_request_line(line(n).as_bytes());
            n += 1;
        }
        entered_within(&entered);
        // Below the bound nothing is written, and nothing waits.
        while writer.shared.with(|s| s.pending.len()) + len < BACKLOG_BYTES {
            writer.write_request_line(line(n).as_bytes());
            n += 1;
        }
        assert_eq!(capture.writes().len(), 0);
        // The line that passes the bound waits for the held write; then the backlog is
        // written (by that thread, or by the flusher if it takes the lock first).
        let passing = {
            let writer = writer.clone();
            let text = line(n);
            std::thread::spawn(move || writer.write_request_line(text.as_bytes()))
        };
        n += 1;
        // Its line is in (nobody can take the buffer while the flusher is held), and it
        // is waiting.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while writer.shared.with(|s| s.pending.len()) < BACKLOG_BYTES {
            assert!(std::time::Instant::now() < deadline, "the line never came");
            std::thread::yield_now();
        }
        assert!(!passing.is_finished(), "it went on without waiting");
        release.send(()).unwrap();
        entered_within(&entered);
        release.send(()).unwrap();
        passing.join().unwrap();
        let writes = capture.writes();
        assert_eq!(writes.len(), 2, "the held batch, then the backlog");
        let backlog = writes[1].len();
        assert!(
            (BACKLOG_BYTES..BACKLOG_BYTES + len).contains(&backlog),
            "{backlog}"
        );
        let text = writes.concat();
        for (i, l) in text.lines().enumerate() {
            assert!(l.contains(&format!("n={i:08} ")), "line {i}: {l}");
        }
        assert_eq!(text.lines().count(), n);
        drop(release);
        drop(guard);
    }
}
