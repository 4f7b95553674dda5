//! The filter pipeline of SPEC 3.5, in its exact order:
//!
//! 1. drop inactive accounts;
//! 2. `without_limited_accounts`: drop accounts out of their usage window; if every
//!    remaining account is out of its window, fail with [`SelectError::AllOutOfWindow`];
//! 3. drop accounts in cooldown; if every remaining account is cooling, keep exactly one:
//!    [`pick_earliest_cooldown_expiry`], ties broken at random.
//!
//! The stages are computed in one pass over the snapshot (one
//! [`Availability::status_of`] call per active account); the result is the same as
//! running them one after the other.

use std::cell::Cell;

use keypool_core::UnixMs;
use rand::Rng;

use crate::availability::{AccountStatus, Availability, WindowBlock};
use crate::candidate::Candidate;
use crate::error::SelectError;

/// The accounts that survived the filters, as indices into the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Survivors {
    /// Snapshot indices in snapshot order.
    pub indices: Vec<usize>,
    /// `true` when every remaining account was cooling and `indices` holds the single
    /// account [`pick_earliest_cooldown_expiry`] chose.
    pub last_resort: bool,
}

/// Runs the filter pipeline over `snapshot` (already in snapshot order).
pub fn filter_snapshot<A, R>(
    snapshot: &[Candidate],
    availability: &A,
    now: UnixMs,
    rng: &mut R,
) -> Result<Survivors, SelectError>
where
    A: Availability + ?Sized,
    R: Rng + ?Sized,
{
    let mut indices = Vec::with_capacity(snapshot.len());
    let last_resort = filter_into(snapshot, availability, now, rng, &mut indices)?;
    Ok(Survivors {
        indices,
        last_resort,
    })
}

/// [`filter_snapshot`] writing into a caller's vector (cleared first). Returns whether
/// the single survivor is a last-resort pick.
pub(crate) fn filter_into<A, R>(
    snapshot: &[Candidate],
    availability: &A,
    now: UnixMs,
    rng: &mut R,
    out: &mut Vec<usize>,
) -> Result<bool, SelectError>
where
    A: Availability + ?Sized,
    R: Rng + ?Sized,
{
    out.clear();
    if snapshot.is_empty() {
        return Err(SelectError::EmptyPool);
    }
    // Cooling accounts are only remembered while no survivor has been seen: they matter
    // only when every remaining account is cooling. The list is reused from plan to plan
    // (per thread), so planning does not allocate for it.
    let mut cooling = COOLING.take();
    cooling.clear();
    let result = filter_stages(snapshot, availability, now, rng, out, &mut cooling);
    COOLING.set(cooling);
    result
}

thread_local! {
    static COOLING: Cell<Vec<(usize, UnixMs)>> = const { Cell::new(Vec::new()) };
}

fn filter_stages<A, R>(
    snapshot: &[Candidate],
    availability: &A,
    now: UnixMs,
    rng: &mut R,
    out: &mut Vec<usize>,
    cooling: &mut Vec<(usize, UnixMs)>,
) -> Result<bool, SelectError>
where
    A: Availability + ?Sized,
    R: Rng + ?Sized,
{
    let mut active = 0usize;
    let mut limited = EarliestWindowReset::default();
    for (index, candidate) in snapshot.iter().enumerate() {
        // Stage 1: inactive accounts are dropped.
        if !candidate.active {
            continue;
        }
        active += 1;
        match availability.status_of(index, candidate, now) {
            // Stage 2: without_limited_accounts.
            AccountStatus::OutOfWindow(block) if block.until > now => limited.note(block),
            // Stage 3: accounts in cooldown.
            AccountStatus::CoolingUntil(until) if until > now => {
                if out.is_empty() {
                    cooling.push((index, until));
                }
            }
            _ => out.push(index),
        }
    }
    if active == 0 {
        return Err(SelectError::NoActiveAccounts {
            total: snapshot.len(),
        });
    }
    if !out.is_empty() {
        return Ok(false);
    }
    match pick_earliest_cooldown_expiry(cooling, rng) {
        Some(index) => {
            out.push(index);
            Ok(true)
        }
        // Every active account is out of its window.
        None => Err(limited.into_error(now)),
    }
}

/// The last resort when every remaining account is cooling: the account whose cooldown
/// ends first; when several end at the same instant, one of them at random (never
/// simply the first of the list). `None` when `cooling` is empty.
///
/// `cooling` holds `(snapshot index, cooldown end)` pairs.
pub fn pick_earliest_cooldown_expiry<R: Rng + ?Sized>(
    cooling: &[(usize, UnixMs)],
    rng: &mut R,
) -> Option<usize> {
    let earliest = cooling.iter().map(|&(_, until)| until).min()?;
    let ties = cooling
        .iter()
        .filter(|&&(_, until)| until == earliest)
        .count();
    let chosen = if ties > 1 {
        rng.random_range(0..ties)
    } else {
        0
    };
    cooling
        .iter()
        .filter(|&&(_, until)| until == earliest)
        .nth(chosen)
        .map(|&(index, _)| index)
}

/// Tracks the earliest window reset among the accounts out of their window.
#[derive(Debug, Default)]
struct EarliestWindowReset {
    earliest: Option<WindowBlock>,
}

impl EarliestWindowReset {
    fn note(&mut self, block: WindowBlock) {
        if self.earliest.is_none_or(|e| block.until < e.until) {
            self.earliest = Some(block);
        }
    }

    fn into_error(self, now: UnixMs) -> SelectError {
        // Called only when at least one active account was out of its window.
        let block = self
            .earliest
            .unwrap_or(WindowBlock::new(keypool_core::Window::FiveHour, now));
        SelectError::AllOutOfWindow {
            window: block.window,
            family: block.family,
            retry_after_secs: block.until.saturating_sub(now).div_ceil(1000).max(1),
            returns_at: block.until,
        }
    }
}

#[cfg(test)]
mod tests {
    use keypool_core::{AuthType, Provider, Window};
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::availability::StaticAvailability;

    fn pool(n: usize) -> Vec<Candidate> {
        (0..n)
            .map(|i| Candidate::new(format!("a{i}"), Provider::Anthropic, AuthType::OAuth))
            .collect()
    }

    fn rng() -> StdRng {
        StdRng::seed_from_u64(7)
    }

    #[test]
    fn empty_pool_and_all_inactive_are_distinct_errors() {
        let av = StaticAvailability::new();
        assert_eq!(
            filter_snapshot(&[], &av, 0, &mut rng()),
            Err(SelectError::EmptyPool)
        );
        let mut p = pool(2);
        p.iter_mut().for_each(|c| c.active = false);
        assert_eq!(
            filter_snapshot(&p, &av, 0, &mut rng()),
            Err(SelectError::NoActiveAccounts { total: 2 })
        );
    }

    #[test]
    fn drops_inactive_limited_and_cooling_in_order() {
        let mut p = pool(5);
        p[0].active = false;
        let mut av = StaticAvailability::new();
        av.block_window(p[1].id.clone(), Window::FiveHour, 10_000)
            .cool_until(p[2].id.clone(), 5_000)
            // An expired cooldown does not count.
            .cool_until(p[3].id.clone(), 1_000);
        let s = filter_snapshot(&p, &av, 1_000, &mut rng()).unwrap();
        assert_eq!(s.indices, vec![3, 4]);
        assert!(!s.last_resort);
    }

    #[test]
    fn all_out_of_window_names_the_earliest_reset() {
        let p = pool(3);
        let mut av = StaticAvailability::new();
        av.block_window(p[0].id.clone(), Window::Weekly, 900_000)
            .block_window(p[1].id.clone(), Window::FiveHour, 10_001)
            .block_window(p[2].id.clone(), Window::Weekly, 10_001);
        let err = filter_snapshot(&p, &av, 1_000, &mut rng()).unwrap_err();
        assert_eq!(
            err,
            SelectError::AllOutOfWindow {
                window: Window::FiveHour,
                family: None,
                retry_after_secs: 10, // 9.001 s rounded up
                returns_at: 10_001,
            }
        );
        let msg = err.to_string();
        assert!(msg.contains("5h usage window"), "{msg}");
        assert!(msg.contains("retry after 10 s"), "{msg}");
    }

    #[test]
    fn retry_after_is_at_least_one_second() {
        let p = pool(1);
        let mut av = StaticAvailability::new();
        av.block_window(p[0].id.clone(), Window::Weekly, 1_001);
        assert!(matches!(
            filter_snapshot(&p, &av, 1_000, &mut rng()),
            Err(SelectError::AllOutOfWindow {
                retry_after_secs: 1,
                window: Window::Weekly,
                returns_at: 1_001,
                family: None,
            })
        ));
    }

    #[test]
    fn out_of_window_plus_cooling_takes_the_last_resort_not_the_429() {
        let p = pool(3);
        let mut av = StaticAvailability::new();
        av.block_window(p[0].id.clone(), Window::FiveHour, 2_000)
            .cool_until(p[1].id.clone(), 9_000)
            .cool_until(p[2].id.clone(), 3_000);
        let s = filter_snapshot(&p, &av, 1_000, &mut rng()).unwrap();
        assert_eq!(s.indices, vec![2]);
        assert!(s.last_resort);
    }

    #[test]
    fn earliest_expiry_of_an_empty_list_is_none() {
        assert_eq!(pick_earliest_cooldown_expiry(&[], &mut rng()), None);
        assert_eq!(
            pick_earliest_cooldown_expiry(&[(4, 10), (2, 5), (9, 7)], &mut rng()),
            Some(2)
        );
    }
}
