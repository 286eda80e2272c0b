//! A full disk, said plainly: the daemon's data dir on a 6 MiB tmpfs that
//! the test fills. Once the store stops taking writes, `/healthz` answers
//! 503 with the reason, every request (reads too) answers 503
//! `storage_unavailable` naming the cause and what to do, and
//! `keel_store_available` is 0; the daemon then exits non-zero (on a
//! signal, or by itself after `KEEL_STORE_STOPPED_EXIT_MS`), and a daemon
//! started on the same data once there is room has every acknowledged
//! message in the log, with contiguous seqs.
//!
//! The small filesystem needs no root: `unshare -Urm` makes a user and a
//! mount namespace whose root is this user, mounts the tmpfs there and
//! stays alive (`exec cat`, until the test closes its stdin), so the tmpfs
//! and its data outlive each daemon. Each daemon joins that namespace with
//! `nsenter` (the network is shared: it listens on the test's loopback),
//! and the test reaches the tmpfs through the holder's
//! `/proc/PID/root`, as its owner.

use std::io::Write as _;
use std::process::ChildStdin;

use super::*;

/// A 6 MiB tmpfs in a namespace of its own, kept by a holder process.
struct SmallDisk {
    holder: Child,
    /// Keeps the holder alive; dropped, it ends.
    _stdin: ChildStdin,
    /// Where the tmpfs is mounted, as the daemon sees it.
    mount: PathBuf,
}

impl SmallDisk {
    fn mount(site: &Site) -> SmallDisk {
        let mount = site.run_dir().join("disk");
        std::fs::create_dir_all(&mount).unwrap();
        let mut holder = Command::new("unshare")
            .args(["-Urm", "sh", "-c"])
            .arg(r#"mount -t tmpfs -o size=6m tmpfs "$0" && echo mounted && exec cat"#)
            .arg(&mount)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare runs");
        let stdin = holder.stdin.take().unwrap();
        let mut ready = String::new();
        BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        assert_eq!(
            ready.trim(),
            "mounted",
            "a tmpfs in a user namespace (unshare -Urm) is needed"
        );
        SmallDisk {
            holder,
            _stdin: stdin,
            mount,
        }
    }

    /// How a daemon joins the namespace: `nsenter … --`, then the binary.
    fn nsenter(&self) -> Vec<String> {
        [
            "nsenter",
            "-t",
            &self.holder.id().to_string(),
            "-U",
            "-m",
            "--preserve-credentials",
            "--",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// `path` in the tmpfs, as the test reaches it.
    fn outside(&self, path: &str) -> PathBuf {
        let mount = self.mount.strip_prefix("/").unwrap();
        Path::new(&format!("/proc/{}/root", self.holder.id()))
            .join(mount)
            .join(path)
    }

    /// Fill every byte left with a file, until the filesystem refuses.
    fn fill(&self) {
        let path = self.outside("filler");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        for chunk in [1 << 20, 4096, 1] {
            let bytes = vec![0u8; chunk];
            loop {
                match file.write_all(&bytes) {
                    Ok(()) => {}
                    Err(error) if error.kind() == std::io::ErrorKind::StorageFull => break,
                    Err(error) => panic!("filling {}: {error}", path.display()),
                }
            }
        }
    }

    /// Room again.
    fn empty(&self) {
        std::fs::remove_file(self.outside("filler")).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// A message the daemon acknowledged: where, at which seq, what.
struct Acknowledged {
    conversation: String,
    seq: u64,
    text: String,
}

/// The daemon's settings on the small disk.
fn settings(disk: &SmallDisk, mock: &MockLlm, exit_ms: &str) -> Vec<(String, String)> {
    let mut env = Wire::Anthropic.env(mock);
    for (name, value) in [
        ("KEEL_TOKEN", "full-disk-token".to_owned()),
        (
            "KEEL_DATA_DIR",
            disk.mount.join("data").display().to_string(),
        ),
        ("KEEL_STORE_STOPPED_EXIT_MS", exit_ms.to_owned()),
    ] {
        env.push((name.to_owned(), value));
    }
    env
}

/// Checks a 503 `storage_unavailable` that names the full disk and what
/// to do.
fn says_storage_unavailable(reply: &Reply) {
    let (code, message) = reply.error(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(code, "storage_unavailable", "{reply:?}");
    assert!(message.contains("disk is full"), "the cause: {message}");
    assert!(message.contains("free space"), "what to do: {message}");
}

/// On a full disk, conversations with large messages until the daemon
/// refuses one; what it acknowledged meanwhile goes into `acknowledged`.
/// Returns the refusal.
async fn send_until_refused(
    daemon: &Daemon,
    site: &Site,
    acknowledged: &mut Vec<Acknowledged>,
) -> Reply {
    let filler = "x".repeat(256 * 1024);
    for attempt in 0..40 {
        let body = json!({"cwd": site.cwd().display().to_string()});
        let created = daemon.post("/v1/conversations", &body).await;
        if created.status != StatusCode::CREATED {
            return created;
        }
        let id = created.body["id"].as_str().unwrap().to_owned();
        let text = format!("{attempt} {filler}");
        let sent = daemon
            .post(
                &format!("/v1/conversations/{id}/messages"),
                &json!({ "text": text }),
            )
            .await;
        if sent.status != StatusCode::ACCEPTED {
            return sent;
        }
        acknowledged.push(Acknowledged {
            conversation: id,
            seq: sent.body["seq"].as_u64().unwrap(),
            text,
        });
    }
    panic!("40 messages of 256 KiB fit on a full 6 MiB disk")
}

/// The log of every acknowledged message's conversation is contiguous and
/// holds the message at its seq.
async fn every_acknowledged_message_is_logged(daemon: &Daemon, acknowledged: &[Acknowledged]) {
    for message in acknowledged {
        let log = daemon.log(&message.conversation).await;
        seqs(&log);
        let event = log
            .get(message.seq as usize - 1)
            .unwrap_or_else(|| panic!("seq {} of {}", message.seq, message.conversation));
        assert_eq!(event["type"], "user_message", "{event:#}");
        assert_eq!(event["text"], message.text.as_str());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_503_storage_unavailable_then_exits_and_loses_nothing_acknowledged() {
    let mock = MockLlm::start();
    let site = Site::new();
    let disk = SmallDisk::mount(&site);
    let mut acknowledged = Vec::new();

    // Life 1 waits for a signal after the store stops (the exit delay is
    // longer than the test), so what it answers meanwhile can be checked.
    let daemon = Daemon::start_under(&site, disk.nsenter(), settings(&disk, &mock, "600000"));
    let id = daemon.create(&site, json!({})).await;
    let seq = daemon.send(&id, "hello while there is room").await;
    daemon.wait_turn_done(&id, 1).await;
    acknowledged.push(Acknowledged {
        conversation: id.clone(),
        seq,
        text: "hello while there is room".to_owned(),
    });
    let health = daemon.anonymous().get(daemon.endpoint("/healthz")).send();
    assert_eq!(health.await.unwrap().status(), StatusCode::OK);

    disk.fill();
    let refused = send_until_refused(&daemon, &site, &mut acknowledged).await;
    says_storage_unavailable(&refused);

    // Health says so, with the reason, without a token.
    let health = Reply::of(
        daemon
            .anonymous()
            .get(daemon.endpoint("/healthz"))
            .send()
            .await,
    )
    .await;
    assert_eq!(health.status, StatusCode::SERVICE_UNAVAILABLE, "{health:?}");
    assert_eq!(health.body["status"], "storage_unavailable", "{health:?}");
    let reason = health.body["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("disk is full"), "{health:?}");

    // Reads and writes alike: 503 with the cause, never 500 internal.
    for path in [
        format!("/v1/conversations/{id}"),
        format!("/v1/conversations/{id}/log"),
        "/v1/conversations".to_owned(),
        "/admin/actors".to_owned(),
    ] {
        says_storage_unavailable(&daemon.get(&path).await);
    }
    says_storage_unavailable(
        &daemon
            .post(
                &format!("/v1/conversations/{id}/messages"),
                &json!({"text": "one more"}),
            )
            .await,
    );

    // The metric shows it.
    let metrics = daemon.get("/metrics").await;
    let text = metrics.body.as_str().unwrap_or_default();
    assert!(
        text.lines().any(|line| line == "keel_store_available 0"),
        "{text}"
    );

    // A signal ends it, non-zero, saying why.
    daemon.sigterm();
    let mut daemon = daemon;
    let status = daemon.wait_exit();
    assert!(!status.success(), "{status:?}\n{}", daemon.output());
    let output = daemon.output();
    assert!(output.contains("storage unavailable"), "{output}");
    assert!(output.contains("disk is full"), "{output}");
    drop(daemon);

    // Room again: life 2 on the same data has every acknowledged message.
    disk.empty();
    let daemon = Daemon::start_under(&site, disk.nsenter(), settings(&disk, &mock, "0"));
    let health = daemon.anonymous().get(daemon.endpoint("/healthz")).send();
    assert_eq!(health.await.unwrap().status(), StatusCode::OK);
    every_acknowledged_message_is_logged(&daemon, &acknowledged).await;

    // Full again: with no delay, the daemon exits by itself once its
    // store stops, non-zero, for its supervisor to restart it.
    disk.fill();
    let refused = send_until_refused(&daemon, &site, &mut acknowledged).await;
    says_storage_unavailable(&refused);
    let mut daemon = daemon;
    let status = daemon.wait_exit();
    assert!(!status.success(), "{status:?}\n{}", daemon.output());
    assert!(daemon.output().contains("disk is full"));
    drop(daemon);

    // And again nothing acknowledged is lost.
    disk.empty();
    let daemon = Daemon::start_under(&site, disk.nsenter(), settings(&disk, &mock, "0"));
    every_acknowledged_message_is_logged(&daemon, &acknowledged).await;
}
