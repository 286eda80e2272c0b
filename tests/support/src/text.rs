//! Deterministic data for the benches: a small generator (xorshift64*)
//! and the English-looking text they fill messages, tool results and
//! tool inputs with. keel-core's, keel-store's and keel-actors' benches
//! each had their own copy; written once here, the logs they build stay
//! alike, and a change to the text is made for all of them or for none.
//!
//! The same seed gives the same data on every run and every machine, so
//! figures taken before and after a change measure the same logs. The
//! benches keep the vocabularies their published figures were taken with
//! (docs/benchmarks.md): [`WORDS`] for keel-store's and keel-actors',
//! [`CORE_WORDS`] (a few words more) for keel-core's.

/// A small deterministic generator (xorshift64*): the same data every run.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting at `seed`, used as it is (not mixed): nearby
    /// seeds give different but not unrelated streams. Zero gives zeros
    /// forever.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 bits of the stream.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// One of `items` (not empty), uniformly.
    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    /// English-looking ASCII text of `lo..=hi` bytes: words of `words`
    /// (ASCII), one in eleven separated by a newline, the others by a
    /// space; cut at the length drawn, so it may end mid-word.
    pub fn text(&mut self, words: &[&str], lo: usize, hi: usize) -> String {
        let len = self.range(lo, hi);
        let mut text = String::with_capacity(len + 16);
        while text.len() < len {
            if !text.is_empty() {
                text.push(if self.next_u64().is_multiple_of(11) {
                    '\n'
                } else {
                    ' '
                });
            }
            text.push_str(self.pick(words));
        }
        text.truncate(len);
        text
    }
}

/// Words of a coding conversation: the vocabulary of keel-store's and
/// keel-actors' benches.
pub const WORDS: &[&str] = &[
    "the",
    "conversation",
    "log",
    "is",
    "appended",
    "before",
    "anything",
    "else",
    "tool",
    "result",
    "assistant",
    "replays",
    "working",
    "set",
    "request",
    "model",
    "file",
    "src/main.rs",
    "function",
    "returns",
    "error",
    "because",
    "cargo",
    "build",
    "test",
    "passes",
    "and",
    "then",
    "we",
    "check",
    "whether",
    "output",
    "matches",
    "expected",
    "value",
    "of",
    "a",
    "struct",
    "field",
    "with",
    "serde",
    "JSON",
    "line",
    "42",
];

/// The vocabulary of keel-core's bench: [`WORDS`] with "stream" and
/// "delta" after "set", and "in", "when" and "state" at the end. The order
/// is part of the data (a word is drawn by its index).
pub const CORE_WORDS: &[&str] = &CORE_WORDS_ARRAY;

const CORE_WORDS_ARRAY: [&str; 49] = {
    let mut words = [""; 49];
    let mut from = 0;
    while from < WORDS.len() {
        // "set" is WORDS[13].
        let to = if from < 14 { from } else { from + 2 };
        words[to] = WORDS[from];
        from += 1;
    }
    words[14] = "stream";
    words[15] = "delta";
    words[46] = "in";
    words[47] = "when";
    words[48] = "state";
    words
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_text() {
        let first = Rng::new(7).text(WORDS, 100, 500);
        assert_eq!(first, Rng::new(7).text(WORDS, 100, 500));
        assert_ne!(first, Rng::new(8).text(WORDS, 100, 500));
        assert!((100..=500).contains(&first.len()));
        assert!(first.is_ascii());
        assert_eq!(Rng::new(7).text(CORE_WORDS, 64, 64).len(), 64);
    }

    /// The generator's stream, pinned: the benches' logs (and so their
    /// figures) stay what they were when each bench had its own copy.
    #[test]
    fn the_stream_is_the_one_the_benches_were_measured_with() {
        assert_eq!(Rng::new(0x5eed_0001).next_u64(), 0xa2e8_ec67_270a_2376);
        assert_eq!(
            Rng::new(7).text(WORDS, 40, 40),
            "line anything the error\nerror with serde"
        );
        assert_eq!(
            Rng::new(7).text(CORE_WORDS, 40, 40),
            "log serde output matches\npasses appended"
        );
        let fnv = |text: &str| {
            text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            })
        };
        let mut rng = Rng::new(0x5eed_cafe);
        let long: String = (0..200).map(|_| rng.text(WORDS, 100, 500)).collect();
        assert_eq!((long.len(), fnv(&long)), (61_275, 0x8cbc_e4a4_4954_96ee));
        let short: String = (0..200)
            .map(|seed| Rng::new(0x5eed_0003 + seed).text(CORE_WORDS, 10, 120))
            .collect();
        assert_eq!((short.len(), fnv(&short)), (12_819, 0xb688_f351_c17d_460c));
    }

    #[test]
    fn the_core_vocabulary_is_the_shared_one_and_five_more() {
        assert_eq!(
            &CORE_WORDS[12..17],
            ["working", "set", "stream", "delta", "request"]
        );
        assert_eq!(&CORE_WORDS[44..], ["line", "42", "in", "when", "state"]);
        assert!(CORE_WORDS.iter().all(|word| !word.is_empty()));
    }
}
