//! A small, fast hasher for account ids.
//!
//! Account ids come from the operator's configuration, not from callers, so hash
//! flooding is not a concern and the planner's hot path (a map lookup per account per
//! plan) can use a multiply-fold hash instead of SipHash: each step multiplies two
//! 64-bit words into 128 bits and folds the halves together with XOR, which mixes every
//! input bit into the high and the low half (hashbrown reads both).

use std::hash::Hasher;

const SEED: u64 = 0x243f_6a88_85a3_08d3; // the first digits of pi
const K1: u64 = 0x9e37_79b9_7f4a_7c15; // 2^64 / golden ratio
const K2: u64 = 0xb7e1_5162_8aed_2a6b; // the first digits of e

/// Multiplies `a` and `b` into 128 bits and folds the halves together.
#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

/// Little-endian `u64` of the 8 bytes at `at` (`bytes.len() >= at + 8`).
#[inline]
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Multiply-fold hashing, two words per step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Default for IdHasher {
    fn default() -> Self {
        Self(SEED)
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        fold(self.0, K1)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let len = bytes.len();
        let (a, b) = if len >= 16 {
            let mut at = 0;
            while len - at > 16 {
                self.0 = fold(self.0 ^ word(bytes, at), word(bytes, at + 8) ^ K1);
                at += 16;
            }
            // The last 16 bytes, overlapping the previous step when needed.
            (word(bytes, len - 16), word(bytes, len - 8))
        } else if len >= 8 {
            (word(bytes, 0), word(bytes, len - 8))
        } else {
            let mut w = [0u8; 8];
            w[..len].copy_from_slice(bytes);
            (u64::from_le_bytes(w), 0)
        };
        // The length keeps overlapping and padded reads of different inputs apart.
        self.0 = fold(self.0 ^ a ^ K2, b ^ K1 ^ len as u64);
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        // `str` ends its hash with one `0xff`; `finish` mixes it in.
        self.0 = self.0.rotate_left(8) ^ u64::from(i);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::{BuildHasher, BuildHasherDefault};

    use super::*;

    fn hash(s: &str) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(s)
    }

    #[test]
    fn is_deterministic_and_tells_similar_ids_apart() {
        assert_eq!(hash("org-1/account-00001"), hash("org-1/account-00001"));
        let ids: Vec<String> = (0..10_000)
            .map(|i| format!("org-1/account-{i:05}"))
            .collect();
        let full: HashSet<u64> = ids.iter().map(|s| hash(s)).collect();
        assert_eq!(full.len(), ids.len());
        // hashbrown's bucket index comes from the low bits: they must spread too.
        let low: HashSet<u64> = ids.iter().map(|s| hash(s) & 0x3fff).collect();
        assert!(
            low.len() > 5_000,
            "only {} distinct low-14-bit values",
            low.len()
        );
        assert_ne!(hash("ab"), hash("ab\0"));
        assert_ne!(hash(""), hash("\0"));
    }
}
