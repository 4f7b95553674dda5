//! LB keys: hashing, extraction from request headers, generation (`keypool keygen`).

use rand::Rng;
use sha2::{Digest, Sha256};

use crate::config::KeyHash;

/// The prefix of every LB key.
pub const LB_KEY_PREFIX: &str = "sk-lb-";
/// How many random base62 characters [`generate_lb_key`] puts after the prefix.
pub const LB_KEY_RANDOM_CHARS: usize = 40;
/// The prefix of a client's own Claude OAuth token, which is never an LB key (SPEC 3.3).
pub const CLIENT_OAUTH_PREFIX: &str = "sk-ant-oat01-";

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The SHA-256 of a presented key, as stored in the config.
pub fn hash_key(key: &str) -> KeyHash {
    KeyHash(Sha256::digest(key.as_bytes()).into())
}

/// Whether `a` and `b` are the same bytes, without an early exit at the first
/// difference (only the lengths, which say nothing of a key's text, are compared
/// first).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The longest presented key a [`KeyMemo`] keeps (an `sk-lb-` key is 46 bytes):
/// anything longer is hashed every time rather than kept.
const MAX_MEMO_KEY_LEN: usize = 128;

/// The key a connection presented last and its SHA-256: a keep-alive connection sends
/// the same key with every request, so the hash is computed once per connection
/// instead of once per request (issue 22: 3,600 instructions per request in software;
/// about 70 ns with the CPU's SHA extensions).
///
/// It only remembers the hash; whether that hash is a key of the config in force, and
/// may use the route, is looked up for every request. The presented text lives as long
/// as the connection that sent it (which held it in its read buffer anyway), is
/// compared in constant time (a connection can carry several callers' requests
/// behind a shared proxy), and is never printed.
#[derive(Default)]
pub struct KeyMemo {
    last: Option<(Box<str>, KeyHash)>,
}

impl KeyMemo {
    /// [`hash_key`] of `presented`, remembered for the next call.
    pub fn hash(&mut self, presented: &str) -> KeyHash {
        if let Some((text, hash)) = &self.last
            && constant_time_eq(text.as_bytes(), presented.as_bytes())
        {
            return *hash;
        }
        let hash = hash_key(presented);
        self.last = (presented.len() <= MAX_MEMO_KEY_LEN).then(|| (Box::from(presented), hash));
        hash
    }
}

impl std::fmt::Debug for KeyMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyMemo")
            .field("holds_a_key", &self.last.is_some())
            .finish()
    }
}

/// Picks the LB key out of the request's `x-api-key` and `Authorization` header values
/// (SPEC 3.3). A `Bearer` token that starts with `sk-ant-oat01-` is the client's own
/// OAuth token and is ignored, as is an `x-api-key` of that form; of what remains, a
/// value that looks like an LB key (`sk-lb-`) wins, otherwise the first present one
/// (which will then fail authentication).
pub fn presented_key<'a>(
    x_api_key: Option<&'a str>,
    authorization: Option<&'a str>,
) -> Option<&'a str> {
    let bearer = authorization.and_then(|v| {
        let v = v.trim();
        let (scheme, token) = v.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    });
    let usable = |v: Option<&'a str>| {
        v.map(str::trim)
            .filter(|v| !v.is_empty() && !v.starts_with(CLIENT_OAUTH_PREFIX))
    };
    let (a, b) = (usable(x_api_key), usable(bearer));
    [a, b]
        .into_iter()
        .flatten()
        .find(|v| v.starts_with(LB_KEY_PREFIX))
        .or(a)
        .or(b)
}

/// A freshly generated LB key and the config line that admits it.
#[derive(Clone, PartialEq, Eq)]
pub struct GeneratedKey {
    /// `sk-lb-` + 40 base62 characters: give it to the caller, once.
    pub key: String,
    /// Its SHA-256 as 64 lowercase hex characters.
    pub sha256_hex: String,
}

impl GeneratedKey {
    /// The `sha256 = "…"` line to paste into a `[[keys]]` table.
    pub fn config_line(&self) -> String {
        format!("sha256 = \"{}\"", self.sha256_hex)
    }
}

impl std::fmt::Debug for GeneratedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedKey")
            .field("key", &"[redacted]")
            .field("sha256_hex", &self.sha256_hex)
            .finish()
    }
}

/// Generates a new LB key from `rng` (pass an OS-seeded rng in production; 40 base62
/// characters are about 238 bits).
pub fn generate_lb_key(rng: &mut impl Rng) -> GeneratedKey {
    let mut key = String::with_capacity(LB_KEY_PREFIX.len() + LB_KEY_RANDOM_CHARS);
    key.push_str(LB_KEY_PREFIX);
    for _ in 0..LB_KEY_RANDOM_CHARS {
        key.push(char::from(BASE62[rng.random_range(0..BASE62.len())]));
    }
    let sha256_hex = hash_key(&key).to_hex();
    GeneratedKey { key, sha256_hex }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn hash_matches_a_known_vector() {
        // sha256("foo")
        assert_eq!(
            hash_key("foo").to_hex(),
            "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
        );
    }

    #[test]
    fn generated_keys_have_the_documented_shape_and_hash() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let a = generate_lb_key(&mut rng);
        let b = generate_lb_key(&mut rng);
        assert_ne!(a.key, b.key);
        assert!(a.key.starts_with("sk-lb-"));
        assert_eq!(a.key.len(), 6 + 40);
        assert!(a.key[6..].bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_eq!(a.sha256_hex, hash_key(&a.key).to_hex());
        assert_eq!(a.config_line(), format!("sha256 = \"{}\"", a.sha256_hex));
        assert!(!format!("{a:?}").contains(&a.key));
        assert!(KeyHash::from_hex(&a.sha256_hex).is_some());
    }

    #[test]
    fn a_memo_hashes_a_new_key_and_keeps_only_a_short_one() {
        let mut memo = KeyMemo::default();
        assert!(!format!("{memo:?}").contains("true"));
        let a = "sk-lb-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        assert_eq!(memo.hash(a), hash_key(a));
        assert_eq!(memo.hash(a), hash_key(a));
        // the text is never printed, only whether one is held
        let shown = format!("{memo:?}");
        assert_eq!(shown, "KeyMemo { holds_a_key: true }");
        // one byte changed, one byte longer, one byte shorter: hashed afresh
        let b = "sk-lb-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab";
        assert_eq!(memo.hash(b), hash_key(b));
        assert_eq!(memo.hash(&format!("{b}c")), hash_key(&format!("{b}c")));
        assert_eq!(memo.hash(&b[..b.len() - 1]), hash_key(&b[..b.len() - 1]));
        // too long to keep: hashed, and nothing held
        let long = "x".repeat(MAX_MEMO_KEY_LEN + 1);
        assert_eq!(memo.hash(&long), hash_key(&long));
        assert_eq!(format!("{memo:?}"), "KeyMemo { holds_a_key: false }");
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"sk-lb-x", b"sk-lb-x"));
        assert!(!constant_time_eq(b"sk-lb-x", b"sk-lb-y"));
        assert!(!constant_time_eq(b"sk-lb-x", b"sk-lb-xx"));
        assert!(!constant_time_eq(b"", b"a"));
    }

    #[test]
    fn presented_key_rules() {
        let lb = "sk-lb-abc";
        assert_eq!(presented_key(Some(lb), None), Some(lb));
        assert_eq!(presented_key(None, Some("Bearer sk-lb-abc")), Some(lb));
        assert_eq!(presented_key(None, Some("bearer   sk-lb-abc ")), Some(lb));
        // the client's own OAuth token is ignored: look at the other header
        assert_eq!(
            presented_key(Some(lb), Some("Bearer sk-ant-oat01-xyz")),
            Some(lb)
        );
        assert_eq!(presented_key(None, Some("Bearer sk-ant-oat01-xyz")), None);
        // an LB-looking value wins over another credential
        assert_eq!(
            presented_key(Some("sk-ant-api03-x"), Some("Bearer sk-lb-abc")),
            Some(lb)
        );
        assert_eq!(presented_key(Some("whatever"), None), Some("whatever"));
        assert_eq!(presented_key(None, Some("Basic dXNlcg==")), None);
        assert_eq!(presented_key(Some(""), None), None);
        assert_eq!(presented_key(None, None), None);
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    proptest! {
        #[test]
        fn every_generated_key_is_well_formed_and_hashes_to_its_line(seed in any::<u64>()) {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let k = generate_lb_key(&mut rng);
            prop_assert!(k.key.starts_with(LB_KEY_PREFIX));
            prop_assert_eq!(k.key.len(), LB_KEY_PREFIX.len() + LB_KEY_RANDOM_CHARS);
            prop_assert!(k.key[LB_KEY_PREFIX.len()..].bytes().all(|b| b.is_ascii_alphanumeric()));
            prop_assert_eq!(hash_key(&k.key).to_hex(), k.sha256_hex);
        }

        /// A memo is invisible: whatever keys a connection presents, in any order, each
        /// gets its own SHA-256.
        #[test]
        fn a_memo_gives_every_key_its_own_hash(
            keys in proptest::collection::vec("sk-lb-[ab]{0,3}", 1..40),
        ) {
            let mut memo = KeyMemo::default();
            for key in &keys {
                prop_assert_eq!(memo.hash(key), hash_key(key));
            }
        }

        #[test]
        fn constant_time_eq_agrees_with_eq(a in "[ab]{0,4}", b in "[ab]{0,4}") {
            prop_assert_eq!(constant_time_eq(a.as_bytes(), b.as_bytes()), a == b);
        }

        #[test]
        fn presented_key_never_returns_a_client_oauth_token(
            x in proptest::option::of("(sk-ant-oat01-|sk-lb-|)[a-z]{0,8}"),
            bearer in proptest::option::of("(sk-ant-oat01-|sk-lb-|)[a-z]{0,8}"),
        ) {
            let auth = bearer.as_ref().map(|b| format!("Bearer {b}"));
            let got = presented_key(x.as_deref(), auth.as_deref());
            if let Some(k) = got {
                prop_assert!(!k.starts_with(CLIENT_OAUTH_PREFIX));
                prop_assert!(!k.is_empty());
            }
            // an LB key present in either header is always the one picked
            let lb = [x.as_deref(), bearer.as_deref()].into_iter().flatten().find(|v| v.starts_with(LB_KEY_PREFIX));
            if let Some(lb) = lb {
                prop_assert_eq!(got, Some(lb));
            }
        }
    }
}
