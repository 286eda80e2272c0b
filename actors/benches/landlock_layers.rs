#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What the order of a confined call's Landlock layers costs
//! (docs/benchmarks.md, "Landlock layers, fewest rules first"). Run it with
//!
//! ```text
//! cargo bench -p keel-actors --bench landlock_layers
//! KEEL_BENCH_QUICK=1 cargo bench -p keel-actors --bench landlock_layers   # smoke run
//! ```
//!
//! A confined call's thread takes on three layers (`actors/src/sandbox.rs`):
//! what may be reached (a rule for every sibling along the hidden paths: a
//! few hundred where `/tmp` is busy), where it may write (a few rules) and
//! the network's (none under `off`). Each layer taken on makes a new
//! domain with a copy of every rule of the one before, so the order
//! decides how often the large layer's rules are copied. Here a reach
//! layer of a rule per entry of `/`, `/tmp`, `/usr` and `/etc` is taken on
//! by a fresh thread per call, in both orders, interleaved round after
//! round; the figure is this process's CPU time per call (thread, rulesets
//! and restrictions), median over the rounds. Prints nothing but a note
//! where the kernel has no Landlock.

use std::time::Instant;

use landlock::{
    Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, RulesetStatus, ABI,
};

const ABI_USED: ABI = ABI::V4;

fn process_cpu() -> f64 {
    let time = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    time.tv_sec as f64 + time.tv_nsec as f64 / 1e9
}

fn reach_layer() -> (RulesetCreated, usize) {
    let mut created = Ruleset::default()
        .handle_access(AccessFs::from_all(ABI_USED))
        .unwrap()
        .create()
        .unwrap();
    let mut rules = 0;
    for dir in ["/", "/tmp", "/usr", "/etc"] {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            if let Ok(fd) = PathFd::new(entry.path()) {
                created = created
                    .add_rule(PathBeneath::new(fd, AccessFs::from_all(ABI_USED)))
                    .unwrap();
                rules += 1;
            }
        }
    }
    (created, rules)
}

fn write_layer() -> RulesetCreated {
    Ruleset::default()
        .handle_access(AccessFs::from_write(ABI_USED))
        .unwrap()
        .create()
        .unwrap()
        .add_rule(PathBeneath::new(
            PathFd::new(std::env::temp_dir()).unwrap(),
            AccessFs::from_write(ABI_USED),
        ))
        .unwrap()
}

fn network_layer() -> RulesetCreated {
    Ruleset::default()
        .handle_access(AccessNet::from_all(ABI_USED))
        .unwrap()
        .create()
        .unwrap()
}

/// CPU seconds per call of `calls` confined threads, the reach layer
/// first (`large_first`) or last.
fn round(reach: &RulesetCreated, large_first: bool, calls: usize) -> f64 {
    let before = process_cpu();
    for _ in 0..calls {
        let reach = reach.try_clone().unwrap();
        let write = write_layer();
        let network = network_layer();
        std::thread::spawn(move || {
            let layers = if large_first {
                [reach, write, network]
            } else {
                [network, write, reach]
            };
            for layer in layers {
                // Partly where a rule gives a file directory rights.
                let status = layer.restrict_self().unwrap();
                assert_ne!(status.ruleset, RulesetStatus::NotEnforced);
            }
        })
        .join()
        .unwrap();
    }
    (process_cpu() - before) / calls as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // Probed on a thread of its own, which the probe confines.
    let enforced = std::thread::spawn(|| {
        matches!(
            Ruleset::default()
                .handle_access(AccessFs::from_all(ABI_USED))
                .and_then(|ruleset| ruleset.create())
                .and_then(|created| created.restrict_self()),
            Ok(status) if status.ruleset == RulesetStatus::FullyEnforced
        )
    })
    .join()
    .unwrap();
    if !enforced {
        println!("this kernel has no Landlock (ABI 4): nothing to measure");
        return;
    }
    let quick = std::env::var_os("KEEL_BENCH_QUICK").is_some();
    let (calls, rounds) = if quick { (50, 1) } else { (500, 7) };
    let (reach, rules) = reach_layer();
    let started = Instant::now();
    let mut first = Vec::new();
    let mut last = Vec::new();
    for _ in 0..rounds {
        first.push(round(&reach, true, calls));
        last.push(round(&reach, false, calls));
    }
    println!(
        "a reach layer of {rules} rules, {rounds} rounds of {calls} confined threads each way ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    println!(
        "  taken on first (large layer, then write, then network): {:.1} µs CPU per call",
        median(first) * 1e6
    );
    println!(
        "  taken on last (network, write, then large layer):       {:.1} µs CPU per call",
        median(last) * 1e6
    );
}
