//! The tool sandbox through the daemon (docs/sandbox.md): the escapes a
//! model might try with `bash`, each a `run:` line the fake provider turns
//! into a call, refused by the kernel with the command's own error in the
//! result, while what the policy allows still works and the conversation
//! goes on; the policy set at creation and by `PATCH`, shown on the
//! conversation, and `full-access` only where the operator allows it.

use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use serde_json::json;

use super::{of_kind, wait_process_gone, Daemon, Site, Wire};
use crate::harness::MockLlm;

/// Run `command` as the model's `bash` call in conversation `id` (turn
/// `turn`), and give the call's result: its content and whether it failed.
async fn run(daemon: &Daemon, id: &str, turn: u64, command: &str) -> (String, bool) {
    daemon.send(id, &format!("run: {command}")).await;
    let log = daemon.wait_turn_done(id, turn).await;
    let results = of_kind(&log, "tool_result");
    let last = results.last().expect("a tool result");
    (
        last["content"].as_str().unwrap_or_default().to_owned(),
        last["is_error"] == json!(true),
    )
}

/// A conversation's turns, one `run:` after another.
struct Session<'a> {
    daemon: &'a Daemon,
    id: String,
    turn: u64,
}

impl Session<'_> {
    async fn run(&mut self, command: &str) -> (String, bool) {
        self.turn += 1;
        run(self.daemon, &self.id, self.turn, command).await
    }

    /// `command` fails, saying why in its own words.
    async fn refused(&mut self, how: &str, command: &str) -> String {
        let (content, is_error) = self.run(command).await;
        assert!(is_error, "{how}: should fail, got {content:?}");
        assert!(
            content.contains("denied")
                || content.contains("not permitted")
                || content.contains("No such file")
                || content.contains("cross-device")
                || content.contains("Read-only file system")
                || content.contains("No such process"),
            "{how}: the command's own error is in the result: {content:?}"
        );
        content
    }

    async fn works(&mut self, how: &str, command: &str) -> String {
        let (content, is_error) = self.run(command).await;
        assert!(!is_error, "{how}: should work, got {content:?}");
        content
    }
}

/// Beside the working directory: a directory a tool must not write in.
fn outside(site: &Site) -> PathBuf {
    let outside = site.cwd().parent().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("victim"), "intact\n").unwrap();
    outside
}

fn port_of(daemon: &Daemon) -> u16 {
    daemon
        .url
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("a port in the daemon's url")
}

/// Every write out of the working directory a model might try, under
/// the default `workspace-write`.
async fn writes_outside_are_refused(session: &mut Session<'_>, outside: &Path) {
    let victim = outside.join("victim");
    let victim = victim.display();
    let outside_shown = outside.display();
    for (how, command) in [
        ("an absolute path", format!("echo x > {victim}")),
        ("..", "echo x > ../outside/victim".to_owned()),
        (
            "a symlink made inside",
            format!("ln -sfn {outside_shown} link && echo x > link/victim"),
        ),
        ("a hard link", format!("ln {victim} hard && echo x > hard")),
        (
            "/proc/self/root",
            format!("echo x > /proc/self/root{victim}"),
        ),
        ("a new file outside", format!("touch {outside_shown}/new")),
    ] {
        session.refused(how, &command).await;
        assert_eq!(
            std::fs::read_to_string(outside.join("victim")).unwrap(),
            "intact\n",
            "{how}"
        );
    }
    assert!(!outside.join("new").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_write_tool_cannot_escape_and_can_work() {
    let mock = MockLlm::start();
    let site = Site::new();
    let outside = outside(&site);
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon.create(&site, json!({})).await;
    let detail = daemon.conversation(&id).await;
    assert_eq!(
        detail["sandbox"],
        json!({"mode": "workspace-write", "network": "off", "default": true})
    );
    let mut session = Session {
        daemon: &daemon,
        id: id.clone(),
        turn: 0,
    };

    // What is allowed works.
    let inside = session
        .works("writing inside", "echo ok > inside && cat inside")
        .await;
    assert_eq!(inside, "ok\n");
    session
        .works("reading the system's files", "head -c 1 /etc/passwd")
        .await;
    let read = session
        .works(
            "reading beside",
            &format!("cat {}/victim", outside.display()),
        )
        .await;
    assert_eq!(read, "intact\n");
    let tmp = session
        .works(
            "its own temporary directory",
            "echo t > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" && echo \"$TMPDIR\"",
        )
        .await;
    assert!(tmp.starts_with("t\n"), "{tmp}");

    writes_outside_are_refused(&mut session, &outside).await;

    // The daemon's data directory: its token, store and ledger.
    let data = site.data_dir();
    session
        .refused(
            "reading the token",
            &format!("cat {}/token", data.display()),
        )
        .await;
    // Its listing shows nothing: the spawner's namespace covers it.
    let (listed, _) = session.run(&format!("ls -A {}", data.display())).await;
    assert!(!listed.contains("token"), "{listed}");

    // The network: a listener the test opens, the daemon's own port, UDP.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let daemon_port = port_of(&daemon);
    for (how, command) in [
        (
            "TCP to loopback",
            format!("echo hi > /dev/tcp/127.0.0.1/{port}"),
        ),
        (
            "the daemon's API",
            format!("echo hi > /dev/tcp/127.0.0.1/{daemon_port}"),
        ),
        ("UDP", format!("echo hi > /dev/udp/127.0.0.1/{udp_port}")),
    ] {
        session.refused(how, &command).await;
    }

    // Signals: the daemon, by pid.
    session
        .refused(
            "signalling the daemon",
            &format!("kill -TERM {}", daemon.pid()),
        )
        .await;
    session
        .refused(
            "the daemon's environment",
            &format!("cat /proc/{}/environ", daemon.pid()),
        )
        .await;

    // The daemon's secrets are not in the tool's environment.
    let env = session.works("its environment", "env").await;
    assert!(!env.contains(&daemon.token), "no token in {env}");
    assert!(
        !env.contains("ANTHROPIC_API_KEY"),
        "no provider key in {env}"
    );
    assert!(env.contains("KEEL_TOOL_CALL_ID="), "{env}");

    // A background process does not outlive its call, even in a session
    // of its own: it says its pid, and is gone once the call is over.
    session
        .works(
            "a background process",
            "setsid sh -c 'read -r pid _ < /proc/self/stat; echo $pid > bg.pid; exec sleep 60' & \
             nohup sh -c 'read -r pid _ < /proc/self/stat; echo $pid > nohup.pid; exec sleep 60' >/dev/null 2>&1 & \
             while [ ! -s bg.pid ] || [ ! -s nohup.pid ]; do sleep 0.01; done",
        )
        .await;
    for file in ["bg.pid", "nohup.pid"] {
        let pid: i32 = std::fs::read_to_string(site.cwd().join(file))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        wait_process_gone(pid).await;
    }

    // The daemon is unharmed and the conversation goes on.
    let (last, is_error) = session.run("echo still here").await;
    assert!(!is_error);
    assert_eq!(last, "still here\n");
    assert_eq!(daemon.conversation(&id).await["state"], "idle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_tool_writes_nothing_but_its_temporary_directory() {
    let mock = MockLlm::start();
    let site = Site::new();
    let outside = outside(&site);
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let id = daemon
        .create(&site, json!({"sandbox": {"mode": "read-only"}}))
        .await;
    assert_eq!(
        daemon.conversation(&id).await["sandbox"],
        json!({"mode": "read-only", "network": "off", "default": false})
    );
    let mut session = Session {
        daemon: &daemon,
        id: id.clone(),
        turn: 0,
    };
    session.refused("writing inside", "echo x > inside").await;
    assert!(!site.cwd().join("inside").exists());
    writes_outside_are_refused(&mut session, &outside).await;
    let tmp = session
        .works(
            "its own temporary directory",
            "echo t > \"$TMPDIR/t\" && cat \"$TMPDIR/t\"",
        )
        .await;
    assert_eq!(tmp, "t\n");
    session
        .works("reading", &format!("cat {}/victim", outside.display()))
        .await;

    // PATCH: the next call may write.
    let patched = daemon
        .patch(
            &format!("/v1/conversations/{id}"),
            &json!({"sandbox": {"mode": "workspace-write"}}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    assert_eq!(patched.body["sandbox"]["mode"], "workspace-write");
    session.works("writing inside", "echo x > inside").await;
    assert!(site.cwd().join("inside").exists());
}

/// The README's layout: `keel serve` run in the directory conversations
/// work in, its data directory `./keel-data` inside it. Landlock alone
/// cannot hide a directory inside one a tool may write; the spawner's
/// mount namespace does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_inside_the_working_directory_stays_hidden() {
    let mock = MockLlm::start();
    let site = Site::new();
    let data = site.cwd().join("keel-data");
    let data_shown = data.display().to_string();
    let daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[
            ("KEEL_DATA_DIR", &data_shown),
            ("KEEL_TOKEN", "kt-inside-secret"),
        ],
    );
    let id = daemon.create(&site, json!({})).await;
    let mut session = Session {
        daemon: &daemon,
        id,
        turn: 0,
    };
    let listed = session.works("listing it", "ls -A keel-data").await;
    assert_eq!(listed, "(no output)", "it shows empty");
    session
        .refused("writing in it", "echo x > keel-data/planted")
        .await;
    assert!(!data.join("planted").exists());
    let (content, _) = session
        .run("grep -r kt-inside-secret . ; cat /proc/self/environ | tr '\\0' '\\n' | grep KEEL_TOKEN; true")
        .await;
    assert!(!content.contains("kt-inside-secret"), "{content}");
    session
        .works("writing beside it", "echo ok > work.txt")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_access_is_the_operator_s_to_allow() {
    let mock = MockLlm::start();
    let site = Site::new();
    let outside = outside(&site);
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let refused = daemon
        .post(
            "/v1/conversations",
            &json!({"cwd": site.cwd().display().to_string(), "sandbox": {"mode": "full-access"}}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{refused:?}");
    assert_eq!(refused.body["error"]["code"], "sandbox_not_allowed");
    assert!(refused.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("KEEL_SANDBOX_FULL_ACCESS=allow"));
    let id = daemon.create(&site, json!({})).await;
    let patch = daemon
        .patch(
            &format!("/v1/conversations/{id}"),
            &json!({"sandbox": {"mode": "full-access"}}),
        )
        .await;
    assert_eq!(patch.status, StatusCode::FORBIDDEN, "{patch:?}");
    for network in [
        json!("somewhere"),
        json!(["exa mple.com:443"]),
        json!(["*:0"]),
    ] {
        let bad = daemon
            .patch(
                &format!("/v1/conversations/{id}"),
                &json!({"sandbox": {"network": network}}),
            )
            .await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{network}: {bad:?}");
    }
    assert_eq!(
        daemon.conversation(&id).await["sandbox"]["mode"],
        "workspace-write",
        "nothing changed"
    );
    drop(daemon);

    let daemon = Daemon::start(
        &site,
        Wire::Anthropic,
        &mock,
        &[("KEEL_SANDBOX_FULL_ACCESS", "allow")],
    );
    let id = daemon
        .create(&site, json!({"sandbox": {"mode": "full-access"}}))
        .await;
    assert_eq!(
        daemon.conversation(&id).await["sandbox"]["mode"],
        "full-access"
    );
    let mut session = Session {
        daemon: &daemon,
        id,
        turn: 0,
    };
    session
        .works(
            "writing beside",
            &format!("echo free > {}/victim", outside.display()),
        )
        .await;
    assert_eq!(
        std::fs::read_to_string(outside.join("victim")).unwrap(),
        "free\n"
    );
    // Still no secrets in its environment.
    let env = session.works("its environment", "env").await;
    assert!(!env.contains(&daemon.token), "{env}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_policy_opens_what_it_names_and_never_the_daemon() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let other_port = other.local_addr().unwrap().port();
    let daemon_port = port_of(&daemon);
    let connect = |port: u16| format!("echo hi > /dev/tcp/127.0.0.1/{port}");

    let id = daemon
        .create(&site, json!({"sandbox": {"network": "all"}}))
        .await;
    let mut session = Session {
        daemon: &daemon,
        id,
        turn: 0,
    };
    session.works("any port", &connect(port)).await;
    session
        .refused("the daemon's API", &connect(daemon_port))
        .await;

    let id = daemon
        .create(
            &site,
            json!({"sandbox": {"network": [format!("*:{port}"), format!("*:{daemon_port}")]}}),
        )
        .await;
    assert_eq!(
        daemon.conversation(&id).await["sandbox"]["network"],
        json!([
            format!("*:{}", port.min(daemon_port)),
            format!("*:{}", port.max(daemon_port))
        ])
    );
    let mut session = Session {
        daemon: &daemon,
        id,
        turn: 0,
    };
    session.works("a listed port", &connect(port)).await;
    session.refused("another port", &connect(other_port)).await;
    session
        .refused("the daemon's API, even listed", &connect(daemon_port))
        .await;
}

/// A network list that names hosts: the call's only way out is keel's
/// proxy (and, for this machine's loopback entries, the same address and
/// port), which lets through what the list names and refuses the rest,
/// the daemon's own port whatever the list says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_list_of_hosts_lets_through_what_it_names() {
    let mock = MockLlm::start();
    let site = Site::new();
    let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
    let allowed = serve_hello();
    let other = serve_hello();
    let daemon_port = port_of(&daemon);
    let id = daemon
        .create(
            &site,
            json!({"sandbox": {"network": [format!("127.0.0.1:{allowed}"), format!("*:{daemon_port}")]}}),
        )
        .await;
    assert_eq!(
        daemon.conversation(&id).await["sandbox"]["network"],
        json!([format!("*:{daemon_port}"), format!("127.0.0.1:{allowed}")])
    );
    let mut session = Session {
        daemon: &daemon,
        id: id.clone(),
        turn: 0,
    };

    let env = session
        .works("the proxy's address", "echo \"$HTTPS_PROXY $http_proxy\"")
        .await;
    assert_eq!(env, "http://127.0.0.1:3128 http://127.0.0.1:3128\n");

    // Allowed: at the same address, through a tunnel, as a plain request.
    let direct = session
        .works(
            "the listed host directly",
            &format!("exec 3<>/dev/tcp/127.0.0.1/{allowed}; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3"),
        )
        .await;
    assert!(direct.contains("hello from the host"), "{direct}");
    let tunnel = session
        .works(
            "a tunnel to the listed host",
            &format!(
                "exec 3<>/dev/tcp/127.0.0.1/3128; printf 'CONNECT 127.0.0.1:{allowed} HTTP/1.1\\r\\n\\r\\n' >&3; \
                 read -r status <&3; read -r blank <&3; echo \"$status\"; \
                 printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3"
            ),
        )
        .await;
    assert!(tunnel.starts_with("HTTP/1.1 200"), "{tunnel}");
    assert!(tunnel.contains("hello from the host"), "{tunnel}");
    let plain = session
        .works(
            "a plain request through the proxy",
            &format!(
                "exec 3<>/dev/tcp/127.0.0.1/3128; \
                 printf 'GET http://127.0.0.1:{allowed}/x HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n' >&3; cat <&3"
            ),
        )
        .await;
    assert!(plain.contains("hello from the host"), "{plain}");

    // Refused: another port of the same host, directly and through the
    // proxy; a host by another name; the daemon's own port, listed or not.
    let (content, is_error) = session
        .run(&format!("echo hi > /dev/tcp/127.0.0.1/{other}"))
        .await;
    assert!(is_error, "{content}");
    assert!(content.contains("Connection refused"), "{content}");
    for (target, why) in [
        (
            format!("127.0.0.1:{other}"),
            "is not on this conversation's network list",
        ),
        (
            format!("localhost:{allowed}"),
            "is not on this conversation's network list",
        ),
        (format!("127.0.0.1:{daemon_port}"), "keel's own"),
    ] {
        let refused = session
            .works(
                &format!("asking the proxy for {target}"),
                &format!(
                    "exec 3<>/dev/tcp/127.0.0.1/3128; printf 'CONNECT {target} HTTP/1.1\\r\\n\\r\\n' >&3; cat <&3"
                ),
            )
            .await;
        assert!(refused.starts_with("HTTP/1.1 403"), "{target}: {refused}");
        assert!(refused.contains(why), "{target}: {refused}");
    }
    let (content, is_error) = session
        .run(&format!("echo hi > /dev/tcp/127.0.0.1/{daemon_port}"))
        .await;
    assert!(is_error, "{content}");
    // No way around the proxy: no route out of the call's network.
    let (content, is_error) = session.run("echo hi > /dev/tcp/192.0.2.1/80").await;
    assert!(is_error, "{content}");
    assert!(content.contains("unreachable"), "{content}");

    // The list can be changed by PATCH: the next call follows it.
    let patched = daemon
        .patch(
            &format!("/v1/conversations/{id}"),
            &json!({"sandbox": {"network": "off"}}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    let (content, is_error) = session
        .run(&format!("echo hi > /dev/tcp/127.0.0.1/{allowed}"))
        .await;
    assert!(is_error, "{content}");
    assert_eq!(daemon.conversation(&id).await["state"], "idle");
}

/// A server on loopback that answers every connection with a short HTTP
/// response and closes it; its port.
fn serve_hello() -> u16 {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0_u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let body = "hello from the host\n";
                let _ = write!(
                    stream,
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}
