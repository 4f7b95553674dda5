//! Per-account concurrency slots (`max_concurrent`) and the queue of requests waiting
//! for one.
//!
//! A [`SlotGuard`] is one slot of one account; dropping it gives the slot back exactly
//! once, whatever ended the attempt (success, failure, the client going away, a hedge
//! loser aborted). A slot given back goes straight to a waiter that wants that account
//! (a hand-off), else it is freed.
//!
//! Fair share (SPEC 12): waiters are served round-robin across callers, not first come
//! first served overall. The next waiter is the one whose caller was served longest
//! ago (a caller with nobody served yet first), the oldest of that caller's; so one
//! caller's burst of queued requests gets one slot turn in each round, and another
//! caller's single request waits at most one turn.
//!
//! With Redis, every slot is also a lease in the sorted set `keypool:leases:{account}`
//! (member = lease id, score = expiry), taken atomically by a Lua script that first drops
//! expired leases: caps hold across replicas, and the slots of a crashed replica come
//! back when its leases expire ([`LEASE_TTL_MS`], renewed by the holder every
//! [`LEASE_RENEW_MS`]). Slots freed by another replica are noticed by polling every
//! [`WAIT_POLL`]. When Redis does not answer, or is known to be unhealthy (not ready),
//! slots are counted locally only, and nothing is sent to Redis for them.
//!
//! The in-process state sits behind one std `Mutex` that is never held across an
//! `.await`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use keypool_core::{AccountId, UnixMs};
use tokio::sync::oneshot;

use crate::StoreError;
use crate::state::redis::RedisMirror;

/// How long a Redis lease lives without renewal (a crashed replica's slots come back
/// after at most this long).
pub const LEASE_TTL_MS: u64 = 30_000;

/// How often held leases are renewed.
pub const LEASE_RENEW_MS: u64 = 10_000;

/// How often a waiter looks for a slot freed elsewhere (another replica, a raised cap).
pub const WAIT_POLL: Duration = Duration::from_millis(50);

/// One account a waiter can take, with its cap.
pub type Want = (AccountId, u32);

/// The slots of every account, and the waiters.
#[derive(Clone)]
pub struct SlotBook {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SlotBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("SlotBook")
            .field("in_use", &state.in_use)
            .field("waiters", &state.waiters.len())
            .finish()
    }
}

struct Shared {
    state: Mutex<State>,
    mirror: Option<Arc<RedisMirror>>,
    next_id: AtomicU64,
    last_renewed: AtomicU64,
}

#[derive(Default)]
struct State {
    in_use: HashMap<AccountId, u32>,
    waiters: VecDeque<Waiter>,
    /// Slots handed to waiters so far: the clock of the round-robin.
    turn: u64,
    /// The turn each caller with waiters was last served at.
    served: HashMap<Arc<str>, u64>,
    /// Redis leases held by this process: lease id → account.
    leases: HashMap<String, AccountId>,
}

struct Waiter {
    id: u64,
    caller: Arc<str>,
    wants: Vec<Want>,
    tx: oneshot::Sender<SlotGuard>,
}

impl State {
    fn in_use(&self, account: &AccountId) -> u32 {
        self.in_use.get(account).copied().unwrap_or(0)
    }

    /// One slot of `account` less in use.
    fn unreserve(&mut self, account: &AccountId) {
        if let Some(n) = self.in_use.get_mut(account) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.in_use.remove(account);
            }
        }
    }

    /// A waiter's place in the round-robin: its caller's last turn, then its age.
    fn rank(&self, w: &Waiter) -> (u64, u64) {
        (self.served.get(&w.caller).copied().unwrap_or(0), w.id)
    }

    /// Whether a live waiter ranked before waiter `before` (any waiter, for
    /// `u64::MAX`: a request that is not queued) wants `account`.
    fn queued_ahead(&self, account: &AccountId, before: u64) -> bool {
        let mine = self
            .waiters
            .iter()
            .find(|w| w.id == before)
            .map_or((0, 0), |w| self.rank(w));
        self.waiters.iter().any(|w| {
            w.id != before
                && !w.tx.is_closed()
                && w.wants.iter().any(|(a, _)| a == account)
                && (before == u64::MAX || self.rank(w) < mine)
        })
    }

    /// The position of the waiter to serve next among those wanting `account`.
    fn next_for(&self, account: &AccountId) -> Option<usize> {
        self.waiters
            .iter()
            .enumerate()
            .filter(|(_, w)| !w.tx.is_closed() && w.wants.iter().any(|(a, _)| a == account))
            .min_by_key(|(_, w)| self.rank(w))
            .map(|(i, _)| i)
    }

    /// `caller` got a slot: it goes to the back of the round.
    fn served(&mut self, caller: &Arc<str>) {
        self.turn += 1;
        let turn = self.turn;
        self.served.insert(caller.clone(), turn);
    }

    fn remove_waiter(&mut self, id: u64) {
        let Some(pos) = self.waiters.iter().position(|w| w.id == id) else {
            return;
        };
        if let Some(gone) = self.waiters.remove(pos)
            && !self.waiters.iter().any(|w| w.caller == gone.caller)
        {
            // Nobody of that caller waits any more: its turn is forgotten (bounded by
            // the callers waiting now).
            self.served.remove(&gone.caller);
        }
    }
}

/// One concurrency slot of one account, held until dropped.
pub struct SlotGuard {
    shared: Arc<Shared>,
    account: AccountId,
    lease: Option<String>,
    armed: bool,
}

impl std::fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotGuard")
            .field("account", &self.account)
            .field("leased", &self.lease.is_some())
            .finish()
    }
}

impl SlotGuard {
    /// The account whose slot this is.
    pub fn account(&self) -> &AccountId {
        &self.account
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if self.armed {
            self.armed = false;
            self.shared.release(self.account.clone(), self.lease.take());
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn guard(self: &Arc<Self>, account: AccountId, lease: Option<String>) -> SlotGuard {
        SlotGuard {
            shared: self.clone(),
            account,
            lease,
            armed: true,
        }
    }

    /// A slot comes back: to the next live waiter wanting the account (round-robin
    /// across callers), else freed.
    fn release(self: &Arc<Self>, account: AccountId, mut lease: Option<String>) {
        let mut state = self.lock();
        while let Some(pos) = state.next_for(&account) {
            let Some(waiter) = state.waiters.remove(pos) else {
                break;
            };
            let caller = waiter.caller.clone();
            match waiter.tx.send(self.guard(account.clone(), lease.take())) {
                Ok(()) => {
                    state.served(&caller);
                    if !state.waiters.iter().any(|w| w.caller == caller) {
                        state.served.remove(&caller);
                    }
                    return;
                }
                Err(mut back) => {
                    // The waiter just went away: take the slot back without releasing.
                    back.armed = false;
                    lease = back.lease.take();
                }
            }
        }
        state.unreserve(&account);
        if let Some(lease) = &lease {
            state.leases.remove(lease);
        }
        drop(state);
        // While Redis is known to be unhealthy the lease is left to expire on its own
        // (LEASE_TTL_MS) rather than sent to a Redis that may hang.
        if let (Some(lease), Some(mirror)) = (lease, self.mirror.clone())
            && mirror.ready()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            handle.spawn(async move {
                if let Err(e) = mirror.release_lease(&account, &lease).await {
                    tracing::debug!(error = %e, "lease release fell back; it expires on its own");
                }
            });
        }
    }

    /// Takes a slot of `account` if it is under `cap` here (and, with Redis, across
    /// replicas), unless a waiter older than `before` wants it.
    async fn try_take(
        self: &Arc<Self>,
        account: &AccountId,
        cap: u32,
        before: u64,
    ) -> Option<SlotGuard> {
        {
            let mut state = self.lock();
            if state.in_use(account) >= cap || state.queued_ahead(account, before) {
                return None;
            }
            *state.in_use.entry(account.clone()).or_default() += 1;
        }
        // Undone on drop unless it becomes a guard: a caller that gives up while Redis
        // answers (its future dropped) leaves no count behind.
        let reserved = Reserved {
            shared: self,
            account,
            kept: false,
        };
        let Some(mirror) = self.mirror.as_ref().filter(|m| m.ready()) else {
            return Some(reserved.keep(None));
        };
        let lease = format!(
            "{}:{}",
            mirror.origin(),
            self.next_id.fetch_add(1, Ordering::Relaxed)
        );
        let now = crate::now_ms();
        match mirror
            .acquire_lease(account, cap, &lease, now, now + LEASE_TTL_MS)
            .await
        {
            Ok(true) => {
                self.lock().leases.insert(lease.clone(), account.clone());
                Some(reserved.keep(Some(lease)))
            }
            // Another replica holds the rest: the reservation is undone as it drops
            // (waiters look again at their next poll).
            Ok(false) => None,
            Err(e) => {
                tracing::debug!(error = %e, "lease not taken in redis; counting the slot locally");
                Some(reserved.keep(None))
            }
        }
    }
}

/// A slot counted in `in_use` before its Redis lease is known; given back on drop
/// (without a hand-off: no lease was taken for it) unless [`Reserved::keep`] made it a
/// guard.
struct Reserved<'a> {
    shared: &'a Arc<Shared>,
    account: &'a AccountId,
    kept: bool,
}

impl Reserved<'_> {
    fn keep(mut self, lease: Option<String>) -> SlotGuard {
        self.kept = true;
        self.shared.guard(self.account.clone(), lease)
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.shared.lock().unreserve(self.account);
        }
    }
}

/// Removes a waiter from the queue when its wait ends, however it ends.
struct Enqueued<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Enqueued<'_> {
    fn drop(&mut self) {
        self.shared.lock().remove_waiter(self.id);
    }
}

impl SlotBook {
    pub(crate) fn new(mirror: Option<Arc<RedisMirror>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                mirror,
                next_id: AtomicU64::new(0),
                last_renewed: AtomicU64::new(0),
            }),
        }
    }

    /// A slot of `account` (capped at `cap`) if one is free now and no earlier waiter
    /// wants it; never waits for a slot (with Redis ready, waits for Redis, bounded by
    /// `redis_timeout_ms`).
    pub async fn try_acquire(&self, account: &AccountId, cap: u32) -> Option<SlotGuard> {
        self.shared.try_take(account, cap, u64::MAX).await
    }

    /// Waits in the queue for the first free slot of any of `wants`, at most
    /// `max_wait`, served round-robin across callers (`caller`: the org and key id
    /// the request counts under; see the module docs). `max_depth` (0 = unbounded)
    /// bounds the waiters of this process; a full queue is refused at once. Dropping
    /// the future leaves the queue.
    pub async fn wait(
        &self,
        caller: &str,
        wants: &[Want],
        max_wait: Duration,
        max_depth: u32,
    ) -> Result<SlotGuard, StoreError> {
        let shared = &self.shared;
        let (tx, mut rx) = oneshot::channel();
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut state = shared.lock();
            if max_depth > 0 && state.waiters.len() >= max_depth as usize {
                return Err(StoreError::QueueFull { depth: max_depth });
            }
            state.waiters.push_back(Waiter {
                id,
                caller: Arc::from(caller),
                wants: wants.to_vec(),
                tx,
            });
        }
        let _enqueued = Enqueued { shared, id };
        let deadline = tokio::time::Instant::now() + max_wait;
        loop {
            // A slot freed before we were queued, elsewhere, or by a raised cap.
            for (account, cap) in wants {
                if let Some(guard) = shared.try_take(account, *cap, id).await {
                    {
                        let mut state = shared.lock();
                        state.served(&Arc::from(caller));
                        state.remove_waiter(id);
                    }
                    // A hand-off that raced with us is given back by its drop.
                    drop(rx.try_recv());
                    return Ok(guard);
                }
            }
            let poll = tokio::time::sleep(WAIT_POLL);
            tokio::select! {
                biased;
                handed = &mut rx => {
                    if let Ok(guard) = handed {
                        return Ok(guard);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    shared.lock().remove_waiter(id);
                    if let Ok(guard) = rx.try_recv() {
                        return Ok(guard);
                    }
                    return Err(StoreError::QueueTimeout {
                        waited_ms: u64::try_from(max_wait.as_millis()).unwrap_or(u64::MAX),
                    });
                }
                _ = poll => {}
            }
        }
    }

    /// Slots of `account` held in this process now.
    pub fn in_use(&self, account: &AccountId) -> u32 {
        self.shared.lock().in_use(account)
    }

    /// Slots held in this process now, over every account.
    pub fn total_in_use(&self) -> u32 {
        self.shared.lock().in_use.values().sum()
    }

    /// Requests waiting for a slot in this process now.
    pub fn waiting(&self) -> usize {
        self.shared.lock().waiters.len()
    }

    /// Renews every Redis lease held here when [`LEASE_RENEW_MS`] passed since the last
    /// renewal (the store's background task calls this).
    pub(crate) async fn renew_due(&self, now: UnixMs) {
        let Some(mirror) = self.shared.mirror.as_ref().filter(|m| m.ready()) else {
            return;
        };
        let last = self.shared.last_renewed.load(Ordering::Relaxed);
        if now.saturating_sub(last) < LEASE_RENEW_MS {
            return;
        }
        self.shared.last_renewed.store(now, Ordering::Relaxed);
        let leases: Vec<(String, AccountId)> = self
            .shared
            .lock()
            .leases
            .iter()
            .map(|(l, a)| (l.clone(), a.clone()))
            .collect();
        for (lease, account) in leases {
            if mirror
                .renew_lease(&account, &lease, now + LEASE_TTL_MS)
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> AccountId {
        AccountId::from(s)
    }

    proptest::proptest! {
        /// Any sequence of takes and drops over three capped accounts: a take succeeds
        /// exactly when the account is under its cap, the count follows the guards
        /// alive, and everything is back to zero once they are gone.
        #[test]
        fn slots_follow_the_guards_alive(
            caps in proptest::collection::vec(1u32..4, 3),
            ops in proptest::collection::vec((0usize..3, proptest::bool::ANY, 0usize..8), 0..60),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(async {
                let book = SlotBook::new(None);
                let ids = [id("a"), id("b"), id("c")];
                let mut alive: Vec<SlotGuard> = Vec::new();
                for (account, take, victim) in ops {
                    if take {
                        let held = alive.iter().filter(|g| *g.account() == ids[account]).count();
                        let got = book.try_acquire(&ids[account], caps[account]).await;
                        proptest::prop_assert_eq!(got.is_some(), (held as u32) < caps[account]);
                        alive.extend(got);
                    } else if !alive.is_empty() {
                        let victim = victim % alive.len();
                        drop(alive.swap_remove(victim));
                    }
                    for (i, account) in ids.iter().enumerate() {
                        let held = alive.iter().filter(|g| g.account() == account).count() as u32;
                        proptest::prop_assert_eq!(book.in_use(account), held);
                        proptest::prop_assert!(held <= caps[i]);
                    }
                }
                alive.clear();
                proptest::prop_assert_eq!(book.total_in_use(), 0);
                Ok(())
            })?;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cap_holds_and_a_slot_comes_back_once() {
        let book = SlotBook::new(None);
        let a = id("a");
        let first = book.try_acquire(&a, 2).await.unwrap();
        let second = book.try_acquire(&a, 2).await.unwrap();
        assert!(book.try_acquire(&a, 2).await.is_none());
        assert_eq!(book.in_use(&a), 2);
        drop(first);
        assert_eq!(book.in_use(&a), 1);
        drop(second);
        assert_eq!(book.in_use(&a), 0);
        assert_eq!(book.total_in_use(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_first_in_first_out() {
        let book = SlotBook::new(None);
        let a = id("a");
        let held = book.try_acquire(&a, 1).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for n in 0..3 {
            let (book, a, order) = (book.clone(), a.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let guard = book
                    .wait("acme/alice", &[(a, 1)], Duration::from_secs(60), 0)
                    .await
                    .unwrap();
                order.lock().unwrap().push(n);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(guard);
            }));
            // Queue them in a known order.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(book.waiting(), 3);
        // A newcomer does not jump the queue even when it sees a slot.
        drop(held);
        assert!(book.try_acquire(&a, 1).await.is_none());
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
        assert_eq!((book.in_use(&a), book.waiting()), (0, 0));
    }

    /// Queues `callers[i]`'s waiters in the order given behind one held slot of a
    /// capped-at-1 account, lets the slot go, and returns the order they were served
    /// in (each holds its slot 10 ms).
    async fn service_order(callers: &[&'static str]) -> Vec<&'static str> {
        let book = SlotBook::new(None);
        let a = id("a");
        let held = book.try_acquire(&a, 1).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for caller in callers {
            let (book, a, order, caller) = (book.clone(), a.clone(), order.clone(), *caller);
            tasks.push(tokio::spawn(async move {
                let guard = book
                    .wait(caller, &[(a, 1)], Duration::from_secs(3600), 0)
                    .await
                    .unwrap();
                order.lock().unwrap().push(caller);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(guard);
            }));
            // Queue them in a known order.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(book.waiting(), callers.len());
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!((book.in_use(&a), book.waiting()), (0, 0));
        order.lock().unwrap().clone()
    }

    /// SPEC 12's fair share: a caller with 50 queued requests delays a second caller's
    /// single request, queued after all of them, by at most one slot turn.
    #[tokio::test(start_paused = true)]
    async fn a_burst_of_one_caller_delays_another_callers_request_by_one_turn_at_most() {
        let mut callers = vec!["acme/burst"; 50];
        callers.push("acme/single");
        let order = service_order(&callers).await;
        let position = order.iter().position(|c| *c == "acme/single").unwrap();
        assert!(position <= 1, "served at turn {position}: {order:?}");
        assert_eq!(order.len(), 51);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Whatever the order callers queued in, the waiter served next is always of a
        /// caller served the fewest times among those still waiting (round-robin), and
        /// each caller's own waiters are served oldest first.
        #[test]
        fn waiters_are_served_round_robin_across_callers(
            picks in proptest::collection::vec(0usize..3, 1..30),
        ) {
            const NAMES: [&str; 3] = ["o/a", "o/b", "o/c"];
            let callers: Vec<&'static str> = picks.iter().map(|i| NAMES[*i]).collect();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            let order = runtime.block_on(service_order(&callers));
            let mut left: HashMap<&str, usize> = HashMap::new();
            for c in &callers {
                *left.entry(c).or_default() += 1;
            }
            let mut served: HashMap<&str, usize> = HashMap::new();
            for c in &order {
                let fewest = left
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(d, _)| served.get(d).copied().unwrap_or(0))
                    .min()
                    .unwrap();
                proptest::prop_assert_eq!(served.get(c).copied().unwrap_or(0), fewest, "{:?} -> {:?}", callers, order);
                *served.entry(c).or_default() += 1;
                *left.get_mut(c).unwrap() -= 1;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_times_out_and_a_full_queue_is_refused_at_once() {
        let book = SlotBook::new(None);
        let a = id("a");
        let _held = book.try_acquire(&a, 1).await.unwrap();
        let start = tokio::time::Instant::now();
        let waiting = {
            let (book, a) = (book.clone(), a.clone());
            tokio::spawn(async move {
                book.wait("acme/alice", &[(a, 1)], Duration::from_millis(300), 1)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let full = book
            .wait("acme/alice", &[(a.clone(), 1)], Duration::from_secs(5), 1)
            .await;
        assert!(
            matches!(full, Err(StoreError::QueueFull { depth: 1 })),
            "{full:?}"
        );
        assert_eq!(start.elapsed(), Duration::from_millis(1));
        let timed_out = waiting.await.unwrap();
        assert!(
            matches!(timed_out, Err(StoreError::QueueTimeout { waited_ms: 300 })),
            "{timed_out:?}"
        );
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        assert_eq!(book.waiting(), 0);
        assert_eq!(book.in_use(&a), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_leaves_does_not_swallow_the_slot() {
        let book = SlotBook::new(None);
        let (a, b) = (id("a"), id("b"));
        let held = book.try_acquire(&a, 1).await.unwrap();
        let _held_b = book.try_acquire(&b, 1).await.unwrap();
        // The first waiter gives up (its future dropped) before the slot comes back.
        let gone = {
            let (book, a) = (book.clone(), a.clone());
            tokio::spawn(async move {
                book.wait("acme/alice", &[(a, 1)], Duration::from_secs(60), 0)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let stays = {
            let (book, a, b) = (book.clone(), a.clone(), b.clone());
            tokio::spawn(async move {
                book.wait("acme/alice", &[(b, 1), (a, 1)], Duration::from_secs(60), 0)
                    .await
                    .map(|g| g.account().clone())
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        gone.abort();
        let _ = gone.await;
        drop(held);
        assert_eq!(stays.await.unwrap().unwrap(), a);
        assert_eq!(book.in_use(&a), 0, "the served waiter's guard was dropped");
        assert_eq!(book.waiting(), 0);
    }
}
