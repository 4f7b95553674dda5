//! The caller limits shared by every replica (SPEC 12): one Lua script checks and
//! takes a request's rate cell, its place among the key's requests in flight and its
//! worst case in each budget, all at once; another settles it to the real spend.
//!
//! Every key of one org carries the hash tag `{lim:<org>}`, so one script can touch all
//! of them on a Redis Cluster (the team budget and a key's budgets live together):
//!
//! | key | type | content |
//! | --- | --- | --- |
//! | `keypool:{lim:<org>}:rate:<key id>` | string, `PX` | the GCRA theoretical arrival time, µs |
//! | `keypool:{lim:<org>}:conc` | hash key id → n | requests of each key in flight |
//! | `keypool:{lim:<org>}:spend:key:<key id>:<d:day \| m:month>` | hash `st su rt ru` | settled and reserved tokens and nano-USD of a key's period; expires a day after it |
//! | `keypool:{lim:<org>}:spend:team:<m:month>` | same | the org's team budget |
//! | `keypool:{lim:<org>}:held` | sorted set hold → expiry (unix ms) | every admitted request's hold, renewed every 10 s by its replica |
//!
//! A hold is the JSON `[id, key id, tokens, nano-USD, in flight (0/1), [budget keys]]`
//! of one admitted request: the settle script removes it and gives back what it took.
//! A replica that dies stops renewing its holds; the next check of the org sweeps the
//! expired ones, so a crash leaks no reservation and no request in flight for longer
//! than [`HOLD_TTL_MS`].
//!
//! A budget hash that does not exist yet is created from the period's usage so far
//! (the usage hashes, which another slot holds: the check answers "seed needed" and is
//! called again with the seeds).

use fred::prelude::SortedSetsInterface;
use keypool_core::UnixMs;
use keypool_ledger::{Period, Spend};

use super::redis::{PREFIX, RedisMirror};
use crate::StoreError;

/// How long a hold lives without renewal.
pub const HOLD_TTL_MS: u64 = 30_000;

/// How often a replica renews its holds.
pub const HOLD_RENEW_MS: u64 = 10_000;

/// How long a budget hash outlives its period (a request settling after midnight
/// still finds yesterday's).
const SPEND_GRACE_SECS: u64 = 86_400;

/// Gives back the holds of requests nobody renews (a dead replica), then checks the
/// rate, the requests in flight and each budget, and takes them all when every one
/// passes.
///
/// KEYS: 1 holds, 2 in-flight counts, 3 rate cell, 4.. budget hashes.
/// ARGV: 1 now ms, 2 now µs, 3 interval µs (0: no rate), 4 tolerance µs, 5 cap (0:
/// none), 6 key id, 7 hold ('' : none), 8 hold expiry ms, 9 worst tokens, 10 worst
/// nano-USD, then per budget: 's'-field suffix ('t' tokens, 'u' USD), limit, expiry
/// (unix s), seed tokens ('' : none), seed nano-USD.
///
/// Returns `{0,0,0}` admitted, `{1,0,µs}` over the rate, `{2,0,n}` at the cap,
/// `{3,i,used}` over budget `i`, `{-2,i,0}` budget `i` needs its seed.
const CHECK: &str = r"
local function dec(k, f, v) if v ~= '0' then redis.call('HINCRBY', k, f, '-' .. v) end end
local now = tonumber(ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, m in ipairs(gone) do
  local h = cjson.decode(m)
  if h[5] == 1 then
    if redis.call('HINCRBY', KEYS[2], h[2], -1) <= 0 then redis.call('HDEL', KEYS[2], h[2]) end
  end
  for _, k in ipairs(h[6]) do
    if redis.call('EXISTS', k) == 1 then dec(k, 'rt', h[3]) dec(k, 'ru', h[4]) end
  end
end
if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) end
local now_us = tonumber(ARGV[2])
local interval = tonumber(ARGV[3])
local tat = nil
if interval > 0 then
  local t = tonumber(redis.call('GET', KEYS[3]) or '') or now_us
  if t < now_us then t = now_us end
  local allowed = t - tonumber(ARGV[4])
  if allowed > now_us then return {1, 0, allowed - now_us} end
  tat = t + interval
end
local cap = tonumber(ARGV[5])
if cap > 0 then
  local n = tonumber(redis.call('HGET', KEYS[2], ARGV[6]) or '0') or 0
  if n >= cap then return {2, 0, n} end
end
local worst = {t = tonumber(ARGV[9]), u = tonumber(ARGV[10])}
local a = 11
for k = 4, #KEYS do
  local f, limit, expiry, st, su = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  a = a + 5
  if redis.call('EXISTS', KEYS[k]) == 0 then
    if st == '' then return {-2, k - 3, 0} end
    redis.call('HSET', KEYS[k], 'st', st, 'su', su, 'rt', '0', 'ru', '0')
    redis.call('EXPIREAT', KEYS[k], expiry)
  end
  local v = redis.call('HMGET', KEYS[k], 's' .. f, 'r' .. f)
  local used = (tonumber(v[1]) or 0) + (tonumber(v[2]) or 0)
  if used + worst[f] > limit then return {3, k - 3, used} end
end
if tat then
  redis.call('SET', KEYS[3], string.format('%.0f', tat), 'PX', math.floor((tat - now_us) / 1000) + 1000)
end
if cap > 0 then redis.call('HINCRBY', KEYS[2], ARGV[6], 1) end
local done = {}
for k = 4, #KEYS do
  if not done[KEYS[k]] then
    done[KEYS[k]] = true
    redis.call('HINCRBY', KEYS[k], 'rt', ARGV[9])
    redis.call('HINCRBY', KEYS[k], 'ru', ARGV[10])
  end
end
if ARGV[7] ~= '' then redis.call('ZADD', KEYS[1], ARGV[8], ARGV[7]) end
return {0, 0, 0}
";

/// Settles a request: removes its hold and, when it was still there, gives back its
/// request in flight and its reservations; adds the real spend to each budget that
/// still exists.
///
/// KEYS: 1 holds, 2 in-flight counts, 3.. budget hashes. ARGV: 1 hold ('' : none, a
/// request admitted while Redis was away), 2 key id, 3 in flight (0/1), 4 reserved
/// tokens, 5 reserved nano-USD, 6 spent tokens, 7 spent nano-USD.
const SETTLE: &str = r"
local function dec(k, f, v) if v ~= '0' then redis.call('HINCRBY', k, f, '-' .. v) end end
local held = 0
if ARGV[1] ~= '' then held = redis.call('ZREM', KEYS[1], ARGV[1]) end
if held == 1 and ARGV[3] == '1' then
  if redis.call('HINCRBY', KEYS[2], ARGV[2], -1) <= 0 then redis.call('HDEL', KEYS[2], ARGV[2]) end
end
for k = 3, #KEYS do
  if redis.call('EXISTS', KEYS[k]) == 1 then
    if held == 1 then dec(KEYS[k], 'rt', ARGV[4]) dec(KEYS[k], 'ru', ARGV[5]) end
    redis.call('HINCRBY', KEYS[k], 'st', ARGV[6])
    redis.call('HINCRBY', KEYS[k], 'su', ARGV[7])
  end
end
return held
";

fn tag(org: &str) -> String {
    format!("{PREFIX}{{lim:{org}}}")
}

fn period_part(period: Period) -> String {
    match period {
        Period::Day(d) => format!("d:{d}"),
        Period::Month(m) => format!("m:{m}"),
    }
}

/// The budget hash of a key's (or, `caller: None`, the org's team) period.
pub(crate) fn spend_key(org: &str, caller: Option<&str>, period: Period) -> String {
    let p = period_part(period);
    match caller {
        Some(c) => format!("{}:spend:key:{c}:{p}", tag(org)),
        None => format!("{}:spend:team:{p}", tag(org)),
    }
}

/// One budget of a shared check.
#[derive(Debug, Clone)]
pub(crate) struct SharedBudget {
    /// Its hash ([`spend_key`]).
    pub key: String,
    /// Whether it counts USD (else tokens).
    pub usd: bool,
    /// Its limit.
    pub limit: u64,
    /// When its period ends.
    pub period_end: UnixMs,
    /// Where it starts when its hash does not exist yet (`None`: not known yet).
    pub seed: Option<Spend>,
}

/// One shared check.
#[derive(Debug, Clone)]
pub(crate) struct SharedCheck<'a> {
    pub org: &'a str,
    pub caller: &'a str,
    /// `(interval µs, tolerance µs)` of the key's rate.
    pub rate: Option<(u64, u64)>,
    pub cap: Option<u32>,
    /// The hold of this request (`None` when it takes nothing to give back).
    pub hold: Option<&'a str>,
    pub worst: Spend,
    pub budgets: &'a [SharedBudget],
}

/// A shared check's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SharedVerdict {
    Admitted,
    /// µs until a request would be admitted.
    OverRate(u64),
    AtCap,
    /// Over budget `i` (index into the check's budgets), with what it used.
    OverBudget(usize, u64),
    /// Budget `i`'s hash needs its seed.
    NeedsSeed(usize),
}

/// The JSON of a hold: what the settle script and the sweep give back.
pub(crate) fn hold_member(
    id: &str,
    caller: &str,
    reserved: Spend,
    in_flight: bool,
    budgets: &[String],
) -> String {
    serde_json::json!([
        id,
        caller,
        reserved.tokens.to_string(),
        reserved.nano_usd.to_string(),
        u8::from(in_flight),
        budgets
    ])
    .to_string()
}

impl RedisMirror {
    /// Runs the check script.
    pub(crate) async fn limit_check(
        &self,
        check: &SharedCheck<'_>,
        now: UnixMs,
    ) -> Result<SharedVerdict, StoreError> {
        let t = tag(check.org);
        let held = format!("{t}:held");
        let mut keys = vec![
            held.clone(),
            format!("{t}:conc"),
            format!("{t}:rate:{}", check.caller),
        ];
        let (interval, tolerance) = check.rate.unwrap_or((0, 0));
        let mut args = vec![
            now.to_string(),
            now.saturating_mul(1000).to_string(),
            interval.to_string(),
            tolerance.to_string(),
            check.cap.unwrap_or(0).to_string(),
            check.caller.to_owned(),
            check.hold.unwrap_or("").to_owned(),
            (now + HOLD_TTL_MS).to_string(),
            check.worst.tokens.to_string(),
            check.worst.nano_usd.to_string(),
        ];
        for b in check.budgets {
            keys.push(b.key.clone());
            args.push(if b.usd { "u" } else { "t" }.to_owned());
            args.push(b.limit.to_string());
            args.push((b.period_end / 1000 + SPEND_GRACE_SECS).to_string());
            match b.seed {
                Some(s) => {
                    args.push(s.tokens.to_string());
                    args.push(s.nano_usd.to_string());
                }
                None => args.extend([String::new(), String::new()]),
            }
        }
        let reply: Vec<i64> = self.eval(CHECK, &held, keys, args).await?;
        let at = |i: usize| reply.get(i).copied().unwrap_or(0);
        let index = |i: i64| usize::try_from(i - 1).unwrap_or(0);
        Ok(match at(0) {
            0 => SharedVerdict::Admitted,
            1 => SharedVerdict::OverRate(u64::try_from(at(2)).unwrap_or(0)),
            2 => SharedVerdict::AtCap,
            3 => SharedVerdict::OverBudget(index(at(1)), u64::try_from(at(2)).unwrap_or(0)),
            -2 => SharedVerdict::NeedsSeed(index(at(1))),
            other => {
                return Err(StoreError::Redis(format!(
                    "the limit script answered {other}, which this version does not know"
                )));
            }
        })
    }

    /// Runs the settle script. `hold` is `None` for a request admitted while Redis was
    /// away (only its spend is added).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn limit_settle(
        &self,
        org: &str,
        caller: &str,
        hold: Option<&str>,
        in_flight: bool,
        budgets: &[String],
        reserved: Spend,
        actual: Spend,
    ) -> Result<(), StoreError> {
        let t = tag(org);
        let held = format!("{t}:held");
        let mut keys = vec![held.clone(), format!("{t}:conc")];
        keys.extend(budgets.iter().cloned());
        let args = vec![
            hold.unwrap_or("").to_owned(),
            caller.to_owned(),
            u8::from(in_flight).to_string(),
            reserved.tokens.to_string(),
            reserved.nano_usd.to_string(),
            actual.tokens.to_string(),
            actual.nano_usd.to_string(),
        ];
        let _: i64 = self.eval(SETTLE, &held, keys, args).await?;
        Ok(())
    }

    /// Pushes a hold's expiry (only if it is still there).
    pub(crate) async fn limit_renew(
        &self,
        org: &str,
        hold: &str,
        expires_at: UnixMs,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .bounded(self.client.zadd(
                format!("{}:held", tag(org)),
                Some(fred::types::SetOptions::XX),
                None,
                false,
                false,
                (expires_at as f64, hold.to_owned()),
            ))
            .await?;
        Ok(())
    }

    /// A key's in-flight count and its budgets' `(settled + reserved)` spends, for the
    /// admin API: `None` for a budget whose hash does not exist.
    pub(crate) async fn limit_usage(
        &self,
        budgets: &[String],
    ) -> Result<Vec<Option<Spend>>, StoreError> {
        use fred::prelude::HashesInterface;
        let mut out = Vec::with_capacity(budgets.len());
        for key in budgets {
            let v: Vec<Option<u64>> = self
                .bounded(
                    self.client
                        .hmget(key.as_str(), vec!["st", "su", "rt", "ru"]),
                )
                .await?;
            out.push(match v.as_slice() {
                [None, None, None, None] => None,
                [st, su, rt, ru] => Some(Spend {
                    tokens: st.unwrap_or(0) + rt.unwrap_or(0),
                    nano_usd: su.unwrap_or(0) + ru.unwrap_or(0),
                }),
                _ => None,
            });
        }
        Ok(out)
    }
}
