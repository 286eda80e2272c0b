//! keel-lab: keel run against itself, for people and for CI. The fake LLM
//! provider (`mock_llm`, `keel mock-llm`), the guided tour (`demo`, `keel
//! demo`), the crash and fault drills (`drill`, `keel drill`) and the
//! measurements of a running daemon (`bench`, `keel bench`). It drives the
//! daemon (keel-daemon) in this process or as a child process through the
//! test rig (keel-test-support), always over the API's client (keel-api).

pub mod bench;
pub mod demo;
pub mod drill;
pub mod mock_llm;

#[cfg(test)]
mod tests {
    /// The rig starts daemons with the daemon's own variable.
    #[test]
    fn the_rig_and_the_daemon_name_the_same_exit_with_parent_variable() {
        assert_eq!(
            keel_test_support::child_daemon::EXIT_WITH_PARENT_ENV,
            keel_daemon::daemon::EXIT_WITH_PARENT_ENV
        );
    }
}
