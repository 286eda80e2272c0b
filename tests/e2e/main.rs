//! End-to-end tests: the real `keel` binary, run as a user would.
