//! One accepted connection, from its first byte to its close: TLS (on the public
//! listener, when configured), the choice of HTTP/1.1 or HTTP/2 from the first bytes,
//! and the server that speaks it: keypool's own HTTP/1.1 server ([`crate::h1_server`])
//! for plain-TCP HTTP/1.1, hyper for TLS and HTTP/2; with the facts the request path
//! reads about the connection ([`ClientInfo`]).
//!
//! **The first bytes are bounded like a request head.** The HTTP/1.1 servers bound the
//! time to a complete head (`header_read_timeout`), but hyper's HTTP/2 server and
//! hyper-util's HTTP/1-or-h2c detection wait for a client's first bytes without any
//! timeout: a client that connects and sends nothing would hold its connection (and
//! its file descriptor) forever. So this module does the detection itself: the TLS
//! handshake, if any, and the first bytes (up to the 24 of the HTTP/2 connection
//! preface, or until they cannot be that preface) must arrive within
//! `header_read_timeout` of the accept, else the connection is closed. The bytes read
//! are then replayed to the server (hyper's through [`Rewind`]). HTTP/1.1 keeps its
//! server's head timeout for every request after that; an HTTP/2 request's body is
//! bounded by the request path's body timeouts and budgets exactly as an HTTP/1.1 body
//! is.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::App;
use crate::balance::OpenConnection;

/// The HTTP/2 connection preface every HTTP/2 client sends first (RFC 9113, 3.4).
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `server.listen`: the Messages routes (and, without `admin_listen`, everything).
    Public,
    /// `server.admin_listen`: `/admin/…`, `/metrics`, `/healthz`, `/readyz`.
    Admin,
}

/// The HTTP version a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 (or 1.0).
    Http1,
    /// HTTP/2: `h2` by ALPN over TLS, or `h2c` with prior knowledge on plain TCP.
    Http2,
}

/// What the request path knows about the connection of a request: put into every
/// request's extensions by hyper's connections, handed to the request path directly by
/// keypool's own HTTP/1.1 server (absent for a request handed to [`App::handle`]
/// without it, which then counts as the public side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientInfo {
    /// The client's address (the load balancer's, behind one).
    pub peer: SocketAddr,
    /// The listener.
    pub side: Side,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// Its HTTP version.
    pub protocol: Protocol,
}

/// The protocol settings every connection of a listener shares.
#[derive(Clone)]
pub(crate) struct Protocols {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    /// Bound on the TLS handshake plus the first bytes (`header_read_timeout`).
    first_bytes: Duration,
}

impl Protocols {
    pub(crate) fn new(header_read_timeout: Duration) -> Self {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            // a peer that stops answering pings is gone: its streams end
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .keep_alive_timeout(Duration::from_secs(20))
            .max_header_list_size(256 * 1024);
        Self {
            http1,
            http2,
            first_bytes: header_read_timeout,
        }
    }
}

/// How the graceful drain reaches a connection: hyper's connections through the
/// `watcher`, keypool's own HTTP/1.1 ones ([`crate::h1_server`]) through `drain`
/// (`true` once the server drains; the server waits until every receiver is gone).
pub(crate) struct DrainSignals {
    pub watcher: Watcher,
    pub drain: tokio::sync::watch::Receiver<bool>,
}

/// Serves one accepted connection to its end (errors are logged at debug level: a
/// client that goes away is not keypool's problem). `drain` lets the graceful drain
/// end it; a connection still in its first bytes when the drain starts closes at its
/// first-bytes deadline at the latest.
///
/// A plain-TCP HTTP/1.1 connection is served by keypool's own server
/// ([`crate::h1_server`]), and only such a connection may move to another worker
/// thread between requests (`open`, [`crate::balance`]); TLS and HTTP/2 connections
/// are served by hyper, on the worker that took them, to their end.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    side: Side,
    tls: Option<tokio_rustls::TlsAcceptor>,
    protocols: &Protocols,
    app: App,
    drain: DrainSignals,
    open: Option<OpenConnection>,
) {
    let _ = stream.set_nodelay(true);
    let deadline = tokio::time::Instant::now() + protocols.first_bytes;
    let accepted = Accepted {
        peer,
        side,
        deadline,
    };
    let DrainSignals { watcher, drain } = drain;
    let Some(acceptor) = tls else {
        return plain(stream, accepted, protocols, app, watcher, drain, open).await;
    };
    drop(drain);
    let _counted = open;
    // Boxed, once per TLS connection: inline, the handshake's result (~1.2 KB) sat in
    // front of the plain connection's future in this future's layout, and made every
    // connection's task that much larger (issue 22).
    Box::pin(secured(stream, acceptor, accepted, protocols, app, watcher)).await;
}

/// A TLS connection: its handshake by the deadline, then HTTP over it.
async fn secured(
    stream: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    accepted: Accepted,
    protocols: &Protocols,
    app: App,
    watcher: Watcher,
) {
    let peer = accepted.peer;
    match tokio::time::timeout_at(accepted.deadline, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => handshaken(stream, true, accepted, protocols, app, watcher).await,
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "no TLS handshake within header_read_timeout; closed"),
    }
}

/// A plain-TCP connection: its first bytes by the deadline, then keypool's HTTP/1.1
/// server, or hyper's HTTP/2 (h2c) one.
async fn plain(
    mut stream: TcpStream,
    accepted: Accepted,
    protocols: &Protocols,
    app: App,
    watcher: Watcher,
    drain: tokio::sync::watch::Receiver<bool>,
    open: Option<OpenConnection>,
) {
    // A connection moved from another worker between two requests is HTTP/1.1, and its
    // next request head is due: keypool's server waits for it (and for the drain).
    let first = match open.as_ref().is_some_and(OpenConnection::moved) {
        true => Some((Vec::new(), Protocol::Http1)),
        false => first_bytes(&mut stream, accepted.deadline, accepted.peer).await,
    };
    let Some((prefix, protocol)) = first else {
        return;
    };
    let info = ClientInfo {
        peer: accepted.peer,
        side: accepted.side,
        tls: false,
        protocol,
    };
    match protocol {
        Protocol::Http1 => {
            drop(watcher);
            crate::h1_server::serve(
                stream,
                prefix,
                info,
                protocols.first_bytes,
                app,
                drain,
                open,
            )
            .await;
        }
        Protocol::Http2 => {
            drop(drain);
            let _counted = open;
            speak(Rewind::new(prefix, stream), info, protocols, app, watcher).await;
        }
    }
}

/// An accepted connection: who, on which listener, and when its first bytes are due.
#[derive(Clone, Copy)]
struct Accepted {
    peer: SocketAddr,
    side: Side,
    deadline: tokio::time::Instant,
}

/// A connection ready for HTTP (plain, or after its TLS handshake): its first bytes by
/// the deadline, then the hyper connection of the protocol they show.
async fn handshaken<IO>(
    mut io: IO,
    tls: bool,
    accepted: Accepted,
    protocols: &Protocols,
    app: App,
    watcher: Watcher,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Accepted {
        peer,
        side,
        deadline,
    } = accepted;
    let Some((prefix, protocol)) = first_bytes(&mut io, deadline, peer).await else {
        return;
    };
    let info = ClientInfo {
        peer,
        side,
        tls,
        protocol,
    };
    speak(Rewind::new(prefix, io), info, protocols, app, watcher).await;
}

/// Reads the first bytes by `deadline`: `None` (the connection is dropped) when the
/// client sent nothing in time or closed.
async fn first_bytes<IO: AsyncRead + Unpin>(
    io: &mut IO,
    deadline: tokio::time::Instant,
    peer: SocketAddr,
) -> Option<(Vec<u8>, Protocol)> {
    match tokio::time::timeout_at(deadline, sniff(io)).await {
        Ok(Ok(Some(found))) => Some(found),
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "connection failed before its first request");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "nothing received within header_read_timeout; closed");
            None
        }
    }
}

/// Reads until the bytes so far are the whole HTTP/2 preface or cannot become it:
/// those bytes and the protocol, or `None` when the client closed first.
async fn sniff<IO: AsyncRead + Unpin>(io: &mut IO) -> io::Result<Option<(Vec<u8>, Protocol)>> {
    let mut seen = Vec::with_capacity(H2_PREFACE.len());
    let mut chunk = [0u8; H2_PREFACE.len()];
    loop {
        let want = H2_PREFACE.len() - seen.len();
        let n = io.read(&mut chunk[..want]).await?;
        if n == 0 {
            return Ok(None);
        }
        seen.extend_from_slice(&chunk[..n]);
        if !H2_PREFACE.starts_with(&seen) {
            return Ok(Some((seen, Protocol::Http1)));
        }
        if seen.len() == H2_PREFACE.len() {
            return Ok(Some((seen, Protocol::Http2)));
        }
    }
}

/// Runs the hyper connection of `info.protocol` over `io`.
async fn speak<IO>(io: IO, info: ClientInfo, protocols: &Protocols, app: App, watcher: Watcher)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(info);
        let app = app.clone();
        async move { Ok::<_, std::convert::Infallible>(app.handle(request).await) }
    });
    let io = TokioIo::new(io);
    let result = match info.protocol {
        Protocol::Http1 => {
            watcher
                .watch(protocols.http1.serve_connection(io, service))
                .await
        }
        Protocol::Http2 => {
            watcher
                .watch(protocols.http2.serve_connection(io, service))
                .await
        }
    };
    if let Err(e) = result {
        tracing::debug!(peer = %info.peer, error = %e, "connection ended with an error");
    }
}

/// An I/O object whose first reads return `prefix` (the bytes the protocol detection
/// already took), then the inner object's.
#[derive(Debug)]
pub struct Rewind<T> {
    prefix: Vec<u8>,
    read: usize,
    inner: T,
}

impl<T> Rewind<T> {
    /// `inner`, with `prefix` read first.
    pub fn new(prefix: Vec<u8>, inner: T) -> Self {
        Self {
            prefix,
            read: 0,
            inner,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read < this.prefix.len() {
            let rest = &this.prefix[this.read..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.read += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Whether `side` serves `route`: with an admin listener, `/admin/…` and `/metrics`
/// only there and the Messages routes only on the public one; health routes and
/// `HEAD` on both. Without one (`split` false), the public listener serves everything.
pub(crate) fn serves(side: Side, split: bool, route: &crate::route::RouteMatch<'_>) -> bool {
    use crate::route::RouteMatch;
    match (side, route) {
        (_, RouteMatch::Health | RouteMatch::Ready) => true,
        (Side::Public, RouteMatch::Admin(_) | RouteMatch::Metrics) => !split,
        (Side::Admin, RouteMatch::Admin(_) | RouteMatch::Metrics) => true,
        (Side::Admin, _) => false,
        (Side::Public, _) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::match_path;

    #[tokio::test]
    async fn sniff_tells_http2_from_http1_and_keeps_the_bytes() {
        let mut h2: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00";
        let (bytes, p) = sniff(&mut h2).await.unwrap().unwrap();
        assert_eq!((bytes.as_slice(), p), (&H2_PREFACE[..], Protocol::Http2));
        // what one read brought (at most the preface's length) is kept for hyper
        let mut h1: &[u8] = b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n";
        let (bytes, p) = sniff(&mut h1).await.unwrap().unwrap();
        assert_eq!(
            (bytes.as_slice(), p),
            (&b"POST /v1/messages HTTP/1"[..], Protocol::Http1)
        );
        assert_eq!(h1, b".1\r\nhost: x\r\n");
        let mut closed: &[u8] = b"PRI *";
        assert!(sniff(&mut closed).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn rewind_replays_the_prefix_first() {
        let mut io = Rewind::new(b"GE".to_vec(), &b"T /"[..]);
        let mut all = Vec::new();
        io.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"GET /");
    }

    #[test]
    fn the_admin_listener_takes_admin_and_metrics() {
        let admin = match_path("/admin/accounts");
        let metrics = match_path("/metrics");
        let api = match_path("/acme/team/v1/messages");
        let ready = match_path("/readyz");
        assert!(serves(Side::Public, false, &admin));
        assert!(serves(Side::Public, false, &metrics));
        assert!(!serves(Side::Public, true, &admin));
        assert!(!serves(Side::Public, true, &metrics));
        assert!(serves(Side::Public, true, &api));
        assert!(serves(Side::Admin, true, &admin));
        assert!(serves(Side::Admin, true, &metrics));
        assert!(!serves(Side::Admin, true, &api));
        assert!(serves(Side::Admin, true, &ready));
        assert!(serves(Side::Public, true, &ready));
    }
}
