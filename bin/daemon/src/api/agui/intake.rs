//! What a run's input brings that keel does not have yet. A client sends
//! the thread's whole history on every run; keel's log already holds most
//! of it. The messages keel gave ids to (`keel-SEQ…`, see `map.rs`) say
//! how far the client has seen the log; what comes after the last of them
//! is new: user messages to send and tool messages answering the
//! frontend's tool calls. A user message the log already holds after that
//! point (a run whose answer the client lost, sent again) is not sent
//! twice. Pure: the handler reads the log and carries the result out.

use keel_actors::core::Seq;

use super::map::seen_through;
use super::wire::{Content, InputMessage, Part, Source};

/// What to take from a run's input.
#[derive(Debug, Default, PartialEq)]
pub struct Taken {
    /// New user messages' texts, in order: sent as one keel message.
    pub texts: Vec<String>,
    /// Their inline images: (media type, base64).
    pub images: Vec<(String, String)>,
    /// Results of frontend tool calls: (tool call id, text).
    pub answers: Vec<(String, String)>,
}

/// How far the client has seen the log: the greatest seq its messages'
/// keel ids name (0 when it holds none).
pub fn anchor(messages: &[InputMessage]) -> Seq {
    messages
        .iter()
        .filter_map(|message| seen_through(message.id()))
        .max()
        .unwrap_or(0)
}

/// The new part of `messages`. `known` are the texts of the user messages
/// the log holds after the [`anchor`], in order. `Err` says what is wrong
/// with the input, for a 400.
pub fn take(messages: &[InputMessage], known: &[String]) -> Result<Taken, String> {
    // After the last message keel gave an id to: before it, the client
    // holds only what keel has.
    let start = messages
        .iter()
        .rposition(|message| seen_through(message.id()).is_some())
        .map_or(0, |last| last + 1);
    let mut taken = Taken::default();
    let mut known = known.iter();
    let mut matching = true;
    for message in &messages[start..] {
        match message {
            InputMessage::User { content, .. } => {
                let (text, images) = user_content(content)?;
                // The log holds it already, right after what the client
                // has seen: a run sent again.
                if matching && known.next().is_some_and(|held| *held == text) {
                    continue;
                }
                matching = false;
                taken.texts.push(text);
                taken.images.extend(images);
            }
            InputMessage::Tool {
                content,
                tool_call_id,
                error,
                ..
            } => {
                let text = match (text_of(content), error) {
                    (text, Some(error)) if text.is_empty() => error.clone(),
                    (text, _) => text,
                };
                if tool_call_id.is_empty() {
                    return Err("a tool message has an empty toolCallId".to_owned());
                }
                taken.answers.push((tool_call_id.clone(), text));
            }
            // keel's own kinds of message, or ones it does not take from
            // a client: the history is keel's log.
            InputMessage::Assistant { .. }
            | InputMessage::System { .. }
            | InputMessage::Developer { .. }
            | InputMessage::Reasoning { .. }
            | InputMessage::Activity { .. } => {}
        }
    }
    Ok(taken)
}

/// A user message's text (its text parts, joined) and inline images.
fn user_content(content: &Content) -> Result<(String, Vec<(String, String)>), String> {
    let parts = match content {
        Content::Text(text) => return Ok((text.clone(), Vec::new())),
        Content::Parts(parts) => parts,
    };
    let mut texts = Vec::new();
    let mut images = Vec::new();
    for part in parts {
        match part {
            Part::Text { text } => texts.push(text.as_str()),
            Part::Image {
                source: Source::Data { value, mime_type },
            } => images.push((mime_type.clone(), value.clone())),
            Part::Image { .. } | Part::Audio {} | Part::Video {} | Part::Document {} => {
                return Err(
                    "a user message may hold text and inline images (source type `data`); keel fetches nothing by URL or file id"
                        .to_owned(),
                )
            }
        }
    }
    Ok((texts.join("\n"), images))
}

/// A tool message's text: its text parts, joined.
fn text_of(content: &Content) -> String {
    match content {
        Content::Text(text) => text.clone(),
        Content::Parts(parts) => parts
            .iter()
            .filter_map(|part| match part {
                Part::Text { text } => Some(text.as_str()),
                Part::Image { .. } | Part::Audio {} | Part::Video {} | Part::Document {} => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn input(json: serde_json::Value) -> Vec<InputMessage> {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_first_run_takes_its_user_messages() {
        let messages = input(serde_json::json!([
            {"id": "u1", "role": "user", "content": "hello"},
        ]));
        assert_eq!(anchor(&messages), 0);
        let taken = take(&messages, &[]).unwrap();
        assert_eq!(taken.texts, ["hello"]);
    }

    #[test]
    fn history_keel_gave_ids_to_is_not_taken_again() {
        let messages = input(serde_json::json!([
            {"id": "keel-2", "role": "user", "content": "hello"},
            {"id": "keel-5", "role": "assistant", "content": "hi"},
            {"id": "u9", "role": "user", "content": "again"},
        ]));
        assert_eq!(anchor(&messages), 5);
        let taken = take(&messages, &[]).unwrap();
        assert_eq!(taken.texts, ["again"]);
    }

    /// The client lost the run's answer and sends the same input again:
    /// the log holds its message already.
    #[test]
    fn a_message_the_log_holds_after_the_anchor_is_not_sent_twice() {
        let messages = input(serde_json::json!([
            {"id": "keel-5", "role": "assistant", "content": "hi"},
            {"id": "u9", "role": "user", "content": "again"},
            {"id": "u10", "role": "user", "content": "and more"},
        ]));
        let taken = take(&messages, &["again".to_owned()]).unwrap();
        assert_eq!(taken.texts, ["and more"]);
    }

    #[test]
    fn a_tool_message_after_the_anchor_answers_its_call() {
        let messages = input(serde_json::json!([
            {"id": "keel-7", "role": "assistant", "toolCalls": [
                {"id": "call-1", "type": "function", "function": {"name": "pick", "arguments": "{}"}}
            ]},
            {"id": "t1", "role": "tool", "toolCallId": "call-1", "content": [{"type": "text", "text": "teal"}]},
        ]));
        let taken = take(&messages, &[]).unwrap();
        assert_eq!(taken.answers, [("call-1".to_owned(), "teal".to_owned())]);
        assert!(taken.texts.is_empty());
    }

    #[test]
    fn media_keel_would_have_to_fetch_is_refused() {
        let messages = input(serde_json::json!([
            {"id": "u1", "role": "user", "content": [
                {"type": "image", "source": {"type": "url", "value": "https://example.com/a.png"}}
            ]},
        ]));
        assert!(take(&messages, &[]).is_err());
    }
}
