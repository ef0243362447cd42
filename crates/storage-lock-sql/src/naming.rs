/// The table name used unless configured otherwise.
pub const DEFAULT_TABLE: &str = "storage_lock";

/// A table name that is not a plain SQL identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidTableName(pub String);

impl std::fmt::Display for InvalidTableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid table name {:?}: use 1-63 ASCII letters, digits and underscores, not starting with a digit",
            self.0
        )
    }
}

impl std::error::Error for InvalidTableName {}

/// Accepts `[A-Za-z_][A-Za-z0-9_]{0,62}`: table names are spliced into SQL text, so only plain
/// identifiers are allowed (no quoting games, no injection).
pub fn validate_table_name(name: &str) -> Result<(), InvalidTableName> {
    let ok = (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(InvalidTableName(name.to_owned()))
    }
}
