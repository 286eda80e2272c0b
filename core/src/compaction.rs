//! Compaction: a long conversation's prompt kept inside its model's context
//! window, so that the conversation never gets stuck on its own length
//! (docs/compaction.md).
//!
//! The log keeps everything. What shrinks is the prompt the reducer builds
//! from it: an `EventKind::Compacted` event says how many of the prompt's
//! leading messages a summary replaces, and the reducer puts the summary
//! in front of the messages it keeps (`reducer::compact`). Everything here is a pure
//! function of the working set, so a replay makes the same prompt the live
//! conversation had.
//!
//! Where to cut ([`plan`]) is always the start of a turn: a user message
//! that does not begin with tool results. Every tool call before such a
//! message has its result before it too, so no call is ever parted from
//! its result, and the turn in flight stays whole.
//!
//! The sizes are estimates (about four characters a token, a fixed count
//! per image), taken together with the provider's own count of the latest
//! request when it is larger ([`prompt_tokens`]). They decide only when to
//! compact; a provider that still refuses a prompt as too long makes keel
//! compact as well.

use crate::config::ConversationConfig;
use crate::ids::Seq;
use crate::message::{ContentBlock, Message, Role};
use crate::reducer::WorkingSet;
use crate::tokens::CHARS_PER_TOKEN;
pub use crate::tokens::{message_tokens, messages_tokens};

/// The most characters of one tool result a summary request shows: the
/// summary needs what was found, not every line of it.
const RESULT_CHARS_IN_TRANSCRIPT: usize = 2_000;

/// The system prompt of a summary request. The fake provider recognises a
/// summary request by it (see `SUMMARY_MARKER`).
pub const SUMMARY_SYSTEM: &str = "[keel:summary] You summarise the earlier part of a \
conversation between a user and an AI assistant that uses tools, so that the assistant can \
carry on from the summary alone. Keep what the user asked for and decided, what was done \
(files changed, commands run and what they showed), what was learnt, and what is still open. \
Be concise and factual; write the summary only.";

/// What a summary request's system prompt starts with.
pub const SUMMARY_MARKER: &str = "[keel:summary]";

/// Where a compaction cuts the prompt, and what it is expected to save.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Leading messages the summary replaces.
    pub replaced_messages: usize,
    /// Seq of the last event those messages were built from.
    pub through_seq: Seq,
    /// The prompt's tokens now ([`prompt_tokens`]).
    pub tokens_before: u64,
    /// Asked for by a user (`Input::Compact`) with no turn running: once
    /// it is recorded the conversation rests again, instead of sending a
    /// turn's request.
    pub on_demand: bool,
}

/// The estimated tokens of the system prompt.
fn system_tokens(config: &ConversationConfig) -> u64 {
    config
        .system
        .as_deref()
        .map_or(0, |system| (system.len() as u64).div_ceil(CHARS_PER_TOKEN))
}

/// The prompt's estimated tokens: the system prompt and the messages, or
/// the provider's count of the latest request and its answer where that
/// is larger (it also counts the tools offered). Compaction resets the
/// provider's count, which described the prompt before it.
pub fn prompt_tokens(working: &WorkingSet) -> u64 {
    let estimate = system_tokens(&working.config) + working.history_tokens();
    estimate.max(working.usage.context_tokens())
}

/// The tokens past which a prompt is compacted before it is sent, or
/// `None` when the conversation compacts only when a provider refuses.
pub fn threshold(config: &ConversationConfig) -> Option<u64> {
    (config.compact_at_percent > 0)
        .then(|| config.context_window / 100 * u64::from(config.compact_at_percent.min(100)))
}

/// Whether the next request should be compacted first: the prompt passes
/// the threshold and there is something before the latest turn to replace.
pub fn due(working: &WorkingSet) -> Option<Plan> {
    let threshold = threshold(&working.config)?;
    let tokens = prompt_tokens(working);
    if tokens < threshold {
        return None;
    }
    plan_with(working, tokens)
}

/// Where to cut: the earliest start of a turn after which the kept messages
/// fit in half the threshold (so that the next compaction is some turns
/// away), or else the start of the latest turn. `None` when the prompt has
/// no turn before the latest one: nothing can be replaced without parting
/// the turn in flight.
pub fn plan(working: &WorkingSet) -> Option<Plan> {
    plan_with(working, prompt_tokens(working))
}

/// [`plan`] of a prompt whose tokens are known to be `tokens`.
fn plan_with(working: &WorkingSet, tokens: u64) -> Option<Plan> {
    let messages = &working.messages;
    let starts = turn_starts(messages);
    let latest = *starts.last()?;
    let window = working.config.context_window;
    let percent = match working.config.compact_at_percent {
        0 => u64::from(crate::config::DEFAULT_COMPACT_AT_PERCENT),
        percent => u64::from(percent.min(100)),
    };
    let keep_budget = window / 100 * percent / 2;
    // Suffix sums: the tokens kept when cutting at each start.
    let mut kept = 0u64;
    let mut cut = latest;
    let mut index = messages.len();
    for &start in starts.iter().rev() {
        while index > start {
            index -= 1;
            kept += message_tokens(&messages[index]);
        }
        if kept > keep_budget {
            break;
        }
        cut = start;
    }
    cut_at(working, cut, tokens)
}

/// A compaction a user asked for: everything before the latest turn is
/// summarised, whatever the threshold. `None` when there is no turn before
/// the latest one.
pub fn plan_on_demand(working: &WorkingSet) -> Option<Plan> {
    let latest = *turn_starts(&working.messages).last()?;
    let plan = cut_at(working, latest, prompt_tokens(working))?;
    Some(Plan {
        on_demand: true,
        ..plan
    })
}

/// The plan that replaces the messages before index `cut`.
fn cut_at(working: &WorkingSet, cut: usize, tokens_before: u64) -> Option<Plan> {
    let through_seq = working.message_seqs.get(cut)?.checked_sub(1)?;
    Some(Plan {
        replaced_messages: cut,
        through_seq,
        tokens_before,
        on_demand: false,
    })
}

/// Indices of the messages that start a turn, after the first: user
/// messages whose first block is not a tool result.
pub fn turn_starts(messages: &[Message]) -> Vec<usize> {
    messages
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, message)| {
            message.role == Role::User
                && !matches!(
                    message.content.first(),
                    Some(ContentBlock::ToolResult { .. })
                )
        })
        .map(|(index, _)| index)
        .collect()
}

/// The prompt's estimated tokens once `plan` is carried out with `summary`.
pub fn tokens_after(working: &WorkingSet, plan: &Plan, summary: Option<&str>) -> u64 {
    let mut messages = working.messages.to_vec();
    let mut seqs = working.message_seqs.clone();
    crate::reducer::compact(&mut messages, &mut seqs, plan.replaced_messages, summary);
    system_tokens(&working.config) + messages_tokens(&messages)
}

/// A summary request's messages: one user message holding the replaced
/// part of the conversation as a transcript. A transcript, not the
/// messages themselves, so that the request carries no tool calls (which
/// some providers accept only with the tools declared) and no images.
pub fn summary_request(replaced: &[Message]) -> Vec<Message> {
    let mut text =
        String::from("Summarise this earlier part of our conversation. The transcript:\n\n");
    text.push_str(&transcript(replaced));
    vec![Message {
        role: Role::User,
        content: vec![ContentBlock::Text { text }],
    }]
}

/// `messages` as plain text, one paragraph per block.
pub fn transcript(messages: &[Message]) -> String {
    let mut out = String::new();
    for message in messages {
        let speaker = match message.role {
            Role::User => "User",
            Role::Assistant => "Assistant",
        };
        for block in &message.content {
            match block {
                ContentBlock::Text { text } => {
                    out.push_str(&format!("{speaker}: {text}\n\n"));
                }
                ContentBlock::Thinking { .. } => {}
                ContentBlock::Image { image } => out.push_str(&format!(
                    "{speaker}: [an image, {}x{}]\n\n",
                    image.width, image.height
                )),
                ContentBlock::ToolUse { call } => out.push_str(&format!(
                    "Assistant called the tool {} with {}\n\n",
                    call.name, call.input
                )),
                ContentBlock::ToolResult { result } => {
                    let content = clip(&result.content, RESULT_CHARS_IN_TRANSCRIPT);
                    let error = if result.is_error { " (an error)" } else { "" };
                    out.push_str(&format!("Tool result{error}: {content}\n\n"));
                    for image in &result.images {
                        out.push_str(&format!(
                            "Tool result: [an image, {}x{}]\n\n",
                            image.width, image.height
                        ));
                    }
                }
            }
        }
    }
    out
}

/// At most `max` bytes of `text`, cut at a character boundary and marked.
fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} more bytes]", &text[..end], text.len() - end)
}
