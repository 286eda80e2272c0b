//! Placeholder until the spawn bench lands.
fn main() {}
