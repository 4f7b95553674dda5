//! [`Packed`]: a usage record packed into one allocation of bytes, as the
//! recent-requests ring ([`crate::RecentRecords`]) keeps it.
//!
//! The ring keeps thousands of records (10,000 by default) and frees the oldest with
//! every new one. As a [`UsageRecord`] each is four allocations (the record, its request
//! id, its model, its attempts) that hold counts shared by every request (the org's,
//! the caller's, the account's names): keeping them filled the caches and freeing the
//! oldest touched about ten cold cache lines per request, the largest single share of
//! the ledger's cost per request (`docs/BENCHMARKS.md`). Packed, a record is one run of
//! about 150 bytes that holds nothing shared; once the ring is full, the oldest record's
//! allocation is written over with the newest one's bytes, so a request neither
//! allocates nor frees (`Packed::refill`). The admin API unpacks the few it answers
//! with.
//!
//! The layout is private to this process (never stored or sent): the fields in their
//! declaration order, numbers as LEB128 varints, strings as their length and bytes,
//! an `Option` as a 0/1 tag before its value. The request id comes first, so a lookup
//! by id compares it without unpacking.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use keypool_core::{AccountId, Usage};

use crate::limits::LimitKind;
use crate::record::{AttemptRecord, CallerKind, CallerRef, CostBasis, ModelRouting, UsageRecord};

/// The tag of a `model_sent` that is the same as `model` (after the 0/1 of an
/// `Option`).
const SAME_MODEL: u8 = 2;

/// One packed record (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Packed(Vec<u8>);

/// How much room beyond its bytes a record's allocation may keep when it is refilled
/// ([`Packed::refill`]): more, and it is given an allocation of its size instead.
const SPARE_ROOM: usize = 256;

impl Packed {
    /// `record`, packed.
    #[cfg(test)]
    pub(crate) fn pack(r: &UsageRecord) -> Self {
        Self::packing(r, Self::from_bytes)
    }

    /// A record of bytes [`Packed::packing`] gave, in an allocation of their size.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        Self(bytes.to_vec())
    }

    /// What `keep` makes of `record`'s packed bytes, written into this thread's scratch
    /// buffer.
    pub(crate) fn packing<T>(r: &UsageRecord, keep: impl FnOnce(&[u8]) -> T) -> T {
        SCRATCH.with(|scratch| {
            let mut w = Writer(std::mem::take(&mut *scratch.borrow_mut()));
            w.0.clear();
            w.record(r);
            let kept = keep(&w.0);
            *scratch.borrow_mut() = w.0;
            kept
        })
    }

    /// This record replaced by `bytes` (what [`Packed::packing`] gave), in its own
    /// allocation when that has room and is not much larger: the ring's oldest record
    /// becomes its newest without an allocation and a free per request, and no record
    /// keeps more than [`SPARE_ROOM`] bytes it does not use.
    pub(crate) fn refill(&mut self, bytes: &[u8]) {
        if self.0.capacity() < bytes.len() || self.0.capacity() > bytes.len() + SPARE_ROOM {
            self.0 = bytes.to_vec();
            return;
        }
        self.0.clear();
        self.0.extend_from_slice(bytes);
    }

    /// The request id, without unpacking the rest.
    pub(crate) fn request_id(&self) -> Option<&str> {
        Reader(&self.0).str()
    }

    /// The record again (`None` only if the bytes were not written by [`Packed::pack`]).
    pub(crate) fn unpack(&self) -> Option<UsageRecord> {
        let mut r = Reader(&self.0);
        let request_id = Arc::from(r.str()?);
        let at = r.u64()?;
        let org = Arc::from(r.str()?);
        let url = Arc::from(r.str()?);
        let kind = match r.u64()? {
            0 => CallerKind::User,
            1 => CallerKind::Client,
            _ => return None,
        };
        let caller = CallerRef {
            kind,
            id: Arc::from(r.str()?),
        };
        let endpoint = owned(r.str()?);
        let model = r.opt_str()?.map(Arc::from);
        let model_sent = if r.0.first() == Some(&SAME_MODEL) {
            r.byte()?;
            Some(Arc::clone(model.as_ref()?))
        } else {
            r.opt_str()?.map(Arc::from)
        };
        let routing = match r.flag()? {
            false => None,
            true => Some(ModelRouting {
                alias: r.opt_str()?.map(Arc::from),
                position: u32::try_from(r.u64()?).ok()?,
            }),
        };
        let stream = r.flag()?;
        let status = u16::try_from(r.u64()?).ok()?;
        let account = r.opt_str()?.map(AccountId::from);
        let attempts = (0..r.u64()?)
            .map(|_| r.attempt())
            .collect::<Option<Vec<_>>>()?;
        let usage = Usage {
            input_tokens: r.u64()?,
            output_tokens: r.u64()?,
            cache_creation_input_tokens: r.u64()?,
            cache_read_input_tokens: r.u64()?,
        };
        let cost_nano_usd = r.u64()?;
        let cost_basis = match r.u64()? {
            0 => CostBasis::Api,
            1 => CostBasis::ListPriceEquivalent,
            2 => CostBasis::Unpriced,
            _ => return None,
        };
        let ttft_ms = r.opt_u64()?;
        let total_ms = r.u64()?;
        let stream_end = r.opt_str()?.map(owned);
        let limit = match r.opt_u64()? {
            None => None,
            Some(i) => Some(*LimitKind::ALL.get(usize::try_from(i).ok()?)?),
        };
        r.0.is_empty().then_some(UsageRecord {
            request_id,
            at,
            org,
            url,
            caller,
            endpoint,
            model,
            model_sent,
            routing,
            stream,
            status,
            account,
            attempts,
            usage,
            cost_nano_usd,
            cost_basis,
            ttft_ms,
            total_ms,
            stream_end,
            limit,
        })
    }
}

fn owned(s: &str) -> Cow<'static, str> {
    Cow::Owned(s.to_owned())
}

thread_local! {
    /// Where [`Packed::pack`] writes before it copies.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(512));
}

/// Appends the fields.
struct Writer(Vec<u8>);

impl Writer {
    /// Every field of `r`, in order.
    fn record(&mut self, r: &UsageRecord) {
        self.str(&r.request_id);
        self.u64(r.at);
        self.str(&r.org);
        self.str(&r.url);
        self.u64(match r.caller.kind {
            CallerKind::User => 0,
            CallerKind::Client => 1,
        });
        self.str(&r.caller.id);
        self.str(&r.endpoint);
        self.opt_str(r.model.as_deref());
        match (&r.model, &r.model_sent) {
            // Usually the model sent is the one asked: tag 2, "the same".
            (Some(asked), Some(sent)) if asked == sent => self.0.push(SAME_MODEL),
            (_, sent) => self.opt_str(sent.as_deref()),
        }
        self.flag(r.routing.is_some());
        if let Some(routing) = &r.routing {
            self.opt_str(routing.alias.as_deref());
            self.u64(routing.position.into());
        }
        self.flag(r.stream);
        self.u64(r.status.into());
        self.opt_str(r.account.as_ref().map(AccountId::as_str));
        self.u64(r.attempts.len() as u64);
        for a in &r.attempts {
            self.str(a.account.as_str());
            self.opt_u64(a.status.map(u64::from));
            self.str(&a.outcome);
            self.opt_str(a.class.as_deref());
            self.u64(a.ms);
        }
        let u = &r.usage;
        self.u64(u.input_tokens);
        self.u64(u.output_tokens);
        self.u64(u.cache_creation_input_tokens);
        self.u64(u.cache_read_input_tokens);
        self.u64(r.cost_nano_usd);
        self.u64(match r.cost_basis {
            CostBasis::Api => 0,
            CostBasis::ListPriceEquivalent => 1,
            CostBasis::Unpriced => 2,
        });
        self.opt_u64(r.ttft_ms);
        self.u64(r.total_ms);
        self.opt_str(r.stream_end.as_deref());
        self.opt_u64(
            r.limit
                .and_then(|l| LimitKind::ALL.iter().position(|&k| k == l))
                .map(|i| i as u64),
        );
    }

    fn u64(&mut self, mut n: u64) {
        while n >= 0x80 {
            self.0.push((n as u8) | 0x80);
            n >>= 7;
        }
        self.0.push(n as u8);
    }

    fn flag(&mut self, b: bool) {
        self.0.push(u8::from(b));
    }

    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }

    fn opt_str(&mut self, s: Option<&str>) {
        self.flag(s.is_some());
        if let Some(s) = s {
            self.str(s);
        }
    }

    fn opt_u64(&mut self, n: Option<u64>) {
        self.flag(n.is_some());
        if let Some(n) = n {
            self.u64(n);
        }
    }
}

/// Reads the fields back, in the same order.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn u64(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            n |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(n);
            }
        }
        None
    }

    fn flag(&mut self) -> Option<bool> {
        match self.byte()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    fn str(&mut self) -> Option<&'a str> {
        let len = usize::try_from(self.u64()?).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (s, rest) = self.0.split_at(len);
        self.0 = rest;
        std::str::from_utf8(s).ok()
    }

    fn opt_str(&mut self) -> Option<Option<&'a str>> {
        Some(match self.flag()? {
            false => None,
            true => Some(self.str()?),
        })
    }

    fn opt_u64(&mut self) -> Option<Option<u64>> {
        Some(match self.flag()? {
            false => None,
            true => Some(self.u64()?),
        })
    }

    fn attempt(&mut self) -> Option<AttemptRecord> {
        Some(AttemptRecord {
            account: AccountId::from(self.str()?),
            status: self.opt_u64()?.map(u16::try_from).transpose().ok()?,
            outcome: owned(self.str()?),
            class: self.opt_str()?.map(owned),
            ms: self.u64()?,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9_:.-é]{0,40}"
    }

    fn attempt() -> impl Strategy<Value = AttemptRecord> {
        (
            text(),
            proptest::option::of(any::<u16>()),
            text(),
            proptest::option::of(text()),
            any::<u64>(),
        )
            .prop_map(|(account, status, outcome, class, ms)| AttemptRecord {
                account: AccountId::from(account),
                status,
                outcome: Cow::Owned(outcome),
                class: class.map(Cow::Owned),
                ms,
            })
    }

    prop_compose! {
        /// Any record.
        pub(crate) fn record()(
            names in proptest::collection::vec(text(), 5),
            models in (proptest::option::of(text()), proptest::option::of(text())),
            routing in proptest::option::of((proptest::option::of(text()), any::<u32>())),
            flags in (any::<bool>(), any::<bool>(), any::<u16>(), 0..3u8),
            account in proptest::option::of(text()),
            attempts in proptest::collection::vec(attempt(), 0..4),
            numbers in proptest::collection::vec(any::<u64>(), 7),
            ttft in proptest::option::of(any::<u64>()),
            stream_end in proptest::option::of(text()),
            limit in proptest::option::of(0..LimitKind::ALL.len()),
        ) -> UsageRecord {
            let (user, stream, status, basis) = flags;
            UsageRecord {
                request_id: Arc::from(names[0].as_str()),
                at: numbers[0],
                org: Arc::from(names[1].as_str()),
                url: Arc::from(names[2].as_str()),
                caller: CallerRef {
                    kind: if user { CallerKind::User } else { CallerKind::Client },
                    id: Arc::from(names[3].as_str()),
                },
                endpoint: Cow::Owned(names[4].clone()),
                model: models.0.map(Arc::from),
                model_sent: models.1.map(Arc::from),
                routing: routing.map(|(alias, position)| ModelRouting {
                    alias: alias.map(Arc::from),
                    position,
                }),
                stream,
                status,
                account: account.map(AccountId::from),
                attempts,
                usage: Usage {
                    input_tokens: numbers[1],
                    output_tokens: numbers[2],
                    cache_creation_input_tokens: numbers[3],
                    cache_read_input_tokens: numbers[4],
                },
                cost_nano_usd: numbers[5],
                cost_basis: [CostBasis::Api, CostBasis::ListPriceEquivalent, CostBasis::Unpriced]
                    [usize::from(basis)],
                ttft_ms: ttft,
                total_ms: numbers[6],
                stream_end: stream_end.map(Cow::Owned),
                limit: limit.map(|i| LimitKind::ALL[i]),
            }
        }
    }

    proptest! {
        #[test]
        fn a_record_unpacks_to_itself(record in record()) {
            let packed = Packed::pack(&record);
            prop_assert_eq!(packed.request_id(), Some(&*record.request_id));
            prop_assert_eq!(packed.unpack(), Some(record));
        }

        #[test]
        fn cut_or_extended_bytes_never_unpack_to_a_record(record in record(), cut in any::<prop::sample::Index>()) {
            let Packed(bytes) = Packed::pack(&record);
            let short = Packed(bytes[..cut.index(bytes.len())].to_vec());
            prop_assert_eq!(short.unpack(), None);
            let mut long = bytes.clone();
            long.push(0);
            prop_assert_eq!(Packed(long).unpack(), None);
        }

        /// A record refilled with another's bytes is that other record, whatever either
        /// was, and keeps at most `SPARE_ROOM` bytes of room it does not use.
        #[test]
        fn a_refilled_record_is_the_new_one(old in record(), new in record()) {
            let mut packed = Packed::pack(&old);
            let kept = packed.0.as_ptr();
            let had = packed.0.capacity();
            Packed::packing(&new, |bytes| packed.refill(bytes));
            prop_assert_eq!(packed.unpack(), Some(new));
            prop_assert!(packed.0.capacity() <= packed.0.len() + SPARE_ROOM);
            if had >= packed.0.len() && had <= packed.0.len() + SPARE_ROOM {
                prop_assert_eq!(packed.0.as_ptr(), kept, "refilled in its own allocation");
            }
        }
    }

    #[test]
    fn a_typical_record_is_one_small_allocation() {
        let record = UsageRecord {
            request_id: Arc::from("req_01JXYZABCDEFGHJKMNPQRSTVWX"),
            at: 1_764_633_600_000,
            org: Arc::from("acme"),
            url: Arc::from("team"),
            caller: CallerRef {
                kind: CallerKind::User,
                id: Arc::from("alice-laptop"),
            },
            endpoint: Cow::Borrowed("messages"),
            model: Some(Arc::from("claude-sonnet-4-5")),
            model_sent: Some(Arc::from("claude-sonnet-4-5")),
            routing: None,
            stream: true,
            status: 200,
            account: Some(AccountId::from("acme-max-01")),
            attempts: vec![AttemptRecord {
                account: AccountId::from("acme-max-01"),
                status: Some(200),
                outcome: Cow::Borrowed("ok"),
                class: None,
                ms: 812,
            }],
            usage: Usage {
                input_tokens: 1_200,
                output_tokens: 350,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 24_000,
            },
            cost_nano_usd: 17_000_000,
            cost_basis: CostBasis::ListPriceEquivalent,
            ttft_ms: Some(640),
            total_ms: 4_100,
            stream_end: Some(Cow::Borrowed("completed")),
            limit: None,
        };
        let packed = Packed::pack(&record);
        assert!(packed.0.len() <= 160, "{} bytes", packed.0.len());
        assert_eq!(packed.unpack().unwrap().model_sent, record.model_sent);
        assert_eq!(packed.unpack(), Some(record));
    }
}
