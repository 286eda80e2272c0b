//! What the tool sandbox costs (docs/sandbox.md): `bash` tool turns
//! (`run: true`) of a conversation whose tools are confined
//! (`workspace-write`) beside one whose tools are not (`full-access`,
//! which the bench's own daemon allows), in alternating rounds, and the
//! CPU of keel's two processes over each: the daemon's, and its process
//! spawner's, where the confining happens (docs/bench.md). Once one
//! conversation of each at a time, once many at once (the machine busy).

use std::time::Duration;

use anyhow::{anyhow, Context as _};
use serde::Serialize;

use keel_api::client::Client;
use keel_api::types::{ApiProvider, ApiSandbox, ApiSandboxMode, CreateConversation};
use keel_test_support as rig;

use super::runs::{ms, turns_of};

#[derive(Debug, Clone, Serialize)]
pub struct SandboxCost {
    /// Conversations of each side running at once.
    pub at_once: usize,
    /// Turns per round and conversation, and rounds (each runs both).
    pub turns_each: usize,
    pub rounds: usize,
    /// keel's CPU (daemon and spawner) per tool turn, confined.
    pub confined_cpu_ms: f64,
    /// The same, unconfined.
    pub unconfined_cpu_ms: f64,
    /// What confining adds per tool run: the difference.
    pub overhead_cpu_ms: f64,
    /// The spawner's part of each, per turn.
    pub confined_spawner_cpu_ms: f64,
    pub unconfined_spawner_cpu_ms: f64,
    /// Turn latency p50, confined and not.
    pub confined_p50_ms: f64,
    pub unconfined_p50_ms: f64,
}

/// The CPU time of the daemon and of its spawner.
fn cpu(pid: u32, spawner: u32) -> anyhow::Result<(Duration, Duration)> {
    let daemon = rig::cpu_time(pid).ok_or_else(|| anyhow!("cannot read the daemon's CPU time"))?;
    let spawner =
        rig::cpu_time(spawner).ok_or_else(|| anyhow!("cannot read the spawner's CPU time"))?;
    Ok((daemon, spawner))
}

/// The sandbox's cost with `at_once` conversations of each side at once;
/// `None` where the daemon does not allow the unconfined side (a daemon
/// at `--addr` without `KEEL_SANDBOX_FULL_ACCESS=allow`).
pub(super) async fn run(
    client: &Client,
    pid: u32,
    cwd: &str,
    (at_once, turns_each, rounds): (usize, usize, usize),
) -> anyhow::Result<Option<SandboxCost>> {
    let create = |mode: ApiSandboxMode| CreateConversation {
        cwd: Some(cwd.to_owned()),
        provider: Some(ApiProvider::Mock),
        sandbox: Some(ApiSandbox {
            mode: Some(mode),
            network: None,
        }),
        ..CreateConversation::default()
    };
    match client.create(&create(ApiSandboxMode::FullAccess)).await {
        Err(error) if error.code() == Some("sandbox_not_allowed") => return Ok(None),
        answer => {
            answer.context("a full-access conversation")?;
        }
    }
    // `at_once` conversations of each side.
    let pair = || async {
        let mut confined = Vec::with_capacity(at_once);
        let mut unconfined = Vec::with_capacity(at_once);
        for _ in 0..at_once {
            confined.push(
                client
                    .create(&create(ApiSandboxMode::WorkspaceWrite))
                    .await?
                    .id,
            );
            unconfined.push(client.create(&create(ApiSandboxMode::FullAccess)).await?.id);
        }
        anyhow::Ok([confined, unconfined])
    };
    let spawner = rig::spawner_of(pid)
        .ok_or_else(|| anyhow!("the daemon (pid {pid}) has no process spawner to measure"))?;
    // [confined, unconfined]: (daemon, spawner) CPU, and p50s.
    let mut spent = [(Duration::ZERO, Duration::ZERO); 2];
    let mut p50s = [Vec::new(), Vec::new()];
    // A warm-up turn each: the first confined spawn builds the network
    // layer and the seccomp filters, once per daemon.
    for ids in pair().await? {
        turns_of(client, None, "tool", &ids, "run: true", 1).await?;
    }
    for round in 0..rounds {
        // A fresh pair each round, so that no history grows long (each
        // turn sends it all), and each side first in every other round.
        let ids = pair().await?;
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let before = cpu(pid, spawner)?;
            let run = turns_of(client, None, "tool", &ids[side], "run: true", turns_each).await?;
            let after = cpu(pid, spawner)?;
            spent[side].0 += after.0.saturating_sub(before.0);
            spent[side].1 += after.1.saturating_sub(before.1);
            p50s[side].push(run.latency_p50_ms);
        }
    }
    let turns = (at_once * turns_each * rounds) as f64;
    let per_turn = |(daemon, spawner): (Duration, Duration)| ms(daemon + spawner) / turns;
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(0.0)
    };
    let [confined_spent, unconfined_spent] = spent;
    let [mut confined_p50s, mut unconfined_p50s] = p50s;
    Ok(Some(SandboxCost {
        at_once,
        turns_each,
        rounds,
        confined_cpu_ms: per_turn(confined_spent),
        unconfined_cpu_ms: per_turn(unconfined_spent),
        overhead_cpu_ms: per_turn(confined_spent) - per_turn(unconfined_spent),
        confined_spawner_cpu_ms: ms(confined_spent.1) / turns,
        unconfined_spawner_cpu_ms: ms(unconfined_spent.1) / turns,
        confined_p50_ms: median(&mut confined_p50s),
        unconfined_p50_ms: median(&mut unconfined_p50s),
    }))
}

pub(super) fn print(out: &mut impl std::io::Write, cost: &SandboxCost) -> anyhow::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "tool sandbox, {} at once: {} rounds of {} `bash` turns each, confined (workspace-write) and not (full-access)",
        cost.at_once, cost.rounds, cost.turns_each
    )?;
    writeln!(
        out,
        "  keel CPU per tool turn (daemon + spawner): {:.3} ms confined, {:.3} ms unconfined: the sandbox adds {:.3} ms",
        cost.confined_cpu_ms, cost.unconfined_cpu_ms, cost.overhead_cpu_ms
    )?;
    writeln!(
        out,
        "  of which the spawner: {:.3} ms confined, {:.3} ms unconfined; turn latency p50 {:.2} ms confined, {:.2} ms unconfined",
        cost.confined_spawner_cpu_ms,
        cost.unconfined_spawner_cpu_ms,
        cost.confined_p50_ms,
        cost.unconfined_p50_ms
    )?;
    Ok(())
}
