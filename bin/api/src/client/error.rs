//! The client's one error type. Each variant a person can act on says what
//! to do in its message (no daemon: start one; busy: cancel first), and
//! [`Error::code`] gives scripts the API's stable code.

use std::path::PathBuf;

use crate::types::ErrorBody;
use crate::ErrorCode;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Nothing accepts connections at the address.
    #[error("no daemon at {addr}: start one with `keel serve`")]
    NoDaemon {
        addr: String,
        #[source]
        source: reqwest::Error,
    },
    /// The daemon knows no conversation by this id.
    #[error("conversation {id} not found")]
    NotFound { id: String },
    /// A message was refused because a turn runs; `state` is what it is doing.
    #[error("busy ({state}): `keel cancel {id}` first")]
    Busy { id: String, state: String },
    /// The daemon refused the token (or none was sent).
    #[error("the daemon at {addr} refused the token: set KEEL_TOKEN, or KEEL_DATA_DIR to the daemon's data dir ({hint})")]
    Unauthorized { addr: String, hint: String },
    /// Any other refusal, in the API's words.
    #[error("{message}")]
    Api {
        status: u16,
        /// The API's stable code (docs/daemon.md, "Errors").
        code: String,
        message: String,
    },
    /// `KEEL_ADDR` cannot be made into a URL.
    #[error("KEEL_ADDR {addr:?} is not an address: give HOST:PORT, such as 127.0.0.1:7777")]
    BadAddr { addr: String },
    /// The connection failed after it was made, or timed out.
    #[error("talking to the daemon at {addr}")]
    Http {
        addr: String,
        #[source]
        source: reqwest::Error,
    },
    /// The daemon answered something that is not the API's shape.
    #[error("unexpected answer from the daemon at {addr} (status {status}): {detail}")]
    Unexpected {
        addr: String,
        status: u16,
        detail: String,
    },
    /// An image to attach could not be read or is of no supported type.
    #[error("image {path}: {reason}")]
    Image { path: PathBuf, reason: String },
}

impl Error {
    /// The API's code for a refusal (`not_found`, `busy`, `unauthorized`,
    /// …); `None` for what never reached the daemon's handlers.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::NotFound { .. } => Some(ErrorCode::NotFound.as_str()),
            Error::Busy { .. } => Some(ErrorCode::Busy.as_str()),
            Error::Unauthorized { .. } => Some(ErrorCode::Unauthorized.as_str()),
            Error::Api { code, .. } => Some(code),
            Error::NoDaemon { .. }
            | Error::BadAddr { .. }
            | Error::Http { .. }
            | Error::Unexpected { .. }
            | Error::Image { .. } => None,
        }
    }

    /// Worth trying again later: the daemon is away or stopping, not
    /// refusing the request itself.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::NoDaemon { .. } | Error::Http { .. } => true,
            Error::Api { status, .. } | Error::Unexpected { status, .. } => *status >= 500,
            Error::NotFound { .. }
            | Error::Busy { .. }
            | Error::Unauthorized { .. }
            | Error::BadAddr { .. }
            | Error::Image { .. } => false,
        }
    }

    /// The error for a non-success answer: `status` and its `body`, about
    /// conversation `id` when the route names one.
    pub(crate) fn from_answer(
        addr: &str,
        token_hint: &str,
        id: Option<&str>,
        status: u16,
        body: &[u8],
    ) -> Error {
        let Ok(ErrorBody { error }) = serde_json::from_slice::<ErrorBody>(body) else {
            return Error::Unexpected {
                addr: addr.to_owned(),
                status,
                detail: String::from_utf8_lossy(body).chars().take(300).collect(),
            };
        };
        match (error.code, id) {
            (ErrorCode::NotFound, Some(id)) => Error::NotFound { id: id.to_owned() },
            (ErrorCode::Busy, Some(id)) => Error::Busy {
                id: id.to_owned(),
                // A daemon before the `state` field said it only in words.
                state: error
                    .state
                    .or_else(|| busy_state(&error.message).map(str::to_owned))
                    .unwrap_or_else(|| "busy".to_owned()),
            },
            (ErrorCode::Unauthorized, _) => Error::Unauthorized {
                addr: addr.to_owned(),
                hint: token_hint.to_owned(),
            },
            (code, _) => Error::Api {
                status,
                code: code.as_str().to_owned(),
                message: error.message,
            },
        }
    }
}

/// The state in a busy message, "conversation X is busy (streaming): …",
/// for a daemon whose error body has no `state` yet.
fn busy_state(message: &str) -> Option<&str> {
    let (_, after) = message.split_once("busy (")?;
    let (state, _) = after.split_once(')')?;
    Some(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(id: Option<&str>, status: u16, body: &str) -> Error {
        Error::from_answer(
            "127.0.0.1:7777",
            "tried ./keel-data/token",
            id,
            status,
            body.as_bytes(),
        )
    }

    #[test]
    fn the_api_codes_become_actionable_errors() {
        let not_found = answer(
            Some("7f3c"),
            404,
            r#"{"error":{"code":"not_found","message":"conversation 7f3c not found"}}"#,
        );
        assert_eq!(not_found.to_string(), "conversation 7f3c not found");
        let fielded = answer(
            Some("7f3c"),
            409,
            r#"{"error":{"code":"busy","message":"in other words","state":"executing_tools"}}"#,
        );
        assert_eq!(
            fielded.to_string(),
            "busy (executing_tools): `keel cancel 7f3c` first"
        );
        let busy = answer(
            Some("7f3c"),
            409,
            r#"{"error":{"code":"busy","message":"conversation 7f3c is busy (streaming): cancel it first"}}"#,
        );
        assert_eq!(
            busy.to_string(),
            "busy (streaming): `keel cancel 7f3c` first"
        );
        assert_eq!(busy.code(), Some("busy"));
        let other = answer(
            Some("7f3c"),
            409,
            r#"{"error":{"code":"already_resolved","message":"call c1 was already approved"}}"#,
        );
        assert_eq!(other.code(), Some("already_resolved"));
        assert_eq!(other.to_string(), "call c1 was already approved");
        assert!(!other.is_transient());
        let unauthorized = answer(
            None,
            401,
            r#"{"error":{"code":"unauthorized","message":"no"}}"#,
        );
        assert!(unauthorized.to_string().contains("KEEL_TOKEN"));
    }

    #[test]
    fn an_answer_not_in_the_api_shape_is_unexpected() {
        let error = answer(None, 502, "Bad Gateway");
        assert!(matches!(error, Error::Unexpected { status: 502, .. }));
        assert!(error.is_transient());
        assert_eq!(error.code(), None);
    }

    #[test]
    fn a_busy_message_without_a_state_still_reads() {
        assert_eq!(
            busy_state("conversation x is busy (executing_tools): y"),
            Some("executing_tools")
        );
        assert_eq!(busy_state("busy"), None);
    }
}
