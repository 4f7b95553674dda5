//! The caller limits of SPEC 12 in the store: one check per request before any account
//! is chosen, and a [`LimitGuard`] that holds what the check took (a request in flight,
//! the worst case in each budget) until the request ends and settles it to the real
//! spend, exactly once, whatever ends the request.
//!
//! Without Redis the [`LimitBook`](keypool_ledger::LimitBook) of this process decides;
//! a budget entry starts from the usage ledger's totals of its period (which the state
//! file keeps), so a restart or a newly configured limit counts what was already spent.
//!
//! With Redis every replica checks against the same counters, one script per check
//! ([`crate::state::redis_limits`]); the hold of an admitted request is renewed by the
//! store's maintenance task while the request runs and settled by one script when it
//! ends. When Redis cannot be reached, `limits_fail_mode` decides: `open` checks this
//! process's book and sends the spend to Redis once it answers again; `closed` refuses
//! with [`LimitDenial::Unavailable`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use keypool_core::UnixMs;
use keypool_ledger::{
    AggregateKey, Ask, Budget, Dimension, LimitKind, Period, Refusal, Reservation, Spend, SpendKey,
    Totals, Who,
};

use crate::Store;
use crate::config::LimitsFailMode;
use crate::state::redis::RedisMirror;
use crate::state::redis_limits::{
    HOLD_RENEW_MS, HOLD_TTL_MS, SharedBudget, SharedCheck, SharedVerdict, hold_member, spend_key,
};

/// Settles waiting for Redis at most (older ones are dropped and counted).
const PENDING_MAX: usize = 10_000;

/// Why a request may not go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitDenial {
    /// Over a limit.
    Refused(Refusal),
    /// A shared limit cannot be checked: Redis is unreachable and `limits_fail_mode`
    /// is `closed`.
    Unavailable,
}

/// A request held in Redis: what its settle gives back.
#[derive(Debug)]
struct SharedHold {
    org: Arc<str>,
    caller: Arc<str>,
    /// The hold's JSON in the org's sorted set; `None` for a request admitted by this
    /// process while Redis was away (only its spend goes to Redis).
    member: Option<String>,
    in_flight: bool,
    budgets: Vec<String>,
    reserved: Spend,
}

/// What an admitted request holds until it ends: settled to the real spend by
/// [`LimitGuard::settle`], or to nothing when dropped unsettled (a request that never
/// reached an upstream).
#[derive(Debug)]
#[must_use = "dropping the guard settles the request at zero"]
pub struct LimitGuard {
    store: Store,
    local: Option<Reservation>,
    shared: Option<SharedHold>,
    reserved: Spend,
}

impl LimitGuard {
    /// Replaces the reservation by the request's real spend.
    pub fn settle(mut self, actual: Spend) {
        self.finish(actual);
    }

    /// The worst case reserved.
    pub fn reserved(&self) -> Spend {
        self.reserved
    }

    fn finish(&mut self, actual: Spend) {
        if let Some(reservation) = self.local.take() {
            self.store.runtime().limits.settle(reservation, actual);
        }
        if let Some(hold) = self.shared.take() {
            self.store.limit_holds().settle(&self.store, hold, actual);
        }
    }
}

impl Drop for LimitGuard {
    fn drop(&mut self) {
        self.finish(Spend::default());
    }
}

/// One request's check (the ledger's [`Ask`]: its key, limits, the org's team budget,
/// its worst case and whether it only counts against the request rate).
pub type LimitCheck<'a> = Ask<'a>;

/// A settle Redis did not take yet.
#[derive(Debug)]
struct PendingSettle {
    hold: SharedHold,
    actual: Spend,
}

/// The Redis side of this process's limits: the holds it renews and the settles
/// waiting for Redis.
#[derive(Debug, Default)]
pub(crate) struct LimitHolds {
    /// Hold JSON → org, renewed every [`HOLD_RENEW_MS`] while its request runs.
    held: Mutex<HashMap<String, Arc<str>>>,
    pending: Mutex<VecDeque<PendingSettle>>,
    next_id: AtomicU64,
    last_renewed: AtomicU64,
    /// Settles dropped because too many waited.
    dropped: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LimitHolds {
    fn settle(&self, store: &Store, hold: SharedHold, actual: Spend) {
        if let Some(member) = &hold.member {
            lock(&self.held).remove(member);
        }
        let mirror = store.redis().filter(|m| m.ready()).cloned();
        match (mirror, tokio::runtime::Handle::try_current()) {
            (Some(mirror), Ok(handle)) => {
                let holds = store.clone();
                handle.spawn(async move {
                    if send_settle(&mirror, &hold, actual).await.is_err() {
                        holds.limit_holds().queue(hold, actual);
                    }
                });
            }
            _ => self.queue(hold, actual),
        }
    }

    fn queue(&self, hold: SharedHold, actual: Spend) {
        let mut pending = lock(&self.pending);
        if pending.len() >= PENDING_MAX {
            pending.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        pending.push_back(PendingSettle { hold, actual });
    }

    /// Renews the holds when [`HOLD_RENEW_MS`] passed, and sends the settles that
    /// waited for Redis (the maintenance task calls this while Redis is ready).
    pub(crate) async fn maintain(&self, mirror: &RedisMirror, now: UnixMs) {
        loop {
            let Some(next) = lock(&self.pending).pop_front() else {
                break;
            };
            if send_settle(mirror, &next.hold, next.actual).await.is_err() {
                lock(&self.pending).push_front(next);
                return;
            }
        }
        if now.saturating_sub(self.last_renewed.load(Ordering::Relaxed)) < HOLD_RENEW_MS {
            return;
        }
        self.last_renewed.store(now, Ordering::Relaxed);
        let held: Vec<(String, Arc<str>)> = lock(&self.held)
            .iter()
            .map(|(m, o)| (m.clone(), o.clone()))
            .collect();
        for (member, org) in held {
            if mirror
                .limit_renew(&org, &member, now + HOLD_TTL_MS)
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Settles waiting for Redis, and the ones dropped because too many waited.
    pub fn pending(&self) -> (usize, u64) {
        (
            lock(&self.pending).len(),
            self.dropped.load(Ordering::Relaxed),
        )
    }
}

async fn send_settle(
    mirror: &RedisMirror,
    hold: &SharedHold,
    actual: Spend,
) -> Result<(), crate::StoreError> {
    mirror
        .limit_settle(
            &hold.org,
            &hold.caller,
            hold.member.as_deref(),
            hold.in_flight,
            &hold.budgets,
            hold.reserved,
            actual,
        )
        .await
}

/// The refusal of a shared check's answer that is neither admitted nor a seed request.
fn shared_refusal(
    verdict: SharedVerdict,
    check: &LimitCheck<'_>,
    cap: Option<u32>,
    budgets: &[Budget],
    now: UnixMs,
) -> Result<Refusal, crate::StoreError> {
    Ok(match verdict {
        SharedVerdict::OverRate(wait_us) => Refusal {
            kind: LimitKind::RequestsPerMinute,
            limit: check.limits.rate.map_or(0, |r| u64::from(r.per_minute)),
            used: 0,
            resets_at: None,
            retry_after_ms: Some(wait_us.div_ceil(1000)),
        },
        SharedVerdict::AtCap => {
            let cap = u64::from(cap.unwrap_or(0));
            Refusal {
                kind: LimitKind::MaxConcurrent,
                limit: cap,
                used: cap,
                resets_at: None,
                retry_after_ms: Some(1000),
            }
        }
        SharedVerdict::OverBudget(i, used) => match budgets.get(i) {
            Some(b) => refusal_of(b, used, now),
            None => {
                return Err(crate::StoreError::Redis(
                    "the limit script named a budget this check does not have".into(),
                ));
            }
        },
        SharedVerdict::Admitted | SharedVerdict::NeedsSeed(_) => {
            return Err(crate::StoreError::Redis(
                "the limit script's answer was read twice".into(),
            ));
        }
    })
}

fn refusal_of(budget: &Budget, used: u64, now: UnixMs) -> Refusal {
    let end = budget.period.end();
    Refusal {
        kind: budget.kind,
        limit: budget.limit,
        used,
        resets_at: Some(end),
        retry_after_ms: Some(end.saturating_sub(now)),
    }
}

impl Store {
    /// Checks a request against its key's limits (the models are the caller's to check
    /// first, [`Limits::check_model`]) and takes what it needs.
    ///
    /// # Errors
    /// [`LimitDenial`]: the first limit it is over (nothing was taken then), or a
    /// shared limit Redis cannot check with `limits_fail_mode = "closed"`. A refusal by
    /// a token or USD budget is alerted (`budget_reached`, once per caller and limit per
    /// `dedup_secs`).
    pub async fn check_limits(
        &self,
        check: &LimitCheck<'_>,
        now: UnixMs,
    ) -> Result<LimitGuard, LimitDenial> {
        let verdict = self.check_limits_unalerted(check, now).await;
        if let Err(LimitDenial::Refused(r)) = &verdict {
            self.alert_budget(check, r, now);
        }
        verdict
    }

    /// `budget_reached` for a refusal by a budget (rates and concurrency are not).
    fn alert_budget(&self, check: &LimitCheck<'_>, r: &Refusal, now: UnixMs) {
        let team = r.kind == LimitKind::TeamUsdPerMonth;
        let budget = matches!(
            r.kind,
            LimitKind::TokensPerDay
                | LimitKind::TokensPerMonth
                | LimitKind::UsdPerDay
                | LimitKind::UsdPerMonth
        );
        if !team && !budget {
            return;
        }
        let usd = matches!(
            r.kind,
            LimitKind::UsdPerDay | LimitKind::UsdPerMonth | LimitKind::TeamUsdPerMonth
        );
        let amount = |v: u64| {
            if usd {
                format!("{:.2} USD", v as f64 / keypool_ledger::NANO_PER_USD as f64)
            } else {
                format!("{v} tokens")
            }
        };
        let resets = r
            .resets_at
            .map(|t| format!("; it resets at {}", crate::alerts::rfc3339(t)))
            .unwrap_or_default();
        self.alert(crate::alerts::AlertEvent::new(
            crate::alerts::AlertKind::BudgetReached,
            crate::alerts::AlertSubject {
                org: Some(check.who.org.clone()),
                caller: (!team).then(|| check.who.caller.clone()),
                limit: Some(r.kind.as_str()),
                ..Default::default()
            },
            format!(
                "{} reached: {} used of {}{resets}",
                r.kind.as_str(),
                amount(r.used),
                amount(r.limit)
            ),
            now,
        ));
    }

    async fn check_limits_unalerted(
        &self,
        check: &LimitCheck<'_>,
        now: UnixMs,
    ) -> Result<LimitGuard, LimitDenial> {
        if let Some(mirror) = self.redis()
            && check.is_shared()
        {
            if mirror.ready() {
                match self.check_shared(mirror, check, now).await {
                    Ok(verdict) => return verdict,
                    Err(e) => tracing::debug!(error = %e, "limit check fell back"),
                }
            }
            if self.config().server().limits_fail_mode == LimitsFailMode::Closed {
                return Err(LimitDenial::Unavailable);
            }
            let mut guard = self.check_local(check, now)?;
            // Its spend reaches Redis's totals once Redis answers again.
            let budgets = shared_budget_keys(check, now);
            if !budgets.is_empty() {
                guard.shared = Some(SharedHold {
                    org: check.who.org.clone(),
                    caller: check.who.caller.clone(),
                    member: None,
                    in_flight: false,
                    budgets,
                    reserved: Spend::default(),
                });
            }
            return Ok(guard);
        }
        self.check_local(check, now)
    }

    fn check_local(&self, check: &LimitCheck<'_>, now: UnixMs) -> Result<LimitGuard, LimitDenial> {
        let seed = |key: &SpendKey| self.spent_so_far(key);
        let reservation = self
            .runtime()
            .limits
            .check(check, now, &seed)
            .map_err(LimitDenial::Refused)?;
        Ok(LimitGuard {
            store: self.clone(),
            reserved: reservation.ask,
            local: Some(reservation),
            shared: None,
        })
    }

    async fn check_shared(
        &self,
        mirror: &RedisMirror,
        check: &LimitCheck<'_>,
        now: UnixMs,
    ) -> Result<Result<LimitGuard, LimitDenial>, crate::StoreError> {
        let who = check.who;
        let budgets = check.budgets(now);
        let mut shared = shared_budgets(who, &budgets);
        let mut distinct: Vec<String> = shared.iter().map(|b| b.key.clone()).collect();
        distinct.sort();
        distinct.dedup();
        let cap = check.cap();
        let member = (cap.is_some() || !distinct.is_empty()).then(|| {
            let n = self.limit_holds().next_id.fetch_add(1, Ordering::Relaxed);
            let id = format!("{}:{n}", mirror.origin());
            hold_member(&id, &who.caller, check.worst, cap.is_some(), &distinct)
        });
        let rate = check
            .limits
            .rate
            .map(|r| (r.interval_us(), r.tolerance_us()));
        // At most two rounds: the second carries the seeds the first asked for.
        for _ in 0..2 {
            let verdict = mirror
                .limit_check(
                    &SharedCheck {
                        org: &who.org,
                        caller: &who.caller,
                        rate,
                        cap,
                        hold: member.as_deref(),
                        worst: check.worst,
                        budgets: &shared,
                    },
                    now,
                )
                .await?;
            let refusal = match verdict {
                SharedVerdict::Admitted => {
                    if let Some(m) = &member {
                        lock(&self.limit_holds().held).insert(m.clone(), who.org.clone());
                    }
                    let held = member.is_some();
                    return Ok(Ok(LimitGuard {
                        store: self.clone(),
                        local: None,
                        reserved: if held { check.worst } else { Spend::default() },
                        shared: member.map(|m| SharedHold {
                            org: who.org.clone(),
                            caller: who.caller.clone(),
                            member: Some(m),
                            in_flight: cap.is_some(),
                            budgets: distinct,
                            reserved: check.worst,
                        }),
                    }));
                }
                SharedVerdict::NeedsSeed(_) => {
                    for (b, budget) in shared.iter_mut().zip(&budgets) {
                        let key = SpendKey {
                            org: who.org.clone(),
                            caller: (!budget.is_team()).then(|| who.caller.clone()),
                            period: budget.period,
                        };
                        b.seed = Some(self.shared_spent_so_far(mirror, &key).await?);
                    }
                    continue;
                }
                refused => shared_refusal(refused, check, cap, &budgets, now)?,
            };
            return Ok(Err(LimitDenial::Refused(refusal)));
        }
        Err(crate::StoreError::Redis(
            "the limit script asked for a seed twice".into(),
        ))
    }

    /// What the usage ledger says a budget's key (or its whole org, for the team
    /// budget) spent in the key's period: where a new budget entry starts.
    fn spent_so_far(&self, key: &SpendKey) -> Spend {
        let aggregates = &self.usage().aggregates;
        let totals = match &key.caller {
            Some(caller) => aggregates.get(&AggregateKey {
                period: key.period,
                dimension: Dimension::Caller,
                org: key.org.clone(),
                key: caller.clone(),
            }),
            None => {
                let mut sum = Totals::default();
                for (org, _, t) in aggregates.rows(key.period, Dimension::Caller) {
                    if org == key.org {
                        sum.add(&t);
                    }
                }
                sum
            }
        };
        spend_of(&totals)
    }

    /// [`Store::spent_so_far`] from every replica's usage totals in Redis.
    async fn shared_spent_so_far(
        &self,
        mirror: &RedisMirror,
        key: &SpendKey,
    ) -> Result<Spend, crate::StoreError> {
        let rows = mirror.usage_rows(key.period, Dimension::Caller).await?;
        let mut sum = Totals::default();
        for ((org, caller), t) in &rows {
            if *org == key.org && key.caller.as_ref().is_none_or(|c| c == caller) {
                sum.add(t);
            }
        }
        Ok(spend_of(&sum))
    }

    /// A key's (or, with `caller: None`, its org's) use of a budget now, settled and
    /// reserved, for the admin API and the status page: Redis's totals when Redis is
    /// configured and answers, else this process's.
    pub async fn limit_usage(&self, key: &SpendKey) -> Spend {
        if let Some(mirror) = self.redis().filter(|m| m.ready()) {
            let hash = spend_key(&key.org, key.caller.as_deref(), key.period);
            match mirror.limit_usage(std::slice::from_ref(&hash)).await {
                Ok(v) => match v.first().copied().flatten() {
                    Some(spend) => return spend,
                    None => {
                        if let Ok(spend) = self.shared_spent_so_far(mirror, key).await {
                            return spend;
                        }
                    }
                },
                Err(e) => tracing::debug!(error = %e, "limit usage read from memory"),
            }
        }
        match self.runtime().limits.entry(key) {
            Some(entry) => entry.used(),
            None => self.spent_so_far(key),
        }
    }

    /// Limit settles waiting for Redis to answer again, and the ones dropped (too many
    /// waited) since boot.
    pub fn limit_settles_pending(&self) -> (usize, u64) {
        self.limit_holds().pending()
    }

    /// Requests of `who` in flight under its `max_concurrent`, in this process.
    pub fn limit_in_flight(&self, who: &Who) -> u32 {
        self.runtime().limits.in_flight(who)
    }
}

/// The budgets of a shared check, with their Redis hashes (seeds not known yet).
fn shared_budgets(who: &Who, budgets: &[Budget]) -> Vec<SharedBudget> {
    budgets
        .iter()
        .map(|b| SharedBudget {
            key: spend_key(&who.org, (!b.is_team()).then_some(&*who.caller), b.period),
            usd: b.kind.is_usd(),
            limit: b.limit,
            period_end: b.period.end(),
            seed: None,
        })
        .collect()
}

/// The distinct Redis budget hashes of a check.
fn shared_budget_keys(check: &LimitCheck<'_>, now: UnixMs) -> Vec<String> {
    let mut keys: Vec<String> = check
        .budgets(now)
        .iter()
        .map(|b| {
            spend_key(
                &check.who.org,
                (!b.is_team()).then_some(&*check.who.caller),
                b.period,
            )
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

fn spend_of(totals: &Totals) -> Spend {
    Spend {
        tokens: totals.tokens(),
        nano_usd: totals.cost_nano_usd,
    }
}

/// The period keys a budget of `kind` counts at `now` (for the admin API).
pub fn budget_period(kind: LimitKind, now: UnixMs) -> Option<Period> {
    use keypool_ledger::{Day, Month};
    match kind {
        LimitKind::TokensPerDay | LimitKind::UsdPerDay => Some(Period::Day(Day::of(now))),
        LimitKind::TokensPerMonth | LimitKind::UsdPerMonth | LimitKind::TeamUsdPerMonth => {
            Some(Period::Month(Month::of(now)))
        }
        _ => None,
    }
}
