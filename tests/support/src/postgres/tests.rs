//! A server of a test's own started, used, crashed, restarted and dropped
//! with nothing left behind (no process, no directory, no shared memory);
//! the watchdog cleaning up after a starter that died; which of Debian's
//! versions is taken.

use std::time::{Duration, Instant};

use super::*;
use crate::procs::is_running;

/// `sql` through `psql` at `url`, its output unaligned, without headers.
fn psql(server: &Postgres, url: &str, sql: &str) -> String {
    let psql = server
        .client("psql")
        .expect("psql beside the server or on PATH");
    let output = client_command(&psql)
        .args(["--no-psqlrc", "--no-align", "--tuples-only"])
        .args([
            "--set",
            "ON_ERROR_STOP=1",
            "--dbname",
            url,
            "--command",
            sql,
        ])
        .output()
        .expect("running psql");
    assert!(
        output.status.success(),
        "psql {sql:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("psql prints UTF-8")
        .trim()
        .to_owned()
}

/// Whether process `pid` is gone (or a zombie), waiting at most `patience`.
fn gone_within(pid: u32, patience: Duration) -> bool {
    let started = Instant::now();
    while is_running(pid) {
        if started.elapsed() > patience {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// The System V shared memory segment a server holds, as its data
/// directory's `postmaster.pid` names it (key and id on the seventh line).
fn segment_of(data: &Path) -> u64 {
    let lock = std::fs::read_to_string(data.join("postmaster.pid")).expect("postmaster.pid");
    lock.lines()
        .nth(6)
        .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
        .expect("a segment's id on postmaster.pid's seventh line")
}

/// Whether System V shared memory segment `id` exists, from `/proc`.
fn segment_exists(id: u64) -> bool {
    let table = std::fs::read_to_string("/proc/sysvipc/shm").expect("/proc/sysvipc/shm");
    table
        .lines()
        .skip(1)
        .any(|row| row.split_whitespace().nth(1) == Some(id.to_string().as_str()))
}

/// The real uid of process `pid`, from `/proc`.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let line = status
        .lines()
        .find(|line| line.starts_with("Uid:"))
        .expect("a Uid line");
    line.split_whitespace()
        .nth(1)
        .and_then(|uid| uid.parse().ok())
        .expect("a uid")
}

#[test]
fn a_server_of_its_own_serves_survives_a_crash_and_leaves_nothing_behind() {
    let Some(mut server) = Postgres::start() else {
        return;
    };
    let dir = server.dir().to_path_buf();
    let data = dir.join("data");
    let port = server.port();
    assert_eq!(
        server.url(),
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    );
    TcpStream::connect(("127.0.0.1", port)).expect("the server accepts a TCP connection");
    let first = server.pid().expect("the server runs");
    if nix::unistd::geteuid().is_root() {
        let postgres = nix::unistd::User::from_name(SERVER_USER)
            .expect("the user database")
            .expect("a postgres user, since the server started as root");
        assert_eq!(uid_of(first), postgres.uid.as_raw(), "not root's server");
    }

    let url = server.database("keel_conformance");
    assert_eq!(
        url,
        format!("postgres://postgres@127.0.0.1:{port}/keel_conformance")
    );
    assert_eq!(
        psql(&server, &url, "select current_database()"),
        "keel_conformance"
    );
    psql(
        &server,
        &url,
        "create table kept (value int); insert into kept values (42)",
    );

    // A crash: every process of the server gone, the port closed, the
    // acknowledged commit kept across the restart on the same port, and
    // the dead server's shared memory removed by the next.
    let crashed_segment = segment_of(&data);
    server.kill();
    assert!(server.pid().is_none());
    assert!(!is_running(first));
    assert!(processes_in(&data).is_empty());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    server.restart();
    assert_eq!(server.port(), port);
    let second = server.pid().expect("the server runs again");
    assert_ne!(second, first);
    assert_eq!(psql(&server, &url, "select value from kept"), "42");
    assert!(!segment_exists(crashed_segment));

    // A restart of a running server stops it cleanly first.
    server.restart();
    assert!(!is_running(second));
    assert_eq!(psql(&server, &url, "select value from kept"), "42");

    // Dropped while a client holds a session open: nothing of it is left.
    let mut session = client_command(&server.client("psql").expect("psql"))
        .args(["--no-psqlrc", "--dbname"])
        .arg(format!("{url}?application_name=keel_idle"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("starting psql");
    let started = Instant::now();
    let sessions = "select count(*) from pg_stat_activity where application_name = 'keel_idle'";
    while psql(&server, &url, sessions) != "1" {
        assert!(started.elapsed() < Duration::from_secs(30), "no session");
        std::thread::sleep(Duration::from_millis(20));
    }
    let last = server.pid().expect("the server runs");
    let last_segment = segment_of(&data);
    drop(server);
    assert!(!is_running(last));
    assert!(processes_in(&data).is_empty());
    assert!(!dir.exists(), "{} is left", dir.display());
    assert!(!segment_exists(last_segment));
    let _ = session.kill();
    let _ = session.wait();
}

#[test]
fn a_killed_server_dropped_leaves_no_shared_memory_behind() {
    let Some(mut server) = Postgres::start() else {
        return;
    };
    let data = server.dir().join("data");
    let segment = segment_of(&data);
    server.kill();
    assert!(
        segment_exists(segment),
        "a killed server leaves its segment"
    );
    drop(server);
    assert!(!segment_exists(segment));
    assert!(!data.exists());
}

#[test]
fn a_restart_after_a_kill_survives_the_dead_postmaster_s_pid_taken() {
    let Some(mut server) = Postgres::start() else {
        return;
    };
    let data = server.dir().join("data");
    let segment = segment_of(&data);
    server.kill();
    // Another process of the server's user (which PostgreSQL takes for a
    // server still running) now holds the pid `postmaster.pid` names.
    let mut squatter = server
        .as_server(Path::new("sleep"))
        .arg("60")
        .spawn()
        .expect("starting sleep");
    let lock = data.join("postmaster.pid");
    let text = std::fs::read_to_string(&lock).expect("postmaster.pid");
    let rest: Vec<&str> = text.lines().skip(1).collect();
    std::fs::write(&lock, format!("{}\n{}\n", squatter.id(), rest.join("\n"))).expect("writing");
    server.restart();
    // Refused once (the second life), then started (the third).
    let refused = std::fs::read_to_string(server.dir().join("server-2.log")).expect("a log");
    assert!(stale_lock(&refused), "{refused}");
    assert_eq!(server.life, 3);
    let url = server.database("after_the_squatter");
    assert_eq!(psql(&server, &url, "select 1"), "1");
    assert!(!segment_exists(segment));
    let _ = squatter.kill();
    let _ = squatter.wait();
}

#[test]
fn the_watchdog_kills_the_server_and_removes_its_directory_when_its_starter_dies() {
    let Some(mut server) = Postgres::start() else {
        return;
    };
    let pid = server.pid().expect("the server runs");
    let dir = server.dir().to_path_buf();
    let segment = segment_of(&dir.join("data"));
    // What this process's death does to the watchdog's pipe: it closes
    // without `stop`.
    let watchdog = server.watchdog.as_mut().expect("a watchdog");
    drop(watchdog.stdin.take());
    assert!(gone_within(pid, Duration::from_secs(10)), "the server runs");
    let started = Instant::now();
    while dir.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} is left",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(processes_in(&dir.join("data")).is_empty());
    assert!(!segment_exists(segment));
}

#[test]
fn debian_s_newest_version_comes_first() {
    let names = ["9.6", "15", "main", "13", "10", "16.1", ""].map(str::to_owned);
    assert_eq!(
        newest_first(names.into_iter()),
        ["16.1", "15", "13", "10", "9.6"]
    );
}

#[test]
fn a_database_name_must_fit_a_url_as_it_is() {
    assert!(is_plain_name("keel_store-2"));
    assert!(!is_plain_name(""));
    assert!(!is_plain_name("a/b"));
    assert!(!is_plain_name("a b"));
    assert!(!is_plain_name("é"));
    assert!(!is_plain_name(&"a".repeat(64)));
}
