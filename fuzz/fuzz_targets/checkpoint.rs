//! Any bytes as a stored working-set checkpoint: `checkpoint::decode` must
//! never panic (a bad checkpoint is refused and the log replayed), and a
//! working set it reads must come back equal when encoded again.
#![no_main]

use keel_core::codec::checkpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(working) = checkpoint::decode(bytes) else {
        return;
    };
    assert_eq!(
        checkpoint::decode(&checkpoint::encode(&working)),
        Ok(working)
    );
});
