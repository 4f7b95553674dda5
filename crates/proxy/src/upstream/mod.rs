//! The upstream HTTP clients and the way their connections leave the host
//! ([`Egress`]): directly, or through an outbound proxy (HTTP `CONNECT` or SOCKS5) named
//! by `HTTPS_PROXY`/`HTTP_PROXY`/`ALL_PROXY` (with `NO_PROXY`) or by an account's own
//! `proxy_url`.
//!
//! - The request path's attempts use keypool's own HTTP/1.1 client (`conn`: pooled
//!   keep-alive connections per worker thread, plain TCP or rustls, driven by the
//!   request's own task; `h1`: the wire format), the upstream side of an L7 proxy as
//!   nginx and HAProxy do it (issue 22).
//! - Everything else keypool calls (OAuth token refreshes, alert webhooks) uses a
//!   pooled hyper client ([`build_client_with`]: HTTP/1.1 and HTTP/2 by ALPN).
//!
//! Both connect through the same [`EgressConnector`]: an account's token refresh goes
//! through the same proxy as its API calls ([`Egress::for_account`]).

mod conn;

pub(crate) use conn::{Answer, SendError, Upstream, UpstreamBody};
pub use conn::{IDLE_TIMEOUT, MAX_IDLE_PER_ORIGIN};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::{SocksV5, Tunnel};
use hyper_util::client::proxy::matcher::{Intercept, Matcher};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use keypool_store::config::Account;
use tokio::net::TcpStream;

/// The client type every attempt uses.
pub type UpstreamClient = Client<HttpsConnector<EgressConnector>, Full<Bytes>>;

/// The environment variables [`Egress::from_env`] reads (upper and lower case).
pub const PROXY_ENV: [&str; 8] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// The error of a connection attempt.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Builds the shared upstream client with the process's proxy environment
/// ([`Egress::from_env`]): connection pooling, TCP_NODELAY, HTTPS with the webpki
/// roots (ring provider) or plain HTTP, HTTP/2 when the server offers it by ALPN.
pub fn build_client() -> UpstreamClient {
    build_client_with(Egress::from_env())
}

/// The TCP connector of every upstream client: TCP_NODELAY, a 10 s connect timeout,
/// through `egress`.
pub(crate) fn egress_connector(egress: Egress) -> EgressConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    EgressConnector {
        direct: http,
        egress: Arc::new(egress),
    }
}

/// [`build_client`] whose connections leave through `egress`.
pub fn build_client_with(egress: Egress) -> UpstreamClient {
    let connector = egress_connector(egress);
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
        .wrap_connector(connector);
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(IDLE_TIMEOUT)
        .build(https)
}

/// Where upstream connections go first.
#[derive(Debug, Clone)]
pub enum Egress {
    /// Straight to the upstream.
    Direct,
    /// Through the proxy the matcher names for each destination: the process's
    /// `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY` (upper or lower case,
    /// read as curl reads them). Loopback destinations always go direct.
    Environment(Arc<Matcher>),
    /// Through one proxy for every destination (an account's `proxy_url`; `NO_PROXY`
    /// does not apply to it).
    Proxy(Arc<Matcher>),
}

impl Egress {
    /// The process's proxy environment, [`Egress::Direct`] when none is set.
    pub fn from_env() -> Self {
        // NO_PROXY alone routes nothing through a proxy
        if PROXY_ENV[..6]
            .iter()
            .any(|n| std::env::var_os(n).is_some_and(|v| !v.is_empty()))
        {
            Self::Environment(Arc::new(Matcher::from_env()))
        } else {
            Self::Direct
        }
    }

    /// Through `proxy_url` (`http://`, `socks5://`, `socks5h://`, with `user:password@`
    /// when the proxy asks for it); the config validation checked its form.
    pub fn via(proxy_url: &str) -> Self {
        Self::Proxy(Arc::new(
            Matcher::builder().all(proxy_url.to_owned()).build(),
        ))
    }

    /// An account's egress: its own `proxy_url`, else the process's environment
    /// (`environment`, read once at start).
    pub fn for_account(account: &Account, environment: &Egress) -> Self {
        match account.proxy_url() {
            Some(url) => Self::via(url.expose()),
            None => environment.clone(),
        }
    }

    /// The proxy for a connection to `dst`, if any.
    fn intercept(&self, dst: &Uri) -> Option<Intercept> {
        match self {
            Self::Direct => None,
            Self::Environment(_) if is_loopback(dst) => None,
            Self::Environment(matcher) | Self::Proxy(matcher) => matcher.intercept(dst),
        }
    }
}

/// Whether `dst` names a loopback host (`localhost`, 127.0.0.0/8, `::1`).
fn is_loopback(dst: &Uri) -> bool {
    let host = dst.host().unwrap_or("");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The TCP connector under TLS: connects to the destination, or to the proxy and
/// through it (HTTP `CONNECT` for an `http://` proxy, for `http://` and `https://`
/// destinations alike; the SOCKS5 handshake for `socks5://`, where keypool resolves
/// the name, and `socks5h://`, where the proxy does).
#[derive(Debug, Clone)]
pub struct EgressConnector {
    direct: HttpConnector,
    egress: Arc<Egress>,
}

impl tower_service::Service<Uri> for EgressConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // HttpConnector is always ready
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let direct = self.direct.clone();
        let Some(proxy) = self.egress.intercept(&dst) else {
            let mut direct = direct;
            return Box::pin(async move { direct.call(dst).await.map_err(BoxError::from) });
        };
        let uri = proxy.uri().clone();
        match uri.scheme_str() {
            Some(scheme @ ("socks5" | "socks5h")) => {
                let mut socks = SocksV5::new(uri.clone(), direct).local_dns(scheme == "socks5");
                if let Some((user, password)) = proxy.raw_auth() {
                    socks = socks.with_auth(user.to_owned(), password.to_owned());
                }
                Box::pin(async move { socks.call(dst).await.map_err(BoxError::from) })
            }
            Some("http") => {
                let mut tunnel = Tunnel::new(uri, direct);
                if let Some(auth) = proxy.basic_auth() {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                Box::pin(async move { tunnel.call(dst).await.map_err(BoxError::from) })
            }
            _ => Box::pin(async move {
                Err(BoxError::from(
                    "unsupported proxy scheme (use http://, socks5:// or socks5h://)",
                ))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_never_proxies_loopback_and_an_account_proxy_always_applies() {
        let env = Egress::Environment(Arc::new(
            Matcher::builder()
                .all("http://proxy.example:3128".to_owned())
                .no("internal.example".to_owned())
                .build(),
        ));
        let api: Uri = "https://api.anthropic.com/v1/messages".parse().unwrap();
        let local: Uri = "http://127.0.0.1:9000/v1/messages".parse().unwrap();
        let internal: Uri = "https://llm.internal.example/".parse().unwrap();
        assert_eq!(
            env.intercept(&api).map(|p| p.uri().to_string()),
            Some("http://proxy.example:3128/".to_owned())
        );
        assert!(env.intercept(&local).is_none());
        assert!(env.intercept(&"http://[::1]:1/".parse().unwrap()).is_none());
        assert!(env.intercept(&internal).is_none());
        let account = Egress::via("socks5h://u:p@127.0.0.1:1080");
        let through = account.intercept(&local).unwrap();
        assert_eq!(through.uri().scheme_str(), Some("socks5h"));
        assert_eq!(through.raw_auth(), Some(("u", "p")));
        assert!(Egress::Direct.intercept(&api).is_none());
    }
}
