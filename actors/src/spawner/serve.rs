//! The spawner process's side: a loop that reads requests from its socket
//! (its stdin), starts each child with `std::process::Command` leading a
//! new process group, and reports pids and exit statuses.
//!
//! The process holds a handful of descriptors (stdio, its socket, the three
//! received for the child being started, all close-on-exec but the child's
//! own), so the kernel's copy of its descriptor table at each spawn is small
//! whatever the runtime has open: that is the point of it.
//!
//! One thread per running child waits for its exit with
//! `waitid(WEXITED | WNOWAIT)`, which leaves it a zombie: the pid (and so
//! the process group id the runtime kills by) stays the child's until the
//! runtime says `release`, after its own `killpg`. Only then is it reaped.
//! When the runtime's end of the socket closes (it exited or crashed), the
//! spawner exits; its children live on, reparented, as they would have
//! after a crash of a runtime that started them itself, and the next
//! runtime's boot reaps them through the process ledger.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;

use rustix::process::{Pid, WaitId, WaitIdOptions};

use super::protocol::{self, Reply, Request, MAX_MESSAGE};

/// Serve the runtime on the socket that is this process's stdin, until it
/// closes. The entry point of `keel spawner` and of `keel-spawner`.
pub fn serve_stdin() -> io::Result<()> {
    // A close-on-exec copy: descriptor 0 itself is replaced by each child's
    // stdin, so children never see the socket.
    let socket = io::stdin().as_fd().try_clone_to_owned()?;
    serve(socket)
}

/// Serve the runtime on `socket` until it closes.
pub fn serve(socket: OwnedFd) -> io::Result<()> {
    let socket = Arc::new(socket);
    protocol::send(socket.as_fd(), &Reply::Ready.encode(), &[])?;
    // Per running child: where its waiter learns it was released.
    let mut releases: HashMap<u64, mpsc::Sender<()>> = HashMap::new();
    let mut buffer = vec![0_u8; MAX_MESSAGE];
    loop {
        let received = match protocol::receive(socket.as_fd(), &mut buffer) {
            Ok(Some(received)) => received,
            // The runtime is gone.
            Ok(None) => return Ok(()),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        match Request::decode(&received.bytes) {
            Some(Request::Spawn { id, cwd, argv, env }) => {
                let reply = match spawn(&cwd, &argv, env, received.fds) {
                    Ok(child) => {
                        let pid = child.id();
                        protocol::send(socket.as_fd(), &Reply::Spawned { id, pid }.encode(), &[])?;
                        let (release, released) = mpsc::channel();
                        releases.insert(id, release);
                        watch(id, child, released, socket.clone());
                        continue;
                    }
                    Err(error) => Reply::Failed {
                        id,
                        errno: error.raw_os_error().unwrap_or(0),
                    },
                };
                protocol::send(socket.as_fd(), &reply.encode(), &[])?;
            }
            Some(Request::Release { id }) => {
                if let Some(release) = releases.remove(&id) {
                    // The waiter is gone only if it could not be started,
                    // and then it reaped the child itself.
                    let _ = release.send(());
                }
            }
            // Not from a runtime of this build: nothing to do but ignore it.
            None => {}
        }
    }
}

/// Start `argv` leading a new process group, stdio from `fds`.
fn spawn(
    cwd: &std::ffi::OsStr,
    argv: &[std::ffi::OsString],
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    fds: Vec<OwnedFd>,
) -> io::Result<Child> {
    let invalid = || io::Error::from_raw_os_error(rustix::io::Errno::INVAL.raw_os_error());
    let [stdin, stdout, stderr]: [OwnedFd; 3] = fds.try_into().map_err(|_| invalid())?;
    let program = argv.first().ok_or_else(invalid)?;
    Command::new(program)
        .args(argv.get(1..).unwrap_or_default())
        .env_clear()
        .envs(env)
        .current_dir(cwd)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .process_group(0)
        .spawn()
}

/// Wait for `child` on a thread of its own: report its exit, then reap it
/// once the runtime released it (or the spawner is going away).
fn watch(id: u64, mut child: Child, released: mpsc::Receiver<()>, socket: Arc<OwnedFd>) {
    let pid = Pid::from_child(&child);
    let reports = socket.clone();
    let waiter = std::thread::Builder::new()
        .name(format!("wait-{}", child.id()))
        .stack_size(64 * 1024);
    let spawned = waiter.spawn(move || {
        let status = loop {
            match rustix::process::waitid(
                WaitId::Pid(pid),
                WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
            ) {
                Ok(Some(status)) => break raw_wait_status(&status),
                Ok(None) => continue,
                Err(rustix::io::Errno::INTR) => continue,
                // ECHILD cannot happen for our own unreaped child; report
                // it as a kill so the runtime does not wait forever.
                Err(_) => break SIGKILL_STATUS,
            }
        };
        let _ = protocol::send(reports.as_fd(), &Reply::Exited { id, status }.encode(), &[]);
        // A closed channel means the spawner is ending: reap regardless.
        let _ = released.recv();
        let _ = child.wait();
    });
    if spawned.is_err() {
        // No thread to wait with (the machine is out of threads): the child
        // is still behind its gate, so kill it rather than leave it
        // unwatched; the runtime's adoption then fails, or it learns of the
        // exit here.
        // The group id is the child's pid: it leads its own group.
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        let _ = child_exit(id, pid, &socket);
    }
}

/// Reap `pid` (already killed) and report its exit.
fn child_exit(id: u64, pid: Pid, socket: &OwnedFd) -> io::Result<()> {
    let status = match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
        Ok(Some((_, status))) => status.as_raw(),
        _ => SIGKILL_STATUS,
    };
    protocol::send(socket.as_fd(), &Reply::Exited { id, status }.encode(), &[])
}

/// The raw wait status of a child killed by `SIGKILL`.
const SIGKILL_STATUS: i32 = 9;

/// The raw wait status (`WIFEXITED` / `WIFSIGNALED` encoding) that `status`
/// describes, so the runtime can rebuild an `ExitStatus` from it.
fn raw_wait_status(status: &rustix::process::WaitIdStatus) -> i32 {
    if let Some(code) = status.exit_status() {
        return (code & 0xff) << 8;
    }
    match status.terminating_signal() {
        Some(signal) if status.dumped() => (signal & 0x7f) | 0x80,
        Some(signal) => signal & 0x7f,
        None => SIGKILL_STATUS,
    }
}
