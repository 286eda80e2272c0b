//! The daemon's event stream scanned, not parsed: the little the benches
//! need of each frame (its event name, a canonical event's seq and type),
//! found with `memchr`, so that the reading client takes as little as it
//! can of the CPU the measured daemon shares.

/// A frame of the daemon's event stream as the benches read it: scanned
/// for the little they need rather than parsed, so that the reading
/// client, which shares the machine with the daemon it measures, takes as
/// little of its CPU as it can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scanned {
    Snapshot,
    Canonical {
        seq: u64,
        kind: ScannedKind,
    },
    Live {
        lagged: bool,
    },
    /// The daemon's `event: error` frame, its data as sent.
    Error(String),
    Other,
}

/// The canonical event types the benches watch for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScannedKind {
    UserMessage,
    ToolResult,
    TurnCompleted,
    Other,
}

/// Splits an event stream's body (de-chunked bytes, as they come) into
/// [`Scanned`] frames.
#[derive(Debug, Default)]
pub struct FrameScanner {
    body: Vec<u8>,
}

impl FrameScanner {
    pub fn push(&mut self, bytes: &[u8]) {
        self.body.extend_from_slice(bytes);
    }

    /// The next whole frame pushed, if any.
    pub fn next_frame(&mut self) -> Option<Scanned> {
        let end = find(&self.body, b"\n\n")?;
        let frame = scan_frame(&self.body[..end]);
        self.body.drain(..end + 2);
        Some(frame)
    }
}

/// A frame's event name and, for a canonical one, its seq and type: the
/// first `"seq":` and `"type":"` of its data are the event's own (they come
/// before any nested object, and a quote inside a string is escaped).
fn scan_frame(block: &[u8]) -> Scanned {
    let mut event: &[u8] = b"";
    let mut data: &[u8] = b"";
    for line in block.split(|&byte| byte == b'\n') {
        if let Some(name) = line.strip_prefix(b"event: ") {
            event = name;
        } else if let Some(value) = line.strip_prefix(b"data: ") {
            data = value;
        }
    }
    match event {
        b"snapshot" => Scanned::Snapshot,
        b"canonical" => {
            let Some(digits) = after(data, b"\"seq\":") else {
                return Scanned::Other;
            };
            let seq =
                digits
                    .iter()
                    .take_while(|byte| byte.is_ascii_digit())
                    .fold(0u64, |seq, digit| {
                        seq.saturating_mul(10)
                            .saturating_add(u64::from(digit - b'0'))
                    });
            let kind = match after(data, b"\"type\":\"") {
                Some(rest) if rest.starts_with(b"user_message\"") => ScannedKind::UserMessage,
                Some(rest) if rest.starts_with(b"tool_result\"") => ScannedKind::ToolResult,
                Some(rest) if rest.starts_with(b"turn_completed\"") => ScannedKind::TurnCompleted,
                _ => ScannedKind::Other,
            };
            Scanned::Canonical { seq, kind }
        }
        b"live" => Scanned::Live {
            lagged: find(data, b"\"type\":\"lagged\"").is_some(),
        },
        b"error" => Scanned::Error(String::from_utf8_lossy(data).into_owned()),
        _ => Scanned::Other,
    }
}

fn after<'a>(haystack: &'a [u8], needle: &[u8]) -> Option<&'a [u8]> {
    find(haystack, needle).map(|at| &haystack[at + needle.len()..])
}

/// The first `needle` in `haystack`. The needles here are short and
/// searched once each, so this jumps between their first byte's places
/// (`memchr`) rather than building a substring searcher per call.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, _) = needle.split_first()?;
    memchr::memchr_iter(first, haystack).find(|&at| haystack[at..].starts_with(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_scanned_for_their_kind_seq_and_type() {
        let mut scanner = FrameScanner::default();
        scanner.push(b"event: snapshot\ndata: {\"id\":\"c-1\"}\n\nevent: canonical\nid: 7\ndata: {\"id\":\"c-1:7\",\"seq\":7,");
        assert_eq!(scanner.next_frame(), Some(Scanned::Snapshot));
        assert_eq!(scanner.next_frame(), None, "a frame cut in two waits");
        scanner.push(
            b"\"type\":\"user_message\",\"text\":\"say \\\"type\\\":\\\"turn_completed\\\"\"}\n\n",
        );
        assert_eq!(
            scanner.next_frame(),
            Some(Scanned::Canonical {
                seq: 7,
                kind: ScannedKind::UserMessage
            })
        );
        scanner.push(b"event: live\ndata: {\"type\":\"lagged\",\"missed\":3}\n\nevent: live\ndata: {\"type\":\"state_changed\"}\n\n");
        assert_eq!(scanner.next_frame(), Some(Scanned::Live { lagged: true }));
        assert_eq!(scanner.next_frame(), Some(Scanned::Live { lagged: false }));
        scanner.push(b"event: canonical\ndata: {\"seq\":12,\"type\":\"turn_completed\"}\n\nevent: error\ndata: {\"code\":\"x\"}\n\n");
        assert_eq!(
            scanner.next_frame(),
            Some(Scanned::Canonical {
                seq: 12,
                kind: ScannedKind::TurnCompleted
            })
        );
        assert_eq!(
            scanner.next_frame(),
            Some(Scanned::Error("{\"code\":\"x\"}".to_owned()))
        );
        assert_eq!(scanner.next_frame(), None);
    }
}
