//! 4. Cancel to idle with a busy process tree.

use std::path::Path;
use std::time::{Duration, Instant};

use keel_actors::core::config::ProviderKind;
use keel_actors::core::message::{AssistantBlock, StopReason, ToolCall};
use keel_actors::core::recovery::{plan_recovery, RecoveryPlan};
use keel_actors::core::{
    Conversation, ConversationId, Event, EventKind, StateName, ToolCallId, WorkingSet,
};
use keel_actors::store::{self, BackendKind};
use keel_actors::Settings;
use nix::errno::Errno;
use nix::sys::signal::killpg;
use nix::unistd::Pid;

use crate::logs::{opening, push, seed, usage};
use crate::plumbing::{fresh_id, open_runtime, print_row, scratch, workdir};
use crate::Counts;

/// What the bash tool runs in the cancel benchmark: it writes its pid (the
/// process group's id, since bash leads the group) and starts two children.
const BUSY_COMMAND: &str = "echo $$ > pgid; sleep 30 & sleep 30 & wait";

/// Longest any wait for the runtime may take before the benchmark fails.
const PATIENCE: Duration = Duration::from_secs(20);

pub(crate) async fn cancel(counts: &Counts) {
    const WARM_UP: usize = 2;
    let dir = scratch();
    let store = store::open(BackendKind::Redb, &dir.path().join("data"), None).unwrap();
    let runtime = open_runtime(store.clone(), dir.path(), Settings::default()).await;
    let mut to_idle = Vec::with_capacity(counts.cancel);
    let mut to_gone = Vec::with_capacity(counts.cancel);
    for n in 0..WARM_UP + counts.cancel {
        let cwd = workdir(dir.path(), &format!("cancel-{n}"));
        let id = fresh_id("cancel");
        let log = dangling_bash_call(&id, &cwd);
        assert_eq!(
            Conversation::replay(&log).unwrap().state_name(),
            StateName::Recovering
        );
        assert_eq!(
            plan_recovery(&WorkingSet::replay(&log).unwrap()),
            RecoveryPlan::Redispatch
        );
        seed(store.as_ref(), &log).await;
        // Started re-dispatches the call: a real bash runs.
        let handle = runtime.open_conversation(&id).await.unwrap();
        let pgid = wait_for_pgid(&cwd.join("pgid")).await;
        let members = wait_for_members(pgid, 3).await;

        let start = Instant::now();
        let state = handle.cancel().await.unwrap();
        let idle_after = start.elapsed();
        assert_eq!(state, StateName::Idle);
        while !group_is_gone(pgid, &members) {
            assert!(
                start.elapsed() < PATIENCE,
                "process group {pgid} outlived the cancel"
            );
            std::thread::sleep(Duration::from_micros(50));
        }
        let gone_after = start.elapsed();
        if n >= WARM_UP {
            to_idle.push(idle_after);
            to_gone.push(gone_after);
        }
        handle.evict().await.unwrap();
    }
    print_row("cancel -> Idle answered (bash tree)", &to_idle);
    print_row("cancel -> process group gone", &to_gone);
    runtime.shutdown().await;
}

/// A log that ends in a `bash` call without a result, mid-turn: what a
/// crash during a tool leaves. Under `recovery = resume` (the default) the
/// next start runs the call again.
fn dangling_bash_call(conversation: &ConversationId, cwd: &Path) -> Vec<Event> {
    let mut log = opening(conversation, cwd);
    let user = push(
        &mut log,
        None,
        true,
        EventKind::UserMessage {
            text: "run the busy command".to_owned(),
            images: Vec::new(),
        },
    );
    let started = push(
        &mut log,
        Some(user),
        false,
        EventKind::TurnStarted { turn: 1 },
    );
    push(
        &mut log,
        Some(started),
        false,
        EventKind::AssistantMessage {
            blocks: vec![
                AssistantBlock::Text {
                    text: "Running it.".to_owned(),
                },
                AssistantBlock::ToolUse {
                    call: ToolCall {
                        id: ToolCallId::new("toolu_busy"),
                        name: "bash".to_owned(),
                        input: serde_json::json!({ "command": BUSY_COMMAND }),
                    },
                },
            ],
            stop_reason: StopReason::ToolUse,
            usage: usage(1_000),
            provider: ProviderKind::Anthropic,
            model: "claude-sonnet".to_owned(),
        },
    );
    log
}

async fn wait_for_pgid(path: &Path) -> i32 {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(pgid) = text.trim().parse() {
                return pgid;
            }
        }
        assert!(start.elapsed() < PATIENCE, "the tool never ran");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Pids of the live members of group `pgid`, once there are `at_least`.
async fn wait_for_members(pgid: i32, at_least: usize) -> Vec<i32> {
    let start = Instant::now();
    loop {
        let members = group_members(pgid);
        if members.len() >= at_least {
            return members;
        }
        assert!(start.elapsed() < PATIENCE, "group {pgid}: {members:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Live (not zombie) processes of group `pgid`, from /proc.
fn group_members(pgid: i32) -> Vec<i32> {
    keel_test_support::pids()
        .filter_map(|pid| i32::try_from(pid).ok())
        .filter(|&pid| {
            state_and_group(pid).is_some_and(|(state, group)| group == pgid && state != 'Z')
        })
        .collect()
}

/// State letter and process group of `pid`; `None` once it is gone.
fn state_and_group(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, fields) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = fields.split_whitespace().collect();
    // After the name: state (field 3), ppid (4), pgrp (5).
    Some((
        fields.first()?.chars().next()?,
        fields.get(2)?.parse().ok()?,
    ))
}

/// Gone: nothing left to signal, or every member we saw is dead or a zombie
/// (orphans reparented to an init that does not reap stay zombies).
fn group_is_gone(pgid: i32, members: &[i32]) -> bool {
    match killpg(Pid::from_raw(pgid), None) {
        Err(Errno::ESRCH) => true,
        _ => members.iter().all(|&pid| {
            state_and_group(pid).is_none_or(|(state, group)| state == 'Z' || group != pgid)
        }),
    }
}
