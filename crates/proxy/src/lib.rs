//! The keypool server: the HTTP service that composes the library crates into the
//! request path of SPEC 3 and 4.
//!
//! A request arrives; [`App::handle`] routes it ([`route`]), enforces the body limit,
//! resolves the org and URL config and validates the LB key (`keypool-store`), parses
//! the body (`keypool-providers`), captures the pool's snapshot and plans the attempts
//! (`keypool-selector` over the health books of `keypool-cooldown`, read through
//! [`availability::HealthAvailability`]), then walks the plan: one attempt per account,
//! each built by the provider adapter and sent with the worker's pooled upstream client,
//! streams held until their commit point (`keypool-sse` + the providers' commit gate),
//! hedge/race partners run side by side, every outcome credited to the account that
//! produced it. Whatever goes wrong ends in [`reject::Reject::respond`]: an Anthropic-shaped
//! error, never a panic or a bare HTTP-library error.
//!
//! ```no_run
//! use keypool_proxy::{App, run};
//! use keypool_store::{Store, config::Config};
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::load("keypool.toml".as_ref())?;
//! let store = Store::open(config).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let server = tokio::spawn(run(listener, App::new(store), async { let _ = stopped.await; }));
//! // … send requests …
//! let _ = stop.send(());
//! server.await??;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - [`server`]: [`run`], the accept loops ([`Listeners`]: public, admin), graceful
//!   drain; [`run_workers`], the same on one single-threaded runtime per worker thread.
//! - `balance`: which worker thread serves a connection: packed onto as few as the
//!   load needs, spread from a saturated or starved one; moved between requests.
//! - [`connection`]: one connection: TLS, HTTP/1.1 or HTTP/2 from its first bytes
//!   (bounded by the header read timeout), [`connection::ClientInfo`]; plain-TCP
//!   HTTP/1.1 goes to `h1_server`, TLS and HTTP/2 to hyper.
//! - `h1_server`: keypool's own HTTP/1.1 server (issue 22): one task per connection,
//!   the request path awaited in place, the request body read from the socket as the
//!   path reads it, the answer written with one vectored write.
//! - `h1`: the HTTP/1.1 wire format without I/O, both roles (request heads parsed with
//!   hyper's rules, response heads written; upstream request heads written, response
//!   heads parsed, RFC 9112 framing, the chunked decoder).
//! - [`tls`]: [`TlsCertificates`], the listener's certificate, reloadable.
//! - `app`: [`App`], steps 1–4 of SPEC 3 (limits, resolution, key, body), the fixed
//!   routes (`HEAD`, `/healthz`, `/readyz`, `/metrics`).
//! - [`route`]: path matching ([`route::match_path`]).
//! - `openai`: the OpenAI-format front (issue 23): chat completions translated to the
//!   Messages path before planning, `GET …/v1/models`, OpenAI-shaped errors.
//! - `failover`: steps 5–8 and SPEC 4: plan (with the session's bound account
//!   preferred), the attempt walker with hedge/race, per-account concurrency slots and
//!   the queue for them, crediting outcomes, the generic 503 and the 429/402
//!   pass-through.
//! - [`affinity`]: the session key of a request (headers, `metadata.user_id`) for
//!   session affinity; the bindings live in the store.
//! - `ceiling`: the attempt ceiling and request-error rule of SPEC 3.7 (pure).
//! - `attempt`: one upstream attempt up to its commit point (the streaming hold).
//! - [`body_budget`]: [`body_budget::BodyBudget`], the body bytes the whole process
//!   holds (`max_body_bytes_in_flight`).
//! - [`body`]: [`body::ProxyBody`], including the committed stream that forwards frames
//!   unchanged (or translated, for an OpenAI client on a Messages upstream) and ends
//!   with one generic error frame when the upstream fails.
//! - [`availability`]: the selector's `Availability` over the store's books.
//! - [`headers`]: the response header allowlist, `x-request-id`, legacy headers.
//! - [`reject`]: [`reject::Reject`] and [`reject::Reject::respond`], the one function
//!   that turns a rejection into a response.
//! - [`metrics`]: the Prometheus registry of SPEC 10.
//! - [`upstream`]: the attempts' own pooled HTTP/1.1 client (plain TCP or rustls, no
//!   connection task; `upstream::conn`), the hyper client of OAuth refreshes and alert
//!   webhooks (HTTP/1.1 + HTTP/2), and the egress (direct, `HTTPS_PROXY`, `proxy_url`).
//! - [`signals`] (Unix): `SIGTERM`/`SIGINT` shutdown, `SIGHUP` reload.
//! - `admin`: the admin API and the `/admin/ui` status page (`docs/ADMIN.md`); off
//!   (404) without `admin.token`.
//! - `alerts`: the alert sender of SPEC 15: the store's alert queue drained into
//!   one task per webhook (JSON or Slack body, per-attempt timeout, retries with
//!   backoff), off the request path.
//! - [`log`]: the one log line per request ([`log::JSON_FIELDS`]: its array fields).
//! - [`error`]: the crate error, [`ProxyError`].

mod admin;
pub mod affinity;
mod alerts;
mod app;
mod attempt;
pub mod availability;
mod balance;
pub mod body;
pub mod body_budget;
mod ceiling;
pub mod connection;
mod context;
pub mod error;
pub mod explain;
mod failover;
mod h1;
mod h1_server;
pub mod headers;
mod limits;
pub mod log;
pub mod metrics;
pub mod oauth;
mod openai;
pub mod reject;
pub mod route;
pub mod server;
#[cfg(unix)]
pub mod signals;
mod spares;
mod timing;
pub mod tls;
pub mod upstream;
mod watchdog;

pub use app::App;
pub use body::ProxyBody;
pub use error::ProxyError;
pub use server::{Listeners, run, run_workers};
pub use tls::TlsCertificates;
