//! Any bytes as a stored event record: `codec::decode` must never panic,
//! and an event it reads must come back equal through the current encoding
//! and through version 1 (JSON), so that nothing read from a log changes
//! meaning when it is written again.
#![no_main]

use keel_core::codec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(event) = codec::decode(bytes) else {
        return;
    };
    assert_eq!(codec::decode(&codec::encode(&event)), Ok(event.clone()));
    assert_eq!(codec::decode(&codec::encode_v1(&event)), Ok(event));
});
