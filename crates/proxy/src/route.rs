//! Route matching (SPEC 2): the path alone decides the route; the query string never
//! takes part (it is forwarded upstream unchanged).

use keypool_providers::Endpoint;

/// What a request path addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteMatch<'a> {
    /// `GET /healthz`.
    Health,
    /// `GET /readyz`.
    Ready,
    /// `GET /metrics`.
    Metrics,
    /// `/admin` and everything below it (the admin API, issue 8). Holds the path after
    /// `/admin` (empty or starting with `/`).
    Admin(&'a str),
    /// An API route (Messages, or the OpenAI-format chat completions and models),
    /// org-scoped (`org` is `Some`) or legacy (`None`).
    Api {
        /// The org slug of `/{org}/{url}/…`; `None` for the legacy `/{url}/…`.
        org: Option<&'a str>,
        /// The custom URL.
        url: &'a str,
        /// `v1/messages`, `v1/messages/count_tokens`, `v1/chat/completions` or
        /// `v1/models`.
        endpoint: Endpoint,
    },
    /// Anything else.
    NotFound,
}

impl RouteMatch<'_> {
    /// Whether this is a legacy (`/{url}/…`, no org) Messages route.
    pub fn is_legacy(&self) -> bool {
        matches!(self, RouteMatch::Api { org: None, .. })
    }
}

/// Matches a request path (without its query string, as `Uri::path` gives it).
///
/// ```
/// use keypool_proxy::route::{match_path, RouteMatch};
/// use keypool_providers::Endpoint;
/// assert_eq!(
///     match_path("/acme/team/v1/messages"),
///     RouteMatch::Api { org: Some("acme"), url: "team", endpoint: Endpoint::Messages }
/// );
/// assert_eq!(
///     match_path("/team/v1/messages/count_tokens"),
///     RouteMatch::Api { org: None, url: "team", endpoint: Endpoint::CountTokens }
/// );
/// assert_eq!(match_path("/api/hello"), RouteMatch::NotFound);
/// ```
pub fn match_path(path: &str) -> RouteMatch<'_> {
    match path {
        "/healthz" => return RouteMatch::Health,
        "/readyz" => return RouteMatch::Ready,
        "/metrics" => return RouteMatch::Metrics,
        _ => {}
    }
    if let Some(rest) = path.strip_prefix("/admin")
        && (rest.is_empty() || rest.starts_with('/'))
    {
        return RouteMatch::Admin(rest);
    }
    let Some(rest) = path.strip_prefix('/') else {
        return RouteMatch::NotFound;
    };
    let Some((segments, n)) = segments(rest) else {
        return RouteMatch::NotFound;
    };
    let api = |org, url, endpoint| RouteMatch::Api { org, url, endpoint };
    match &segments[..n] {
        [org, url, "v1", "messages"] => api(Some(*org), *url, Endpoint::Messages),
        [org, url, "v1", "messages", "count_tokens"] => {
            api(Some(*org), *url, Endpoint::CountTokens)
        }
        [url, "v1", "messages"] => api(None, *url, Endpoint::Messages),
        [url, "v1", "messages", "count_tokens"] => api(None, *url, Endpoint::CountTokens),
        // The OpenAI-format front (issue 23).
        [org, url, "v1", "chat", "completions"] => api(Some(*org), *url, Endpoint::ChatCompletions),
        [org, url, "v1", "models"] => api(Some(*org), *url, Endpoint::Models),
        [url, "v1", "chat", "completions"] => api(None, *url, Endpoint::ChatCompletions),
        [url, "v1", "models"] => api(None, *url, Endpoint::Models),
        _ => RouteMatch::NotFound,
    }
}

/// `rest`'s `/`-separated segments (at most six, none empty), as `rest.split('/')`
/// would give them, else `None`. By hand: the byte search is a few instructions per
/// byte where `split`'s char searcher costs ~100 per segment, on every request.
fn segments(rest: &str) -> Option<([&str; 6], usize)> {
    let mut segments = [""; 6];
    let mut n = 0;
    let bytes = rest.as_bytes();
    let mut start = 0;
    loop {
        let end = bytes[start..]
            .iter()
            .position(|&b| b == b'/')
            .map_or(bytes.len(), |at| start + at);
        // `start` and `end` are next to a '/' (ASCII) or at the ends: char boundaries
        let segment = &rest[start..end];
        if n == segments.len() || segment.is_empty() {
            return None;
        }
        segments[n] = segment;
        n += 1;
        if end == bytes.len() {
            return Some((segments, n));
        }
        start = end + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fixed_routes() {
        assert_eq!(match_path("/healthz"), RouteMatch::Health);
        assert_eq!(match_path("/readyz"), RouteMatch::Ready);
        assert_eq!(match_path("/metrics"), RouteMatch::Metrics);
        assert_eq!(match_path("/admin"), RouteMatch::Admin(""));
        assert_eq!(match_path("/admin/ui"), RouteMatch::Admin("/ui"));
        // `/administrator` is not the admin API: it is a (legacy-shaped) unknown path.
        assert_eq!(match_path("/administrator"), RouteMatch::NotFound);
        assert_eq!(match_path("/healthz/"), RouteMatch::NotFound);
    }

    #[test]
    fn api_routes() {
        let org = |o, u, e| RouteMatch::Api {
            org: Some(o),
            url: u,
            endpoint: e,
        };
        let legacy = |u, e| RouteMatch::Api {
            org: None,
            url: u,
            endpoint: e,
        };
        assert_eq!(
            match_path("/acme/team/v1/messages"),
            org("acme", "team", Endpoint::Messages)
        );
        assert_eq!(
            match_path("/acme/team/v1/messages/count_tokens"),
            org("acme", "team", Endpoint::CountTokens)
        );
        assert_eq!(
            match_path("/team/v1/messages"),
            legacy("team", Endpoint::Messages)
        );
        assert_eq!(
            match_path("/team/v1/messages/count_tokens"),
            legacy("team", Endpoint::CountTokens)
        );
        // A URL config called `v1` still works in both forms.
        assert_eq!(
            match_path("/acme/v1/v1/messages"),
            org("acme", "v1", Endpoint::Messages)
        );
        assert_eq!(
            match_path("/v1/v1/messages"),
            legacy("v1", Endpoint::Messages)
        );
        assert!(match_path("/v1/v1/messages").is_legacy());
        assert_eq!(
            match_path("/acme/team/v1/chat/completions"),
            org("acme", "team", Endpoint::ChatCompletions)
        );
        assert_eq!(
            match_path("/team/v1/chat/completions"),
            legacy("team", Endpoint::ChatCompletions)
        );
        assert_eq!(
            match_path("/acme/team/v1/models"),
            org("acme", "team", Endpoint::Models)
        );
        assert_eq!(
            match_path("/team/v1/models"),
            legacy("team", Endpoint::Models)
        );
        assert!(!match_path("/a/b/v1/messages").is_legacy());
    }

    #[test]
    fn near_misses_are_not_found() {
        for path in [
            "",
            "/",
            "/v1/messages",
            "/api/hello",
            "/acme/team/v1/messages/",
            "//team/v1/messages",
            "/acme//v1/messages",
            "/acme/team/v2/messages",
            "/acme/team/v1/messages/count_tokens/x",
            "/a/b/c/v1/messages",
            "/acme/team/v1/Messages",
            "/v1/chat/completions",
            "/acme/team/v1/chat",
            "/acme/team/v1/chat/completions/x",
            "acme/team/v1/messages",
        ] {
            assert_eq!(match_path(path), RouteMatch::NotFound, "{path:?}");
        }
    }

    proptest! {
        /// The segments are `split('/')`'s, for any text (any Unicode, any slashes).
        #[test]
        fn segments_are_splits(rest in "[/a-zé€😀]{0,20}") {
            let split: Vec<&str> = rest.split('/').collect();
            let expected = (split.len() <= 6 && split.iter().all(|s| !s.is_empty()))
                .then_some(split);
            let ours = segments(&rest).map(|(s, n)| s[..n].to_vec());
            prop_assert_eq!(ours, expected);
        }

        /// Any path matches without panicking, and an API match's parts are non-empty
        /// slices of the path with no `/` in them.
        #[test]
        fn any_path_is_safe(path in "(/[a-z0-9_v]{0,6}){0,7}") {
            if let RouteMatch::Api { org, url, .. } = match_path(&path) {
                prop_assert!(!url.is_empty() && !url.contains('/'));
                prop_assert!(org.is_none_or(|o| !o.is_empty() && !o.contains('/')));
                prop_assert!(path.contains(url));
            }
        }
    }
}
