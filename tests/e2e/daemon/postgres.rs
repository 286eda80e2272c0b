//! The daemon on PostgreSQL (docs/postgres.md): `KEEL_STORE=postgres` and
//! `KEEL_DATABASE_URL`, against a server the test starts itself
//! (`keel_test_support::postgres`); without PostgreSQL's server binaries
//! these tests say they were not run.

use serde_json::json;

use super::{Daemon, Site, Wire, PATIENCE};
use crate::harness::MockLlm;
use keel_test_support::postgres::Postgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_on_postgres_recovers_a_turn_killed_mid_tool() {
    let Some(server) = Postgres::start() else {
        return;
    };
    let url = server.url();
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[("KEEL_STORE", "postgres"), ("KEEL_DATABASE_URL", &url)],
    );
    let id = daemon.create(&site, json!({})).await;
    daemon.send(&id, "hello postgres").await;
    daemon.wait_turn_done(&id, 1).await;

    // Killed while a tool runs: the log in PostgreSQL ends in a tool call
    // without its result, and recovery runs it again.
    daemon
        .send(&id, "run: sleep 1; echo survived-on-postgres")
        .await;
    daemon.wait_state(&id, "executing_tools").await;
    daemon.sigkill();
    let daemon = daemon.restart();
    let log = daemon.wait_turn_done(&id, 2).await;
    let recovered = log
        .iter()
        .any(|event| event["type"] == "recovered" && event["action"] == "redispatch");
    assert!(recovered, "{log:#?}");
    let detail = daemon.conversation(&id).await;
    let texts: Vec<&str> = detail["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|message| message["content"].as_array().unwrap())
        .filter_map(|block| block["text"].as_str())
        .collect();
    assert_eq!(texts.first(), Some(&"hello postgres"), "{texts:?}");
    assert!(
        texts
            .iter()
            .any(|text| text.contains("The command printed: survived-on-postgres")),
        "{texts:?}"
    );
    // Seqs contiguous from 1, as on every store.
    let seqs: Vec<u64> = log
        .iter()
        .map(|event| event["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());

    // A second daemon (its own data dir) on the same database is refused,
    // naming why, and the first goes on.
    let (status, said) = refused_start(&mock, &url).await;
    assert!(!status.success(), "{status:?}");
    assert!(said.contains("in use by another keel"), "{said}");
    assert!(!said.contains("keel listening"), "{said}");
    daemon.send(&id, "still here").await;
    daemon.wait_turn_done(&id, 3).await;
}

/// `keel serve` on `url` with a data dir of its own, which must exit:
/// its status and what it printed.
async fn refused_start(mock: &MockLlm, url: &str) -> (std::process::ExitStatus, String) {
    let site = Site::new();
    let mut env = super::base_env(&site);
    env.extend(Wire::Anthropic.env(mock));
    env.push(("KEEL_STORE".to_owned(), "postgres".to_owned()));
    env.push(("KEEL_DATABASE_URL".to_owned(), url.to_owned()));
    let child = tokio::process::Command::new(crate::harness::keel_bin())
        .arg("serve")
        .env_clear()
        .envs(env)
        .current_dir(site.cwd())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    // Bounded: a daemon that started serving instead would hang here.
    let output = tokio::time::timeout(PATIENCE, child)
        .await
        .expect("a second keel on a held database exits")
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, said)
}

/// PostgreSQL killed under a running daemon: the append that finds it gone
/// fails, the store stops taking writes (a failed commit is never
/// retried), every request answers 503 `storage_unavailable` naming the
/// cause, and a daemon started again once the database is back has every
/// acknowledged message, with contiguous seqs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_lost_under_the_daemon_stops_it_cleanly_and_loses_nothing_acknowledged() {
    let Some(mut server) = Postgres::start() else {
        return;
    };
    let url = server.url();
    let mock = MockLlm::start();
    let site = Site::new();
    // It waits for a signal after the store stops, so what it answers
    // meanwhile can be checked.
    let daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[
            ("KEEL_STORE", "postgres"),
            ("KEEL_DATABASE_URL", &url),
            ("KEEL_STORE_STOPPED_EXIT_MS", "600000"),
        ],
    );
    let id = daemon.create(&site, json!({})).await;
    let acknowledged = daemon.send(&id, "before the database went away").await;
    daemon.wait_turn_done(&id, 1).await;

    server.kill();
    let refused = daemon
        .post(
            &format!("/v1/conversations/{id}/messages"),
            &json!({"text": "while the database is away"}),
        )
        .await;
    let (code, message) = refused.error(reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(code, "storage_unavailable", "{refused:?}");
    assert!(message.contains("postgres"), "the cause: {message}");
    let health = daemon.anonymous().get(daemon.endpoint("/healthz")).send();
    assert_eq!(
        health.await.unwrap().status(),
        reqwest::StatusCode::SERVICE_UNAVAILABLE
    );

    server.restart();
    daemon.sigterm();
    let daemon = daemon.restart();
    let log = daemon.log(&id).await;
    let seqs: Vec<u64> = log
        .iter()
        .map(|event| event["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    let message = &log[acknowledged as usize - 1];
    assert_eq!(message["type"], "user_message", "{message:#}");
    assert_eq!(message["text"], "before the database went away");
    assert!(
        !log.iter()
            .any(|event| event["text"] == "while the database is away"),
        "a refused message is not in the log: {log:#?}"
    );
    daemon.send(&id, "after the database came back").await;
    daemon.wait_turn_done(&id, 2).await;
}
