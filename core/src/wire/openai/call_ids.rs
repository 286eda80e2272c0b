//! Ids for tool calls a server sent without one (some compatible servers
//! send none, or an empty one).
//!
//! A made-up id is derived from the response's id and creation time with
//! FNV-1a, so it differs between responses without keel-core drawing
//! randomness (keel-core is pure) and stays the same across versions (an id
//! is stored in the log and sent back to the model). Kept apart because that
//! hash may never drift; its test vectors are here.

use super::Decoder;
use crate::ids::ToolCallId;

impl Decoder {
    /// An id for the call at `slot` if the server sends none: derived from
    /// the response's id and creation time, so it differs between responses
    /// without keel-core drawing randomness.
    pub(super) fn fallback_id(&self, slot: usize) -> ToolCallId {
        let mut hash = Fnv1a::new();
        hash.write(self.response_id.as_deref().unwrap_or("").as_bytes());
        hash.write(&self.created.unwrap_or(0).to_le_bytes());
        ToolCallId::new(format!("call_{:016x}_{slot}", hash.finish()))
    }
}

/// FNV-1a, 64 bits: a stable hash without a dependency, for made-up ids.
struct Fnv1a(u64);

impl Fnv1a {
    fn new() -> Fnv1a {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::live::StreamDelta;
    use crate::wire::openai::testing::feed_all;

    #[test]
    fn the_made_up_ids_hash_is_fnv_1a() {
        // Test vectors of FNV-1a, 64 bits: the ids must stay the same
        // across versions, so the hash may not drift.
        let hash = |bytes: &[u8]| {
            let mut hash = Fnv1a::new();
            hash.write(bytes);
            hash.finish()
        };
        assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn made_up_ids_differ_between_responses() {
        let made_up = |response_id: &str| {
            let mut decoder = Decoder::new("m");
            let chunk = json!({ "id": response_id, "created": 5, "choices": [{ "index": 0,
                "delta": { "tool_calls": [{ "index": 0, "function": { "name": "t" } }] } }] });
            match &feed_all(&mut decoder, &[chunk])[0] {
                StreamDelta::ToolUseStarted { id, .. } => id.clone(),
                other => panic!("unexpected {other:?}"),
            }
        };
        assert_ne!(made_up("chatcmpl-1"), made_up("chatcmpl-2"));
        assert_eq!(made_up("chatcmpl-1"), made_up("chatcmpl-1"));
    }
}
