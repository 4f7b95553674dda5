//! The plain-text log format when stderr is not a terminal (a journal, a file, a pipe).
//!
//! It writes the same line as `tracing-subscriber`'s default format with colours off
//! (`2026-11-30T00:18:12.970542Z  INFO keypool::request: request request_id=... org="acme"
//! ...`), but without that formatter's per-field styling machinery: every request ends
//! with one such line, and the default formatter was the largest single cost of a
//! request (~24,000 instructions, 18 % of the request path; see docs/BENCHMARKS.md).
//! On a terminal the default, coloured formatter is kept.
//!
//! Request lines do not come through here: `init_logging` has `keypool-proxy` write
//! their fields itself and hand them to [`crate::logbuf::BatchedStderr::
//! write_request_line`], which puts the same line into the batch without a `tracing`
//! event (see `keypool_proxy::log::write_request_lines_to`). The text is what
//! [`PlainFields`] would write; both use [`timestamp`] and [`level_label`].

use keypool_proxy::log::{write_quoted, write_u64};
use std::fmt::{self, Write as _};
use std::time::UNIX_EPOCH;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The lean plain-text event format.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainFormat;

impl<S, N> FormatEvent<S, N> for PlainFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write_now(&mut writer)?;
        writer.write_str(level_label(*event.metadata().level()))?;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                writer.write_str(span.name())?;
                if let Some(fields) = span.extensions().get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    write!(writer, "{{{fields}}}")?;
                }
                writer.write_char(':')?;
            }
            writer.write_char(' ')?;
        }
        writer.write_str(event.metadata().target())?;
        writer.write_str(": ")?;
        // The fields are written into this thread's line buffer and handed to the
        // writer in one piece: a `Writer` is a `dyn fmt::Write`, and a request line's
        // few hundred small writes through it cost more than the fields themselves.
        LINE.with(|line| {
            let mut line = line.borrow_mut();
            line.clear();
            let mut visitor = PlainFields {
                writer: &mut line,
                first: true,
                result: Ok(()),
            };
            event.record(&mut visitor);
            visitor.result?;
            line.push('\n');
            writer.write_str(&line)
        })
    }
}

thread_local! {
    /// The fields of the event being formatted on this thread.
    static LINE: std::cell::RefCell<String> = std::cell::RefCell::new(String::with_capacity(1024));
}

/// `" INFO "` and friends: the level right-aligned in five columns between spaces.
pub(crate) fn level_label(level: Level) -> &'static str {
    match level {
        Level::TRACE => " TRACE ",
        Level::DEBUG => " DEBUG ",
        Level::INFO => "  INFO ",
        Level::WARN => "  WARN ",
        Level::ERROR => " ERROR ",
    }
}

/// Writes the current time as `2026-11-30T00:18:12.970542Z` (UTC).
pub(crate) fn write_now(out: &mut impl fmt::Write) -> fmt::Result {
    // Only ASCII digits and the template's punctuation are in it.
    out.write_str(std::str::from_utf8(&timestamp()).map_err(|_| fmt::Error)?)
}

/// The current time as `2026-11-30T00:18:12.970542Z` (UTC).
pub(crate) fn timestamp() -> [u8; 27] {
    let since_epoch = keypool_store::clock::system_time()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    stamp(since_epoch.as_secs(), since_epoch.subsec_micros())
}

thread_local! {
    /// The minute this thread stamped last (`u64::MAX`: none yet) and its stamp.
    static MINUTE: std::cell::Cell<(u64, [u8; 27])> =
        const { std::cell::Cell::new((u64::MAX, [0; 27])) };
}

/// [`rfc3339_micros`], with the date, hour and minute taken from the thread's last
/// stamp when it was of the same minute (lines come many a second): the calendar
/// arithmetic once a minute, two and six digits per line.
fn stamp(secs: u64, micros: u32) -> [u8; 27] {
    let minute = secs / 60;
    let (last, mut buf) = MINUTE.get();
    if last != minute {
        buf = rfc3339_micros(secs, micros);
        MINUTE.set((minute, buf));
        return buf;
    }
    put_second(&mut buf, secs, micros);
    buf
}

/// `2026-11-30T00:18:12.970542Z` for `secs` since the epoch (UTC) and `micros`.
fn rfc3339_micros(secs: u64, micros: u32) -> [u8; 27] {
    let t = keypool_core::UtcDateTime::from_unix_secs(secs);
    let mut buf = *b"0000-00-00T00:00:00.000000Z";
    put_digits(&mut buf[0..4], t.year);
    put_digits(&mut buf[5..7], t.month);
    put_digits(&mut buf[8..10], t.day);
    put_digits(&mut buf[11..13], t.hour);
    put_digits(&mut buf[14..16], t.minute);
    put_second(&mut buf, secs, micros);
    buf
}

/// The seconds and microseconds of a stamp: what changes within its minute.
fn put_second(buf: &mut [u8; 27], secs: u64, micros: u32) {
    put_digits(&mut buf[17..19], secs % 60);
    put_digits(&mut buf[20..26], u64::from(micros));
}

/// Writes the last `out.len()` decimal digits of `n` into `out`, zero-padded.
fn put_digits(out: &mut [u8], mut n: u64) {
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// Writes `message` first, then ` name=value` per field: strings quoted (escaped only
/// when they need it), numbers and booleans bare, anything else by its `Debug`.
struct PlainFields<'w> {
    writer: &'w mut String,
    first: bool,
    result: fmt::Result,
}

impl PlainFields<'_> {
    fn name(&mut self, field: &Field) -> fmt::Result {
        if !std::mem::take(&mut self.first) {
            self.writer.write_char(' ')?;
        }
        let name = field.name();
        self.writer
            .write_str(name.strip_prefix("r#").unwrap_or(name))?;
        self.writer.write_char('=')
    }

    fn message(&mut self, value: fmt::Arguments<'_>) -> fmt::Result {
        if !std::mem::take(&mut self.first) {
            self.writer.write_char(' ')?;
        }
        self.writer.write_fmt(value)
    }

    fn quoted(&mut self, value: &str) -> fmt::Result {
        write_quoted(self.writer, value)
    }

    fn record(&mut self, field: &Field, write: impl FnOnce(&mut Self) -> fmt::Result) {
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        self.result = write(self);
    }
}

impl Visit for PlainFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record(field, |v| {
            if field.name() == "message" {
                v.message(format_args!("{value}"))
            } else {
                v.name(field)?;
                v.quoted(value)
            }
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.record(field, |v| {
            v.name(field)?;
            write_u64(v.writer, value)
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.record(field, |v| {
            v.name(field)?;
            if value < 0 {
                v.writer.write_char('-')?;
            }
            write_u64(v.writer, value.unsigned_abs())
        });
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.record(field, |v| {
            v.name(field)?;
            v.writer.write_str(if value { "true" } else { "false" })
        });
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.record(field, |v| {
            v.name(field)?;
            write!(v.writer, "{value}")?;
            let mut source = value.source();
            if source.is_some() {
                write!(v.writer, " {}.sources=[", field.name())?;
                let mut first = true;
                while let Some(s) = source {
                    if !std::mem::take(&mut first) {
                        v.writer.write_str(", ")?;
                    }
                    write!(v.writer, "{s}")?;
                    source = s.source();
                }
                v.writer.write_char(']')?;
            }
            Ok(())
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record(field, |v| {
            if field.name() == "message" {
                v.message(format_args!("{value:?}"))
            } else {
                v.name(field)?;
                write!(v.writer, "{value:?}")
            }
        });
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};

    /// A writer that keeps what a test's subscriber writes (shared with `logjson`'s
    /// tests).
    #[derive(Clone, Default)]
    pub(crate) struct Capture(Arc<Mutex<Vec<u8>>>);

    impl Capture {
        /// What was written so far.
        pub(crate) fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// The same events through the default formatter (no colours, no timestamp) and
    /// through ours, with our timestamp and the space after it cut off.
    fn both(emit: impl Fn()) -> (String, String) {
        let run = |lean: bool| {
            let capture = Capture::default();
            let writer = {
                let c = capture.clone();
                move || c.clone()
            };
            let builder = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_max_level(Level::TRACE)
                .with_writer(writer);
            if lean {
                tracing::subscriber::with_default(
                    builder.event_format(PlainFormat).finish(),
                    &emit,
                );
            } else {
                tracing::subscriber::with_default(builder.without_time().finish(), &emit);
            }
            String::from_utf8(capture.0.lock().unwrap().clone()).unwrap()
        };
        let lean: String = run(true)
            .lines()
            .map(|l| format!("{}\n", &l[28..]))
            .collect();
        (run(false), lean)
    }

    #[test]
    fn lines_match_the_default_format_without_colours() {
        let (default, lean) = both(|| {
            tracing::info!(
                target: "keypool::request",
                request_id = %"req_kp_1",
                org = "acme",
                caller = %"client_api_key_id=ci",
                stream = false,
                status = 200u16,
                ttft_ms = Some(12u64),
                missing = None::<u64>,
                delta = -3i64,
                zero = 0u64,
                max = u64::MAX,
                min = i64::MIN,
                quoted = "say \"hi\"\n",
                "request"
            );
            let span = tracing::warn_span!("reload", file = "keypool.toml");
            let _e = span.enter();
            tracing::warn!(error = %"bad value", "config reload refused");
            tracing::error!("plain {} message", 42);
            tracing::debug!(r#type = "x", "raw identifier");
        });
        assert_eq!(lean, default);
        assert!(lean.contains(
            r#" INFO keypool::request: request request_id=req_kp_1 org="acme" caller=client_api_key_id=ci stream=false status=200 ttft_ms=12 delta=-3 zero=0 max=18446744073709551615 min=-9223372036854775808 quoted="say \"hi\"\n""#
        ));
    }

    #[test]
    fn errors_list_their_sources() {
        #[derive(Debug)]
        struct Outer(io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("state file unreadable")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let (default, lean) = both(|| {
            let e = Outer(io::Error::other("disk gone"));
            tracing::error!(
                error = &e as &(dyn std::error::Error + 'static),
                "snapshot failed"
            );
        });
        assert_eq!(lean, default);
    }

    fn rfc3339_micros(secs: u64, micros: u32) -> String {
        String::from_utf8(super::rfc3339_micros(secs, micros).to_vec()).unwrap()
    }

    proptest::proptest! {
        /// A stamp made from the thread's last minute is the stamp made afresh, for
        /// any times in any order (the same minute, the next, years apart).
        #[test]
        fn kept_minutes_stamp_as_fresh_ones(
            times in proptest::collection::vec((0u64..4_000_000_000, 0u32..1_000_000), 1..40),
            near in proptest::collection::vec((0u64..180, 0u32..1_000_000), 1..40),
        ) {
            let base = times[0].0;
            let all = times.iter().copied().chain(near.iter().map(|&(d, m)| (base + d, m)));
            for (secs, micros) in all {
                proptest::prop_assert_eq!(
                    super::stamp(secs, micros),
                    super::rfc3339_micros(secs, micros)
                );
            }
        }
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339_micros(0, 0), "1970-01-01T00:00:00.000000Z");
        // 2026-11-30T00:18:12.970542Z
        assert_eq!(
            rfc3339_micros(1_795_997_892, 970_542),
            "2026-11-30T00:18:12.970542Z"
        );
        // A leap day and the last second of a year.
        assert_eq!(
            rfc3339_micros(1_709_164_800, 1),
            "2024-02-29T00:00:00.000001Z"
        );
        assert_eq!(
            rfc3339_micros(1_735_689_599, 999_999),
            "2024-12-31T23:59:59.999999Z"
        );
    }
}
