//! The versioned encoding of canonical events, as stored in the log.
//!
//! A record is JSON: `{"v":1,"event":{…}}`. Version 1 grows only by adding
//! event kinds and optional fields (read with defaults), so every log written
//! since stays readable. A record from a newer keel, with a version this one
//! does not know, is a clear error rather than a guess.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::event::Event;

/// The encoding this build writes.
pub const CURRENT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Written by a newer keel.
    UnsupportedVersion { found: u32, supported: u32 },
    /// Not a record at all, or not a valid event of its version.
    Malformed { reason: String },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::UnsupportedVersion { found, supported } => write!(
                f,
                "event record has encoding version {found}; this keel reads versions up to {supported} (upgrade keel)"
            ),
            DecodeError::Malformed { reason } => write!(f, "event record is malformed: {reason}"),
        }
    }
}

impl std::error::Error for DecodeError {}

#[derive(Serialize)]
struct RecordOut<'a> {
    v: u32,
    event: &'a Event,
}

#[derive(Deserialize)]
struct Version {
    v: u32,
}

#[derive(Deserialize)]
struct RecordV1 {
    v: u32,
    event: Event,
}

pub fn encode(event: &Event) -> Vec<u8> {
    let record = RecordOut {
        v: CURRENT_VERSION,
        event,
    };
    // Serializing plain data with string keys into a Vec cannot fail.
    serde_json::to_vec(&record).unwrap_or_default()
}

/// Decode one record in a single pass; only when that fails is the version
/// looked at alone, so that a record from a newer keel is named as such
/// rather than called malformed.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    match serde_json::from_slice::<RecordV1>(bytes) {
        Ok(RecordV1 { v: 1, event }) => Ok(event),
        Ok(RecordV1 { v: found, .. }) => Err(DecodeError::UnsupportedVersion {
            found,
            supported: CURRENT_VERSION,
        }),
        Err(error) => match serde_json::from_slice::<Version>(bytes) {
            Ok(Version { v: found }) if found != CURRENT_VERSION => {
                Err(DecodeError::UnsupportedVersion {
                    found,
                    supported: CURRENT_VERSION,
                })
            }
            Ok(_) | Err(_) => Err(DecodeError::Malformed {
                reason: error.to_string(),
            }),
        },
    }
}
