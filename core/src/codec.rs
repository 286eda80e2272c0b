//! The versioned encoding of canonical events, as stored in the log.
//!
//! Two versions are read; the current one is written.
//!
//! - Version 1 is JSON: `{"v":1,"event":{…}}`, the event in its domain shape
//!   (kinds tagged with `"type"`). The first logs were written in it and stay
//!   readable.
//! - Version 2 (`codec/v2.rs`, written since) is MessagePack: a map
//!   `{"v":2,"event":{…}}` with the same field names, kinds tagged
//!   externally, about 4x faster to decode.
//!
//! A record's first byte tells them apart: `{` starts JSON, and a
//! MessagePack map never starts with it. Each version grows only by adding
//! event kinds and optional fields (read with defaults). A record from a
//! newer keel, with a version this one does not know, is a clear error
//! rather than a guess.

pub mod checkpoint;
mod v2;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::event::Event;

/// The encoding this build writes.
pub const CURRENT_VERSION: u32 = 2;

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

#[derive(Deserialize)]
struct Version {
    v: u32,
}

#[derive(Deserialize)]
struct RecordV1 {
    v: u32,
    event: Event,
}

/// Encode `event` as a current (version 2) record.
pub fn encode(event: &Event) -> Vec<u8> {
    let record = v2::Record {
        v: 2,
        event: event.clone().into(),
    };
    // Plain data with string keys into a Vec: this cannot fail.
    rmp_serde::to_vec_named(&record).unwrap_or_default()
}

/// Encode `event` as a version 1 (JSON) record, as keel wrote before
/// version 2. For tests of old logs and for tools that want text.
pub fn encode_v1(event: &Event) -> Vec<u8> {
    #[derive(Serialize)]
    struct RecordOut<'a> {
        v: u32,
        event: &'a Event,
    }
    serde_json::to_vec(&RecordOut { v: 1, event }).unwrap_or_default()
}

/// Decode one record of any version this keel reads.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    match bytes.first() {
        Some(b'{') => decode_json(bytes),
        Some(_) => decode_msgpack(bytes),
        None => Err(DecodeError::Malformed {
            reason: "empty record".to_owned(),
        }),
    }
}

/// In one pass; only when that fails is the version looked at alone, so that
/// a record from a newer keel is named as such rather than called malformed.
fn decode_json(bytes: &[u8]) -> Result<Event, DecodeError> {
    match serde_json::from_slice::<RecordV1>(bytes) {
        Ok(RecordV1 { v: 1, event }) => Ok(event),
        Ok(RecordV1 { v: found, .. }) => Err(unsupported(found)),
        Err(error) => match serde_json::from_slice::<Version>(bytes) {
            Ok(Version { v: found }) if found != 1 => Err(unsupported(found)),
            Ok(_) | Err(_) => Err(DecodeError::Malformed {
                reason: error.to_string(),
            }),
        },
    }
}

fn decode_msgpack(bytes: &[u8]) -> Result<Event, DecodeError> {
    match rmp_serde::from_slice::<v2::Record>(bytes) {
        Ok(v2::Record { v: 2, event }) => Ok(event.into()),
        Ok(v2::Record { v: found, .. }) => Err(unsupported(found)),
        Err(error) => match rmp_serde::from_slice::<Version>(bytes) {
            Ok(Version { v: found }) if found != 2 => Err(unsupported(found)),
            Ok(_) | Err(_) => Err(DecodeError::Malformed {
                reason: error.to_string(),
            }),
        },
    }
}

fn unsupported(found: u32) -> DecodeError {
    if found > CURRENT_VERSION {
        DecodeError::UnsupportedVersion {
            found,
            supported: CURRENT_VERSION,
        }
    } else {
        DecodeError::Malformed {
            reason: format!("version {found} in the wrong format for it"),
        }
    }
}
