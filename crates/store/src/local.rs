//! Each thread's view of a [`Store`](crate::Store): its own copy of the config in force
//! ([`Config::local_copy`]) and the snapshots it took from it.
//!
//! Every request clones and drops a dozen of the config's `Arc`s and its pool's
//! snapshot. When all worker threads share one copy, each of those reference counts
//! is an atomic write to a cache line the other workers write too, and the line moves
//! between cores on every request; kept per thread, the same writes stay in one core's
//! cache. The snapshot cache per thread also takes the shared map's lock off the path.
//! A thread makes its copy the first time it asks after a reload; the copy shares no
//! state, only the config's values, so a thread's view is always the config in force
//! (by [`LocalViews::get`]'s version check) and the books stay shared.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use keypool_core::UnixMs;

use crate::config::Config;
use crate::resolve::PoolKey;
use crate::snapshot::Snapshot;

/// How many stores one thread keeps a view of (a process has one; tests have many):
/// past this, the view used longest ago is dropped.
const VIEWS_PER_THREAD: usize = 4;

static NEXT_STORE: AtomicU64 = AtomicU64::new(1);

/// A process-unique number naming a store in the threads' views.
pub(crate) fn store_id() -> u64 {
    NEXT_STORE.fetch_add(1, Ordering::Relaxed)
}

/// A snapshot with what says whether it may still be used.
pub(crate) struct CachedSnapshot {
    pub taken_at: UnixMs,
    pub generation: u64,
    pub snapshot: Snapshot,
}

/// One thread's view of one store.
pub(crate) struct LocalView {
    store: u64,
    version: u64,
    /// This thread's copy of the config in force.
    pub config: Arc<Config>,
    /// The snapshots taken from `config`, by pool.
    pub snapshots: HashMap<PoolKey, CachedSnapshot, foldhash::fast::RandomState>,
}

thread_local! {
    static VIEWS: RefCell<Vec<LocalView>> = const { RefCell::new(Vec::new()) };
}

/// The entry point: `f` on this thread's view of store `store` at config `version`,
/// made from `shared` (the config in force) when the thread has none or an older one.
/// `None` when the thread cannot keep one (it is exiting, or `f` asked again from
/// inside `f`): the caller then uses the shared config.
pub(crate) fn with_view<R>(
    store: u64,
    version: u64,
    shared: impl FnOnce() -> Arc<Config>,
    f: impl FnOnce(&mut LocalView) -> R,
) -> Option<R> {
    VIEWS
        .try_with(|views| {
            let mut views = views.try_borrow_mut().ok()?;
            let at = match views.iter().position(|v| v.store == store) {
                Some(at) if views[at].version == version => at,
                found => {
                    let view = LocalView {
                        store,
                        version,
                        config: Arc::new(shared().local_copy()),
                        snapshots: HashMap::default(),
                    };
                    match found {
                        Some(at) => {
                            views[at] = view;
                            at
                        }
                        None => {
                            if views.len() == VIEWS_PER_THREAD {
                                views.remove(0);
                            }
                            views.push(view);
                            views.len() - 1
                        }
                    }
                }
            };
            // most recently used last: the first is the one to drop
            let last = views.len() - 1;
            views[at..].rotate_left(1);
            Some(f(&mut views[last]))
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Arc<Config> {
        Arc::new(Config::from_toml_str("[[orgs]]\nslug = \"acme\"\n", None, &|_| None).unwrap())
    }

    #[test]
    fn a_thread_copies_the_config_once_per_version_and_store() {
        let shared = config();
        let (a, b) = (store_id(), store_id());
        let made = std::cell::Cell::new(0);
        let load = || {
            made.set(made.get() + 1);
            shared.clone()
        };
        let first = with_view(a, 1, load, |v| v.config.clone()).unwrap();
        let again = with_view(a, 1, load, |v| v.config.clone()).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert!(!Arc::ptr_eq(&first, &shared));
        assert_eq!(made.get(), 1);
        // another store has its own view
        let other = with_view(b, 1, load, |v| v.config.clone()).unwrap();
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(made.get(), 2);
        // a new version replaces the copy
        let newer = with_view(a, 2, load, |v| v.config.clone()).unwrap();
        assert!(!Arc::ptr_eq(&first, &newer));
        assert_eq!(made.get(), 3);
        // another thread makes its own
        let there = std::thread::scope(|s| {
            s.spawn(|| with_view(a, 2, || shared.clone(), |v| v.config.clone()).unwrap())
                .join()
                .unwrap()
        });
        assert!(!Arc::ptr_eq(&there, &newer));
    }

    #[test]
    fn a_thread_keeps_the_views_it_used_last() {
        let shared = config();
        let ids: Vec<u64> = (0..=VIEWS_PER_THREAD).map(|_| store_id()).collect();
        let first = with_view(ids[0], 0, || shared.clone(), |v| v.config.clone()).unwrap();
        for &id in &ids[1..VIEWS_PER_THREAD] {
            with_view(id, 0, || shared.clone(), |_| ()).unwrap();
        }
        // ids[0] used again: ids[1] is now the oldest, and goes for the new store
        let kept = with_view(ids[0], 0, || shared.clone(), |v| v.config.clone()).unwrap();
        assert!(Arc::ptr_eq(&first, &kept));
        with_view(ids[VIEWS_PER_THREAD], 0, || shared.clone(), |_| ()).unwrap();
        let still = with_view(ids[0], 0, || unreachable!(), |v| v.config.clone()).unwrap();
        assert!(Arc::ptr_eq(&first, &still));
        let mut remade = false;
        with_view(
            ids[1],
            0,
            || {
                remade = true;
                shared.clone()
            },
            |_| (),
        )
        .unwrap();
        assert!(remade, "the view used longest ago was dropped");
    }

    #[test]
    fn asking_again_from_inside_is_refused_not_a_panic() {
        let shared = config();
        let id = store_id();
        let inner = with_view(
            id,
            0,
            || shared.clone(),
            |_| with_view(id, 0, || shared.clone(), |_| ()),
        );
        assert_eq!(inner, Some(None));
    }
}
