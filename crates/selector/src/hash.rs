//! A small, fast hasher for account ids.
//!
//! Account ids come from the operator's configuration, not from callers, so hash
//! flooding is not a concern and the planner's hot path can use FNV-1a instead of
//! SipHash.

use std::hash::Hasher;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over the bytes written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Default for IdHasher {
    fn default() -> Self {
        Self(FNV_OFFSET)
    }
}

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_fnv1a_reference_values() {
        let mut h = IdHasher::default();
        h.write(b"");
        assert_eq!(h.finish(), 0xcbf2_9ce4_8422_2325);
        let mut h = IdHasher::default();
        h.write(b"a");
        assert_eq!(h.finish(), 0xaf63_dc4c_8601_ec8c);
    }
}
