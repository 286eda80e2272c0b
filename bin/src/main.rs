//! The `keel` binary: parses the command line and hands over to `keel::cli`.
fn main() {}
