//! The place of the admin API and status page (`/admin/…`, SPEC 10; issue 8).
//!
//! Until it is built every `/admin` path answers the same Anthropic-shaped `404` as
//! any unknown path. The router already sends `/admin` and everything below it here,
//! with the store and metrics at hand through [`App`](crate::App).

use bytes::Bytes;
use http::Response;
use http::request::Parts;

use crate::App;
use crate::body::ProxyBody;
use crate::rescue::{Reject, rescue};

/// Answers an `/admin…` request; `rest` is the path after `/admin`.
pub(crate) async fn handle(
    _app: &App,
    _parts: &Parts,
    _body: Bytes,
    _rest: &str,
    request_id: &str,
) -> Response<ProxyBody> {
    rescue(&Reject::unknown_path(), request_id)
}
