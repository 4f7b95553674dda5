//! The export/import shape the per-account books share: a `DashMap` from account id to
//! one value, written out as records and merged back in (restart and Redis state).

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use keypool_core::AccountId;

/// What a book's `import` took, and the values it corrected on the way (a persisted
/// time beyond what keypool would set now), for the store to log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Imported<C> {
    /// How many records were taken.
    pub taken: usize,
    /// Each corrected value, with its account (taken or not).
    pub corrected: Vec<(AccountId, C)>,
}

/// Every entry of `entries`, as records built by `record`.
pub(crate) fn export<V: Clone, R>(
    entries: &DashMap<AccountId, V, crate::Hasher>,
    record: impl Fn(AccountId, V) -> R,
) -> Vec<R> {
    entries
        .iter()
        .map(|e| record(e.key().clone(), e.value().clone()))
        .collect()
}

/// Merges `records` into `entries`: an account without an entry takes the record's
/// value; one with an entry takes it only when `replaces(current, incoming)`. `on_taken`
/// sees every value taken while the entry is still locked (the books update their
/// signals there), and whether it made a new entry. Returns how many records were
/// taken.
pub(crate) fn import<V>(
    entries: &DashMap<AccountId, V, crate::Hasher>,
    records: impl IntoIterator<Item = (AccountId, V)>,
    replaces: impl Fn(&V, &V) -> bool,
    on_taken: impl Fn(&AccountId, &V, bool),
) -> usize {
    let mut taken = 0;
    for (account, value) in records {
        match entries.entry(account) {
            Entry::Vacant(v) => {
                on_taken(v.key(), &value, true);
                v.insert(value);
                taken += 1;
            }
            Entry::Occupied(mut o) if replaces(o.get(), &value) => {
                on_taken(o.key(), &value, false);
                o.insert(value);
                taken += 1;
            }
            Entry::Occupied(_) => {}
        }
    }
    taken
}
