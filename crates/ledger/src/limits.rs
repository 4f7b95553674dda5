//! Caller limits (SPEC 12) as pure policy: which models a key may use, its request rate
//! (GCRA), its requests in flight, and its token and cost budgets per UTC day and month,
//! with the org's team budget beside them.
//!
//! - [`Limits`]: one key's limits after the org's defaults were applied.
//! - [`Rate`]: the GCRA of `requests_per_minute` and `burst`; [`Rate::admit`] takes the
//!   cell's theoretical arrival time and `now` and says admitted (the new time) or how
//!   long until admitted.
//! - [`worst_case`]: what a request may cost at most, reserved before it is sent.
//! - [`LimitBook`]: the limit state of one process: GCRA cells, requests in flight, and
//!   per budget the settled spend and the reservations outstanding. [`LimitBook::check`]
//!   decides and reserves in one step; [`LimitBook::settle`] replaces a reservation by
//!   the real spend, exactly once (a [`Reservation`] is consumed by it).
//!
//! Time is an argument everywhere; nothing here reads a clock or does I/O. A shared
//! store (Redis) runs the same arithmetic in its own script and keeps this book only as
//! the fallback of an outage.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use keypool_core::{UnixMs, Usage};
use serde::{Deserialize, Serialize};

use crate::period::{Day, Month, Period};
use crate::price::{ModelGlob, NanoUsd, Prices};

/// A request rate: `per_minute` requests per minute on average, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    /// Requests per minute (at least 1).
    pub per_minute: u32,
    /// Requests admitted at once after a quiet spell (at least 1).
    pub burst: u32,
}

impl Rate {
    /// The emission interval `T`, µs: a minute over `per_minute`, rounded up (so the
    /// rate admitted is never above the one configured).
    pub fn interval_us(self) -> u64 {
        60_000_000u64.div_ceil(u64::from(self.per_minute.max(1)))
    }

    /// The tolerance `τ = (burst − 1) × T`, µs.
    pub fn tolerance_us(self) -> u64 {
        u64::from(self.burst.max(1) - 1) * self.interval_us()
    }

    /// The GCRA decision for a cell whose theoretical arrival time is `tat_us` (µs;
    /// `None` for a cell never used) at `now`: `Ok(new_tat_us)` when admitted, else
    /// `Err(µs until a request would be admitted)` (the cell is then unchanged).
    pub fn admit(self, tat_us: Option<u64>, now: UnixMs) -> Result<u64, u64> {
        let now_us = now.saturating_mul(1000);
        let tat = tat_us.unwrap_or(now_us).max(now_us);
        let allowed_at = tat.saturating_sub(self.tolerance_us());
        if allowed_at > now_us {
            Err(allowed_at - now_us)
        } else {
            Ok(tat.saturating_add(self.interval_us()))
        }
    }
}

/// Tokens (all four kinds summed) and cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Spend {
    /// Tokens.
    pub tokens: u64,
    /// Nano-USD.
    pub nano_usd: NanoUsd,
}

impl Spend {
    /// The spend of `usage` costing `nano_usd`.
    pub fn of(usage: &Usage, nano_usd: NanoUsd) -> Self {
        Self {
            tokens: usage.total(),
            nano_usd,
        }
    }

    /// `self + other`, saturating.
    #[must_use]
    pub fn plus(self, other: Spend) -> Self {
        Self {
            tokens: self.tokens.saturating_add(other.tokens),
            nano_usd: self.nano_usd.saturating_add(other.nano_usd),
        }
    }

    /// `self − other`, saturating at zero.
    #[must_use]
    pub fn minus(self, other: Spend) -> Self {
        Self {
            tokens: self.tokens.saturating_sub(other.tokens),
            nano_usd: self.nano_usd.saturating_sub(other.nano_usd),
        }
    }
}

/// What a request may cost at most (SPEC 12): `body_bytes / 3` input tokens (rounded
/// up) and `max_tokens` output tokens, at `prices` (no price: 0 USD).
pub fn worst_case(body_bytes: usize, max_tokens: u64, prices: Option<&Prices>) -> Spend {
    let usage = Usage {
        input_tokens: (body_bytes as u64).div_ceil(3),
        output_tokens: max_tokens,
        ..Usage::default()
    };
    Spend::of(&usage, prices.map_or(0, |p| p.cost(&usage)))
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// The model matches none of `models`.
    Models,
    /// The model matches one of `deny_models`.
    DenyModels,
    /// `requests_per_minute` (and `burst`).
    RequestsPerMinute,
    /// `max_concurrent` requests of the key.
    MaxConcurrent,
    /// `tokens_per_day`.
    TokensPerDay,
    /// `tokens_per_month`.
    TokensPerMonth,
    /// `usd_per_day`.
    UsdPerDay,
    /// `usd_per_month`.
    UsdPerMonth,
    /// The org's `usd_per_month`, shared by all its keys.
    TeamUsdPerMonth,
}

impl LimitKind {
    /// Every kind, in the order they are checked.
    pub const ALL: [LimitKind; 9] = [
        Self::Models,
        Self::DenyModels,
        Self::RequestsPerMinute,
        Self::MaxConcurrent,
        Self::TokensPerDay,
        Self::TokensPerMonth,
        Self::UsdPerDay,
        Self::UsdPerMonth,
        Self::TeamUsdPerMonth,
    ];

    /// The config name (`team_usd_per_month` for the org's budget).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Models => "models",
            Self::DenyModels => "deny_models",
            Self::RequestsPerMinute => "requests_per_minute",
            Self::MaxConcurrent => "max_concurrent",
            Self::TokensPerDay => "tokens_per_day",
            Self::TokensPerMonth => "tokens_per_month",
            Self::UsdPerDay => "usd_per_day",
            Self::UsdPerMonth => "usd_per_month",
            Self::TeamUsdPerMonth => "team_usd_per_month",
        }
    }

    /// Whether the limit counts USD (else tokens, for the budgets).
    pub const fn is_usd(self) -> bool {
        matches!(
            self,
            Self::UsdPerDay | Self::UsdPerMonth | Self::TeamUsdPerMonth
        )
    }
}

/// One budget of a request: a kind, whose spend it counts (the key's or the org's), a
/// period and the limit (tokens, or nano-USD).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Which budget.
    pub kind: LimitKind,
    /// The day or month it counts.
    pub period: Period,
    /// The most tokens or nano-USD.
    pub limit: u64,
}

impl Budget {
    /// The part of `spend` this budget counts.
    pub fn amount(&self, spend: Spend) -> u64 {
        if self.kind.is_usd() {
            spend.nano_usd
        } else {
            spend.tokens
        }
    }

    /// Whether the team's spend (else the key's) is counted.
    pub fn is_team(&self) -> bool {
        self.kind == LimitKind::TeamUsdPerMonth
    }
}

/// One key's limits, the org's defaults applied (SPEC 12). Empty = no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// Models the key may use (any, when empty).
    pub models: Vec<ModelGlob>,
    /// Models the key may not use.
    pub deny_models: Vec<ModelGlob>,
    /// `requests_per_minute` and `burst`.
    pub rate: Option<Rate>,
    /// Requests of the key in flight at once.
    pub max_concurrent: Option<u32>,
    /// Tokens per UTC day.
    pub tokens_per_day: Option<u64>,
    /// Tokens per UTC month.
    pub tokens_per_month: Option<u64>,
    /// Nano-USD per UTC day.
    pub usd_per_day: Option<NanoUsd>,
    /// Nano-USD per UTC month.
    pub usd_per_month: Option<NanoUsd>,
}

impl Limits {
    /// Whether the key has no limit at all.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Whether any token or cost budget is set.
    pub fn has_budget(&self) -> bool {
        self.tokens_per_day.is_some()
            || self.tokens_per_month.is_some()
            || self.usd_per_day.is_some()
            || self.usd_per_month.is_some()
    }

    /// `Err` with the refusing kind when `model` is not allowed.
    pub fn check_model(&self, model: &str) -> Result<(), LimitKind> {
        if self.deny_models.iter().any(|g| g.matches(model)) {
            return Err(LimitKind::DenyModels);
        }
        if !self.models.is_empty() && !self.models.iter().any(|g| g.matches(model)) {
            return Err(LimitKind::Models);
        }
        Ok(())
    }

    /// The budgets of a request at `now`, the team's `team_usd_per_month` last.
    pub fn budgets(&self, team_usd_per_month: Option<NanoUsd>, now: UnixMs) -> Vec<Budget> {
        budgets_of(self, team_usd_per_month, now).collect()
    }
}

/// Whose spend a budget entry holds: one key's, or (`caller: None`) the whole org's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SpendKey {
    /// The org.
    pub org: Arc<str>,
    /// The key's id; `None` for the org's team budget.
    pub caller: Option<Arc<str>>,
    /// The day or month.
    pub period: Period,
}

/// A budget's state: what settled, and what requests in flight reserved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpendEntry {
    /// The spend of finished requests (and, for an entry created mid-period, of the
    /// ones before it, from its seed).
    pub settled: Spend,
    /// The worst cases reserved by requests in flight.
    pub reserved: Spend,
}

impl SpendEntry {
    /// Settled and reserved together: what a new request must fit beside.
    pub fn used(&self) -> Spend {
        self.settled.plus(self.reserved)
    }
}

/// A refused request: which limit, its value, what was used, and when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The limit.
    pub kind: LimitKind,
    /// Its value (requests per minute, requests, tokens or nano-USD; 0 for models).
    pub limit: u64,
    /// What was used (tokens or nano-USD, settled and reserved), for the budgets.
    pub used: u64,
    /// When its period ends (the budgets).
    pub resets_at: Option<UnixMs>,
    /// How long until a request could be admitted, ms (none for models).
    pub retry_after_ms: Option<u64>,
}

/// The key a request is checked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Who {
    /// The org.
    pub org: Arc<str>,
    /// The key's id.
    pub caller: Arc<str>,
}

/// What one admitted request holds until it is settled: its worst case in each of its
/// budgets (the key's day and month, the team's month), and one request in flight
/// when the key has `max_concurrent`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a reservation is settled exactly once"]
pub struct Reservation {
    /// The key.
    pub who: Who,
    /// The worst case reserved.
    pub ask: Spend,
    /// The key's day entry it is reserved in.
    pub day: Option<Day>,
    /// The key's month entry it is reserved in.
    pub month: Option<Month>,
    /// The team's month entry it is reserved in.
    pub team: Option<Month>,
    /// Whether it holds one of the key's `max_concurrent`.
    pub in_flight: bool,
}

impl Reservation {
    /// A reservation that holds nothing (a key without budgets or cap).
    pub fn empty(who: Who) -> Self {
        Self {
            who,
            ask: Spend::default(),
            day: None,
            month: None,
            team: None,
            in_flight: false,
        }
    }

    /// The entries it is reserved in.
    pub fn keys(&self) -> Vec<SpendKey> {
        let key = |caller: Option<&Arc<str>>, period| SpendKey {
            org: self.who.org.clone(),
            caller: caller.cloned(),
            period,
        };
        let caller = Some(&self.who.caller);
        let mut keys = Vec::new();
        keys.extend(self.day.map(|d| key(caller, Period::Day(d))));
        keys.extend(self.month.map(|m| key(caller, Period::Month(m))));
        keys.extend(self.team.map(|m| key(None, Period::Month(m))));
        keys
    }
}

/// What a check needs besides the book: the key's limits, the org's team budget, the
/// request's worst case and whether it is a `count_tokens` call (rate only).
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The key.
    pub who: &'a Who,
    /// Its limits.
    pub limits: &'a Limits,
    /// The org's `usd_per_month`.
    pub team_usd_per_month: Option<NanoUsd>,
    /// The request's worst case.
    pub worst: Spend,
    /// `count_tokens` counts against the request rate only.
    pub rate_only: bool,
}

/// The maps hash with `foldhash` (randomly seeded per map): a limited request looks
/// up its key's cell and each of its budgets twice (check, settle), and SipHash was
/// most of the limits' cost (`docs/BENCHMARKS.md`).
type Hasher = foldhash::fast::RandomState;

impl Ask<'_> {
    /// Its budgets at `now` (none for a `count_tokens` call), the team's last.
    pub fn budgets(&self, now: UnixMs) -> Vec<Budget> {
        if self.rate_only {
            Vec::new()
        } else {
            self.limits.budgets(self.team_usd_per_month, now)
        }
    }

    /// The key's `max_concurrent`, when it holds this request (not `count_tokens`).
    pub fn cap(&self) -> Option<u32> {
        if self.rate_only {
            None
        } else {
            self.limits.max_concurrent
        }
    }

    /// Whether anything but the models is limited: what a shared store shares.
    pub fn is_shared(&self) -> bool {
        self.limits.rate.is_some()
            || (!self.rate_only
                && (self.limits.max_concurrent.is_some()
                    || self.limits.has_budget()
                    || self.team_usd_per_month.is_some()))
    }
}

/// Everything of one key: its request-rate cell, its requests in flight and its
/// day and month budget entries (one look-up per request finds them all).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct KeyState {
    /// GCRA theoretical arrival time, µs (`None`: never used, or only a cap).
    tat: Option<u64>,
    /// Requests in flight under its `max_concurrent`.
    in_flight: u32,
    day: Option<(Day, SpendEntry)>,
    month: Option<(Month, SpendEntry)>,
}

impl KeyState {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<Who, KeyState, Hasher>,
    /// The team budget's entry per org.
    teams: HashMap<Arc<str>, (Month, SpendEntry), Hasher>,
}

/// The limit state of one process (see the module docs). One mutex, held for a few
/// hash-map operations per request (two at most: the key, its org's team budget),
/// never across anything that waits.
#[derive(Debug, Default)]
pub struct LimitBook {
    state: Mutex<State>,
}

/// The budgets of a request, without an allocation: the team's last.
fn budgets_of(
    limits: &Limits,
    team_usd_per_month: Option<NanoUsd>,
    now: UnixMs,
) -> impl Iterator<Item = Budget> {
    let day = Period::Day(Day::of(now));
    let month = Period::Month(Month::of(now));
    [
        (LimitKind::TokensPerDay, day, limits.tokens_per_day),
        (LimitKind::TokensPerMonth, month, limits.tokens_per_month),
        (LimitKind::UsdPerDay, day, limits.usd_per_day),
        (LimitKind::UsdPerMonth, month, limits.usd_per_month),
        (LimitKind::TeamUsdPerMonth, month, team_usd_per_month),
    ]
    .into_iter()
    .filter_map(|(kind, period, limit)| {
        Some(Budget {
            kind,
            period,
            limit: limit?,
        })
    })
}

/// The entry of `period` in `slot`, started from `seed` when the slot holds none or
/// an older period's.
fn current<P: Copy + PartialEq>(
    slot: &mut Option<(P, SpendEntry)>,
    period: P,
    seed: impl FnOnce() -> Spend,
) -> SpendEntry {
    match slot {
        Some((p, entry)) if *p == period => *entry,
        _ => {
            let entry = SpendEntry {
                settled: seed(),
                reserved: Spend::default(),
            };
            *slot = Some((period, entry));
            entry
        }
    }
}

/// Adds `delta` to the reservation of `slot`'s entry when it is of `period`.
fn reserve<P: Copy + PartialEq>(slot: &mut Option<(P, SpendEntry)>, period: P, delta: Spend) {
    if let Some((p, entry)) = slot
        && *p == period
    {
        entry.reserved = entry.reserved.plus(delta);
    }
}

/// Replaces `ask` reserved in `slot`'s entry of `period` by `actual` (an entry of a
/// period that ended meanwhile is gone: nothing to settle there).
fn settle_in<P: Copy + PartialEq>(
    slot: &mut Option<(P, SpendEntry)>,
    period: P,
    ask: Spend,
    actual: Spend,
) {
    if let Some((p, entry)) = slot
        && *p == period
    {
        entry.reserved = entry.reserved.minus(ask);
        entry.settled = entry.settled.plus(actual);
    }
}

impl LimitBook {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks a request against every limit except the models (checked first, by
    /// [`Limits::check_model`]) and, when it passes, takes its rate cell, one request
    /// in flight and its worst case in each budget, all in one step. `seed` gives the
    /// spend an entry starts from when a budget is first used in a period (the
    /// period's usage so far); it is called at most once per entry.
    ///
    /// # Errors
    /// The first limit the request is over, in [`LimitKind::ALL`] order; nothing was
    /// taken then.
    pub fn check(
        &self,
        ask: &Ask<'_>,
        now: UnixMs,
        seed: &dyn Fn(&SpendKey) -> Spend,
    ) -> Result<Reservation, Refusal> {
        let who = ask.who;
        let mut guard = self.lock();
        let State { keys, teams } = &mut *guard;
        let slot = keys.get_mut(who);
        let mut cell = slot.as_deref().copied().unwrap_or_default();
        let verdict = decide(&mut cell, teams, ask, now, seed);
        match slot {
            Some(s) => *s = cell,
            None if !cell.is_empty() => {
                keys.insert(who.clone(), cell);
            }
            None => {}
        }
        verdict
    }

    /// Replaces `reservation` by the request's real spend `actual` (zero when it never
    /// reached an upstream) and gives back its request in flight.
    pub fn settle(&self, reservation: Reservation, actual: Spend) {
        let mut guard = self.lock();
        let State { keys, teams } = &mut *guard;
        let ask = reservation.ask;
        if (reservation.in_flight || reservation.day.is_some() || reservation.month.is_some())
            && let Some(cell) = keys.get_mut(&reservation.who)
        {
            if let Some(d) = reservation.day {
                settle_in(&mut cell.day, d, ask, actual);
            }
            if let Some(m) = reservation.month {
                settle_in(&mut cell.month, m, ask, actual);
            }
            if reservation.in_flight {
                cell.in_flight = cell.in_flight.saturating_sub(1);
            }
            if cell.is_empty() {
                keys.remove(&reservation.who);
            }
        }
        if let Some(m) = reservation.team
            && let Some(team) = teams.get_mut(&reservation.who.org)
        {
            let mut slot = Some(*team);
            settle_in(&mut slot, m, ask, actual);
            if let Some(t) = slot {
                *team = t;
            }
        }
    }

    /// The entry of `key`, if a check created it.
    pub fn entry(&self, key: &SpendKey) -> Option<SpendEntry> {
        let state = self.lock();
        match (&key.caller, key.period) {
            (None, Period::Month(m)) => state
                .teams
                .get(&key.org)
                .filter(|(p, _)| *p == m)
                .map(|(_, e)| *e),
            (None, Period::Day(_)) => None,
            (Some(caller), period) => {
                let cell = state.keys.get(&Who {
                    org: key.org.clone(),
                    caller: caller.clone(),
                })?;
                match period {
                    Period::Day(d) => cell.day.filter(|(p, _)| *p == d).map(|(_, e)| e),
                    Period::Month(m) => cell.month.filter(|(p, _)| *p == m).map(|(_, e)| e),
                }
            }
        }
    }

    /// Sets the settled spend of `key` (a shared store's total, so an outage starts
    /// from it); its reservations are kept.
    pub fn set_settled(&self, key: SpendKey, settled: Spend) {
        let mut state = self.lock();
        let set = |entry: &mut Option<(Period, SpendEntry)>| {
            let mut e = entry.map_or_else(SpendEntry::default, |(_, e)| e);
            e.settled = settled;
            e
        };
        match (key.caller, key.period) {
            (None, Period::Month(m)) => {
                let slot = state
                    .teams
                    .entry(key.org)
                    .or_insert((m, SpendEntry::default()));
                let reserved = if slot.0 == m {
                    slot.1.reserved
                } else {
                    Spend::default()
                };
                *slot = (m, SpendEntry { settled, reserved });
            }
            (None, Period::Day(_)) => {}
            (Some(caller), period) => {
                let cell = state
                    .keys
                    .entry(Who {
                        org: key.org,
                        caller,
                    })
                    .or_default();
                match period {
                    Period::Day(d) => {
                        let mut slot = cell
                            .day
                            .filter(|(p, _)| *p == d)
                            .map(|(p, e)| (Period::Day(p), e));
                        cell.day = Some((d, set(&mut slot)));
                    }
                    Period::Month(m) => {
                        let mut slot = cell
                            .month
                            .filter(|(p, _)| *p == m)
                            .map(|(p, e)| (Period::Month(p), e));
                        cell.month = Some((m, set(&mut slot)));
                    }
                }
            }
        }
    }

    /// Requests of `who` in flight under its `max_concurrent`.
    pub fn in_flight(&self, who: &Who) -> u32 {
        self.lock().keys.get(who).map_or(0, |c| c.in_flight)
    }

    /// Drops entries of periods that ended before `now` with nothing reserved, and GCRA
    /// cells in the past (a fresh cell admits the same).
    pub fn prune(&self, now: UnixMs) {
        let now_us = now.saturating_mul(1000);
        let ended = |end: UnixMs, e: &SpendEntry| end <= now && e.reserved == Spend::default();
        let mut state = self.lock();
        state.keys.retain(|_, c| {
            if c.tat.is_some_and(|t| t <= now_us) {
                c.tat = None;
            }
            if c.day.is_some_and(|(d, e)| ended(d.end(), &e)) {
                c.day = None;
            }
            if c.month.is_some_and(|(m, e)| ended(m.end(), &e)) {
                c.month = None;
            }
            !c.is_empty()
        });
        state.teams.retain(|_, (m, e)| !ended(m.end(), e));
    }

    /// The GCRA cells still ahead of `now`, for the state file.
    pub fn export_cells(&self, now: UnixMs) -> Vec<(Arc<str>, Arc<str>, u64)> {
        let now_us = now.saturating_mul(1000);
        let mut cells: Vec<_> = self
            .lock()
            .keys
            .iter()
            .filter_map(|(w, c)| Some((w, c.tat.filter(|t| *t > now_us)?)))
            .map(|(w, tat)| (w.org.clone(), w.caller.clone(), tat))
            .collect();
        cells.sort();
        cells
    }

    /// Takes GCRA cells from the state file (the later time wins).
    pub fn import_cells(&self, cells: impl IntoIterator<Item = (Arc<str>, Arc<str>, u64)>) {
        let mut state = self.lock();
        for (org, caller, tat) in cells {
            let cell = state.keys.entry(Who { org, caller }).or_default();
            cell.tat = Some(cell.tat.map_or(tat, |t| t.max(tat)));
        }
    }
}

/// [`LimitBook::check`] on a copy of the key's state: every limit, then (admitted)
/// every take. A refusal leaves `cell` as it was but for entries it started (so a
/// seed is asked once).
fn decide(
    cell: &mut KeyState,
    teams: &mut HashMap<Arc<str>, (Month, SpendEntry), Hasher>,
    ask: &Ask<'_>,
    now: UnixMs,
    seed: &dyn Fn(&SpendKey) -> Spend,
) -> Result<Reservation, Refusal> {
    let who = ask.who;
    let limits = ask.limits;
    let tat = match limits.rate {
        None => None,
        Some(rate) => Some(rate.admit(cell.tat, now).map_err(|wait_us| Refusal {
            kind: LimitKind::RequestsPerMinute,
            limit: u64::from(rate.per_minute),
            used: 0,
            resets_at: None,
            retry_after_ms: Some(wait_us.div_ceil(1000)),
        })?),
    };
    let cap = ask.cap();
    if let Some(cap) = cap
        && cell.in_flight >= cap
    {
        return Err(Refusal {
            kind: LimitKind::MaxConcurrent,
            limit: u64::from(cap),
            used: u64::from(cap),
            resets_at: None,
            retry_after_ms: Some(1000),
        });
    }
    let day = Day::of(now);
    let month = day.month();
    let uses = if ask.rate_only {
        Uses::default()
    } else {
        check_budgets(cell, teams, ask, now, seed)?
    };
    // Everything passed: take it all.
    if tat.is_some() {
        cell.tat = tat;
    }
    if cap.is_some() {
        cell.in_flight += 1;
    }
    if uses.day {
        reserve(&mut cell.day, day, ask.worst);
    }
    if uses.month {
        reserve(&mut cell.month, month, ask.worst);
    }
    if uses.team
        && let Some(team) = teams.get_mut(&who.org)
    {
        let mut slot = Some(*team);
        reserve(&mut slot, month, ask.worst);
        if let Some(t) = slot {
            *team = t;
        }
    }
    let (uses_day, uses_month, uses_team) = (uses.day, uses.month, uses.team);
    Ok(Reservation {
        who: who.clone(),
        ask: ask.worst,
        day: uses_day.then_some(day),
        month: uses_month.then_some(month),
        team: uses_team.then_some(month),
        in_flight: cap.is_some(),
    })
}

/// Which entries a request's budgets use.
#[derive(Debug, Default, Clone, Copy)]
struct Uses {
    day: bool,
    month: bool,
    team: bool,
}

/// Checks every budget of `ask` against its entry (started from `seed` when new).
fn check_budgets(
    cell: &mut KeyState,
    teams: &mut HashMap<Arc<str>, (Month, SpendEntry), Hasher>,
    ask: &Ask<'_>,
    now: UnixMs,
    seed: &dyn Fn(&SpendKey) -> Spend,
) -> Result<Uses, Refusal> {
    let who = ask.who;
    let day = Day::of(now);
    let month = day.month();
    let key_of = |caller: bool, period| SpendKey {
        org: who.org.clone(),
        caller: caller.then(|| who.caller.clone()),
        period,
    };
    let mut uses = Uses::default();
    let mut team_entry = None;
    for budget in budgets_of(ask.limits, ask.team_usd_per_month, now) {
        let entry = match budget.kind {
            LimitKind::TokensPerDay | LimitKind::UsdPerDay => {
                uses.day = true;
                current(&mut cell.day, day, || seed(&key_of(true, Period::Day(day))))
            }
            LimitKind::TeamUsdPerMonth => {
                uses.team = true;
                *team_entry.get_or_insert_with(|| {
                    let mut slot = teams.get(&who.org).copied();
                    let e = current(&mut slot, month, || {
                        seed(&key_of(false, Period::Month(month)))
                    });
                    if let Some(t) = slot
                        && teams.get(&who.org) != Some(&t)
                    {
                        teams.insert(who.org.clone(), t);
                    }
                    e
                })
            }
            _ => {
                uses.month = true;
                current(&mut cell.month, month, || {
                    seed(&key_of(true, Period::Month(month)))
                })
            }
        };
        let used = budget.amount(entry.used());
        if used.saturating_add(budget.amount(ask.worst)) > budget.limit {
            let end = budget.period.end();
            return Err(Refusal {
                kind: budget.kind,
                limit: budget.limit,
                used,
                resets_at: Some(end),
                retry_after_ms: Some(end.saturating_sub(now)),
            });
        }
    }
    Ok(uses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who() -> Who {
        Who {
            org: Arc::from("acme"),
            caller: Arc::from("alice"),
        }
    }

    fn ask<'a>(who: &'a Who, limits: &'a Limits, worst: Spend) -> Ask<'a> {
        Ask {
            who,
            limits,
            team_usd_per_month: None,
            worst,
            rate_only: false,
        }
    }

    const NOON: UnixMs = 1_796_126_400_000; // 2026-12-01T12:00:00Z

    #[test]
    fn gcra_admits_the_burst_then_one_per_interval() {
        let rate = Rate {
            per_minute: 60,
            burst: 3,
        };
        let mut tat = None;
        for _ in 0..3 {
            tat = Some(rate.admit(tat, NOON).unwrap());
        }
        // The fourth waits one interval (1 s).
        assert_eq!(rate.admit(tat, NOON), Err(1_000_000));
        assert!(rate.admit(tat, NOON + 999).is_err());
        assert!(rate.admit(tat, NOON + 1_000).is_ok());
    }

    #[test]
    fn a_budget_refuses_what_does_not_fit_and_settles_to_the_real_cost() {
        let who = who();
        let limits = Limits {
            usd_per_day: Some(1_000),
            ..Limits::default()
        };
        let book = LimitBook::new();
        let none = |_: &SpendKey| Spend::default();
        let worst = Spend {
            tokens: 10,
            nano_usd: 600,
        };
        let first = book.check(&ask(&who, &limits, worst), NOON, &none).unwrap();
        // 600 reserved: another 600 does not fit beside it.
        let refused = book
            .check(&ask(&who, &limits, worst), NOON, &none)
            .unwrap_err();
        assert_eq!(refused.kind, LimitKind::UsdPerDay);
        assert_eq!((refused.limit, refused.used), (1_000, 600));
        let midnight = Day::of(NOON).end();
        assert_eq!(refused.resets_at, Some(midnight));
        assert_eq!(refused.retry_after_ms, Some(midnight - NOON));
        // Settled at 300: 300 + 600 fits.
        book.settle(
            first,
            Spend {
                tokens: 5,
                nano_usd: 300,
            },
        );
        let second = book.check(&ask(&who, &limits, worst), NOON, &none).unwrap();
        let key = second.keys()[0].clone();
        assert_eq!(
            book.entry(&key).unwrap(),
            SpendEntry {
                settled: Spend {
                    tokens: 5,
                    nano_usd: 300
                },
                reserved: worst
            }
        );
        book.settle(second, Spend::default());
        assert_eq!(book.entry(&key).unwrap().reserved, Spend::default());
    }

    #[test]
    fn a_new_entry_starts_from_its_seed_once() {
        let who = who();
        let limits = Limits {
            tokens_per_month: Some(100),
            ..Limits::default()
        };
        let book = LimitBook::new();
        let calls = std::cell::Cell::new(0);
        let seed = |_: &SpendKey| {
            calls.set(calls.get() + 1);
            Spend {
                tokens: 95,
                nano_usd: 0,
            }
        };
        let worst = Spend {
            tokens: 6,
            nano_usd: 0,
        };
        let refused = book
            .check(&ask(&who, &limits, worst), NOON, &seed)
            .unwrap_err();
        assert_eq!(refused.kind, LimitKind::TokensPerMonth);
        let small = Spend {
            tokens: 5,
            nano_usd: 0,
        };
        let r = book.check(&ask(&who, &limits, small), NOON, &seed).unwrap();
        book.settle(r, small);
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn max_concurrent_counts_requests_until_settled() {
        let who = who();
        let limits = Limits {
            max_concurrent: Some(1),
            ..Limits::default()
        };
        let book = LimitBook::new();
        let none = |_: &SpendKey| Spend::default();
        let held = book
            .check(&ask(&who, &limits, Spend::default()), NOON, &none)
            .unwrap();
        let refused = book
            .check(&ask(&who, &limits, Spend::default()), NOON, &none)
            .unwrap_err();
        assert_eq!(refused.kind, LimitKind::MaxConcurrent);
        assert_eq!(refused.retry_after_ms, Some(1000));
        // count_tokens is not held to it.
        let mut counting = ask(&who, &limits, Spend::default());
        counting.rate_only = true;
        book.settle(
            book.check(&counting, NOON, &none).unwrap(),
            Spend::default(),
        );
        book.settle(held, Spend::default());
        assert_eq!(book.in_flight(&who), 0);
        book.settle(
            book.check(&ask(&who, &limits, Spend::default()), NOON, &none)
                .unwrap(),
            Spend::default(),
        );
    }

    #[test]
    fn a_refused_request_takes_nothing() {
        let who = who();
        let limits = Limits {
            rate: Some(Rate {
                per_minute: 1,
                burst: 1,
            }),
            usd_per_day: Some(10),
            ..Limits::default()
        };
        let book = LimitBook::new();
        let none = |_: &SpendKey| Spend::default();
        let too_dear = Spend {
            tokens: 1,
            nano_usd: 11,
        };
        assert_eq!(
            book.check(&ask(&who, &limits, too_dear), NOON, &none)
                .unwrap_err()
                .kind,
            LimitKind::UsdPerDay
        );
        // The rate cell was not taken by the refused request.
        let r = book
            .check(&ask(&who, &limits, Spend::default()), NOON, &none)
            .unwrap();
        book.settle(r, Spend::default());
    }

    #[test]
    fn models_and_deny_models() {
        let glob = |g: &str| ModelGlob::try_new(g).unwrap();
        let limits = Limits {
            models: vec![glob("claude-sonnet-*"), glob("claude-haiku-*")],
            deny_models: vec![glob("claude-sonnet-4-0*")],
            ..Limits::default()
        };
        assert_eq!(limits.check_model("claude-sonnet-4-5"), Ok(()));
        assert_eq!(
            limits.check_model("claude-opus-4-5"),
            Err(LimitKind::Models)
        );
        assert_eq!(
            limits.check_model("claude-sonnet-4-0"),
            Err(LimitKind::DenyModels)
        );
    }

    #[test]
    fn the_worst_case_is_a_third_of_the_body_and_max_tokens() {
        let prices = Prices {
            input: crate::PerMillion(3_000_000_000),
            output: crate::PerMillion(15_000_000_000),
            ..Prices::default()
        };
        let w = worst_case(301, 100, Some(&prices));
        assert_eq!(w.tokens, 101 + 100);
        assert_eq!(w.nano_usd, 101 * 3_000 + 100 * 15_000);
        assert_eq!(
            worst_case(3, 0, None),
            Spend {
                tokens: 1,
                nano_usd: 0
            }
        );
    }
}
