//! The confinement tools will run under (`actors/src/sandbox.rs`,
//! docs/sandbox.md): escapes a command might try, each refused by the
//! kernel, while what is allowed still works, and the process that starts
//! confined commands stays free.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};

use keel_actors::core::config::NetworkAccess;
use keel_actors::sandbox::{
    probe, spawn_confined, spawn_confining_this_thread, Confinement, SandboxError,
};

/// `script` under `sh` in `cwd`, confined: its exit code and what it
/// printed on stderr.
fn run(cwd: &Path, confinement: &Confinement, script: &str) -> (i32, String) {
    let mut command = Command::new("/bin/sh");
    command
        .args(["-c", script])
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = spawn_confined(command, confinement).unwrap();
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

struct Place {
    _root: tempfile::TempDir,
    work: std::path::PathBuf,
    outside: std::path::PathBuf,
    data: std::path::PathBuf,
}

fn place() -> Place {
    let root = tempfile::tempdir().unwrap();
    let work = root.path().join("work");
    let outside = root.path().join("outside");
    let data = root.path().join("data");
    for dir in [&work, &outside, &data] {
        std::fs::create_dir(dir).unwrap();
    }
    std::fs::write(data.join("token"), "secret").unwrap();
    std::fs::write(outside.join("victim"), "intact").unwrap();
    Place {
        _root: root,
        work,
        outside,
        data,
    }
}

fn workspace_write(place: &Place) -> Confinement {
    Confinement {
        writable: vec![place.work.clone()],
        hidden: vec![place.data.clone()],
        network: NetworkAccess::Off,
        blocked_ports: Vec::new(),
    }
}

/// keel's machines have Landlock 6 or later and seccomp (Linux 6.7 on);
/// these tests need them, and say so rather than pass unexercised.
fn confining() {
    let protections = probe();
    assert!(
        protections.enough(),
        "this kernel offers {protections}; the sandbox needs Landlock ABI 6 and seccomp"
    );
}

/// A confinement the kernel cannot enforce starts nothing: a writable path
/// that does not exist cannot be confined to, and the command never runs.
#[test]
fn what_cannot_be_enforced_runs_nothing() {
    confining();
    let place = place();
    let marker = place.outside.join("ran");
    let mut command = Command::new("/bin/sh");
    command.args(["-c", &format!("touch {}", marker.display())]);
    let confinement = Confinement {
        writable: vec![place.work.join("missing")],
        ..workspace_write(&place)
    };
    let refused = spawn_confined(command, &confinement);
    assert!(
        matches!(refused, Err(SandboxError::Path { .. })),
        "{refused:?}"
    );
    assert!(!marker.exists(), "nothing ran");
}

#[test]
fn writes_stay_in_the_working_directory() {
    confining();
    let place = place();
    let confinement = workspace_write(&place);
    let (code, _) = run(&place.work, &confinement, "echo ok > inside && cat inside");
    assert_eq!(code, 0, "writing inside works");
    assert_eq!(
        std::fs::read_to_string(place.work.join("inside")).unwrap(),
        "ok\n"
    );

    let victim = place.outside.join("victim");
    for (how, script) in [
        ("an absolute path", format!("echo x > {}", victim.display())),
        ("..", "echo x > ../outside/victim".to_owned()),
        (
            "a symlink made inside",
            format!(
                "ln -s {} link && echo x > link/victim",
                place.outside.display()
            ),
        ),
        (
            "a hard link",
            format!("ln {} hard && echo x > hard", victim.display()),
        ),
        (
            "/proc/self/root",
            format!("echo x > /proc/self/root{}", victim.display()),
        ),
        (
            "a new file outside",
            format!("touch {}/new", place.outside.display()),
        ),
    ] {
        let (code, stderr) = run(&place.work, &confinement, &script);
        assert_ne!(code, 0, "{how}: refused");
        assert!(!stderr.is_empty(), "{how}: the command says why");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "intact", "{how}");
    }
    assert!(!place.outside.join("new").exists());
}

#[test]
fn the_hidden_directory_cannot_be_read_and_the_system_can() {
    confining();
    let place = place();
    let confinement = workspace_write(&place);
    let (code, stderr) = run(
        &place.work,
        &confinement,
        &format!("cat {}/token", place.data.display()),
    );
    assert_ne!(code, 0, "{stderr}");
    let (code, stderr) = run(
        &place.work,
        &confinement,
        &format!("ls {}", place.data.display()),
    );
    assert_ne!(code, 0, "{stderr}");
    let (code, stderr) = run(
        &place.work,
        &confinement,
        "cat /etc/passwd > /dev/null && ls /usr/bin > /dev/null",
    );
    assert_eq!(code, 0, "the system's files read: {stderr}");
}

#[test]
fn no_ip_network_and_no_signals_beyond_its_own() {
    confining();
    let place = place();
    let confinement = workspace_write(&place);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    for (how, script) in [
        (
            "TCP",
            format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'"),
        ),
        (
            "UDP",
            format!("bash -c 'echo hi > /dev/udp/127.0.0.1/{udp_port}'"),
        ),
        (
            "a signal to the caller",
            format!("kill -0 {}", std::process::id()),
        ),
    ] {
        let (code, stderr) = run(&place.work, &confinement, &script);
        assert_ne!(code, 0, "{how}: refused ({stderr})");
    }
    let (code, stderr) = run(&place.work, &confinement, "sleep 5 & kill $!");
    assert_eq!(code, 0, "its own processes may be signalled: {stderr}");
    // With the network allowed, TCP goes through.
    let open = Confinement {
        network: NetworkAccess::All,
        ..confinement
    };
    let (code, stderr) = run(
        &place.work,
        &open,
        &format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'"),
    );
    assert_eq!(code, 0, "{stderr}");
}

/// The thread that starts a confined command is the one confined: the
/// caller still writes anywhere afterwards.
#[test]
fn the_caller_stays_free() {
    confining();
    let place = place();
    run(&place.work, &workspace_write(&place), "true");
    std::fs::write(place.outside.join("after"), "free").unwrap();
    assert!(TcpListener::bind("127.0.0.1:0").is_ok());
}

/// Confining the calling thread itself (the spawner's thread for one
/// call): the command is held as a command from `spawn_confined` is, the
/// thread that started it is confined too (and may still wait for it),
/// and a network list of hosts, whose way out needs a thread that is not
/// confined, is refused with nothing started.
#[test]
fn a_thread_confines_itself_for_its_own_call() {
    confining();
    let place = place();
    let confinement = workspace_write(&place);
    let victim = place.outside.join("victim");
    let script = format!("echo ok > inside; echo x > {}", victim.display());
    let (work, outside) = (place.work.clone(), place.outside.clone());
    let (code, thread_could_write) = std::thread::spawn(move || {
        let mut command = Command::new("/bin/sh");
        command
            .args(["-c", &script])
            .current_dir(&work)
            .stderr(Stdio::null());
        let mut child = spawn_confining_this_thread(command, &confinement).unwrap();
        let status = child.wait().unwrap();
        (
            status.code(),
            std::fs::write(outside.join("from-the-thread"), "x").is_ok(),
        )
    })
    .join()
    .unwrap();
    assert_ne!(code, Some(0), "the write outside was refused");
    assert_eq!(
        std::fs::read_to_string(place.work.join("inside")).unwrap(),
        "ok\n"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "intact");
    assert!(!thread_could_write, "the thread is confined with its call");
    std::fs::write(place.outside.join("after"), "free").unwrap();

    let hosts = Confinement {
        network: NetworkAccess::Hosts(Vec::new()),
        ..workspace_write(&place)
    };
    let marker = place.work.join("ran");
    let script = format!("touch {}", marker.display());
    let refused = std::thread::spawn(move || {
        let mut command = Command::new("/bin/sh");
        command.args(["-c", &script]);
        spawn_confining_this_thread(command, &hosts).map(|_| ())
    })
    .join()
    .unwrap();
    assert!(matches!(refused, Err(SandboxError::Unsupported { .. })));
    assert!(!marker.exists(), "nothing was started");
}

/// With the network on, every port but the blocked one (the daemon's
/// API) is open; with a list of ports, only those, and no UDP.
#[test]
fn the_network_allowed_is_the_network_reached() {
    confining();
    let place = place();
    let allowed = TcpListener::bind("127.0.0.1:0").unwrap();
    let allowed_port = allowed.local_addr().unwrap().port();
    let blocked = TcpListener::bind("127.0.0.1:0").unwrap();
    let blocked_port = blocked.local_addr().unwrap().port();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let connect = |port: u16| format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'");
    let udp_send = format!("bash -c 'echo hi > /dev/udp/127.0.0.1/{udp_port}'");

    let all_but_api = Confinement {
        network: NetworkAccess::All,
        blocked_ports: vec![blocked_port],
        ..workspace_write(&place)
    };
    assert_eq!(run(&place.work, &all_but_api, &connect(allowed_port)).0, 0);
    assert_ne!(run(&place.work, &all_but_api, &connect(blocked_port)).0, 0);
    assert_eq!(run(&place.work, &all_but_api, &udp_send).0, 0);

    let listed = Confinement {
        network: NetworkAccess::Ports(vec![allowed_port, blocked_port]),
        blocked_ports: vec![blocked_port],
        ..workspace_write(&place)
    };
    assert_eq!(run(&place.work, &listed, &connect(allowed_port)).0, 0);
    assert_ne!(
        run(&place.work, &listed, &connect(blocked_port)).0,
        0,
        "blocked even when listed"
    );
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let other_port = other.local_addr().unwrap().port();
    assert_ne!(run(&place.work, &listed, &connect(other_port)).0, 0);
    assert_ne!(run(&place.work, &listed, &udp_send).0, 0, "no UDP");
}

/// Disks and the rest of `/dev` are out of reach (a root daemon's tools
/// could read them raw), its harmless devices are not.
#[test]
fn only_the_harmless_devices_are_there() {
    confining();
    let place = place();
    let confinement = workspace_write(&place);
    let (code, stderr) = run(
        &place.work,
        &confinement,
        "head -c 4 /dev/zero >/dev/null && head -c 4 /dev/urandom >/dev/null && echo x >/dev/null",
    );
    assert_eq!(code, 0, "{stderr}");
    let (code, _) = run(&place.work, &confinement, "ls /dev");
    assert_ne!(code, 0, "/dev cannot be listed");
    let disk = ["/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/xvda"]
        .into_iter()
        .find(|disk| Path::new(disk).exists());
    if let Some(disk) = disk {
        let (code, _) = run(&place.work, &confinement, &format!("head -c 1 {disk}"));
        assert_ne!(code, 0, "{disk} cannot be read");
    }
}
