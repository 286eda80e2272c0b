//! The estimated size of a prompt in tokens: about four characters a
//! token, a fixed count per image and per message. Compaction decides by
//! it when a prompt is too long (`compaction.rs`, docs/compaction.md), and
//! the reducer keeps the count of a history's settled messages as it grows
//! (`WorkingSet::history_tokens`), so a request's prompt is counted
//! without walking the whole history.

use crate::message::{ContentBlock, Message};

/// Characters counted as one token.
pub(crate) const CHARS_PER_TOKEN: u64 = 4;
/// Tokens counted for an image: about what a provider charges for one at
/// the size keel sends (images are downscaled on the way in).
const IMAGE_TOKENS: u64 = 1_600;
/// Tokens counted for each message's framing.
const MESSAGE_TOKENS: u64 = 4;

/// The estimated tokens of one message.
pub fn message_tokens(message: &Message) -> u64 {
    let mut chars = 0u64;
    let mut images = 0u64;
    for block in &message.content {
        match block {
            ContentBlock::Text { text } | ContentBlock::Thinking { text, .. } => {
                chars += text.len() as u64;
            }
            ContentBlock::Image { .. } => images += 1,
            ContentBlock::ToolUse { call } => {
                chars += call.name.len() as u64 + json_len(&call.input);
            }
            ContentBlock::ToolResult { result } => {
                chars += result.content.len() as u64;
                images += result.images.len() as u64;
            }
        }
    }
    MESSAGE_TOKENS + chars.div_ceil(CHARS_PER_TOKEN) + images * IMAGE_TOKENS
}

/// The length of `value` as compact JSON, counted without writing it out:
/// every message is estimated as it settles, and the whole prompt again
/// after an edit or when compaction plans its cut; building each tool
/// input's text was most of the estimate's cost (BENCHMARKS.md,
/// "Compaction at 100k tokens").
fn json_len(value: &serde_json::Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len() as u64;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The estimated tokens of `messages`.
pub fn messages_tokens(messages: &[Message]) -> u64 {
    messages.iter().map(message_tokens).sum()
}
