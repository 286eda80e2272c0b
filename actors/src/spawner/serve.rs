//! The spawner process's side: a loop that reads requests from its socket
//! (its stdin), starts each child with `std::process::Command` leading a
//! new process group, and reports pids and exit statuses.
//!
//! The process holds a handful of descriptors (stdio, its socket, the three
//! received for the child being started, all close-on-exec but the child's
//! own), so the kernel's copy of its descriptor table at each spawn is small
//! whatever the runtime has open: that is the point of it.
//!
//! A confined child is started on a thread of its own, which confines
//! itself first (confining takes several times a plain spawn's work, so
//! the loop goes on to the next request meanwhile), then waits for the
//! child and ends: a confined thread cannot serve another call. One whose
//! network is a list of hosts is started from a thread of the pool
//! (`pool.rs`) by a short-lived confining thread instead, as its way out
//! is served from a thread that is not confined. A plain child is started
//! by the loop itself and waited for on a thread of the pool.
//!
//! One thread per running child waits for its exit with
//! `waitid(WEXITED | WNOWAIT)`, which leaves it a zombie: the pid (and so
//! the process group id the runtime kills by) stays the child's until the
//! runtime closes the child's reply socket, after its own `killpg`. Only
//! then is it reaped.
//! A request may ask for the child to be confined (`sandbox.rs`); one that
//! cannot be is not started, and the answer says why. If the runtime named
//! its data directory (`KEEL_SPAWNER_HIDE`), the spawner first moves into
//! namespaces of its own in which that directory is empty
//! ([`sandbox::hide_in_namespace`]), before it has a thread besides its
//! main one (a process with threads cannot enter a user namespace).
//!
//! When the runtime's end of the socket closes (it exited or crashed), the
//! spawner exits; its children live on, reparented, as they would have
//! after a crash of a runtime that started them itself, and the next
//! runtime's boot reaps them through the process ledger. Started with
//! `--kill-on-exit` (a node among several, docs/nodes.md: another node
//! may run the call again once this one is gone, and the dead node's boot
//! may never come), it first kills every group it started that was not
//! reaped yet: a group id stays its leader's until then, so none names a
//! stranger.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};

use rustix::process::{Pid, WaitId, WaitIdOptions};

use super::pool::Pool;
use super::protocol::{self, Reply, Request, MAX_MESSAGE};
use crate::sandbox::{self, Confinement, SandboxError};

/// Serve the runtime on the socket that is this process's stdin, until it
/// closes. The entry point of `keel spawner` and of `keel-spawner`.
pub fn serve_stdin(kill_on_exit: bool) -> io::Result<()> {
    // A close-on-exec copy: descriptor 0 itself is replaced by each child's
    // stdin, so children never see the socket.
    let socket = io::stdin().as_fd().try_clone_to_owned()?;
    if let Some(data_dir) = std::env::var_os(sandbox::SPAWNER_HIDE_ENV) {
        if let Err(error) = sandbox::hide_in_namespace(std::path::Path::new(&data_dir)) {
            eprintln!(
                "keel spawner: cannot hide the data directory in a namespace ({error}); a \
                 confined command whose writable directories hold it will be refused"
            );
        }
    }
    let served = serve(socket);
    if kill_on_exit {
        kill_unreaped();
    }
    served
}

/// The groups started and not yet reaped, by their leaders' pids (which
/// are their group ids).
static UNREAPED: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

fn unreaped() -> std::sync::MutexGuard<'static, Vec<u32>> {
    UNREAPED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Kill every group started and not reaped, holding the list so that no
/// waiter reaps one meanwhile.
fn kill_unreaped() {
    let groups = unreaped();
    for pid in groups.iter() {
        if let Some(pid) = i32::try_from(*pid).ok().and_then(Pid::from_raw) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Until when the runtime may act, as its last `lease` said; `None`
/// until one comes, or once it lapsed and its groups were killed.
static LEASE: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

fn lease() -> std::sync::MutexGuard<'static, Option<std::time::Instant>> {
    LEASE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The watchdog's stack: it sleeps, reads a clock and kills groups.
const WATCHDOG_STACK: usize = 64 * 1024;

/// How often the watchdog looks at the lease.
const LEASE_CHECK: std::time::Duration = std::time::Duration::from_millis(20);

/// The runtime may act for `length` more. The first lease starts the
/// watchdog: a thread that, once a lease lapses unrenewed (the runtime is
/// paused, or cut off from what renews its lease), kills every group this
/// spawner started and has not reaped, so another node can run the calls
/// again without an old copy beside them (docs/nodes.md). The thread is
/// not paused with the runtime: it is this process's.
fn lease_for(length: std::time::Duration) {
    let first = lease()
        .replace(std::time::Instant::now() + length)
        .is_none();
    static WATCHDOG: std::sync::Once = std::sync::Once::new();
    if first {
        WATCHDOG.call_once(|| {
            let _ = std::thread::Builder::new()
                .name("keel-lease".to_owned())
                .stack_size(WATCHDOG_STACK)
                .spawn(|| loop {
                    std::thread::sleep(LEASE_CHECK);
                    let mut until = lease();
                    if until.is_some_and(|until| std::time::Instant::now() >= until) {
                        *until = None;
                        drop(until);
                        kill_unreaped();
                    }
                });
        });
    }
}

/// Serve the runtime on `socket` until it closes.
pub fn serve(socket: OwnedFd) -> io::Result<()> {
    protocol::send(socket.as_fd(), &Reply::Ready.encode(), &[])?;
    let mut buffer = vec![0_u8; MAX_MESSAGE];
    let pool = Pool::default();
    loop {
        let received = match protocol::receive(socket.as_fd(), &mut buffer) {
            Ok(Some(received)) => received,
            // The runtime is gone.
            Ok(None) => return Ok(()),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        let (cwd, argv, env, confinement) = match Request::decode(&received.bytes) {
            Some(Request::Spawn {
                cwd,
                argv,
                env,
                confinement,
            }) => (cwd, argv, env, confinement),
            Some(Request::Lease { millis }) => {
                lease_for(std::time::Duration::from_millis(millis));
                continue;
            }
            // Not from a runtime of this build: nothing to do but ignore it.
            None => continue,
        };
        let Ok([stdin, stdout, stderr, replies]) = <[OwnedFd; 4]>::try_from(received.fds) else {
            // Without its reply socket nobody hears of the child: start none.
            continue;
        };
        match confinement {
            None => {
                let started = spawn(&cwd, &argv, env, [stdin, stdout, stderr], Confine::Not);
                if let Some(child) = answer(started, &replies) {
                    watch(&pool, child, replies);
                }
            }
            // Most confined calls get a thread of their own, which
            // confines itself, starts the child, waits for it and ends
            // (a confined thread cannot serve another call). A network
            // list of hosts is served from a thread that is not confined,
            // so such a call confines a short-lived thread of its own
            // (`sandbox.rs`) from a thread of the pool, which then waits.
            // Either way this loop takes the next request meanwhile.
            Some(confinement) => {
                let in_place = sandbox::confines_in_place(&confinement);
                let replies = std::sync::Arc::new(replies);
                let ours = replies.clone();
                let call = move || {
                    let confine = if in_place {
                        Confine::ThisThread(&confinement)
                    } else {
                        Confine::OnThreadOfItsOwn(&confinement)
                    };
                    let started = spawn(&cwd, &argv, env, [stdin, stdout, stderr], confine);
                    if let Some(child) = answer(started, &replies) {
                        wait_then_release(child, replies);
                    }
                };
                let started = if in_place {
                    std::thread::Builder::new()
                        .name("keel-confined".to_owned())
                        .stack_size(CONFINED_STACK)
                        .spawn(call)
                        .map(|_| ())
                } else {
                    pool.run(Box::new(call))
                };
                if started.is_err() {
                    // Nothing was started (the closure, and the child's
                    // descriptors, are gone): say so on our copy.
                    let _ = protocol::send(
                        ours.as_fd(),
                        &Reply::Failed { errno: EAGAIN }.encode(),
                        &[],
                    );
                }
            }
        }
    }
}

/// `EAGAIN`: no thread to start a confined child with.
const EAGAIN: i32 = 11;

/// The stack of a thread that confines itself for one call: it lists
/// directories and builds the confinement's rules (`sandbox.rs`), then
/// waits.
const CONFINED_STACK: usize = 256 * 1024;

/// Whether, and how, a child is confined.
enum Confine<'a> {
    Not,
    /// By the calling thread itself, which serves nothing else afterwards.
    ThisThread(&'a Confinement),
    /// By a short-lived thread of its own.
    OnThreadOfItsOwn(&'a Confinement),
}

/// Tell the runtime how a start went, on the child's reply socket: the
/// child if it started.
fn answer(started: Result<Child, SandboxError>, replies: &impl AsFd) -> Option<Child> {
    match started {
        Ok(child) => {
            unreaped().push(child.id());
            // The caller may have given up already; the child then finds
            // its stdin closed at the gate, and the waiter reaps it.
            let _ = protocol::send(
                replies.as_fd(),
                &Reply::Spawned { pid: child.id() }.encode(),
                &[],
            );
            Some(child)
        }
        Err(SandboxError::Spawn(error)) => {
            let errno = error.raw_os_error().unwrap_or(0);
            let _ = protocol::send(replies.as_fd(), &Reply::Failed { errno }.encode(), &[]);
            None
        }
        Err(refused) => {
            let mut why = refused.to_string();
            // Replies are read into a small buffer.
            if why.len() > MAX_REFUSAL {
                let mut end = MAX_REFUSAL;
                while !why.is_char_boundary(end) {
                    end -= 1;
                }
                why.truncate(end);
            }
            let _ = protocol::send(replies.as_fd(), &Reply::Refused { why }.encode(), &[]);
            None
        }
    }
}

/// The longest reason a refusal gives.
const MAX_REFUSAL: usize = 2000;

/// Start `argv` leading a new process group, stdio from `stdio`, confined
/// as `confinement` says if given.
fn spawn(
    cwd: &OsStr,
    argv: &[OsString],
    env: Vec<(OsString, OsString)>,
    [stdin, stdout, stderr]: [OwnedFd; 3],
    confine: Confine<'_>,
) -> Result<Child, SandboxError> {
    let program = argv.first().ok_or_else(|| {
        SandboxError::Spawn(io::Error::from_raw_os_error(
            rustix::io::Errno::INVAL.raw_os_error(),
        ))
    })?;
    let mut command = Command::new(super::on_path(program, &env));
    command
        .arg0(program)
        .args(argv.get(1..).unwrap_or_default())
        .env_clear()
        .envs(env)
        .current_dir(cwd)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .process_group(0);
    match confine {
        Confine::Not => command.spawn().map_err(SandboxError::Spawn),
        Confine::ThisThread(confinement) => {
            sandbox::spawn_confining_this_thread(command, confinement)
        }
        Confine::OnThreadOfItsOwn(confinement) => sandbox::spawn_confined(command, confinement),
    }
}

/// Wait for `child` on a thread of the pool ([`wait_then_release`]).
fn watch(pool: &Pool, child: Child, replies: OwnedFd) {
    let pid = Pid::from_child(&child);
    let spawned = pool.run(Box::new(move || wait_then_release(child, replies)));
    if spawned.is_err() {
        // No thread to wait with (the machine is out of threads): the child
        // is still behind its gate, so kill it rather than leave it
        // unwatched. The runtime learns of its exit when its reply socket
        // closes (the closure, and the child's handle, are gone). Its group
        // id is its pid: it leads its own group.
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        let mut groups = unreaped();
        groups.retain(|started| i32::try_from(*started).ok() != Some(pid.as_raw_nonzero().get()));
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
    }
}

/// Report `child`'s exit on `replies`, then reap it once the runtime
/// closed its end (the release).
fn wait_then_release(child: Child, replies: impl AsFd) {
    let status = exit_status(Pid::from_child(&child));
    let _ = protocol::send(replies.as_fd(), &Reply::Exited { status }.encode(), &[]);
    // The runtime sends nothing on this socket: the read returns when
    // it closes its end (or the spawner is ending).
    let mut byte = [0_u8; 1];
    while let Ok(Some(_)) = protocol::receive(replies.as_fd(), &mut byte) {}
    reap(child);
}

/// Reap `child`, off the list of groups to kill first.
fn reap(mut child: Child) {
    let id = child.id();
    let mut groups = unreaped();
    groups.retain(|pid| *pid != id);
    let _ = child.wait();
}

/// Wait until `pid` (our child) has exited, leaving it unreaped, and give
/// its raw wait status.
fn exit_status(pid: Pid) -> i32 {
    loop {
        match rustix::process::waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {
            Ok(Some(status)) => return raw_wait_status(&status),
            Ok(None) | Err(rustix::io::Errno::INTR) => continue,
            // ECHILD cannot happen for our own unreaped child; report it as
            // a kill so the runtime does not wait forever.
            Err(_) => return SIGKILL_STATUS,
        }
    }
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
