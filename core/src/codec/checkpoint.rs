//! Working-set checkpoints: the whole [`WorkingSet`] at a log position, so
//! that a cold start decodes one value and replays only the events after
//! it instead of the whole log.
//!
//! A checkpoint is a cache over the log, like the snapshot: the log stays
//! the only truth. It records the log position it was built from
//! (`working.last_seq`), the reducer that built it and its own format. One
//! written by another reducer or format, one that does not decode, or one
//! that does not fit the log is not used, and the log is replayed whole.
//!
//! The encoding is MessagePack with named fields. The prompt's content
//! blocks go through externally tagged mirrors (as record version 2 does for
//! events): serde decodes the domain's internally tagged enums by buffering
//! each one first, which made a checkpoint slower to decode than the log it
//! replaces.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::codec::DecodeError;
use crate::message::{ContentBlock, ImageRef, Message, Role, ToolCall, ToolResult};
use crate::reducer::{WorkingSet, REDUCER_VERSION};

/// The layout of a checkpoint; bumped when it changes.
pub const FORMAT: u32 = 1;

#[derive(Serialize)]
struct CheckpointRef<'a> {
    format: u32,
    reducer: u32,
    /// Everything but the prompt, in the domain's own shape.
    working: &'a WorkingSet,
    messages: Vec<MessageRef<'a>>,
}

#[derive(Deserialize)]
struct Checkpoint {
    format: u32,
    reducer: u32,
    working: WorkingSet,
    messages: Vec<MessageOwned>,
}

#[derive(Serialize)]
struct MessageRef<'a> {
    role: Role,
    content: Vec<BlockRef<'a>>,
}

#[derive(Deserialize)]
struct MessageOwned {
    role: Role,
    content: Vec<BlockOwned>,
}

#[derive(Serialize)]
enum BlockRef<'a> {
    Text(&'a str),
    Thinking(&'a str, Option<&'a str>),
    Image(&'a ImageRef),
    ToolUse(&'a ToolCall),
    ToolResult(&'a ToolResult),
}

#[derive(Deserialize)]
enum BlockOwned {
    Text(String),
    Thinking(String, Option<String>),
    Image(ImageRef),
    ToolUse(ToolCall),
    ToolResult(ToolResult),
}

impl<'a> From<&'a ContentBlock> for BlockRef<'a> {
    fn from(block: &'a ContentBlock) -> Self {
        match block {
            ContentBlock::Text { text } => BlockRef::Text(text),
            ContentBlock::Thinking { text, signature } => {
                BlockRef::Thinking(text, signature.as_deref())
            }
            ContentBlock::Image { image } => BlockRef::Image(image),
            ContentBlock::ToolUse { call } => BlockRef::ToolUse(call),
            ContentBlock::ToolResult { result } => BlockRef::ToolResult(result),
        }
    }
}

impl From<BlockOwned> for ContentBlock {
    fn from(block: BlockOwned) -> Self {
        match block {
            BlockOwned::Text(text) => ContentBlock::Text { text },
            BlockOwned::Thinking(text, signature) => ContentBlock::Thinking { text, signature },
            BlockOwned::Image(image) => ContentBlock::Image { image },
            BlockOwned::ToolUse(call) => ContentBlock::ToolUse { call },
            BlockOwned::ToolResult(result) => ContentBlock::ToolResult { result },
        }
    }
}

/// `working` as a checkpoint.
pub fn encode(working: &WorkingSet) -> Vec<u8> {
    let shell = without_messages(working);
    let checkpoint = CheckpointRef {
        format: FORMAT,
        reducer: REDUCER_VERSION,
        working: &shell,
        messages: working
            .messages
            .iter()
            .map(|message| MessageRef {
                role: message.role,
                content: message.content.iter().map(BlockRef::from).collect(),
            })
            .collect(),
    };
    // Serializing plain data into a Vec cannot fail; an empty checkpoint
    // would only be ignored by `decode`.
    rmp_serde::to_vec_named(&checkpoint).unwrap_or_default()
}

/// The working set a checkpoint holds. Anything written by another format
/// or reducer is refused, so a caller falls back to the log.
pub fn decode(bytes: &[u8]) -> Result<WorkingSet, DecodeError> {
    let malformed = |error: rmp_serde::decode::Error| DecodeError::Malformed {
        reason: format!("checkpoint: {error}"),
    };
    // One pass: a checkpoint of another layout most likely fails to decode,
    // and one that decodes is still refused by its versions.
    let Checkpoint {
        format,
        reducer,
        mut working,
        messages,
    } = rmp_serde::from_slice(bytes).map_err(malformed)?;
    if format != FORMAT || reducer != REDUCER_VERSION {
        return Err(DecodeError::Malformed {
            reason: format!(
                "checkpoint has format {format} and reducer {reducer}; this keel writes {FORMAT} and {REDUCER_VERSION}"
            ),
        });
    }
    working.messages = messages
        .into_iter()
        .map(|message| Message {
            role: message.role,
            content: message
                .content
                .into_iter()
                .map(ContentBlock::from)
                .collect(),
        })
        .collect::<Vec<Message>>()
        .into();
    working.count_settled_tokens();
    Ok(working)
}

/// A copy of `working` without its prompt: everything else is small. Every
/// field is named, so a new field is a compile error here rather than one
/// a checkpoint silently drops.
fn without_messages(working: &WorkingSet) -> WorkingSet {
    let WorkingSet {
        id,
        created_at,
        cwd,
        config,
        parent_conversation,
        user_initiated,
        forked_from,
        messages: _,
        message_seqs,
        history_edits,
        // Counted again from the messages when the checkpoint is read.
        settled_tokens: _,
        last_seq,
        last_activity,
        turn,
        current_turn,
        open_calls,
        calls_seq,
        pending,
        approved,
        resolved,
        queued,
        usage,
        last_error,
        consecutive_resumes,
        untriggered,
        session,
        outcome,
        last_compaction,
    } = working;
    WorkingSet {
        id: id.clone(),
        created_at: *created_at,
        cwd: cwd.clone(),
        config: config.clone(),
        parent_conversation: parent_conversation.clone(),
        user_initiated: *user_initiated,
        forked_from: forked_from.clone(),
        messages: Arc::default(),
        message_seqs: message_seqs.clone(),
        history_edits: *history_edits,
        settled_tokens: 0,
        last_seq: *last_seq,
        last_activity: *last_activity,
        turn: *turn,
        current_turn: current_turn.clone(),
        open_calls: open_calls.clone(),
        calls_seq: *calls_seq,
        pending: pending.clone(),
        approved: approved.clone(),
        resolved: resolved.clone(),
        queued: queued.clone(),
        usage: *usage,
        last_error: last_error.clone(),
        consecutive_resumes: *consecutive_resumes,
        untriggered: untriggered.clone(),
        session: *session,
        outcome: outcome.clone(),
        last_compaction: *last_compaction,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn garbage_and_other_versions_are_refused() {
        assert!(decode(b"").is_err());
        assert!(decode(b"\x93\x01\x02").is_err());
        let created = crate::event::Event {
            seq: 1,
            at: crate::time::Timestamp::from_millis(1),
            parent: None,
            triggers_turn: false,
            kind: crate::event::EventKind::Created {
                conversation: crate::ids::ConversationId::new("c").unwrap(),
                cwd: "/tmp".to_owned(),
                config: crate::config::ConversationConfig::default(),
                parent_conversation: None,
                user_initiated: true,
                forked_from: None,
            },
        };
        let working = WorkingSet::from_created(&created).unwrap();
        assert_eq!(decode(&encode(&working)).unwrap(), working);
        let mut other = CheckpointRef {
            format: FORMAT,
            reducer: REDUCER_VERSION + 1,
            working: &working,
            messages: Vec::new(),
        };
        let error = decode(&rmp_serde::to_vec_named(&other).unwrap()).unwrap_err();
        assert!(error.to_string().contains("reducer"), "{error}");
        other.reducer = REDUCER_VERSION;
        other.format = FORMAT + 1;
        let error = decode(&rmp_serde::to_vec_named(&other).unwrap()).unwrap_err();
        assert!(error.to_string().contains("reducer"), "{error}");
    }
}
