//! Simulated accounts: who a credential is, what its script says next, and its counters.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use http::{HeaderName, HeaderValue};
use keypool_core::AccountId;
use tokio::sync::watch;

use crate::error::SimError;
use crate::script::{Behaviour, Script};

/// The id under which the any-credential fallback script is addressed.
pub const ANY_CREDENTIAL: &str = "*";

/// One simulated account as declared: its id, the credential that identifies it
/// (`x-api-key` value or `Authorization: Bearer` token) and its script.
#[derive(Clone)]
pub struct SimAccount {
    /// The account's id (what tests and keypool's config call it).
    pub id: AccountId,
    /// The credential that identifies the account.
    pub credential: String,
    /// What the account does.
    pub script: Script,
}

impl fmt::Debug for SimAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimAccount")
            .field("id", &self.id)
            .field(
                "credential",
                &format_args!("<{} bytes>", self.credential.len()),
            )
            .field("script", &self.script)
            .finish()
    }
}

/// Counters of one account (or of the whole simulator).
///
/// `requests = finished + cancelled + in_flight` at any instant it is read consistently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AccountStats {
    /// Requests received.
    pub requests: u64,
    /// Requests the simulator answered to the end as scripted (including errors, resets
    /// and cut streams).
    pub finished: u64,
    /// Requests the client abandoned: the connection closed before the scripted response
    /// was complete.
    pub cancelled: u64,
    /// Requests being served now.
    pub in_flight: u64,
    /// The most requests ever served at once.
    pub peak_in_flight: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    finished: AtomicU64,
    cancelled: AtomicU64,
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
}

impl Counters {
    fn start(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_in_flight.fetch_max(now, Ordering::Relaxed);
    }

    fn end(&self, finished: bool) {
        let counter = if finished {
            &self.finished
        } else {
            &self.cancelled
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> AccountStats {
        AccountStats {
            requests: self.requests.load(Ordering::Relaxed),
            finished: self.finished.load(Ordering::Relaxed),
            cancelled: self.cancelled.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            peak_in_flight: self.peak_in_flight.load(Ordering::Relaxed),
        }
    }
}

/// Headers attached to every response of an account, shared by all its responses.
pub(crate) type AlwaysHeaders = Arc<[(HeaderName, HeaderValue)]>;

#[derive(Debug)]
struct ScriptState {
    default: Behaviour,
    sequence: VecDeque<Behaviour>,
    headers: AlwaysHeaders,
    by_model: Vec<(String, Behaviour)>,
}

impl From<Script> for ScriptState {
    fn from(s: Script) -> Self {
        Self {
            default: s.default,
            sequence: s.sequence,
            headers: s.headers.into(),
            by_model: s.by_model,
        }
    }
}

/// A live account: identity, script and counters.
#[derive(Debug)]
pub(crate) struct Account {
    pub(crate) id: AccountId,
    script: Mutex<ScriptState>,
    pub(crate) counters: Counters,
}

impl Account {
    fn new(id: AccountId, script: Script) -> Self {
        Self {
            id,
            script: Mutex::new(script.into()),
            counters: Counters::default(),
        }
    }

    fn script(&self) -> MutexGuard<'_, ScriptState> {
        // Nothing can panic while the lock is held; a poisoned lock still holds a whole
        // script.
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The behaviour for the next request (of `model`), and the headers to attach.
    pub(crate) fn next(&self, model: Option<&str>) -> (Behaviour, AlwaysHeaders) {
        let mut s = self.script();
        let by_model = model.and_then(|m| {
            s.by_model
                .iter()
                .find(|(text, _)| m.contains(text.as_str()))
                .map(|(_, b)| b.clone())
        });
        let behaviour = by_model
            .or_else(|| s.sequence.pop_front())
            .unwrap_or_else(|| s.default.clone());
        (behaviour, s.headers.clone())
    }
}

/// Every account, the fallback, the total counters and the change notifier.
#[derive(Debug)]
pub(crate) struct Accounts {
    by_credential: RwLock<HashMap<Box<str>, Arc<Account>>>,
    fallback: Option<Arc<Account>>,
    pub(crate) total: Counters,
    events: watch::Sender<u64>,
}

impl Accounts {
    pub(crate) fn new(
        accounts: Vec<SimAccount>,
        fallback: Option<Script>,
    ) -> Result<Self, SimError> {
        let this = Self {
            by_credential: RwLock::new(HashMap::new()),
            fallback: fallback.map(|s| Arc::new(Account::new(AccountId::from(ANY_CREDENTIAL), s))),
            total: Counters::default(),
            events: watch::Sender::new(0),
        };
        for a in accounts {
            this.add(a)?;
        }
        Ok(this)
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Box<str>, Arc<Account>>> {
        self.by_credential
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn add(&self, account: SimAccount) -> Result<(), SimError> {
        let mut map = self
            .by_credential
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let id = account.id.as_str();
        if id == ANY_CREDENTIAL || map.values().any(|a| a.id.as_str() == id) {
            return Err(SimError::DuplicateAccount { id: id.to_owned() });
        }
        if let Some(other) = map.get(account.credential.as_str()) {
            return Err(SimError::DuplicateCredential {
                id: id.to_owned(),
                other: other.id.as_str().to_owned(),
            });
        }
        let live = Arc::new(Account::new(account.id, account.script));
        map.insert(account.credential.into_boxed_str(), live);
        Ok(())
    }

    /// The account a credential identifies, else the fallback.
    pub(crate) fn identify(&self, credential: Option<&str>) -> Option<Arc<Account>> {
        let credential = credential?;
        self.map()
            .get(credential)
            .cloned()
            .or_else(|| self.fallback.clone())
    }

    /// The account with this id (`"*"` is the fallback).
    pub(crate) fn by_id(&self, id: &str) -> Result<Arc<Account>, SimError> {
        let found = if id == ANY_CREDENTIAL {
            self.fallback.clone()
        } else {
            self.map().values().find(|a| a.id.as_str() == id).cloned()
        };
        found.ok_or_else(|| SimError::UnknownAccount { id: id.to_owned() })
    }

    pub(crate) fn set_script(&self, id: &str, script: Script) -> Result<(), SimError> {
        *self.by_id(id)?.script() = script.into();
        Ok(())
    }

    pub(crate) fn set_default(&self, id: &str, behaviour: Behaviour) -> Result<(), SimError> {
        self.by_id(id)?.script().default = behaviour;
        Ok(())
    }

    pub(crate) fn push(
        &self,
        id: &str,
        behaviours: impl IntoIterator<Item = Behaviour>,
    ) -> Result<(), SimError> {
        self.by_id(id)?.script().sequence.extend(behaviours);
        Ok(())
    }

    /// Starts counting one request; the guard's drop ends it.
    pub(crate) fn begin(self: &Arc<Self>, account: Option<Arc<Account>>) -> RequestGuard {
        self.total.start();
        if let Some(a) = &account {
            a.counters.start();
        }
        self.notify();
        RequestGuard {
            accounts: self.clone(),
            account,
            finished: false,
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.events.subscribe()
    }

    fn notify(&self) {
        // Nobody waits (benchmarks, most tests): skip the watch's lock entirely.
        if self.events.receiver_count() == 0 {
            return;
        }
        self.events
            .send_modify(|generation| *generation = generation.wrapping_add(1));
    }
}

/// Counts one request from arrival to its end. Dropped without [`RequestGuard::finish`]
/// means the client went away first: it counts as cancelled.
#[derive(Debug)]
pub(crate) struct RequestGuard {
    accounts: Arc<Accounts>,
    account: Option<Arc<Account>>,
    finished: bool,
}

impl RequestGuard {
    /// The simulator produced the whole scripted response.
    pub(crate) fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.accounts.total.end(self.finished);
        if let Some(a) = &self.account {
            a.counters.end(self.finished);
        }
        self.accounts.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(id: &str, credential: &str, script: Script) -> SimAccount {
        SimAccount {
            id: AccountId::from(id),
            credential: credential.into(),
            script,
        }
    }

    #[test]
    fn sequence_is_consumed_then_default_repeats() {
        let accounts = Accounts::new(
            vec![account(
                "a",
                "key-a",
                Script::ok()
                    .then(Behaviour::status(429))
                    .then(Behaviour::Reset),
            )],
            None,
        )
        .unwrap();
        let a = accounts.identify(Some("key-a")).unwrap();
        assert_eq!(a.next(None).0, Behaviour::status(429));
        assert_eq!(a.next(None).0, Behaviour::Reset);
        assert_eq!(a.next(None).0, Behaviour::ok());
        assert_eq!(a.next(None).0, Behaviour::ok());
        accounts.push("a", [Behaviour::status(500)]).unwrap();
        accounts.set_default("a", Behaviour::status(401)).unwrap();
        assert_eq!(a.next(None).0, Behaviour::status(500));
        assert_eq!(a.next(None).0, Behaviour::status(401));
    }

    #[test]
    fn unknown_credential_uses_the_fallback_only_when_there_is_one() {
        let without = Accounts::new(vec![], None).unwrap();
        assert!(without.identify(Some("nobody")).is_none());
        let with = Accounts::new(vec![], Some(Script::ok())).unwrap();
        assert_eq!(
            with.identify(Some("nobody")).unwrap().id.as_str(),
            ANY_CREDENTIAL
        );
        assert!(
            with.identify(None).is_none(),
            "a missing credential is never accepted"
        );
    }

    #[test]
    fn duplicates_are_rejected_without_naming_the_credential() {
        let err = Accounts::new(
            vec![
                account("a", "secret-1", Script::ok()),
                account("b", "secret-1", Script::ok()),
            ],
            None,
        )
        .unwrap_err();
        assert!(matches!(err, SimError::DuplicateCredential { .. }));
        assert!(!err.to_string().contains("secret-1"));
        assert!(!format!("{:?}", account("a", "secret-1", Script::ok())).contains("secret-1"));
        let err = Accounts::new(
            vec![
                account("a", "k1", Script::ok()),
                account("a", "k2", Script::ok()),
            ],
            None,
        )
        .unwrap_err();
        assert!(matches!(err, SimError::DuplicateAccount { .. }));
        let err = Accounts::new(vec![], None)
            .unwrap()
            .set_script("x", Script::ok())
            .unwrap_err();
        assert!(matches!(err, SimError::UnknownAccount { .. }));
    }

    #[test]
    fn guard_counts_finished_and_cancelled() {
        let accounts =
            Arc::new(Accounts::new(vec![account("a", "k", Script::ok())], None).unwrap());
        let a = accounts.identify(Some("k"));
        let mut g1 = accounts.begin(a.clone());
        let g2 = accounts.begin(a.clone());
        let s = accounts.by_id("a").unwrap().counters.read();
        assert_eq!((s.requests, s.in_flight, s.peak_in_flight), (2, 2, 2));
        g1.finish();
        drop(g1);
        drop(g2);
        let s = accounts.by_id("a").unwrap().counters.read();
        assert_eq!(
            s,
            AccountStats {
                requests: 2,
                finished: 1,
                cancelled: 1,
                in_flight: 0,
                peak_in_flight: 2
            }
        );
        assert_eq!(accounts.total.read(), s);
    }
}
