//! [`RequestContext`]: one request's own state from its arrival to its answer, owned by
//! the handler and passed down by `&mut` (instead of out-parameters threaded through
//! every step): its id and start, the metric labels once resolved, the log line's
//! facts, and the status it was answered with.
//!
//! Dropping the context counts the request in `keypool_requests_total` (with the
//! status of its answer, or `499` when the client went away first; a request to one
//! of keypool's own routes in `keypool_internal_requests_total`) and writes its log
//! line, unless a committed stream took the log line to write it when the stream ends.

use std::sync::Arc;
use std::time::Instant;

use std::borrow::Cow;

use keypool_core::{AccountId, UnixMs};
use keypool_ledger::AttemptRecord;
use keypool_providers::Endpoint;
use keypool_store::now_ms;
use keypool_store::resolve::{Caller, Route};

use crate::App;
use crate::log::RequestLog;
use crate::metrics::{InternalRoute, Metrics};

/// The status `keypool_requests_total` counts for a request whose client went away
/// before keypool wrote the answer's head (nginx's "client closed request").
pub(crate) const CLIENT_CLOSED_REQUEST: u16 = 499;

/// One request's context (see the module docs).
pub(crate) struct RequestContext<'a> {
    metrics: &'a Metrics,
    /// The request id (`x-request-id`, `request_id` of keypool's error bodies).
    pub id: Arc<str>,
    /// When the request arrived.
    pub started: Instant,
    /// `org` and `url` labels of the request's metrics: `-` until resolved.
    labels: (Arc<str>, Arc<str>),
    status: u16,
    log: Option<RequestLog>,
    /// Set for a request to one of keypool's own routes: counted apart.
    internal: Option<InternalRoute>,
}

impl<'a> RequestContext<'a> {
    /// The context of a request that just arrived, counted in `metrics` when dropped;
    /// `unresolved` is the label of an org or URL not (yet) resolved.
    pub(crate) fn new(metrics: &'a Metrics, id: Arc<str>, unresolved: &Arc<str>) -> Self {
        Self {
            metrics,
            id,
            started: keypool_store::clock::instant(),
            labels: (unresolved.clone(), unresolved.clone()),
            status: CLIENT_CLOSED_REQUEST,
            log: None,
            internal: None,
        }
    }

    /// The request went to one of keypool's own routes (health, metrics, admin, a
    /// `HEAD`, an unknown path): it is counted in `keypool_internal_requests_total`
    /// instead of `keypool_requests_total`.
    pub(crate) fn internal(&mut self, route: InternalRoute) {
        self.internal = Some(route);
    }

    /// A Messages request: it gets a log line.
    pub(crate) fn open_log(&mut self) {
        self.log = Some(RequestLog::new(self.id.clone(), self.started));
    }

    /// The org and URL config were resolved: they become the metric labels and go to
    /// the log line with the route's strategy and the endpoint.
    pub(crate) fn resolved(&mut self, route: &Route, endpoint: Endpoint) {
        self.labels = (
            route.org().slug_shared().clone(),
            route.url().custom_url_shared().clone(),
        );
        if let Some(log) = self.log.as_mut() {
            log.org = Some(self.labels.0.clone());
            log.url = Some(self.labels.1.clone());
            log.strategy = Some(route.strategy());
            log.count_tokens = endpoint == Endpoint::CountTokens;
        }
    }

    /// The LB key was valid: the caller goes to the log line (by key id only), and the
    /// request's usage record will go to `app`'s ledger.
    pub(crate) fn authenticated(&mut self, caller: Caller, app: &App) {
        if let Some(log) = self.log.as_mut() {
            log.caller = Some(caller);
            log.ledger = Some(app.clone());
        }
    }

    /// The log line's facts, while the context still holds them.
    pub(crate) fn log_mut(&mut self) -> Option<&mut RequestLog> {
        self.log.as_mut()
    }

    /// One attempt of the request on `account`: its upstream status, what it came to
    /// (`ok`, a failure's trigger, `aborted`, …), its class when it failed, and when it
    /// started (unix ms; its time is counted up to now).
    pub(crate) fn attempt(
        &mut self,
        account: &AccountId,
        status: Option<u16>,
        outcome: &'static str,
        class: Option<&'static str>,
        started_at: UnixMs,
    ) {
        if self.log.is_some() {
            self.attempt_until(account, status, outcome, class, (started_at, now_ms()));
        }
    }

    /// [`RequestContext::attempt`] for an attempt that ran from `span.0` to `span.1`
    /// (unix ms), for a caller that read the clock already.
    pub(crate) fn attempt_until(
        &mut self,
        account: &AccountId,
        status: Option<u16>,
        outcome: &'static str,
        class: Option<&'static str>,
        span: (UnixMs, UnixMs),
    ) {
        if let Some(log) = self.log.as_mut() {
            log.attempts.push(AttemptRecord {
                account: account.clone(),
                status,
                outcome: Cow::Borrowed(outcome),
                class: class.map(Cow::Borrowed),
                ms: span.1.saturating_sub(span.0),
            });
        }
    }

    /// Hands the log line to a committed stream, which writes it when it ends.
    pub(crate) fn take_log(&mut self) -> Option<RequestLog> {
        self.log.take()
    }

    /// The request was answered with `status` (also the log line's, when it is still
    /// here: a committed stream's log line already has its status).
    pub(crate) fn answered(&mut self, status: u16) {
        self.status = status;
        if let Some(log) = self.log.as_mut() {
            log.status = status;
        }
    }
}

impl Drop for RequestContext<'_> {
    fn drop(&mut self) {
        match self.internal {
            Some(route) => self.metrics.internal_request(route, self.status),
            None => self
                .metrics
                .request(&self.labels.0, &self.labels.1, self.status),
        }
        // The log line (if the context still holds it) is written as it drops, after.
    }
}
