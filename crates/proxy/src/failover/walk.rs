//! The walk of one request's plan (SPEC 3.7 and 4), as a small state machine: the
//! [`Walker`] owns the attempts in flight (at most two: primary and hedge/race
//! partner) and has one method per event: start the fan-out, start the next attempt
//! (or wait in the queue for a concurrency slot), the hedge timer, an attempt done.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use http::Response;
use keypool_core::{AccountId, UnixMs};
use keypool_selector::FanOut;
use keypool_store::config::Account;
use keypool_store::slots::SlotGuard;
use keypool_store::{Store, StoreError, now_ms};
use tokio::time::Sleep;

use super::credit::{commit, record_failure};
use super::planning::{ExtraAttempt, PlannedRequest, Session};
use crate::attempt::{Call, Failure, Ready};
use crate::body::ProxyBody;
use crate::ceiling::AttemptCeiling;
use crate::context::RequestContext;
use crate::metrics::{AffinityOutcome, FanOutRole, InFlight};

type AttemptFuture<'a> = Pin<Box<dyn Future<Output = Result<Ready, Failure>> + Send + 'a>>;

/// Where an attempt's future lives.
enum AttemptSlot<'a> {
    /// In the walker's inline slot, pinned in the walk's own future: the first attempt
    /// of a request, which is most often the only one, allocates nothing. The future is
    /// ~2.8 KB, and a box of it took mimalloc's slow path for blocks above 1 KiB on
    /// every request (`docs/BENCHMARKS.md`, issue 22).
    Inline,
    /// Boxed: the fan-out partner, or any attempt while the inline slot is taken.
    Boxed(AttemptFuture<'a>),
}

/// One attempt in flight.
pub(super) struct Running<'a> {
    future: AttemptSlot<'a>,
    /// Index into the snapshot.
    pub index: usize,
    pub started_at: UnixMs,
    role: FanOutRole,
    /// The call's flag of this attempt's slot.
    first_chunk: &'a AtomicBool,
    /// Counts the attempt in the account's in-flight gauge while it lives.
    pub in_flight: InFlight,
    /// The account's concurrency slot (`max_concurrent`), given back when dropped.
    pub capacity: Option<SlotGuard>,
}

/// Whether an account can take one more attempt now.
enum Capacity {
    /// Yes: with the slot to hold, or `None` for an account without `max_concurrent`.
    Free(Option<SlotGuard>),
    /// It is at its cap (the value).
    Full(u32),
}

async fn capacity(store: &Store, account: &Account) -> Capacity {
    match account.max_concurrent() {
        None => Capacity::Free(None),
        Some(cap) => match store.slots().try_acquire(account.id(), cap).await {
            Some(guard) => Capacity::Free(Some(guard)),
            None => Capacity::Full(cap),
        },
    }
}

/// What happened next in the walk.
// Short-lived, on the stack of one request: boxing the result would cost an allocation
// per attempt for nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Event {
    /// The attempt in `running[i]` finished.
    Done(usize, Result<Ready, Failure>),
    /// The hedge delay passed.
    HedgeDelay,
}

/// Why the walk ended without an answer of its own, when not simply because every
/// account failed.
pub(super) enum Stopped {
    /// No concurrency slot came free in time, or the queue was full.
    Queue(StoreError),
    /// keypool's own resources ran out.
    Local,
}

/// An account of the plan skipped because it was at its cap, kept for the queue.
struct Deferred {
    index: usize,
    account: Arc<Account>,
    cap: u32,
}

/// The walk of one planned request.
pub(super) struct Walker<'c, 's, F, M> {
    call: &'c Call<'c>,
    planned: &'c PlannedRequest,
    running: [Option<Running<'c>>; 2],
    /// The future of the one attempt whose slot is [`AttemptSlot::Inline`], if any.
    /// Emptied whenever that attempt leaves `running`: an attempt aborted is dropped
    /// at once, as a boxed one is.
    inline: Pin<&'s mut Option<F>>,
    /// Makes an attempt's future ([`crate::oauth::attempt_with_refresh`]); a function
    /// item, called directly, so that its future can be built in place.
    make: M,
    /// The next position in the plan.
    next: usize,
    ceiling: AttemptCeiling,
    /// The last failure and the snapshot index of its account.
    pub last_failure: Option<(Failure, usize)>,
    /// Armed while a hedge's backup may still fire.
    hedge_timer: Option<Pin<Box<Sleep>>>,
    /// The fan-out's extra attempt until the backup fires (dropping it refunds it).
    extra: Option<ExtraAttempt>,
    backup_started: bool,
    deferred: Vec<Deferred>,
    pub stopped: Option<Stopped>,
}

impl<'c, 's, F, M> Walker<'c, 's, F, M>
where
    F: Future<Output = Result<Ready, Failure>> + Send + 'c,
    M: Fn(&'c Call<'c>, Arc<Account>, &'c AtomicBool) -> F,
{
    /// A walk of `planned` whose attempts `make` makes; `inline` (empty) holds one of
    /// them at a time without a box.
    pub fn new(
        call: &'c Call<'c>,
        planned: &'c mut PlannedRequest,
        inline: Pin<&'s mut Option<F>>,
        make: M,
    ) -> Self {
        let extra = planned.extra.take();
        let planned: &'c PlannedRequest = planned;
        Self {
            call,
            ceiling: AttemptCeiling::new(planned.plan.len()),
            planned,
            running: [None, None],
            inline,
            make,
            next: 0,
            last_failure: None,
            hedge_timer: None,
            extra,
            backup_started: false,
            deferred: Vec::new(),
            stopped: None,
        }
    }

    /// How many attempts started.
    pub fn attempts_started(&self) -> usize {
        self.ceiling.started()
    }

    /// The account at `position` of the plan; `None` when it is gone, or when its
    /// provider cannot serve this request's endpoint (a Messages request never goes to
    /// an `openai` account): the walk skips it.
    fn account_at(&self, position: usize) -> Option<Arc<Account>> {
        let index = self.planned.plan.get(position)?;
        let snapshot = &self.planned.snapshot;
        let account = match snapshot.account(index, self.call.config) {
            Some(account) => account,
            None => self.call.config.account(snapshot[index].id.as_str())?,
        };
        self.call
            .endpoint
            .upstream_for(account.provider())
            .map(|_| account.clone())
    }

    fn start(
        &mut self,
        which: usize,
        index: usize,
        role: FanOutRole,
        account: Arc<Account>,
        capacity: Option<SlotGuard>,
    ) {
        let first_chunk = &self.call.first_chunks[which];
        first_chunk.store(false, Ordering::Release);
        let in_flight = self.call.app.metrics().start_in_flight(account.id());
        let future = if self.inline.is_none() {
            self.inline
                .set(Some((self.make)(self.call, account, first_chunk)));
            AttemptSlot::Inline
        } else {
            AttemptSlot::Boxed(Box::pin((self.make)(self.call, account, first_chunk)))
        };
        self.running[which] = Some(Running {
            future,
            index,
            started_at: now_ms(),
            role,
            first_chunk,
            in_flight,
            capacity,
        });
        self.ceiling.start();
    }

    /// Starts a hedge or race: the primary (unless it is at its cap: then the walk
    /// defers it like any other), and for a race the partner at once (unless it is at
    /// its cap), for a hedge the timer.
    pub async fn start_fan_out(&mut self) {
        let fan_out = self.planned.plan.fan_out;
        if matches!(fan_out, FanOut::Single(_)) {
            return;
        }
        let store = self.call.app.store();
        let (Some(primary), Some(partner)) = (self.account_at(0), self.account_at(1)) else {
            self.extra = None;
            return;
        };
        let Capacity::Free(slot) = capacity(store, &primary).await else {
            // No fan-out after all: the extra attempt is given back.
            self.extra = None;
            return;
        };
        self.start(
            0,
            self.planned.plan.primary(),
            FanOutRole::Primary,
            primary,
            slot,
        );
        self.next = 1;
        match fan_out {
            FanOut::Race { .. } => match capacity(store, &partner).await {
                Capacity::Free(slot) => self.fire_backup(partner, slot, true),
                Capacity::Full(_) => self.extra = None,
            },
            FanOut::Hedge { delay_ms, .. } => {
                self.hedge_timer = Some(Box::pin(tokio::time::sleep(Duration::from_millis(
                    delay_ms,
                ))));
            }
            FanOut::Single(_) => {}
        }
    }

    fn fire_backup(&mut self, partner: Arc<Account>, slot: Option<SlotGuard>, race: bool) {
        let index = self.planned.plan.get(1).unwrap_or_default();
        self.start(1, index, FanOutRole::Backup, partner, slot);
        self.call.app.metrics().backup_fired(race);
        self.backup_started = true;
        self.next = 2;
        if let Some(extra) = self.extra.take() {
            extra.fire();
        }
    }

    /// Whether nothing is in flight.
    pub fn idle(&self) -> bool {
        self.running.iter().all(Option::is_none)
    }

    /// Nothing is in flight: starts the next attempt of the plan, or, when every
    /// other account is used up and some were at their cap, waits in the queue for a
    /// slot of one of those. `false` when nothing more can start.
    pub async fn launch_next(&mut self, ctx: &mut RequestContext<'_>) -> bool {
        if self.hedge_timer.take().is_some() {
            // The primary failed before the hedge delay: the partner is simply the
            // next attempt of the plan; the budget's extra attempt is given back.
            self.extra = None;
        }
        let store = self.call.app.store();
        while self.ceiling.may_start() && self.next < self.planned.plan.len() {
            let index = self.planned.plan.get(self.next).unwrap_or_default();
            let Some(account) = self.account_at(self.next) else {
                self.next += 1;
                continue;
            };
            self.next += 1;
            let candidate = &self.planned.snapshot[index];
            let base_url = candidate.base_url.as_deref().unwrap_or("");
            if !store.health().breakers.allow(base_url, now_ms()) {
                ctx.attempt(&candidate.id, None, "breaker_open", None, now_ms());
                continue;
            }
            match capacity(store, &account).await {
                Capacity::Free(slot) => {
                    self.start(0, index, FanOutRole::Primary, account, slot);
                    return true;
                }
                Capacity::Full(cap) => self.deferred.push(Deferred {
                    index,
                    account,
                    cap,
                }),
            }
        }
        if !self.ceiling.may_start() || self.deferred.is_empty() {
            return false;
        }
        self.wait_for_slot().await
    }

    /// Every other account of the plan is used up: waits in the queue (round-robin
    /// across callers) for the first slot of the accounts at their cap.
    async fn wait_for_slot(&mut self) -> bool {
        let settings = self.call.config.server();
        let wants: Vec<_> = self
            .deferred
            .iter()
            .map(|d| (d.account.id().clone(), d.cap))
            .collect();
        let max_wait = Duration::from_millis(settings.queue_max_wait_ms);
        let caller = format!("{}/{}", self.call.key.org(), self.call.key.id());
        let waited = self
            .call
            .app
            .store()
            .slots()
            .wait(&caller, &wants, max_wait, settings.queue_max_depth)
            .await;
        match waited {
            Ok(slot) => {
                let Some(pos) = self
                    .deferred
                    .iter()
                    .position(|d| d.account.id() == slot.account())
                else {
                    return false;
                };
                let d = self.deferred.remove(pos);
                self.start(0, d.index, FanOutRole::Primary, d.account, Some(slot));
                true
            }
            Err(e) => {
                self.call
                    .app
                    .metrics()
                    .queue_rejection(matches!(e, StoreError::QueueFull { .. }));
                self.stopped = Some(Stopped::Queue(e));
                false
            }
        }
    }

    /// Waits for the next event: an attempt done, or the hedge delay.
    pub async fn next_event(&mut self) -> Event {
        std::future::poll_fn(|cx| {
            let Self {
                running, inline, ..
            } = &mut *self;
            for (i, running) in running.iter_mut().enumerate() {
                let Some(running) = running else { continue };
                let poll = match &mut running.future {
                    AttemptSlot::Boxed(future) => future.as_mut().poll(cx),
                    AttemptSlot::Inline => match inline.as_mut().as_pin_mut() {
                        Some(future) => future.poll(cx),
                        // Never: the slot is emptied only with its attempt.
                        None => continue,
                    },
                };
                if let Poll::Ready(result) = poll {
                    return Poll::Ready(Event::Done(i, result));
                }
            }
            if let Some(timer) = self.hedge_timer.as_mut()
                && timer.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(Event::HedgeDelay);
            }
            Poll::Pending
        })
        .await
    }

    /// The hedge delay passed: fires the backup when the primary is still running
    /// without a first chunk and the partner has a free slot; otherwise the extra
    /// attempt is given back.
    pub async fn on_hedge_delay(&mut self) {
        self.hedge_timer = None;
        let primary_has_chunk = self.running[0]
            .as_ref()
            .is_some_and(|r| r.first_chunk.load(Ordering::Acquire));
        let partner = self.account_at(1);
        let slot = match &partner {
            Some(account) if self.running[0].is_some() && !primary_has_chunk && self.next == 1 => {
                match capacity(self.call.app.store(), account).await {
                    Capacity::Free(slot) => Some(slot),
                    Capacity::Full(_) => None,
                }
            }
            _ => None,
        };
        match (partner, slot) {
            (Some(account), Some(slot)) => self.fire_backup(account, slot, false),
            _ => self.extra = None,
        }
    }

    /// The attempt `running[which]` reached its commit point: its fan-out partner, if
    /// any, is aborted. The session to bind to the account that served, if the request
    /// has one: the caller awaits [`bind_session`] before [`Walker::on_done`] commits.
    pub fn on_win(
        &mut self,
        which: usize,
        ctx: &mut RequestContext<'_>,
    ) -> Option<(&Session, &AccountId)> {
        // out of the array while the others are aborted, back for `on_done`
        let running = self.running[which].take()?;
        self.won(&running, ctx);
        let index = running.index;
        self.running[which] = Some(running);
        let session = self.planned.session.as_ref()?;
        Some((session, &self.planned.snapshot[index].id))
    }

    /// The attempt `running[which]` finished: the answer when it reached its commit
    /// point ([`Walker::on_win`] was called for it), else its failure is credited and
    /// the walk goes on (or stops, on a second request error or keypool's own failure).
    ///
    /// Not async: the attempt's result (a few hundred bytes) is not moved into a
    /// future per request (issue 22); the one await of a win, the session's binding,
    /// is the caller's, in a future of its own.
    pub fn on_done(
        &mut self,
        which: usize,
        result: Result<Ready, Failure>,
        ctx: &mut RequestContext<'_>,
    ) -> Option<Response<ProxyBody>> {
        let running = self.take(which)?;
        match result {
            Ok(ready) => {
                // `on_win` aborted the partner
                debug_assert!(self.running.iter().all(Option::is_none));
                let snapshot = &self.planned.snapshot;
                Some(commit(
                    self.call,
                    &snapshot[running.index],
                    snapshot.len(),
                    running,
                    ready,
                    ctx,
                ))
            }
            Err(failure) => {
                self.failed(running, failure, ctx);
                None
            }
        }
    }

    /// `running` (taken out of `self.running`) won: its fan-out partner, if any, is
    /// aborted.
    fn won(&mut self, running: &Running<'c>, ctx: &mut RequestContext<'_>) {
        let app = self.call.app;
        // A win counts only when primary and backup really ran together.
        if self.backup_started {
            app.metrics().fan_out_win(running.role);
        }
        // The other attempt, if any, is aborted in flight: dropped, credited nothing.
        self.abort_others(ctx);
        app.metrics().attempts(self.ceiling.started() as u64);
    }

    fn failed(&mut self, running: Running<'c>, failure: Failure, ctx: &mut RequestContext<'_>) {
        let snapshot = &self.planned.snapshot;
        let candidate = &snapshot[running.index];
        let Some(c) = record_failure(
            self.call,
            candidate,
            running.started_at,
            snapshot.len(),
            &failure,
        ) else {
            // keypool's own resources ran out: nothing is the account's fault and the
            // next account would fail the same way.
            if let Failure::Local(local) = failure {
                tracing::error!(
                    account = %candidate.id,
                    resource = local.as_str(),
                    "keypool's own resources ran out during an attempt; not counted against the account"
                );
                self.call.app.metrics().local_failure(local.as_str());
            }
            ctx.attempt(
                &candidate.id,
                None,
                "local_failure",
                None,
                running.started_at,
            );
            self.abort_others(ctx);
            self.stopped = Some(Stopped::Local);
            return;
        };
        let status = match &failure {
            Failure::Status { status, .. } => Some(status.as_u16()),
            _ => None,
        };
        ctx.attempt(
            &candidate.id,
            status,
            c.trigger.as_str(),
            Some(c.class.as_str()),
            running.started_at,
        );
        let in_flight = self.running.iter().filter(|r| r.is_some()).count();
        self.ceiling.failed(c.is_request_error(), in_flight);
        self.last_failure = Some((failure, running.index));
        if self.ceiling.terminal() {
            self.abort_others(ctx);
        }
    }

    /// Drops the attempts still in flight (their upstream connections close), noting
    /// them as aborted.
    fn abort_others(&mut self, ctx: &mut RequestContext<'_>) {
        for which in 0..self.running.len() {
            if let Some(other) = self.take(which) {
                let id = &self.planned.snapshot[other.index].id;
                ctx.attempt(id, None, "aborted", None, other.started_at);
            }
        }
    }

    /// Takes `running[which]` out of the walk; its future, if inline, is dropped now
    /// (finished, or aborted in flight).
    fn take(&mut self, which: usize) -> Option<Running<'c>> {
        let running = self.running[which].take()?;
        if matches!(running.future, AttemptSlot::Inline) {
            self.inline.set(None);
        }
        Some(running)
    }

    /// Whether the walk must end now (keypool's own failure).
    pub fn must_stop(&self) -> bool {
        matches!(self.stopped, Some(Stopped::Local))
    }
}

/// Binds, re-binds or refreshes the request's session to `served`, the account that
/// served it (a future of its own, holding only what it needs).
pub(super) async fn bind_session(call: &Call<'_>, session: &Session, served: &AccountId) {
    let app = call.app;
    let ttl = call.config.server().session_affinity_ttl_ms;
    app.store()
        .bind_session(&session.key, served, ttl, now_ms())
        .await;
    if session.bound.as_ref().is_some_and(|b| b != served) {
        app.metrics().affinity(AffinityOutcome::Rebind);
    }
}
