//! A conversation's messages as the last request sent them, in JSON, so
//! that the next request encodes only what was added since
//! (docs/requirements.md, "A request encodes only what the history
//! gained").
//!
//! A request carries the whole history, every time. Encoding all of it
//! again (every string escaped again) made each request cost in proportion
//! to the conversation's length: at the hundredth turn of one conversation
//! it was a third of the daemon's work per turn. Between two requests a
//! history only grows at its end: messages are appended, and the last user
//! message may take more blocks (tool results, queued text). Any other
//! change (an approval that edited a call, a compaction, a rewind) counts
//! in `WorkingSet::history_edits`. So while that count stands still, every
//! message before the last one an earlier request sent is sent again as it
//! was, and so is its JSON.

use serde::Serialize;

use crate::message::Message;
use crate::wire::{EncodeError, ToolsWire};

/// The JSON of the messages an earlier request sent, one wire's.
///
/// The caller keeps one per conversation and passes it, with the
/// conversation's `history_edits`, to every request made from that
/// conversation's history as it stands (`openai::encode_request_reusing`,
/// `anthropic::encode_request_reusing`); never for a request whose messages
/// were changed for it alone (images left out, a summary's transcript).
/// Encodings of images are not reused: what an image is sent as may depend
/// on the request (how many images it holds), so a caller passes none for
/// a history with images.
#[derive(Debug, Default)]
pub struct EncodedHistory {
    /// The wire and the count of edits the encodings were made under;
    /// `None` before the first, or after a failed one.
    made_under: Option<(ToolsWire, u64)>,
    /// For each history message encoded, where its JSON ends in `json`.
    ends: Vec<usize>,
    /// The wire messages of each history message in turn, each followed by
    /// a comma.
    json: Vec<u8>,
}

impl EncodedHistory {
    /// How many of the history's messages it holds the encoding of.
    pub fn messages(&self) -> usize {
        self.ends.len()
    }

    /// The encodings of `messages`: those kept from before, while `wire`
    /// and `edits` are the same, for every message but the last one kept;
    /// `encode` (which appends a message's wire messages, each followed by
    /// a comma) for the rest.
    pub(crate) fn update(
        &mut self,
        wire: ToolsWire,
        edits: u64,
        messages: &[Message],
        mut encode: impl FnMut(&Message, &mut Vec<u8>) -> Result<(), EncodeError>,
    ) -> Result<&[u8], EncodeError> {
        let kept = match self.made_under {
            Some(under) if under == (wire, edits) => {
                self.ends.len().saturating_sub(1).min(messages.len())
            }
            _ => 0,
        };
        self.ends.truncate(kept);
        self.json.truncate(self.ends.last().copied().unwrap_or(0));
        self.made_under = None;
        for message in messages.get(kept..).unwrap_or_default() {
            encode(message, &mut self.json)?;
            self.ends.push(self.json.len());
        }
        self.made_under = Some((wire, edits));
        Ok(&self.json)
    }
}

/// Append `value`'s JSON, then a comma.
pub(crate) fn element(value: &impl Serialize, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    serde_json::to_writer(&mut *out, value).map_err(json_error)?;
    out.push(b',');
    Ok(())
}

/// The JSON serde writes for a struct of `head`'s fields, then a
/// `messages` array of `leading` and `elements` (each element followed by
/// a comma), then `tail`'s fields.
pub(crate) fn body(
    head: &impl Serialize,
    leading: &[u8],
    elements: &[u8],
    tail: &impl Serialize,
) -> Result<Vec<u8>, EncodeError> {
    let head = serde_json::to_vec(head).map_err(json_error)?;
    let tail = serde_json::to_vec(tail).map_err(json_error)?;
    // Both are objects: `{`, their fields, `}`.
    let fields = |object: &[u8]| -> Vec<u8> {
        object
            .get(1..object.len().saturating_sub(1))
            .unwrap_or_default()
            .to_vec()
    };
    let (head, tail) = (fields(&head), fields(&tail));
    let mut out = Vec::with_capacity(head.len() + leading.len() + elements.len() + tail.len() + 16);
    out.push(b'{');
    out.extend_from_slice(&head);
    if !head.is_empty() {
        out.push(b',');
    }
    out.extend_from_slice(b"\"messages\":[");
    out.extend_from_slice(leading);
    out.extend_from_slice(elements);
    // The last element's comma.
    if out.last() == Some(&b',') {
        out.pop();
    }
    out.push(b']');
    if !tail.is_empty() {
        out.push(b',');
        out.extend_from_slice(&tail);
    }
    out.push(b'}');
    Ok(out)
}

fn json_error(error: serde_json::Error) -> EncodeError {
    EncodeError::Json {
        reason: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{ContentBlock, Role};

    fn text(role: Role, text: &str) -> Message {
        Message {
            role,
            content: vec![ContentBlock::Text {
                text: text.to_owned(),
            }],
        }
    }

    /// Encodes a message as its text, counting the calls.
    fn update(history: &mut EncodedHistory, edits: u64, messages: &[Message]) -> (String, usize) {
        let mut encoded = 0;
        let json = history
            .update(ToolsWire::OpenAi, edits, messages, |message, out| {
                encoded += 1;
                let ContentBlock::Text { text } = &message.content[0] else {
                    unreachable!("text messages only");
                };
                element(text, out)
            })
            .unwrap();
        (String::from_utf8(json.to_vec()).unwrap(), encoded)
    }

    #[test]
    fn only_what_came_after_the_last_message_kept_is_encoded_again() {
        let mut history = EncodedHistory::default();
        let mut messages = vec![text(Role::User, "a"), text(Role::Assistant, "b")];
        assert_eq!(
            update(&mut history, 0, &messages),
            (r#""a","b","#.into(), 2)
        );
        messages.push(text(Role::User, "c"));
        // "b" was the last one sent: it may have grown since.
        assert_eq!(
            update(&mut history, 0, &messages),
            (r#""a","b","c","#.into(), 2)
        );
        messages[2] = text(Role::User, "c and more");
        assert_eq!(
            update(&mut history, 0, &messages),
            (r#""a","b","c and more","#.into(), 1)
        );
        // An edit anywhere: everything again.
        messages[0] = text(Role::User, "A");
        assert_eq!(
            update(&mut history, 1, &messages),
            (r#""A","b","c and more","#.into(), 3)
        );
        // A shorter history (only an edit makes one) under the same count
        // still never reads past it.
        messages.truncate(1);
        assert_eq!(update(&mut history, 1, &messages), (r#""A","#.into(), 0));
        assert_eq!(history.messages(), 1);
    }

    #[test]
    fn another_wire_starts_again() {
        let mut history = EncodedHistory::default();
        let messages = vec![text(Role::User, "a"), text(Role::Assistant, "b")];
        update(&mut history, 0, &messages);
        let json = history
            .update(ToolsWire::Anthropic, 0, &messages, |_, out| {
                element(&"x", out)
            })
            .unwrap();
        assert_eq!(json, br#""x","x","#);
    }

    #[test]
    fn a_failed_encoding_keeps_nothing() {
        let mut history = EncodedHistory::default();
        let messages = vec![text(Role::User, "a"), text(Role::Assistant, "b")];
        update(&mut history, 0, &messages);
        let failed = history.update(ToolsWire::OpenAi, 0, &messages, |_, _| {
            Err(EncodeError::MissingImage { hash: "h".into() })
        });
        assert!(failed.is_err());
        assert_eq!(update(&mut history, 0, &messages).1, 2);
    }

    #[test]
    fn the_body_is_what_serde_writes_for_the_whole_struct() {
        #[derive(Serialize)]
        struct Whole<'a> {
            model: &'a str,
            messages: Vec<&'a str>,
            stream: bool,
        }
        #[derive(Serialize)]
        struct Head<'a> {
            model: &'a str,
        }
        #[derive(Serialize)]
        struct Tail {
            stream: bool,
        }
        #[derive(Serialize)]
        struct Empty {}
        for messages in [vec![], vec!["one"], vec!["one", "two \"quoted\""]] {
            let mut elements = Vec::new();
            for message in &messages {
                element(message, &mut elements).unwrap();
            }
            let whole = Whole {
                model: "m",
                messages: messages.clone(),
                stream: true,
            };
            let spliced = body(&Head { model: "m" }, b"", &elements, &Tail { stream: true });
            assert_eq!(spliced.unwrap(), serde_json::to_vec(&whole).unwrap());
        }
        // A leading element alone, and no tail fields.
        let mut leading = Vec::new();
        element(&"system", &mut leading).unwrap();
        let spliced = body(&Head { model: "m" }, &leading, b"", &Empty {}).unwrap();
        assert_eq!(spliced, br#"{"model":"m","messages":["system"]}"#);
    }
}
