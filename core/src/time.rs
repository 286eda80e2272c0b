//! Time as a value. keel-core never reads a clock: the shell passes `now` into
//! every transition, so a run can be replayed and tested with any timeline.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub const fn from_millis(millis: u64) -> Self {
        Timestamp(millis)
    }

    pub const fn as_millis(self) -> u64 {
        self.0
    }

    pub const fn plus_millis(self, millis: u64) -> Self {
        Timestamp(self.0.saturating_add(millis))
    }

    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
    pub const fn millis_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timestamp_shows_as_its_milliseconds() {
        assert_eq!(Timestamp(1_700_000_000_123).to_string(), "1700000000123ms");
    }
}
