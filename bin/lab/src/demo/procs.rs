//! Whether processes are still running, read from `/proc` (Linux, as the
//! runtime's process groups are): the demo's proof that a cancel left
//! nothing of a tool's process tree behind.
//!
//! A killed process stays a zombie until its parent reaps it; a zombie
//! runs nothing and holds nothing but its exit status, so it counts as
//! gone here.

use std::time::Duration;

use keel_test_support::{self as rig, is_running};

/// The pids of `pids` that are running, and every running process of
/// process group `pgid`.
pub fn running(pids: &[u32], pgid: u32) -> Vec<u32> {
    let mut alive: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|&pid| is_running(pid))
        .collect();
    for pid in rig::pids() {
        if let Some(stat) = stat(pid) {
            if stat.pgrp == pgid && stat.state != 'Z' && !alive.contains(&pid) {
                alive.push(pid);
            }
        }
    }
    alive.sort_unstable();
    alive
}

/// Wait up to `within` for every process of `pids` and of group `pgid` to
/// be gone; returns those still running then. A SIGKILL takes effect at
/// once, but the kernel tears a process down asynchronously.
pub async fn wait_gone(pids: &[u32], pgid: u32, within: Duration) -> Vec<u32> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let alive = running(pids, pgid);
        if alive.is_empty() || tokio::time::Instant::now() >= deadline {
            return alive;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct Stat {
    /// `R`, `S`, `D`, `Z` (zombie), …
    state: char,
    pgrp: u32,
}

/// `/proc/PID/stat`: `pid (comm) state ppid pgrp …`; comm may hold spaces
/// and parentheses, so the fields are read after its last `)`.
fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(Stat { state, pgrp })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_and_a_reaped_child_does_not() {
        assert!(is_running(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!is_running(pid));
    }
}
