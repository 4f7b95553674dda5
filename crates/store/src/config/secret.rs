//! [`Secret`]: a credential that never shows itself in `Debug`, `Display` or errors.

use std::fmt;
use std::sync::Arc;

/// A secret value (an upstream account key or OAuth token, the admin token, a Redis URL
/// with a password). `Debug` and `Display` print `[redacted]`; the value is only reachable
/// through [`Secret::expose`], which the few places that must send it call explicitly.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<Arc<str>>) -> Self {
        Self(value.into())
    }

    /// The secret value itself. Call this only to put the value on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The same value in an allocation of its own (see `Config::local_copy`).
    pub(crate) fn local_copy(&self) -> Secret {
        Secret(Arc::from(&*self.0))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_never_show_the_value() {
        let s = Secret::new("sk-ant-api03-very-secret");
        assert_eq!(format!("{s:?}"), "[redacted]");
        assert_eq!(format!("{s}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some([redacted])");
        assert_eq!(s.expose(), "sk-ant-api03-very-secret");
    }
}
