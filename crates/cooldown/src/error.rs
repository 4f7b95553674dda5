//! The crate's one error type.

/// Errors of `keypool-cooldown`. Only configuration can be invalid: every policy
/// operation is total.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CooldownError {
    /// A configuration value is out of its range.
    #[error(
        "invalid cooldown setting `{field}` = {value}: {expected}; fix it in the configuration"
    )]
    InvalidSetting {
        /// The setting's name, as in [`crate::CooldownSettings`].
        field: &'static str,
        /// The rejected value, printed.
        value: String,
        /// What the value must be.
        expected: &'static str,
    },
}
