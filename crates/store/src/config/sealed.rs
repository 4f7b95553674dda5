//! Secrets sent through the admin API are stored in the config document sealed
//! (SPEC 13): `enc:v1:<nonce><ciphertext and tag>` in hex, ChaCha20-Poly1305 (ring)
//! under the 32-byte key of `KEYPOOL_SECRETS_KEY` (64 hex characters). The document,
//! its backups and Redis never hold such a secret in clear; loading the document opens
//! it with the same key.

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// The environment variable holding the key.
pub const SECRETS_KEY_ENV: &str = "KEYPOOL_SECRETS_KEY";

/// The prefix of a sealed secret.
pub const SEALED_PREFIX: &str = "enc:v1:";

/// Why a secret cannot be sealed or opened (never carries the secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// `KEYPOOL_SECRETS_KEY` is not set.
    #[error(
        "{SECRETS_KEY_ENV} is not set: keypool stores a secret sent through the API only encrypted, with that key (64 hex characters, e.g. from `openssl rand -hex 32`); set it on every replica, or give the secret as $ENV_NAME or file:/path instead"
    )]
    NoKey,
    /// The key is not 64 hex characters.
    #[error(
        "{SECRETS_KEY_ENV} must be 64 hex characters (32 bytes), e.g. from `openssl rand -hex 32`"
    )]
    BadKey,
    /// Not a sealed secret of this version, or damaged.
    #[error("this encrypted secret is damaged (expected enc:v1: and hex); write the secret again")]
    Malformed,
    /// Opened with another key than the one that sealed it.
    #[error(
        "this encrypted secret cannot be opened with {SECRETS_KEY_ENV}: another key encrypted it; set the key it was stored with"
    )]
    WrongKey,
    /// The system's random source failed.
    #[error("no randomness for a nonce: the system's random source failed")]
    Random,
}

fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn hex_encode(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn key_of(key_hex: Option<&str>) -> Result<LessSafeKey, SealError> {
    let key_hex = key_hex.ok_or(SealError::NoKey)?.trim();
    let bytes = hex_decode(key_hex)
        .filter(|b| b.len() == 32)
        .ok_or(SealError::BadKey)?;
    let unbound = UnboundKey::new(&CHACHA20_POLY1305, &bytes).map_err(|_| SealError::BadKey)?;
    Ok(LessSafeKey::new(unbound))
}

/// Whether `value` is a sealed secret.
pub fn is_sealed(value: &str) -> bool {
    value.starts_with(SEALED_PREFIX)
}

/// Seals `secret` under `key_hex` (the value of `KEYPOOL_SECRETS_KEY`).
///
/// # Errors
/// [`SealError::NoKey`], [`SealError::BadKey`], [`SealError::Random`].
pub fn seal(key_hex: Option<&str>, secret: &str) -> Result<String, SealError> {
    let key = key_of(key_hex)?;
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| SealError::Random)?;
    let mut data = secret.as_bytes().to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(SEALED_PREFIX.as_bytes()),
        &mut data,
    )
    .map_err(|_| SealError::Random)?;
    Ok(format!(
        "{SEALED_PREFIX}{}{}",
        hex_encode(&nonce),
        hex_encode(&data)
    ))
}

/// Opens a sealed secret with `key_hex`.
///
/// # Errors
/// Every [`SealError`] but `Random`.
pub fn open(key_hex: Option<&str>, sealed: &str) -> Result<String, SealError> {
    let body = sealed
        .strip_prefix(SEALED_PREFIX)
        .ok_or(SealError::Malformed)?;
    let bytes = hex_decode(body).ok_or(SealError::Malformed)?;
    if bytes.len() <= NONCE_LEN {
        return Err(SealError::Malformed);
    }
    let key = key_of(key_hex)?;
    let (nonce, data) = bytes.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Malformed)?;
    let mut data = data.to_vec();
    let plain = key
        .open_in_place(nonce, Aad::from(SEALED_PREFIX.as_bytes()), &mut data)
        .map_err(|_| SealError::WrongKey)?;
    String::from_utf8(plain.to_vec()).map_err(|_| SealError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn a_sealed_secret_opens_with_its_key_only_and_never_shows_it() {
        let sealed = seal(Some(KEY), "sk-ant-api03-secret").unwrap();
        assert!(sealed.starts_with(SEALED_PREFIX));
        assert!(!sealed.contains("secret"));
        assert_eq!(open(Some(KEY), &sealed).unwrap(), "sk-ant-api03-secret");
        // A fresh nonce each time.
        assert_ne!(seal(Some(KEY), "sk-ant-api03-secret").unwrap(), sealed);
        let other = KEY.replace("00", "ff");
        assert_eq!(open(Some(&other), &sealed), Err(SealError::WrongKey));
        assert_eq!(open(None, &sealed), Err(SealError::NoKey));
        assert_eq!(seal(None, "x"), Err(SealError::NoKey));
        assert_eq!(seal(Some("abc"), "x"), Err(SealError::BadKey));
        let mut damaged = sealed.clone();
        damaged.pop();
        assert!(open(Some(KEY), &damaged).is_err());
        assert_eq!(open(Some(KEY), "enc:v1:zz"), Err(SealError::Malformed));
    }
}
