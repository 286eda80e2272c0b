//! Sub-agents through the daemon: a parent's event stream carries a live
//! `child_state` frame for each change of each child, the listing leaves
//! the children out unless `all=true` (which names each one's parent), and
//! `keel ls --all` shows each child under its parent. A daemon killed
//! (SIGKILL) while children run finds the same children when it starts
//! again, and the parent gets their results once.

use serde_json::{json, Value};

use super::{kind, of_kind, Daemon, Resume, Site, Wire};
use crate::cli::Rig;
use crate::harness::MockLlm;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_streams_child_states_and_lists_children_under_their_parent() {
    let rig = Rig::start();
    let daemon = &rig.daemon;
    rig.mock
        .push_script(json!([
            {
                "when": "PARENT",
                "tool_calls": [{"id": "spawn1", "name": "spawn_agents", "input": {"tasks": [
                    {"task": "TASK-ONE"}, {"task": "TASK-TWO"}
                ]}}]
            },
            {"when": "TASK-ONE", "tool_calls": [{"name": "submit_result", "input": {"result": "one"}}]},
            {"when": "TASK-TWO", "tool_calls": [{"name": "submit_result", "input": {"result": "two"}}]},
            {"when": "PARENT", "text": "both done"},
        ]))
        .await;
    let parent = daemon.create(&rig.site, json!({})).await;
    let mut stream = daemon.events(&parent, Resume::Now).await;
    daemon.send(&parent, "PARENT: split the work").await;
    let frames = stream
        .until("the parent's turn ends", |frame| {
            frame.is_canonical_of("turn_completed")
        })
        .await;

    // A live frame for each child's state changes, ending in completed.
    let child_states: Vec<Value> = frames
        .iter()
        .filter(|frame| frame.is_live("child_state"))
        .map(|frame| frame.json())
        .collect();
    for task_idx in 0..2 {
        assert!(
            child_states
                .iter()
                .any(|state| state["task_idx"] == task_idx
                    && state["tool_call_id"] == "spawn1"
                    && state["state"] == "completed"),
            "task {task_idx} completed: {child_states:#?}"
        );
    }
    let result = frames
        .iter()
        .find(|frame| frame.is_canonical_of("tool_result"))
        .expect("the spawn call's result")
        .json();
    let content = result["content"].as_str().unwrap();
    assert!(
        content.find("one").unwrap() < content.find("two").unwrap(),
        "{content}"
    );

    // The listing: children only with all=true, each naming its parent.
    let normal = daemon.get("/v1/conversations").await.body;
    let normal = normal["conversations"].as_array().unwrap();
    assert_eq!(normal.len(), 1, "{normal:#?}");
    let all = daemon.get("/v1/conversations?all=true").await.body;
    let children: Vec<&Value> = all["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|conversation| conversation["parent"] == parent.as_str())
        .collect();
    assert_eq!(children.len(), 2, "{all:#?}");
    assert!(children
        .iter()
        .all(|child| child["user_initiated"] == false && child["state"] == "completed"));
    // `parent=ID`: those children and nothing else (the console finds a
    // running call's sub-agents so).
    let mine = daemon
        .get(&format!("/v1/conversations?parent={parent}"))
        .await
        .body;
    let mine: Vec<&Value> = mine["conversations"].as_array().unwrap().iter().collect();
    assert_eq!(mine, children);
    let none = daemon
        .get("/v1/conversations?parent=c-0000000000000000")
        .await
        .body;
    assert_eq!(none["conversations"], serde_json::json!([]));

    // `keel ls --all`: each child on the line after its parent.
    let listed = rig.ok(&["ls", "--all"]);
    let lines: Vec<&str> = listed.lines().collect();
    let parent_at = lines
        .iter()
        .position(|line| line.starts_with(parent.as_str()))
        .unwrap_or_else(|| panic!("the parent is listed: {listed}"));
    for (offset, child) in children.iter().enumerate() {
        let line = lines.get(parent_at + 1 + offset).copied().unwrap_or("");
        let child_id = child["id"].as_str().unwrap();
        assert!(
            line.trim_start().starts_with(&format!("└ {child_id}")),
            "child {child_id} under its parent: {listed}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_while_sub_agents_run_finds_them_again_after_a_restart() {
    let mock = MockLlm::start();
    let site = Site::new();
    let mut daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    mock.push_script(json!([
        {
            "when": "PARENT",
            "tool_calls": [{"id": "spawn1", "name": "spawn_agents", "input": {"tasks": [
                {"task": "TASK-DONE"}, {"task": "TASK-PENDING"}
            ]}}]
        },
        {"when": "TASK-DONE", "tool_calls": [{"name": "submit_result", "input": {"result": "done before"}}]},
        {"when": "TASK-PENDING", "hang": true},
    ]))
    .await;
    let parent = daemon.create(&site, json!({})).await;
    let mut stream = daemon.events(&parent, Resume::Now).await;
    daemon.send(&parent, "PARENT: split the work").await;
    // One child done, the other asking the mock.
    stream
        .until("the first child completes", |frame| {
            frame.is_live("child_state")
                && frame.json()["task_idx"] == 0
                && frame.json()["state"] == "completed"
        })
        .await;
    let deadline = std::time::Instant::now() + super::PATIENCE;
    while !mock.requests().await.iter().any(|request| {
        request["body"]["messages"][0]["content"]
            .to_string()
            .contains("TASK-PENDING")
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "the second child never asked"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    drop(stream);
    daemon.sigkill();
    assert!(!daemon.wait_exit().success());

    mock.push_script(json!([
        {"when": "TASK-PENDING", "tool_calls": [{"name": "submit_result", "input": {"result": "done after"}}]},
        {"when": "PARENT", "text": "both done"},
    ]))
    .await;
    let daemon = daemon.restart();
    let log = daemon
        .wait_log(&parent, "the parent's answer", |event| {
            kind(event) == "assistant_message" && event.to_string().contains("both done")
        })
        .await;
    let results = of_kind(&log, "tool_result");
    assert_eq!(results.len(), 1, "one aggregate: {log:#?}");
    let content = results[0]["content"].as_str().unwrap();
    assert!(
        content.contains("done before") && content.contains("done after"),
        "{content}"
    );
    let all = daemon.get("/v1/conversations?all=true").await.body;
    let children: Vec<&Value> = all["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|conversation| conversation["parent"] == parent.as_str())
        .collect();
    assert_eq!(children.len(), 2, "the same two children: {all:#?}");
    // The child that had finished was not run again.
    let requests = mock.requests().await;
    let done_asked = requests
        .iter()
        .filter(|request| {
            request["body"]["messages"][0]["content"]
                .to_string()
                .contains("TASK-DONE")
        })
        .count();
    assert_eq!(done_asked, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agents_gated_call_reaches_whoever_watches_its_parent() {
    let rig = Rig::start();
    let daemon = &rig.daemon;
    rig.mock
        .push_script(json!([
            {
                "when": "PARENT",
                "tool_calls": [{"id": "spawn1", "name": "spawn_agents", "input": {"tasks": [
                    {"task": "TASK-GATED"}
                ]}}]
            },
            {"when": "TASK-GATED", "tool_calls": [{"id": "gated1", "name": "bash", "input": {"command": "echo gated-ran"}}]},
            {"when": "TASK-GATED", "tool_calls": [{"name": "submit_result", "input": {"result": "ran it"}}]},
            {"when": "PARENT", "text": "all done"},
        ]))
        .await;
    // The child inherits `bash = approve`.
    let parent = daemon
        .create(&rig.site, json!({"tools": {"bash": "approve"}}))
        .await;
    let mut stream = daemon.events(&parent, Resume::Now).await;

    // `keel send` stops at the child's call and says how to decide it,
    // through the parent.
    let sent = rig.keel(&["send", &parent, "PARENT: split the work"]);
    let stdout = String::from_utf8_lossy(&sent.stdout).into_owned();
    assert_eq!(
        sent.status.code(),
        Some(5),
        "{}",
        crate::cli::describe(&sent)
    );
    assert!(
        stdout.contains("gated1") && stdout.contains("sub-agent"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("keel approve {parent} gated1")),
        "{stdout}"
    );

    // The parent's stream showed it, naming the child.
    let frames = stream
        .until("the child's pending call", |frame| {
            frame.is_live("child_pending") && frame.json()["pending"] != json!([])
        })
        .await;
    let shown = frames.last().unwrap().json();
    let child = shown["child"].as_str().unwrap().to_owned();
    assert_eq!(shown["pending"][0]["tool_call_id"], "gated1", "{shown:#}");
    assert_eq!(shown["pending"][0]["conversation"], child.as_str());

    // Listed with the parent's pending calls.
    let detail = daemon
        .get(&format!("/v1/conversations/{parent}"))
        .await
        .body;
    let pending = detail["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{detail:#}");
    assert_eq!(pending[0]["tool_call_id"], "gated1");
    assert_eq!(pending[0]["conversation"], child.as_str());

    // `keel approve PARENT CALL` reaches the child, which runs the call.
    rig.ok(&["approve", &parent, "gated1"]);
    let log = daemon
        .wait_log(&parent, "the parent's answer", |event| {
            kind(event) == "assistant_message" && event.to_string().contains("all done")
        })
        .await;
    let results = of_kind(&log, "tool_result");
    assert_eq!(results.len(), 1, "{log:#?}");
    assert!(
        results[0]["content"].as_str().unwrap().contains("ran it"),
        "{results:#?}"
    );
    let detail = daemon
        .get(&format!("/v1/conversations/{parent}"))
        .await
        .body;
    assert_eq!(detail["pending"], json!([]), "{detail:#}");
}
