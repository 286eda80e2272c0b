//! Sub-agents through the runtime against the real `keel mock-llm`: a
//! parent's `spawn_agents` call starts one conversation per task, they run
//! in parallel, and their outcomes come back in task order as the call's
//! result. Each child is scripted by its task text (the mock's `"when"`),
//! since children ask the mock at the same time. Also: every way a child
//! can end without a result, a child's spawn refused, a parent's cancel
//! reaching its children and their tools, and a host killed mid-call and
//! restarted finding the same children.

use std::time::Instant;

use keel_actors::core::config::SubAgentLimits;
use keel_actors::core::event::SubAgentOutcome;
use keel_actors::core::ids::ConversationId;
use keel_actors::store::IndexEntry;
use serde_json::Value;

use super::*;

/// The parent's prompt: its script entries ask for it, so that no child
/// takes them.
const PARENT: &str = "PARENT: split the work";

/// A script entry for the parent: a `spawn_agents` call with these tasks,
/// under the fixed id `spawn1`.
fn spawn_entry(tasks: &[&str]) -> Value {
    let tasks: Vec<Value> = tasks.iter().map(|task| json!({"task": task})).collect();
    json!({
        "when": PARENT,
        "tool_calls": [{"id": "spawn1", "name": "spawn_agents", "input": {"tasks": tasks}}]
    })
}

/// A script entry for the child whose task contains `task`: submit `result`.
fn submit_entry(task: &str, result: &str) -> Value {
    json!({
        "when": task,
        "tool_calls": [{"name": "submit_result", "input": {"result": result}}]
    })
}

fn parent_config() -> ConversationConfig {
    config()
}

/// Sends the parent's prompt and waits until the spawn call has its
/// result and the parent is idle again; returns that result and the
/// child states the parent published meanwhile.
async fn run_parent(
    conversation: &ConversationHandle,
) -> (String, Vec<(usize, ConversationId, StateName)>) {
    let mut watch = watch(conversation).await;
    conversation.send(PARENT, Vec::new()).await.unwrap();
    let mut result = None;
    let mut children = Vec::new();
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            match watch.next().await {
                Received::Update(Update::Event { event }) => {
                    if let EventKind::ToolResult {
                        tool_call_id,
                        content,
                        ..
                    } = &event.kind
                    {
                        if tool_call_id.as_str() == "spawn1" {
                            result = Some(content.clone());
                        }
                    }
                }
                Received::Update(Update::Live {
                    event:
                        LiveEvent::ChildState {
                            task_idx,
                            child,
                            state,
                            ..
                        },
                }) => children.push((task_idx, child, state)),
                Received::Closed => panic!("the parent stopped"),
                _ => {}
            }
            if result.is_some() && watch.state == StateName::Idle {
                break;
            }
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "the spawn call got no result within {PATIENCE:?}"
    );
    (result.unwrap_or_default(), children)
}

/// The sub-agents of `parent` in the store, in creation order.
async fn children_of(runtime: &Runtime, parent: &ConversationId) -> Vec<IndexEntry> {
    runtime
        .list(true)
        .await
        .unwrap()
        .into_iter()
        .filter(|entry| entry.parent.as_ref() == Some(parent))
        .collect()
}

/// The sub-agent of `parent` whose task contains `task` (children are
/// created in parallel, so the listing's order is not the tasks').
async fn child_for(runtime: &Runtime, parent: &ConversationId, task: &str) -> ConversationId {
    for child in children_of(runtime, parent).await {
        let events = runtime.store().read_all(&child.id).await.unwrap();
        let given = events.iter().any(|event| {
            matches!(&event.kind, EventKind::UserMessage { text, .. } if text.contains(task))
        });
        if given {
            return child.id;
        }
    }
    panic!("no sub-agent has the task {task:?}")
}

/// A child's terminal outcome, from its log.
async fn outcome_of(runtime: &Runtime, child: &ConversationId) -> SubAgentOutcome {
    let events = runtime.store().read_all(child).await.unwrap();
    events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::Finished { outcome } => Some(outcome.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{child} has not finished"))
}

/// Where each of `needles` starts in `text`; panics naming the missing one.
fn positions(text: &str, needles: &[&str]) -> Vec<usize> {
    needles
        .iter()
        .map(|needle| {
            text.find(needle)
                .unwrap_or_else(|| panic!("{needle:?} is not in:\n{text}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_agents_run_in_parallel_and_their_results_come_back_in_task_order() {
    let rig = Rig::new();
    // Each child takes about DRIP_MS * (deltas in its answer) at the mock.
    const DRIP_MS: u64 = 250;
    let mut script = vec![spawn_entry(&["TASK-A count", "TASK-B list", "TASK-C sum"])];
    for (task, result) in [
        ("TASK-A", "result of A"),
        ("TASK-B", "result of B"),
        ("TASK-C", "result of C"),
    ] {
        let mut entry = submit_entry(task, result);
        entry["text"] = json!("working on it");
        entry["drip_ms"] = json!(DRIP_MS);
        script.push(entry);
    }
    script.push(json!({"when": PARENT, "text": "all three are done"}));
    rig.mock.push_script(json!(script)).await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let parent = runtime.create(rig.cwd(), parent_config()).await.unwrap();

    let started = Instant::now();
    let (result, states) = run_parent(&parent).await;
    let wall = started.elapsed();

    // In task order, each with its result.
    let at = positions(
        &result,
        &[
            "3 of 3 sub-agents completed",
            "## Task 1",
            "result of A",
            "## Task 2",
            "result of B",
            "## Task 3",
            "result of C",
        ],
    );
    assert!(at.windows(2).all(|pair| pair[0] < pair[1]), "{result}");

    // Each child linked to the parent, not user-initiated, left out of
    // the normal listing, and completed with its own result.
    let children = children_of(&runtime, parent.id()).await;
    assert_eq!(children.len(), 3);
    let normal = runtime.list(false).await.unwrap();
    assert_eq!(normal.len(), 1, "only the parent is listed normally");
    let mut longest_child_ms = 0;
    for child in &children {
        assert!(!child.user_initiated);
        assert!(child.finished);
        assert_eq!(child.cwd, parent.inspect().await.unwrap().cwd);
        let events = runtime.store().read_all(&child.id).await.unwrap();
        let finished_at = events.last().unwrap().at;
        longest_child_ms = longest_child_ms.max(finished_at.millis_since(child.created_at));
        assert!(matches!(
            outcome_of(&runtime, &child.id).await,
            SubAgentOutcome::Completed { .. }
        ));
    }
    // The children worked at the same time: the whole call took about as
    // long as one child (about 1.5 s here), not three. Twice one child's
    // time leaves room for a loaded 2-core machine and still fails if
    // they ran one after another.
    let wall_ms = wall.as_millis() as u64;
    assert!(
        longest_child_ms >= 2 * DRIP_MS,
        "a child took {longest_child_ms} ms"
    );
    assert!(
        wall_ms < 2 * longest_child_ms,
        "the call took {wall_ms} ms; one child took up to {longest_child_ms} ms"
    );
    // The parent's watchers saw every child finish.
    for task_idx in 0..3 {
        assert!(
            states
                .iter()
                .any(|(idx, _, state)| *idx == task_idx && *state == StateName::Completed),
            "no completed state for task {task_idx}: {states:?}"
        );
    }
    assert_paired(&parent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_way_a_sub_agent_ends_without_a_result_is_reported_as_such() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([
            spawn_entry(&[
                "TASK-CHATTY never submits",
                "TASK-SLOW never answers",
                "TASK-BROKEN meets an error",
                "TASK-GREEDY tries to spawn",
            ]),
            // Answers in text, is reminded, answers in text again on its
            // grace turn: the turn cap ends it.
            {"when": "TASK-CHATTY", "text": "I would rather talk"},
            {"when": "TASK-CHATTY", "text": "still talking"},
            {"when": "TASK-SLOW", "hang": true},
            {"when": "TASK-BROKEN", "status": 400},
            {"when": "TASK-GREEDY", "tool_calls": [{"name": "spawn_agents", "input": {"tasks": ["more"]}}]},
            submit_entry("TASK-GREEDY", "did it alone"),
            {"when": PARENT, "text": "noted"},
        ]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let config = ConversationConfig {
        sub_agent: SubAgentLimits {
            max_turns: 1,
            timeout_ms: 2_000,
            ..SubAgentLimits::default()
        },
        ..parent_config()
    };
    let parent = runtime.create(rig.cwd(), config).await.unwrap();
    let (result, _) = run_parent(&parent).await;

    let at = positions(
        &result,
        &[
            "1 of 4 sub-agents completed",
            "## Task 1",
            "exceeded its turn cap of 1 without submitting a result",
            "## Task 2",
            "timed out after 2 s without submitting a result",
            "## Task 3",
            "HTTP 400",
            "## Task 4",
            "did it alone",
        ],
    );
    assert!(at.windows(2).all(|pair| pair[0] < pair[1]), "{result}");

    // The child that tried to spawn was refused, and no grandchild exists.
    let children = children_of(&runtime, parent.id()).await;
    assert_eq!(children.len(), 4);
    assert_eq!(runtime.list(true).await.unwrap().len(), 5);
    let greedy = child_for(&runtime, parent.id(), "TASK-GREEDY").await;
    let refusals: Vec<String> = tool_results(&runtime.store().read_all(&greedy).await.unwrap())
        .into_iter()
        .map(|(_, content, _)| content)
        .collect();
    assert!(
        refusals
            .iter()
            .any(|content| content.contains("cannot spawn sub-agents")),
        "{refusals:?}"
    );
    let broken = outcome_of(
        &runtime,
        &child_for(&runtime, parent.id(), "TASK-BROKEN").await,
    )
    .await;
    assert!(
        matches!(broken, SubAgentOutcome::Failed { .. }),
        "{broken:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_parent_cancels_its_sub_agents_and_their_tools() {
    let rig = Rig::new();
    let mut script = vec![spawn_entry(&["TASK-1 sleep", "TASK-2 sleep"])];
    for task in ["TASK-1", "TASK-2"] {
        script.push(json!({
            "when": task,
            "tool_calls": [{"name": "bash", "input": {"command": format!("read -r pid _ < /proc/self/stat; echo $pid > pgid-{task}; sleep 30")}}]
        }));
    }
    rig.mock.push_script(json!(script)).await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let parent = runtime.create(rig.cwd(), parent_config()).await.unwrap();
    let mut watch = watch(&parent).await;
    parent.send(PARENT, Vec::new()).await.unwrap();
    watch.reach(StateName::ExecutingTools).await;
    let mut pgids = Vec::new();
    for task in ["TASK-1", "TASK-2"] {
        let text = wait_file(&rig.cwd().join(format!("pgid-{task}"))).await;
        pgids.push(text.trim().parse::<i32>().unwrap());
    }

    assert_eq!(parent.cancel().await.unwrap(), StateName::Idle);
    for pgid in pgids {
        wait_group_gone(pgid).await;
    }
    let children = children_of(&runtime, parent.id()).await;
    assert_eq!(children.len(), 2);
    for child in &children {
        let handle = runtime.handle(child.id.clone());
        let mut child_watch = super::watch(&handle).await;
        child_watch.reach(StateName::Failed).await;
        let events = log(&runtime, &handle).await;
        assert_eq!(
            count(&events, |kind| matches!(
                kind,
                EventKind::TurnInterrupted {
                    reason: keel_actors::core::event::InterruptReason::Cancelled,
                    ..
                }
            )),
            1,
            "the child's log records the cancel"
        );
        assert_eq!(
            outcome_of(&runtime, &child.id).await,
            SubAgentOutcome::Failed {
                reason: "cancelled".to_owned()
            }
        );
    }
    // The parent's call was answered by the cancel, once.
    let results = tool_results(&log(&runtime, &parent).await);
    assert_eq!(results.len(), 1);
    assert!(results[0].2, "a synthetic result");
    assert_paired(&parent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_while_sub_agents_run_finds_the_same_ones_after_a_restart() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([
            spawn_entry(&["TASK-EARLY", "TASK-LATE"]),
            submit_entry("TASK-EARLY", "early result"),
            {"when": "TASK-LATE", "hang": true},
        ]))
        .await;
    let parent_id = {
        let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
        let parent = runtime.create(rig.cwd(), parent_config()).await.unwrap();
        let mut watch = watch(&parent).await;
        parent.send(PARENT, Vec::new()).await.unwrap();
        // Wait until the early child has finished and the late one is asking.
        let waited = tokio::time::timeout(PATIENCE, async {
            let mut early_done = false;
            while !early_done {
                if let Received::Update(Update::Live {
                    event:
                        LiveEvent::ChildState {
                            task_idx: 0,
                            state: StateName::Completed,
                            ..
                        },
                }) = watch.next().await
                {
                    early_done = true;
                }
            }
        })
        .await;
        assert!(waited.is_ok(), "the early child did not finish");
        eventually_requests_with(&rig, "TASK-LATE").await;
        let id = parent.id().clone();
        drop(watch);
        drop(parent);
        runtime.crash().await;
        id
    };
    rig.mock
        .push_script(json!([
            submit_entry("TASK-LATE", "late result"),
            {"when": PARENT, "text": "both done"},
        ]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
    let parent = runtime.handle(parent_id);
    let mut watch = watch(&parent).await;
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            let events = log(&runtime, &parent).await;
            let answered = events.iter().any(|event| {
                matches!(&event.kind, EventKind::AssistantMessage { blocks, .. }
                    if blocks.iter().any(|block| matches!(block,
                        keel_actors::core::message::AssistantBlock::Text { text } if text == "both done")))
            });
            if answered {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), watch.next()).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the parent never got its aggregate");

    // The same two children, not four; the early one ran once.
    let children = children_of(&runtime, parent.id()).await;
    assert_eq!(children.len(), 2);
    let requests = rig.mock.requests().await;
    let asked = |task: &str| {
        requests
            .iter()
            .filter(|request| {
                request["body"]["messages"][0]["content"]
                    .to_string()
                    .contains(task)
            })
            .count()
    };
    assert_eq!(asked("TASK-EARLY"), 1, "the early child was not run again");
    let early = child_for(&runtime, parent.id(), "TASK-EARLY").await;
    assert_eq!(
        count(
            &runtime.store().read_all(&early).await.unwrap(),
            |kind| matches!(kind, EventKind::Finished { .. })
        ),
        1
    );
    // The aggregate arrived once, with the early result kept.
    let results = tool_results(&log(&runtime, &parent).await);
    assert_eq!(results.len(), 1, "{results:?}");
    positions(&results[0].1, &["early result", "late result"]);
    assert!(!results[0].2, "a real result, not a synthetic one");
}

/// Waits until the mock has a request whose first message holds `task`.
async fn eventually_requests_with(rig: &Rig, task: &str) {
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            let requests = rig.mock.requests().await;
            if requests.iter().any(|request| {
                request["body"]["messages"][0]["content"]
                    .to_string()
                    .contains(task)
            }) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "no request for {task}");
}

/// The ids of the children the parent has published a state for, by task.
async fn child_ids_seen(watch: &mut Watch, n_children: usize) -> Vec<ConversationId> {
    let mut ids: Vec<Option<ConversationId>> = vec![None; n_children];
    let waited = tokio::time::timeout(PATIENCE, async {
        while ids.iter().any(Option::is_none) {
            if let Received::Update(Update::Live {
                event:
                    LiveEvent::ChildState {
                        task_idx, child, ..
                    },
            }) = watch.next().await
            {
                ids[task_idx] = Some(child);
            }
        }
    })
    .await;
    assert!(waited.is_ok(), "the parent did not publish its children");
    ids.into_iter().flatten().collect()
}

/// Waits until the parent's log has the spawn call's result and the
/// parent rests; returns the results of its log.
async fn wait_aggregate(
    runtime: &Runtime,
    parent: &ConversationHandle,
) -> Vec<(String, String, bool)> {
    let mut watch = watch(parent).await;
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            let results = tool_results(&log(runtime, parent).await);
            if !results.is_empty() && watch.state == StateName::Idle {
                return results;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), watch.next()).await;
        }
    })
    .await;
    waited.expect("the parent never got its aggregate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_sub_agent_is_restarted_and_its_parent_still_gets_the_result() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([
            spawn_entry(&["TASK-CRASHY"]),
            {"when": "TASK-CRASHY", "hang": true},
        ]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let parent = runtime.create(rig.cwd(), parent_config()).await.unwrap();
    let mut parent_watch = watch(&parent).await;
    parent.send(PARENT, Vec::new()).await.unwrap();
    let children = child_ids_seen(&mut parent_watch, 1).await;
    eventually_requests_with(&rig, "TASK-CRASHY").await;
    rig.mock
        .push_script(json!([
            submit_entry("TASK-CRASHY", "survived"),
            {"when": PARENT, "text": "fine"},
        ]))
        .await;
    runtime.handle(children[0].clone()).crash().await.unwrap();

    let results = wait_aggregate(&runtime, &parent).await;
    assert_eq!(results.len(), 1);
    assert!(results[0].1.contains("survived"), "{results:?}");
    assert!(runtime.restarts().await.unwrap() >= 1);
    assert_eq!(children_of(&runtime, parent.id()).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_parent_re_attaches_to_the_same_sub_agents() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([
            spawn_entry(&["TASK-STEADY one", "TASK-QUICK two"]),
            {
                "when": "TASK-STEADY",
                "text": "slowly",
                "drip_ms": 300,
                "tool_calls": [{"name": "submit_result", "input": {"result": "steady result"}}]
            },
            submit_entry("TASK-QUICK", "quick result"),
            {"when": PARENT, "text": "fine"},
        ]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let parent = runtime.create(rig.cwd(), parent_config()).await.unwrap();
    let mut parent_watch = watch(&parent).await;
    parent.send(PARENT, Vec::new()).await.unwrap();
    child_ids_seen(&mut parent_watch, 2).await;
    eventually_requests_with(&rig, "TASK-STEADY").await;
    drop(parent_watch);
    parent.crash().await.unwrap();

    let results = wait_aggregate(&runtime, &parent).await;
    assert_eq!(results.len(), 1, "one aggregate: {results:?}");
    positions(&results[0].1, &["steady result", "quick result"]);
    assert_eq!(children_of(&runtime, parent.id()).await.len(), 2);
    let requests = rig.mock.requests().await;
    for task in ["TASK-STEADY", "TASK-QUICK"] {
        let asked = requests
            .iter()
            .filter(|request| {
                request["body"]["messages"][0]["content"]
                    .to_string()
                    .contains(task)
            })
            .count();
        assert_eq!(asked, 1, "{task} was asked once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_directory_is_taken_from_the_parents_and_may_not_lead_out_of_it() {
    let rig = Rig::new();
    let cwd = rig.cwd();
    std::fs::create_dir_all(cwd.join("sub")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), cwd.join("link")).unwrap();
    rig.mock
        .push_script(json!([
            {
                "when": PARENT,
                "tool_calls": [{"id": "spawn0", "name": "spawn_agents", "input": {"tasks": [
                    {"task": "TASK-UP", "cwd": "../up"}
                ]}}]
            },
            {
                "when": PARENT,
                "tool_calls": [{"id": "spawn1", "name": "spawn_agents", "input": {"tasks": [
                    {"task": "TASK-SUB in sub", "cwd": "sub"},
                    {"task": "TASK-LINK through a link", "cwd": "link"}
                ]}}]
            },
            submit_entry("TASK-SUB", "in sub"),
            {"when": PARENT, "text": "done"},
        ]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let parent = runtime.create(&cwd, parent_config()).await.unwrap();
    let (result, _) = run_parent(&parent).await;

    // `..` was refused before anything started; the model tried again.
    let results = tool_results(&log(&runtime, &parent).await);
    assert!(results[0].1.contains("inside yours"), "{results:?}");
    positions(
        &result,
        &["## Task 1", "in sub", "## Task 2", "could not be started"],
    );
    let children = children_of(&runtime, parent.id()).await;
    assert_eq!(children.len(), 1, "the linked one was never created");
    assert_eq!(
        std::path::Path::new(&children[0].cwd),
        cwd.join("sub").as_path()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_reuses_tool_call_ids_still_gets_new_sub_agents_for_a_new_call() {
    // Both spawn calls come back under the id `spawn1`, as from a provider
    // that numbers its calls (keel's fake provider after a restart, local
    // OpenAI-compatible servers).
    let rig = Rig::new();
    rig.mock
        .push_script(json!([
            spawn_entry(&["TASK-FIRST"]),
            submit_entry("TASK-FIRST", "first result"),
            {"when": PARENT, "text": "first done"},
            spawn_entry(&["TASK-SECOND"]),
            submit_entry("TASK-SECOND", "second result"),
            {"when": PARENT, "text": "second done"},
        ]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let parent = runtime.create(rig.cwd(), parent_config()).await.unwrap();
    let (first, _) = run_parent(&parent).await;
    positions(&first, &["1 of 1 sub-agent completed", "first result"]);

    let (second, _) = run_parent(&parent).await;
    positions(&second, &["1 of 1 sub-agent completed", "second result"]);
    assert!(!second.contains("first result"), "{second}");
    assert_eq!(children_of(&runtime, parent.id()).await.len(), 2);
    child_for(&runtime, parent.id(), "TASK-SECOND").await;
}

/// Waits until `child` has finished; returns its outcome.
async fn finished(runtime: &Runtime, child: &ConversationId) -> SubAgentOutcome {
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            let events = runtime.store().read_all(child).await.unwrap();
            if let Some(outcome) = events.iter().find_map(|event| match &event.kind {
                EventKind::Finished { outcome } => Some(outcome.clone()),
                _ => None,
            }) {
                return outcome;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    waited.unwrap_or_else(|_| panic!("{child} did not finish within {PATIENCE:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_recovered_idle_cancels_the_sub_agents_it_no_longer_waits_for() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([
            spawn_entry(&["TASK-ABANDONED"]),
            {"when": "TASK-ABANDONED", "hang": true},
        ]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let config = ConversationConfig {
        recovery: RecoveryPolicy::Idle,
        ..parent_config()
    };
    let parent = runtime.create(rig.cwd(), config).await.unwrap();
    let mut parent_watch = watch(&parent).await;
    parent.send(PARENT, Vec::new()).await.unwrap();
    let children = child_ids_seen(&mut parent_watch, 1).await;
    eventually_requests_with(&rig, "TASK-ABANDONED").await;
    drop(parent_watch);
    // The parent alone crashes; its child runs on, live. Recovered under
    // `idle`, the parent answers its call "interrupted by restart": nobody
    // waits for the child any more, so it is cancelled at once, not left
    // to its deadline (ten minutes by default).
    parent.crash().await.unwrap();

    assert_eq!(
        finished(&runtime, &children[0]).await,
        SubAgentOutcome::Failed {
            reason: "cancelled".to_owned()
        }
    );
    let results = tool_results(&log(&runtime, &parent).await);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(
        results[0].1.contains("interrupted by restart"),
        "{results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_whose_parent_was_cancelled_before_a_crash_is_cancelled_at_boot_not_resumed() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([
            spawn_entry(&["TASK-ORPHAN"]),
            {"when": "TASK-ORPHAN", "hang": true},
        ]))
        .await;
    let (parent_id, child) = {
        let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
        let parent = runtime.create(rig.cwd(), parent_config()).await.unwrap();
        let mut parent_watch = watch(&parent).await;
        parent.send(PARENT, Vec::new()).await.unwrap();
        let children = child_ids_seen(&mut parent_watch, 1).await;
        eventually_requests_with(&rig, "TASK-ORPHAN").await;
        let id = parent.id().clone();
        drop(parent_watch);
        drop(parent);
        runtime.crash().await;
        (id, children[0].clone())
    };
    // The parent's cancel was durable, the cancel of its sub-agent was
    // not: what a crash right after a cancel leaves. The parent's log gets
    // the very events the core records for a cancel.
    {
        let store = rig.store(BackendKind::Redb);
        let events = store.read_all(&parent_id).await.unwrap();
        let conversation = keel_actors::core::Conversation::replay(&events).unwrap();
        let now = events.last().unwrap().at;
        let step =
            keel_actors::core::transition(conversation, keel_actors::core::Input::Cancel, now);
        store
            .append(&parent_id, step.appended().to_vec())
            .await
            .unwrap();
    }
    let (runtime, report) = Runtime::open(rig.runtime_config(rig.store(BackendKind::Redb)))
        .await
        .unwrap();
    assert_eq!(report.cancelled, vec![child.clone()], "{report:?}");
    assert!(!report.recovered.contains(&child), "{report:?}");
    assert_eq!(
        finished(&runtime, &child).await,
        SubAgentOutcome::Failed {
            reason: "cancelled".to_owned()
        }
    );
    // Nothing of it was sent to the provider again.
    let requests = rig.mock.requests().await;
    let asked = requests
        .iter()
        .filter(|request| {
            request["body"]["messages"][0]["content"]
                .to_string()
                .contains("TASK-ORPHAN")
        })
        .count();
    assert_eq!(asked, 1, "the orphan was resumed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agents_gated_call_is_listed_shown_and_resolved_through_its_parent() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([
            spawn_entry(&["TASK-GATED"]),
            {"when": "TASK-GATED", "tool_calls": [{"id": "gated1", "name": "bash", "input": {"command": "echo gated-ran"}}]},
            submit_entry("TASK-GATED", "ran it"),
            {"when": PARENT, "text": "done"},
        ]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let mut config = parent_config();
    config.tools.insert(
        "bash".to_owned(),
        keel_actors::core::config::ToolPolicy::Approve,
    );
    let parent = runtime.create(rig.cwd(), config).await.unwrap();
    let mut parent_watch = watch(&parent).await;
    parent.send(PARENT, Vec::new()).await.unwrap();

    // The parent's watchers are shown the child's call.
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Received::Update(Update::Live {
                event: LiveEvent::ChildPending { child, pending, .. },
            }) = parent_watch.next().await
            {
                if !pending.is_empty() {
                    return (child, pending);
                }
            }
        }
    })
    .await;
    let (child, pending) = waited.expect("the parent never showed its child's pending call");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].call.id.as_str(), "gated1");
    // Listed with the parent's pending calls, naming the child.
    let inspection = parent.inspect().await.unwrap();
    assert!(inspection.pending.is_empty(), "the parent's own calls");
    assert_eq!(inspection.child_pending.len(), 1);
    assert_eq!(inspection.child_pending[0].child, child);
    assert_eq!(
        inspection.child_pending[0].pending.call.id.as_str(),
        "gated1"
    );
    let subscription = parent.subscribe().await.unwrap();
    assert_eq!(subscription.view.child_pending, inspection.child_pending);
    drop(subscription);

    // Resolved through the parent: the decision reaches the child.
    parent
        .resolve(
            keel_actors::core::ids::ToolCallId::new("gated1"),
            Decision::Approve,
        )
        .await
        .unwrap();
    // Asked again after a lost answer: the same decision succeeds.
    parent
        .resolve(
            keel_actors::core::ids::ToolCallId::new("gated1"),
            Decision::Approve,
        )
        .await
        .unwrap();
    let results = wait_aggregate(&runtime, &parent).await;
    assert_eq!(results.len(), 1, "{results:?}");
    positions(&results[0].1, &["1 of 1 sub-agent completed", "ran it"]);
    let child_results = tool_results(&runtime.store().read_all(&child).await.unwrap());
    assert!(
        child_results
            .iter()
            .any(|(id, content, _)| id == "gated1" && content.contains("gated-ran")),
        "{child_results:?}"
    );
    assert!(parent.inspect().await.unwrap().child_pending.is_empty());
}
