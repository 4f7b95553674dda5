//! The loopback relay guard between `fred` and Redis.
//!
//! `fred` decodes Redis replies with `redis-protocol`, whose decoder recurses once per
//! level of nesting without a bound: a Redis endpoint (or anything listening on its
//! address) that answers `*1\r\n` a million times overflows the stack and aborts the
//! whole process. `fred` offers no frame-depth or size limit and no custom transport, so
//! keypool puts a relay in front of it: [`RespGuard::start`] listens on `127.0.0.1:0`,
//! the mirror points `fred` at that address, and every accepted connection gets its own
//! connection to the real Redis. Bytes from `fred` to Redis are copied unchanged (so
//! `AUTH`, `SELECT` and every command pass through); bytes from Redis to `fred` go through
//! a [`RespScanner`] first, and only bytes it has checked are forwarded. A reply that
//! breaks a bound ([`Limits`]) closes both sockets and logs one error line (no URL, no
//! secret): `fred` sees a broken connection, keypool serves from memory and `fred`
//! reconnects through the relay as usual.
//!
//! The scanner is iterative and keeps a fixed amount of state (one counter per open
//! aggregate, at most [`MAX_DEPTH`]), whatever the input.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::StoreError;

/// Most aggregates open at once in one reply. keypool's deepest replies are 2–3 levels
/// (`SCAN`: an array holding an array; a pub/sub message).
pub const MAX_DEPTH: usize = 32;

/// Most bytes of one top-level reply (and so of one bulk string): 64 MiB. keypool's
/// largest reply is `HGETALL keypool:rating`, about 1 KiB per account; this leaves room
/// for tens of thousands of accounts while bounding what `fred` buffers for one reply
/// (Redis itself accepts bulk strings up to 512 MB, which `fred` would hold whole).
pub const MAX_REPLY_BYTES: u64 = 64 * 1024 * 1024;

/// Most elements one aggregate may announce (a map counts its keys and values):
/// 1,048,576. keypool's largest is the rating hash, two per account.
pub const MAX_ELEMENTS: u64 = 1 << 20;

/// After an error line about a refused reply, further refusals within this long are
/// logged at debug level only and counted into the next error line: `fred` reconnects
/// every 100 ms, and a hostile endpoint would otherwise flood the log.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// Bytes read from Redis at once.
const READ_BUFFER: usize = 64 * 1024;

/// The bounds a [`RespScanner`] enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most aggregates open at once (at most [`MAX_DEPTH`]).
    pub max_depth: usize,
    /// Most elements one aggregate may announce.
    pub max_elements: u64,
    /// Most bytes of one top-level reply.
    pub max_reply_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_depth: MAX_DEPTH,
            max_elements: MAX_ELEMENTS,
            max_reply_bytes: MAX_REPLY_BYTES,
        }
    }
}

/// What was wrong with a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// An aggregate opened with [`Limits::max_depth`] already open.
    TooDeep,
    /// An aggregate announced more than [`Limits::max_elements`] elements.
    TooManyElements,
    /// A bulk string announced more than [`Limits::max_reply_bytes`] bytes.
    BulkTooLong,
    /// The reply grew past [`Limits::max_reply_bytes`].
    ReplyTooLarge,
    /// A byte that starts no RESP value where a value had to start.
    NotResp(u8),
    /// A length that is not `-1` or a decimal number (streamed RESP3 lengths included).
    BadLength,
    /// A bulk string not followed by `\r\n`.
    BadBulkEnd,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooDeep => write!(f, "nested deeper than {MAX_DEPTH} levels"),
            Self::TooManyElements => {
                write!(f, "an aggregate of more than {MAX_ELEMENTS} elements")
            }
            Self::BulkTooLong => write!(f, "a bulk string over {} MiB", MAX_REPLY_BYTES >> 20),
            Self::ReplyTooLarge => write!(f, "a reply over {} MiB", MAX_REPLY_BYTES >> 20),
            Self::NotResp(byte) => write!(f, "byte 0x{byte:02x} where a RESP value starts"),
            Self::BadLength => write!(f, "a malformed length"),
            Self::BadBulkEnd => write!(f, "a bulk string not ended by CRLF"),
        }
    }
}

/// Where a checked stream had to be cut: the bytes before `offset` (of the chunk that
/// broke a bound) are well-formed and within the bounds; the byte at `offset` is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// Index, in the chunk given to [`RespScanner::scan`], of the first refused byte.
    pub offset: usize,
    /// Why.
    pub violation: Violation,
}

/// How a length header frames what follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `$`, `=`, `!`: that many bytes, then `\r\n`.
    Bulk,
    /// `*`, `~`, `>` (`pairs` false), `%` (`pairs`), `|` (`pairs` and `attribute`: the
    /// attribute's pairs and then the value they describe, one element of its parent).
    Aggregate { pairs: bool, attribute: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The first byte of a value.
    Type,
    /// A line value (`+ - : _ , # (`) up to `\r\n`; `cr`: the last byte was `\r`.
    Line { cr: bool },
    /// The length after `$ = ! * ~ > % |`, up to `\r\n`.
    Length {
        framing: Framing,
        value: u64,
        digits: u8,
        negative: bool,
        cr: bool,
    },
    /// Payload bytes of a bulk string still to come.
    Bulk { remaining: u64 },
    /// The `\r` after a bulk string.
    BulkCr,
    /// The `\n` after a bulk string.
    BulkLf,
}

/// An incremental checker of a stream of RESP2/RESP3 replies (the Redis → client
/// direction): feed it the stream in chunks of any size; it says whether every byte so
/// far is part of well-formed replies within its [`Limits`], or where to cut.
#[derive(Debug, Clone)]
pub struct RespScanner {
    limits: Limits,
    state: State,
    /// Elements still to come in each open aggregate, outermost first.
    open: [u32; MAX_DEPTH],
    depth: usize,
    reply_bytes: u64,
    refused: Option<Violation>,
}

impl Default for RespScanner {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl RespScanner {
    /// A scanner at the start of a stream (`max_depth` is capped at [`MAX_DEPTH`], and
    /// `max_elements` so that a map's count fits its counter).
    pub fn new(limits: Limits) -> Self {
        Self {
            limits: Limits {
                max_depth: limits.max_depth.min(MAX_DEPTH),
                max_elements: limits.max_elements.min(u64::from(u32::MAX / 2 - 1)),
                max_reply_bytes: limits.max_reply_bytes,
            },
            state: State::Type,
            open: [0; MAX_DEPTH],
            depth: 0,
            reply_bytes: 0,
            refused: None,
        }
    }

    /// Whether the stream so far ends exactly after a complete reply.
    pub fn at_reply_boundary(&self) -> bool {
        self.refused.is_none() && self.depth == 0 && self.state == State::Type
    }

    /// Checks the next `chunk` of the stream. `Ok`: every byte of it may be forwarded.
    /// `Err`: only `chunk[..offset]` may; the scanner then refuses everything after.
    pub fn scan(&mut self, chunk: &[u8]) -> Result<(), Cut> {
        if let Some(violation) = self.refused {
            return Err(Cut {
                offset: 0,
                violation,
            });
        }
        let mut at = 0;
        while at < chunk.len() {
            let budget = self.limits.max_reply_bytes.saturating_sub(self.reply_bytes);
            let window = usize::try_from(budget).unwrap_or(usize::MAX);
            let end = at + (chunk.len() - at).min(window);
            let step = if end == at {
                Err((0, Violation::ReplyTooLarge))
            } else {
                self.step(&chunk[at..end])
            };
            match step {
                Ok((consumed, reply_complete)) => {
                    self.reply_bytes = if reply_complete {
                        0
                    } else {
                        self.reply_bytes + consumed as u64
                    };
                    at += consumed;
                }
                Err((index, violation)) => {
                    self.refused = Some(violation);
                    return Err(Cut {
                        offset: at + index,
                        violation,
                    });
                }
            }
        }
        Ok(())
    }

    /// Consumes at least one byte of the non-empty `window`: how many, and whether a
    /// top-level reply ended with the last of them; or the index of a refused byte.
    fn step(&mut self, window: &[u8]) -> Result<(usize, bool), (usize, Violation)> {
        match self.state {
            State::Type => self.step_type(window[0]),
            State::Line { cr } => Ok(self.step_line(window, cr)),
            State::Length {
                framing,
                value,
                digits,
                negative,
                cr,
            } => self.step_length(window, framing, value, digits, negative, cr),
            State::Bulk { remaining } => {
                let take = remaining.min(window.len() as u64);
                self.state = match remaining - take {
                    0 => State::BulkCr,
                    remaining => State::Bulk { remaining },
                };
                // `take` ≤ window.len(), so it fits a usize
                Ok((usize::try_from(take).unwrap_or(window.len()), false))
            }
            State::BulkCr if window[0] == b'\r' => {
                self.state = State::BulkLf;
                Ok((1, false))
            }
            State::BulkLf if window[0] == b'\n' => Ok((1, self.complete_value())),
            State::BulkCr | State::BulkLf => Err((0, Violation::BadBulkEnd)),
        }
    }

    /// A reply's first byte: its type.
    fn step_type(&mut self, byte: u8) -> Result<(usize, bool), (usize, Violation)> {
        let length = |framing| State::Length {
            framing,
            value: 0,
            digits: 0,
            negative: false,
            cr: false,
        };
        let aggregate = |pairs, attribute| Framing::Aggregate { pairs, attribute };
        self.state = match byte {
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => State::Line { cr: false },
            b'$' | b'=' | b'!' => length(Framing::Bulk),
            b'*' | b'~' | b'>' | b'%' | b'|' if self.depth >= self.limits.max_depth => {
                return Err((0, Violation::TooDeep));
            }
            b'*' | b'~' | b'>' => length(aggregate(false, false)),
            b'%' => length(aggregate(true, false)),
            b'|' => length(aggregate(true, true)),
            other => return Err((0, Violation::NotResp(other))),
        };
        Ok((1, false))
    }

    /// Inside a line-framed value (simple string, error, integer, …), which was `cr`
    /// right after its last byte so far.
    fn step_line(&mut self, window: &[u8], cr: bool) -> (usize, bool) {
        match window.iter().position(|&b| b == b'\n') {
            Some(newline) => {
                let ended = if newline == 0 {
                    cr
                } else {
                    window[newline - 1] == b'\r'
                };
                if ended {
                    (newline + 1, self.complete_value())
                } else {
                    self.state = State::Line { cr: false };
                    (newline + 1, false)
                }
            }
            None => {
                self.state = State::Line {
                    cr: window.last() == Some(&b'\r'),
                };
                (window.len(), false)
            }
        }
    }

    /// Inside the length of a bulk string or an aggregate.
    fn step_length(
        &mut self,
        window: &[u8],
        framing: Framing,
        mut value: u64,
        mut digits: u8,
        mut negative: bool,
        mut cr: bool,
    ) -> Result<(usize, bool), (usize, Violation)> {
        for (index, &byte) in window.iter().enumerate() {
            if cr {
                if byte != b'\n' {
                    return Err((index, Violation::BadLength));
                }
                return self.end_length(framing, value, negative, index);
            }
            match byte {
                b'\r' if digits > 0 => cr = true,
                b'-' if digits == 0 && !negative => negative = true,
                b'0'..=b'9' => {
                    let next = value
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(u64::from(byte - b'0')));
                    digits = digits.saturating_add(1);
                    match next {
                        Some(next) if digits <= 19 && !(negative && next > 1) => {
                            value = next;
                        }
                        _ => return Err((index, Violation::BadLength)),
                    }
                    match framing {
                        _ if negative => {}
                        Framing::Bulk if value > self.limits.max_reply_bytes => {
                            return Err((index, Violation::BulkTooLong));
                        }
                        Framing::Aggregate { .. } if value > self.limits.max_elements => {
                            return Err((index, Violation::TooManyElements));
                        }
                        _ => {}
                    }
                }
                _ => return Err((index, Violation::BadLength)),
            }
        }
        self.state = State::Length {
            framing,
            value,
            digits,
            negative,
            cr,
        };
        Ok((window.len(), false))
    }

    /// The `\n` at `index` ended a length: what it announced starts.
    fn end_length(
        &mut self,
        framing: Framing,
        value: u64,
        negative: bool,
        index: usize,
    ) -> Result<(usize, bool), (usize, Violation)> {
        let consumed = index + 1;
        if negative {
            // `-1`: a null bulk string or aggregate (the digit check allowed only 1)
            return if value == 1 {
                Ok((consumed, self.complete_value()))
            } else {
                Err((index, Violation::BadLength))
            };
        }
        match framing {
            Framing::Bulk => {
                self.state = if value == 0 {
                    State::BulkCr
                } else {
                    State::Bulk { remaining: value }
                };
                Ok((consumed, false))
            }
            Framing::Aggregate { pairs, attribute } => {
                let elements = value * if pairs { 2 } else { 1 } + u64::from(attribute);
                if elements == 0 {
                    return Ok((consumed, self.complete_value()));
                }
                // max_elements keeps this within u32 (see `new`)
                self.open[self.depth] = u32::try_from(elements).unwrap_or(u32::MAX);
                self.depth += 1;
                self.state = State::Type;
                Ok((consumed, false))
            }
        }
    }

    /// A value ended: counts it into the aggregates it closes. `true` when it was a
    /// whole top-level reply.
    fn complete_value(&mut self) -> bool {
        self.state = State::Type;
        while self.depth > 0 {
            let left = &mut self.open[self.depth - 1];
            *left -= 1;
            if *left > 0 {
                return false;
            }
            self.depth -= 1;
        }
        true
    }
}

/// The relay: a listener on `127.0.0.1:<port>` that connects each accepted connection
/// to the Redis server at its target and checks every reply on the way back. Stops
/// (closing every relayed connection) when dropped.
#[derive(Debug)]
pub struct RespGuard {
    port: u16,
    task: tokio::task::AbortHandle,
}

impl RespGuard {
    /// Starts relaying to `target` (`host:port`, resolved at each connection as `fred`
    /// would); `connect_timeout` bounds each connection to Redis.
    ///
    /// # Errors
    /// [`StoreError::Redis`] when no loopback port can be listened on.
    pub async fn start(target: String, connect_timeout: Duration) -> Result<Self, StoreError> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.map_err(|e| {
            StoreError::Redis(format!(
                "cannot listen on 127.0.0.1 for the Redis reply guard: {e}"
            ))
        })?;
        let port = listener
            .local_addr()
            .map_err(|e| StoreError::Redis(format!("the Redis reply guard has no address: {e}")))?
            .port();
        let relay = Relay {
            target: Arc::from(target),
            connect_timeout,
            refusals: Arc::new(Refusals::default()),
        };
        let task = tokio::spawn(relay.accept_loop(listener)).abort_handle();
        Ok(Self { port, task })
    }

    /// The loopback port `fred` connects to.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for RespGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Relay {
    target: Arc<str>,
    connect_timeout: Duration,
    refusals: Arc<Refusals>,
}

impl Relay {
    /// Accepts until aborted; the relayed connections end with it (their `JoinSet`).
    async fn accept_loop(self, listener: TcpListener) {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((client, _)) => {
                        connections.spawn(self.clone().serve(client));
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "redis reply guard: accept failed; retrying");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    }

    /// Relays one connection until either side closes or a reply is refused.
    async fn serve(self, client: TcpStream) {
        let upstream =
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&*self.target))
                .await
            {
                Ok(Ok(upstream)) => upstream,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "redis reply guard: cannot connect to redis");
                    return;
                }
                Err(_) => {
                    tracing::debug!("redis reply guard: no connection to redis in time");
                    return;
                }
            };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (mut from_client, mut to_client) = client.into_split();
        let (mut from_redis, mut to_redis) = upstream.into_split();
        let requests = tokio::io::copy(&mut from_client, &mut to_redis);
        let replies = async {
            let mut scanner = RespScanner::default();
            let mut buffer = vec![0u8; READ_BUFFER];
            loop {
                let n = from_redis.read(&mut buffer).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>(None);
                }
                match scanner.scan(&buffer[..n]) {
                    Ok(()) => to_client.write_all(&buffer[..n]).await?,
                    Err(cut) => {
                        to_client.write_all(&buffer[..cut.offset]).await?;
                        return Ok(Some(cut.violation));
                    }
                }
            }
        };
        tokio::select! {
            _ = requests => {}
            ended = replies => {
                if let Ok(Some(violation)) = ended {
                    self.refusals.report(violation);
                }
            }
        }
        // both sockets close as their halves drop here
    }
}

/// Rate limit of the error lines about refused replies.
#[derive(Debug, Default)]
struct Refusals {
    /// When the last error line was written, and the refusals since then.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Refusals {
    fn report(&self, violation: Violation) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (last, since) = &mut *state;
        if last.is_some_and(|at| at.elapsed() < REFUSAL_LOG_EVERY) {
            *since += 1;
            tracing::debug!(reason = %violation, "redis reply refused again");
            return;
        }
        let repeated = std::mem::take(since);
        *last = Some(Instant::now());
        drop(state);
        tracing::error!(
            reason = %violation,
            repeated,
            "redis reply refused ({violation}): the connection to Redis was closed; keypool \
             serves from memory and reconnects. Check that redis_url points at a Redis server"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `stream` in `chunks` (sizes, cycled); returns what may be forwarded and the
    /// violation that stopped it.
    fn pass(
        scanner: &mut RespScanner,
        stream: &[u8],
        chunks: &[usize],
    ) -> (Vec<u8>, Option<Violation>) {
        let mut out = Vec::new();
        let mut at = 0;
        let mut sizes = chunks.iter().cycle();
        while at < stream.len() {
            let size = (*sizes.next().unwrap_or(&1)).max(1);
            let chunk = &stream[at..stream.len().min(at.saturating_add(size))];
            match scanner.scan(chunk) {
                Ok(()) => out.extend_from_slice(chunk),
                Err(cut) => {
                    out.extend_from_slice(&chunk[..cut.offset]);
                    return (out, Some(cut.violation));
                }
            }
            at += chunk.len();
        }
        (out, None)
    }

    fn check(stream: &[u8]) -> (Vec<u8>, Option<Violation>) {
        pass(&mut RespScanner::default(), stream, &[usize::MAX])
    }

    #[test]
    fn every_kind_of_reply_keypool_and_redis_send_passes_whole() {
        let stream: &[u8] = b"+OK\r\n-ERR no\r\n:42\r\n:-7\r\n$5\r\nhello\r\n$0\r\n\r\n$-1\r\n*-1\r\n*0\r\n\
            *2\r\n$1\r\n0\r\n*2\r\n$3\r\nk:1\r\n$3\r\nk:2\r\n\
            *3\r\n$7\r\nmessage\r\n$14\r\nkeypool:events\r\n$2\r\n{}\r\n\
            $4\r\na\r\nb\r\n+a\rb\r\n+a\nb\r\n-\r\r\n\
            _\r\n,3.14\r\n#t\r\n(12345678901234567890\r\n=7\r\ntxt:abc\r\n!3\r\nerr\r\n\
            %1\r\n+k\r\n:1\r\n~2\r\n:1\r\n:2\r\n>2\r\n+pubsub\r\n+x\r\n|1\r\n+ttl\r\n:3\r\n+value\r\n";
        let (out, refused) = check(stream);
        assert_eq!(refused, None);
        assert_eq!(out, stream);
        let mut scanner = RespScanner::default();
        scanner.scan(stream).unwrap();
        assert!(scanner.at_reply_boundary());
        scanner.scan(b"*2\r\n:1\r\n").unwrap();
        assert!(!scanner.at_reply_boundary(), "inside an array");
    }

    #[test]
    fn a_million_nested_arrays_are_cut_at_the_first_level_past_the_bound() {
        let stream = b"*1\r\n".repeat(1_000_000);
        let (out, refused) = check(&stream);
        assert_eq!(refused, Some(Violation::TooDeep));
        assert_eq!(
            out.len(),
            MAX_DEPTH * 4,
            "32 headers pass, the 33rd `*` does not"
        );
        // exactly at the bound is fine
        let mut ok = b"*1\r\n".repeat(MAX_DEPTH);
        ok.extend_from_slice(b":1\r\n");
        assert_eq!(check(&ok), (ok.clone(), None));
        // every aggregate kind counts as a level
        let mixed = b"%1\r\n+k\r\n~1\r\n>1\r\n|1\r\n+a\r\n+b\r\n".repeat(20);
        let (out, refused) = check(&mixed);
        assert_eq!(refused, Some(Violation::TooDeep));
        assert!(out.len() < mixed.len());
    }

    #[test]
    fn lengths_and_counts_over_the_bounds_are_cut_at_the_digit_that_passes_them() {
        let limits = Limits {
            max_depth: 4,
            max_elements: 10,
            max_reply_bytes: 100,
        };
        let run = |stream: &[u8]| pass(&mut RespScanner::new(limits), stream, &[3]);
        assert_eq!(run(b"*10\r\n").1, None);
        assert_eq!(
            run(b"*11\r\n"),
            (b"*1".to_vec(), Some(Violation::TooManyElements))
        );
        assert_eq!(run(b"%11\r\n").1, Some(Violation::TooManyElements));
        assert_eq!(
            run(b"$101\r\n"),
            (b"$10".to_vec(), Some(Violation::BulkTooLong))
        );
        assert_eq!(
            run(b"$99999999999999999999999\r\n").1,
            Some(Violation::BulkTooLong)
        );
        // the bytes of one reply: 100 pass, the 101st does not
        let mut big = b"+".to_vec();
        big.extend(std::iter::repeat_n(b'x', 200));
        let (out, refused) = run(&big);
        assert_eq!((out.len(), refused), (100, Some(Violation::ReplyTooLarge)));
        // ... counted per reply: many small replies are fine
        let many = b"+0123456789\r\n".repeat(100);
        assert_eq!(run(&many), (many.clone(), None));
        // a reply of exactly the bound is fine
        let mut exact = b"$94\r\n".to_vec();
        exact.extend(std::iter::repeat_n(b'y', 94));
        exact.extend_from_slice(b"\r\n");
        assert_eq!(exact.len(), 101);
        assert_eq!(run(&exact).1, Some(Violation::ReplyTooLarge));
        let mut exact = b"$93\r\n".to_vec();
        exact.extend(std::iter::repeat_n(b'y', 93));
        exact.extend_from_slice(b"\r\n");
        assert_eq!(run(&exact), (exact.clone(), None));
    }

    #[test]
    fn what_is_no_resp_is_cut_at_its_first_byte() {
        assert_eq!(
            check(b"+OK\r\n\x00\x17\xff"),
            (b"+OK\r\n".to_vec(), Some(Violation::NotResp(0)))
        );
        assert_eq!(check(b"hello\r\n").1, Some(Violation::NotResp(b'h')));
        assert_eq!(check(b"$-2\r\n").1, Some(Violation::BadLength));
        assert_eq!(
            check(b"*00000000000000000000001\r\n").1,
            Some(Violation::BadLength)
        );
        // 20 digits never overflow, whatever the limits
        let unbounded = Limits {
            max_depth: MAX_DEPTH,
            max_elements: u64::MAX,
            max_reply_bytes: u64::MAX,
        };
        let (out, refused) = pass(
            &mut RespScanner::new(unbounded),
            b"$99999999999999999999\r\n",
            &[64],
        );
        assert_eq!((out.len(), refused), (20, Some(Violation::BadLength)));
        assert_eq!(check(b"*-0\r\n").1, Some(Violation::BadLength));
        assert_eq!(
            check(b"$?\r\n").1,
            Some(Violation::BadLength),
            "streamed RESP3"
        );
        assert_eq!(check(b"*\r\n").1, Some(Violation::BadLength));
        assert_eq!(check(b"*1\rx").1, Some(Violation::BadLength));
        assert_eq!(check(b"*1 \r\n").1, Some(Violation::BadLength));
        assert_eq!(
            check(b"$1\r\nab\r\n"),
            (b"$1\r\na".to_vec(), Some(Violation::BadBulkEnd))
        );
        // after a refusal nothing more passes
        let mut scanner = RespScanner::default();
        assert!(scanner.scan(b"\x00").is_err());
        assert_eq!(
            scanner.scan(b"+OK\r\n"),
            Err(Cut {
                offset: 0,
                violation: Violation::NotResp(0)
            })
        );
        assert!(!scanner.at_reply_boundary());
    }

    /// A generated reply: its bytes.
    fn reply(depth: u32) -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let line = (
            proptest::sample::select(b"+-:_,#(".to_vec()),
            proptest::collection::vec(
                any::<u8>().prop_filter("no CR/LF", |b| *b != b'\r' && *b != b'\n'),
                0..12,
            ),
        )
            .prop_map(|(kind, text)| {
                let mut v = vec![kind];
                v.extend(text);
                v.extend_from_slice(b"\r\n");
                v
            });
        let bulk = (
            proptest::sample::select(b"$=!".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(|(kind, data)| {
                let mut v = format!("{}{}\r\n", kind as char, data.len()).into_bytes();
                v.extend(data);
                v.extend_from_slice(b"\r\n");
                v
            });
        let null = proptest::sample::select(vec![b"$-1\r\n".to_vec(), b"*-1\r\n".to_vec()]);
        let leaf = prop_oneof![line, bulk, null];
        leaf.prop_recursive(depth, 64, 4, |inner| {
            (
                proptest::sample::select(b"*~>%|".to_vec()),
                proptest::collection::vec(inner, 0..4),
            )
                .prop_map(|(kind, items)| {
                    // a map or attribute has pairs; an attribute then its value
                    let (count, items) = match kind {
                        b'%' | b'|' => {
                            let pairs = items.len() / 2;
                            let mut items: Vec<Vec<u8>> =
                                items.into_iter().take(pairs * 2).collect();
                            if kind == b'|' {
                                items.push(b":0\r\n".to_vec());
                            }
                            (pairs, items)
                        }
                        _ => (items.len(), items),
                    };
                    let mut v = format!("{}{count}\r\n", kind as char).into_bytes();
                    v.extend(items.concat());
                    v
                })
        })
    }

    proptest::proptest! {
        /// Any chunking of a stream of valid replies (nested at most as deep as the
        /// bound) passes through byte for byte and ends at a reply boundary.
        #[test]
        fn valid_replies_pass_whole_whatever_the_chunking(
            replies in proptest::collection::vec(reply(8), 1..6),
            chunks in proptest::collection::vec(1usize..20, 1..10),
        ) {
            let stream = replies.concat();
            let mut scanner = RespScanner::default();
            let (out, refused) = pass(&mut scanner, &stream, &chunks);
            proptest::prop_assert_eq!(refused, None);
            proptest::prop_assert_eq!(out, stream);
            proptest::prop_assert!(scanner.at_reply_boundary());
        }

        /// A reply deeper than the bound, after valid ones and with valid siblings on the
        /// way down, is cut exactly before the header of its first level past the bound,
        /// whatever the chunking.
        #[test]
        fn a_reply_deeper_than_the_bound_is_cut_before_its_first_byte_past_it(
            before in proptest::collection::vec(reply(4), 0..3),
            levels in proptest::collection::vec(
                (proptest::sample::select(b"*~>%|".to_vec()), proptest::option::of(reply(2))),
                MAX_DEPTH + 1..MAX_DEPTH + 40,
            ),
            chunks in proptest::collection::vec(1usize..64, 1..10),
        ) {
            let mut stream = before.concat();
            let mut cut_at = None;
            for (level, (kind, sibling)) in levels.iter().enumerate() {
                if level == MAX_DEPTH {
                    cut_at = Some(stream.len());
                }
                // one or two elements: an optional sibling first, then the next level
                // a sibling adds at most 3 levels of its own: none near the bound
                let sibling = sibling.as_ref().filter(|_| level + 4 <= MAX_DEPTH);
                let (count, prefix) = match (kind, sibling) {
                    (b'%', Some(s)) => (1, s.clone()),
                    (b'%', None) => (1, b"+key\r\n".to_vec()),
                    (b'|', _) => (1, b"+key\r\n+value\r\n".to_vec()),
                    (_, Some(s)) => (2, s.clone()),
                    (_, None) => (1, Vec::new()),
                };
                stream.extend(format!("{}{count}\r\n", *kind as char).into_bytes());
                stream.extend(prefix);
            }
            stream.extend_from_slice(b":1\r\n");
            let cut_at = cut_at.unwrap_or(stream.len());
            let (out, refused) = pass(&mut RespScanner::default(), &stream, &chunks);
            proptest::prop_assert_eq!(refused, Some(Violation::TooDeep));
            proptest::prop_assert_eq!(out.len(), cut_at);
            proptest::prop_assert_eq!(&out[..], &stream[..cut_at]);
        }
    }
}
