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
