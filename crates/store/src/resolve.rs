//! SPEC 3.2–3.3: which org and URL config a request addresses, and who is calling.

use std::sync::Arc;

use keypool_core::Strategy;

use crate::config::{Config, Group, LbKey, LegacyEntry, Org, UrlConfig};
use crate::keys::KeyMemo;

/// A resolved URL config: the org, the config, and the pool it points at.
#[derive(Debug, Clone)]
pub struct Route {
    org: Arc<Org>,
    url: Arc<UrlConfig>,
    group: Option<Arc<Group>>,
    legacy: bool,
}

impl Route {
    /// The org that owns the URL config (may be suspended: checked after the key).
    pub fn org(&self) -> &Arc<Org> {
        &self.org
    }
    /// The URL config.
    pub fn url(&self) -> &Arc<UrlConfig> {
        &self.url
    }
    /// The group, or `None` for the org's whole pool.
    pub fn group(&self) -> Option<&Arc<Group>> {
        self.group.as_ref()
    }
    /// Whether it was reached through a legacy `/{url}/…` route.
    pub fn legacy(&self) -> bool {
        self.legacy
    }
    /// The pool's strategy: the group's, or the default for a whole-org pool.
    pub fn strategy(&self) -> Strategy {
        self.group
            .as_ref()
            .map_or_else(Strategy::default, |g| g.strategy())
    }
    /// The pool's identity, used for rotation counters and the snapshot cache:
    /// `org/group` or `org/*` for the whole org.
    ///
    /// Built once per URL config at validation: this is a reference-count increment.
    pub fn pool_key(&self) -> PoolKey {
        self.url.pool.clone()
    }

    /// [`Route::pool_key`] without a clone.
    pub(crate) fn pool_key_ref(&self) -> &PoolKey {
        &self.url.pool
    }
}

/// The identity of one pool: an org's group or its whole pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey(Arc<str>);

impl PoolKey {
    /// `org/group`, or `org/*` when `group` is `None` (org slugs and group ids are
    /// path segments, so neither `/` nor `*` can make two pools collide).
    pub fn new(org: &str, group: Option<&str>) -> Self {
        Self(Arc::from(format!("{org}/{}", group.unwrap_or("*"))))
    }
    /// The same key in an allocation of its own (see `Config::local_copy`).
    pub(crate) fn local_copy(&self) -> PoolKey {
        PoolKey(Arc::from(&*self.0))
    }

    /// The key as text (`acme/fast`).
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The org part.
    pub fn org(&self) -> &str {
        self.0.split_once('/').map_or(&*self.0, |(o, _)| o)
    }
}

/// Why a route did not resolve (SPEC 3.2). Unknown org and unknown URL are one variant so
/// that no caller can tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// `404 not_found_error` "Custom URL config not found".
    #[error("Custom URL config not found")]
    NotFound,
    /// Legacy route whose `custom_url` exists in more than one org: `409`.
    #[error("this custom URL exists in several organisations; use /{{org}}/{{url}}/v1/messages")]
    LegacyConflict,
    /// The URL config belongs to no org: `403 permission_error` (no global pool).
    #[error(
        "this URL config belongs to no organisation and has no pool; pools are per organisation"
    )]
    NoPool,
}

/// Who is calling: the key's id under the field name SPEC 1 records it as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A `user` key: recorded as `user_api_key_id`.
    User(Arc<str>),
    /// A `client` key: recorded as `client_api_key_id`.
    Client(Arc<str>),
}

impl Caller {
    /// `user_api_key_id`, for a user key.
    pub fn user_api_key_id(&self) -> Option<&str> {
        match self {
            Caller::User(id) => Some(id),
            Caller::Client(_) => None,
        }
    }
    /// `client_api_key_id`, for a client key.
    pub fn client_api_key_id(&self) -> Option<&str> {
        match self {
            Caller::Client(id) => Some(id),
            Caller::User(_) => None,
        }
    }
    /// The key's id, whatever its kind.
    pub fn key_id(&self) -> &str {
        match self {
            Caller::User(id) | Caller::Client(id) => id,
        }
    }
}

/// Why a request's LB key was refused (SPEC 3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Missing, unknown, revoked, or cannot see this URL config: `401 authentication_error`.
    #[error("invalid API key")]
    Unauthenticated,
    /// The key is valid for this URL config but its org is suspended:
    /// `403 permission_error` whose message contains `ORG_SUSPENDED`.
    #[error("ORG_SUSPENDED: this organisation is suspended")]
    OrgSuspended,
}

impl Config {
    /// Resolves `/{org}/{url}/…`. An unknown org and an unknown URL inside a known org
    /// give the same [`ResolveError::NotFound`].
    pub fn resolve(&self, org: &str, url: &str) -> Result<Route, ResolveError> {
        let org = self.orgs.get(org).ok_or(ResolveError::NotFound)?;
        let url = org.url(url).ok_or(ResolveError::NotFound)?;
        Ok(self.route(org, url, false))
    }

    /// Resolves the legacy `/{url}/…`: none → not found; several configs → conflict; a
    /// config of no org → no pool; exactly one org → its config.
    pub fn resolve_legacy(&self, url: &str) -> Result<Route, ResolveError> {
        match self.legacy.get(url) {
            None => Err(ResolveError::NotFound),
            Some(LegacyEntry::Ambiguous) => Err(ResolveError::LegacyConflict),
            Some(LegacyEntry::Orphan) => Err(ResolveError::NoPool),
            Some(LegacyEntry::One(slug)) => {
                let org = self.orgs.get(slug).ok_or(ResolveError::NotFound)?;
                let url = org.url(url).ok_or(ResolveError::NotFound)?;
                Ok(self.route(org, url, true))
            }
        }
    }

    fn route(&self, org: &Arc<Org>, url: &Arc<UrlConfig>, legacy: bool) -> Route {
        Route {
            org: org.clone(),
            url: url.clone(),
            group: url.group().and_then(|g| org.group(g)).cloned(),
            legacy,
        }
    }

    /// Validates the presented LB key for `route` (SPEC 3.3): hashed with SHA-256 and
    /// looked up; missing, unknown, revoked, or not able to see this URL config →
    /// [`AuthError::Unauthenticated`]; then, only for a key valid here, a suspended org →
    /// [`AuthError::OrgSuspended`]. The key itself is never logged or stored.
    pub fn authenticate(
        &self,
        route: &Route,
        presented: Option<&str>,
    ) -> Result<Caller, AuthError> {
        self.authenticate_key(route, presented).map(LbKey::caller)
    }

    /// [`Config::authenticate`], giving the key itself (its limits, SPEC 12).
    ///
    /// # Errors
    /// As [`Config::authenticate`].
    pub fn authenticate_key(
        &self,
        route: &Route,
        presented: Option<&str>,
    ) -> Result<&LbKey, AuthError> {
        self.authenticate_key_with(route, presented, &mut KeyMemo::default())
    }

    /// [`Config::authenticate_key`] with the hash of a key the connection presented
    /// before taken from `memo` (and this one's left there).
    ///
    /// # Errors
    /// As [`Config::authenticate`].
    pub fn authenticate_key_with(
        &self,
        route: &Route,
        presented: Option<&str>,
        memo: &mut KeyMemo,
    ) -> Result<&LbKey, AuthError> {
        let presented = presented
            .filter(|k| !k.is_empty())
            .ok_or(AuthError::Unauthenticated)?;
        let key = self
            .keys_by_hash
            .get(&memo.hash(presented))
            .ok_or(AuthError::Unauthenticated)?;
        if key.revoked() || !key.can_see(route.org.slug(), route.url.custom_url()) {
            return Err(AuthError::Unauthenticated);
        }
        if route.org.suspended() {
            return Err(AuthError::OrgSuspended);
        }
        Ok(key)
    }
}
