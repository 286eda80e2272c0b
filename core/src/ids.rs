//! Identifiers: conversations, events (`"{conversation}:{seq}"`) and tool calls.
//!
//! Ids are validated once, where they enter, so the rest of keel can put them
//! in paths, registry names and URLs without escaping.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Position of an event in its conversation's log. The first event has seq 1.
pub type Seq = u64;

/// The longest id keel accepts; longer ids are a caller's mistake.
pub const MAX_ID_LEN: usize = 128;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdError {
    Empty,
    TooLong {
        len: usize,
    },
    BadChar {
        ch: char,
    },
    /// An event id lacks the `:seq` suffix or its seq is not a positive number.
    BadEventId,
}

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdError::Empty => write!(f, "id is empty"),
            IdError::TooLong { len } => {
                write!(f, "id is {len} characters long; the limit is {MAX_ID_LEN}")
            }
            IdError::BadChar { ch } => write!(
                f,
                "id contains {ch:?}; only ASCII letters, digits, '-', '_' and '.' are allowed"
            ),
            IdError::BadEventId => write!(f, "event id must look like \"conversation:seq\""),
        }
    }
}

impl std::error::Error for IdError {}

fn validate(raw: &str) -> Result<(), IdError> {
    if raw.is_empty() {
        return Err(IdError::Empty);
    }
    if raw.len() > MAX_ID_LEN {
        return Err(IdError::TooLong { len: raw.len() });
    }
    match raw
        .chars()
        .find(|ch| !(ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.')))
    {
        Some(ch) => Err(IdError::BadChar { ch }),
        None if raw == "." || raw == ".." => Err(IdError::BadChar { ch: '.' }),
        None => Ok(()),
    }
}

/// Names one conversation for its whole life: in the log, the registry and URLs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ConversationId(String);

impl ConversationId {
    pub fn new(raw: impl Into<String>) -> Result<Self, IdError> {
        let raw = raw.into();
        validate(&raw)?;
        Ok(ConversationId(raw))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id of the event at `seq` in this conversation.
    pub fn event_id(&self, seq: Seq) -> EventId {
        EventId {
            conversation: self.clone(),
            seq,
        }
    }
}

impl TryFrom<String> for ConversationId {
    type Error = IdError;
    fn try_from(raw: String) -> Result<Self, IdError> {
        ConversationId::new(raw)
    }
}

impl From<ConversationId> for String {
    fn from(id: ConversationId) -> String {
        id.0
    }
}

impl fmt::Display for ConversationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ConversationId {
    type Err = IdError;
    fn from_str(raw: &str) -> Result<Self, IdError> {
        ConversationId::new(raw)
    }
}

/// `"{conversation}:{seq}"`: globally unique, and ordered within a conversation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId {
    pub conversation: ConversationId,
    pub seq: Seq,
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.conversation, self.seq)
    }
}

impl FromStr for EventId {
    type Err = IdError;
    fn from_str(raw: &str) -> Result<Self, IdError> {
        let (conversation, seq) = raw.rsplit_once(':').ok_or(IdError::BadEventId)?;
        let seq: Seq = seq.parse().map_err(|_| IdError::BadEventId)?;
        if seq == 0 {
            return Err(IdError::BadEventId);
        }
        Ok(EventId {
            conversation: ConversationId::new(conversation)?,
            seq,
        })
    }
}

/// The provider's id for one `tool_use` block; its result must carry the same id.
/// Re-dispatch after a crash reuses it, so tools can use it as an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ToolCallId(pub String);

impl ToolCallId {
    pub fn new(raw: impl Into<String>) -> Self {
        ToolCallId(raw.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ToolCallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_id_round_trips_through_its_text_form() {
        let id = ConversationId::new("c-1").unwrap().event_id(42);
        assert_eq!(id.to_string(), "c-1:42");
        assert_eq!("c-1:42".parse::<EventId>().unwrap(), id);
    }

    #[test]
    fn bad_ids_are_rejected_with_a_reason() {
        assert_eq!(ConversationId::new(""), Err(IdError::Empty));
        assert_eq!(
            ConversationId::new("a/b"),
            Err(IdError::BadChar { ch: '/' })
        );
        assert!(ConversationId::new("..").is_err());
        assert!(ConversationId::new("x".repeat(MAX_ID_LEN + 1)).is_err());
        assert_eq!("c-1".parse::<EventId>(), Err(IdError::BadEventId));
        assert_eq!("c-1:0".parse::<EventId>(), Err(IdError::BadEventId));
        assert_eq!("c-1:x".parse::<EventId>(), Err(IdError::BadEventId));
    }

    #[test]
    fn an_id_at_the_length_limit_is_accepted_and_read_back_as_given() {
        let longest = "x".repeat(MAX_ID_LEN);
        let id = ConversationId::new(longest.clone()).unwrap();
        assert_eq!(id.as_str(), longest);
        assert_eq!(ConversationId::new("c-1.a_b").unwrap().as_str(), "c-1.a_b");
    }

    #[test]
    fn id_errors_say_what_is_wrong() {
        assert_eq!(IdError::Empty.to_string(), "id is empty");
        assert_eq!(
            IdError::TooLong { len: 300 }.to_string(),
            format!("id is 300 characters long; the limit is {MAX_ID_LEN}")
        );
        assert_eq!(
            IdError::BadChar { ch: '/' }.to_string(),
            "id contains '/'; only ASCII letters, digits, '-', '_' and '.' are allowed"
        );
        assert_eq!(
            IdError::BadEventId.to_string(),
            "event id must look like \"conversation:seq\""
        );
    }

    #[test]
    fn conversation_id_deserialization_validates() {
        let parsed: Result<ConversationId, _> = serde_json::from_str("\"a b\"");
        assert!(parsed.is_err());
    }
}
