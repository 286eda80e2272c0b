//! The API's error codes, one enum for both sides: the daemon answers with
//! them (`{"error": {"code", "message"}}` and the event stream's `error`
//! frame) and the client matches on them, so a code is never spelled twice
//! and the client never reads the English message to know what happened.
//! On the wire each is its snake_case string (`busy`, `not_found`,
//! `storage_unavailable`, …; docs/daemon.md, "Errors"); a code this build
//! does not know (a newer daemon's) is kept as [`ErrorCode::Other`].

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The enum, its wire strings and their documentation, written once.
macro_rules! error_codes {
    ($($(#[doc = $doc:literal])* $variant:ident => $code:literal,)*) => {
        /// A stable, machine-readable error code.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[doc = $doc])* $variant,)*
            /// A code this build does not know, as sent.
            Other(String),
        }

        impl ErrorCode {
            /// Every code this build knows, in the order of docs/daemon.md.
            pub const KNOWN: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as it is on the wire.
            pub fn as_str(&self) -> &str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                    ErrorCode::Other(code) => code,
                }
            }

            /// The code for its wire string.
            pub fn parse(code: &str) -> ErrorCode {
                match code {
                    $($code => ErrorCode::$variant,)*
                    other => ErrorCode::Other(other.to_owned()),
                }
            }
        }
    };
}

error_codes! {
    /// The request is malformed (a path, query or field out of range).
    BadRequest => "bad_request",
    /// The body is not JSON of the route's shape.
    BadJson => "bad_json",
    /// The body is over the daemon's limit.
    PayloadTooLarge => "payload_too_large",
    /// The body is not `application/json`.
    UnsupportedMediaType => "unsupported_media_type",
    /// No route has this path.
    NoRoute => "no_route",
    /// The bearer token is missing or wrong.
    Unauthorized => "unauthorized",
    /// No conversation has this id.
    NotFound => "not_found",
    /// A turn runs and the conversation rejects messages meanwhile.
    Busy => "busy",
    /// The conversation's queue of waiting messages is full.
    QueueFull => "queue_full",
    /// A message with neither text nor images.
    EmptyMessage => "empty_message",
    /// The conversation has completed or failed.
    Finished => "finished",
    /// No pending call has this id.
    UnknownCall => "unknown_call",
    /// The conversation names no image with this hash, or the image's
    /// bytes are no longer stored.
    UnknownImage => "unknown_image",
    /// The decision does not fit the pending call.
    InvalidDecision => "invalid_decision",
    /// The call was resolved already.
    AlreadyResolved => "already_resolved",
    /// The call was settled already.
    AlreadySettled => "already_settled",
    /// `resolved_by` is too long.
    ResolvedByTooLong => "resolved_by_too_long",
    /// A compaction was asked for, but there is no turn before the latest one.
    NothingToCompact => "nothing_to_compact",
    /// Compaction, fork and rewind are for a sub-agent's parent, not for it.
    SubAgentHistory => "sub_agent_history",
    /// A fork or rewind seq that is not a turn boundary of the log (the
    /// message names the nearest ones).
    NotABoundary => "not_a_boundary",
    /// The working directory is not an existing absolute directory.
    InvalidCwd => "invalid_cwd",
    /// An attached image cannot be read or is too large.
    InvalidImage => "invalid_image",
    /// The daemon is stopping.
    ShuttingDown => "shutting_down",
    /// The conversation's actor stopped.
    Stopped => "stopped",
    /// The event could not be recorded.
    NotRecorded => "not_recorded",
    /// The store stopped taking writes.
    StorageUnavailable => "storage_unavailable",
    /// The runtime did not answer in time.
    Timeout => "timeout",
    /// Several nodes: the node that owns this conversation cannot be
    /// reached now (it is being taken over after its lease); try again
    /// shortly (docs/nodes.md).
    OwnerUnavailable => "owner_unavailable",
    /// A thread (a conversation) with that id exists already.
    AlreadyExists => "already_exists",
    /// The run has ended: there is nothing to cancel.
    NotRunning => "not_running",
    /// What was asked is a feature keel does not have; the message says
    /// what to do instead.
    Unsupported => "unsupported",
    /// A decision was sent, but nothing waits for one.
    NothingWaits => "nothing_waits",
    /// A sandbox this daemon does not allow (`full-access` without
    /// `KEEL_SANDBOX_FULL_ACCESS=allow`).
    SandboxNotAllowed => "sandbox_not_allowed",
    /// A change asked with the console's cookie but without its header
    /// (`X-Keel-Console: 1`): refused as a possible cross-site request.
    CrossSite => "cross_site",
    /// Anything else: a bug or an unexpected failure.
    Internal => "internal",
    /// An event stream could not read the log it owed its client.
    CatchUpFailed => "catch_up_failed",
    /// An event stream's conversation went away.
    ConversationUnavailable => "conversation_unavailable",
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = std::borrow::Cow::<str>::deserialize(deserializer)?;
        Ok(ErrorCode::parse(&code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_their_snake_case_strings_both_ways() {
        for code in ErrorCode::KNOWN {
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(&serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
        }
        assert_eq!(ErrorCode::Busy.as_str(), "busy");
        assert_eq!(
            ErrorCode::StorageUnavailable.to_string(),
            "storage_unavailable"
        );
        assert_eq!(
            serde_json::from_str::<ErrorCode>("\"from_the_future\"").unwrap(),
            ErrorCode::Other("from_the_future".to_owned())
        );
    }
}
