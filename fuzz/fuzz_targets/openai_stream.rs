//! The Chat Completions stream decoder over any response body (or any
//! sequence of events): it must never panic, and a failure must stick (see
//! `keel_fuzz::drive`).
#![no_main]

use keel_core::wire::openai::Decoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let events = keel_fuzz::events(input);
    keel_fuzz::drive(Box::new(Decoder::new("gpt-fuzz")), &events);
});
