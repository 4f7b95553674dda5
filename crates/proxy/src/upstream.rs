//! The upstream HTTP client: one pooled hyper client for every account, HTTP/1.1 and
//! HTTP/2 (ALPN) over rustls for real providers, plain HTTP for loopback and tests.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// The client type every attempt uses.
pub type UpstreamClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// How long an idle pooled upstream connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Builds the shared upstream client: connection pooling, TCP_NODELAY, HTTPS with the
/// webpki roots (ring provider) or plain HTTP, HTTP/2 when the server offers it by ALPN.
pub fn build_client() -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    // ring, named explicitly: rustls' process default would be ambiguous (and panic) if
    // another crate of the build enabled aws-lc-rs too.
    let builder = match HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
    {
        Ok(builder) => builder,
        Err(e) => {
            tracing::error!(error = %e, "ring TLS provider unusable; using the process default");
            HttpsConnectorBuilder::new().with_webpki_roots()
        }
    };
    let https = builder
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(https)
}
