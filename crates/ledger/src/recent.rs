//! [`RecentRecords`]: the most recent usage records, newest first, for request lookup
//! (SPEC 11, `GET /admin/requests`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use crate::packed::Packed;
use crate::record::UsageRecord;

/// What `GET /admin/requests` filters by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordFilter {
    /// Only this caller's (key id).
    pub caller: Option<String>,
    /// Only these statuses.
    pub status: Option<StatusFilter>,
}

/// A status, or a class of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    /// Exactly this status.
    Exact(u16),
    /// `2xx`, `4xx`, `5xx`: the hundred.
    Class(u16),
    /// Any error (4xx, 5xx, or no answer).
    Error,
}

impl StatusFilter {
    /// `429`, `4xx`, or `error`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "error" | "errors" => Some(Self::Error),
            _ if text.len() == 3 && text.ends_with("xx") => text[..1]
                .parse::<u16>()
                .ok()
                .filter(|c| (1..=5).contains(c))
                .map(Self::Class),
            _ => text
                .parse::<u16>()
                .ok()
                .filter(|s| (100..=999).contains(s))
                .map(Self::Exact),
        }
    }

    fn admits(self, record: &UsageRecord) -> bool {
        match self {
            Self::Exact(s) => record.status == s,
            Self::Class(c) => record.status / 100 == c,
            Self::Error => record.is_error(),
        }
    }
}

impl RecordFilter {
    /// Whether `record` passes.
    pub fn admits(&self, record: &UsageRecord) -> bool {
        self.caller
            .as_deref()
            .is_none_or(|c| &*record.caller.id == c)
            && self.status.is_none_or(|s| s.admits(record))
    }
}

/// The last `capacity` records, each packed (the private `packed` module) into one small
/// allocation (what keeps thousands of them cheap on the request path).
#[derive(Debug)]
pub struct RecentRecords {
    capacity: usize,
    records: Mutex<VecDeque<Packed>>,
}

impl RecentRecords {
    /// Keeps at most `capacity` records (the oldest go first).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            records: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
        }
    }

    /// Adds a record (packed before the lock is taken).
    pub fn push(&self, record: &UsageRecord) {
        if self.capacity == 0 {
            return;
        }
        let packed = Packed::pack(record);
        let evicted = {
            let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
            // The capacity never changes, so at most one record is ever over it.
            let evicted = if records.len() >= self.capacity {
                records.pop_front()
            } else {
                None
            };
            records.push_back(packed);
            evicted
        };
        // The oldest record is freed after the lock is released.
        drop(evicted);
    }

    /// The newest `limit` records that pass `filter`, newest first.
    pub fn list(&self, filter: &RecordFilter, limit: usize) -> Vec<Arc<UsageRecord>> {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records
            .iter()
            .rev()
            .filter_map(Packed::unpack)
            .filter(|r| filter.admits(r))
            .take(limit)
            .map(Arc::new)
            .collect()
    }

    /// The record of request `id`, if it is still kept.
    pub fn get(&self, id: &str) -> Option<Arc<UsageRecord>> {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records
            .iter()
            .rev()
            .find(|r| r.request_id() == Some(id))
            .and_then(Packed::unpack)
            .map(Arc::new)
    }

    /// Every record, oldest first (for the state file).
    pub fn export(&self) -> Vec<Arc<UsageRecord>> {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        records
            .iter()
            .filter_map(Packed::unpack)
            .map(Arc::new)
            .collect()
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
