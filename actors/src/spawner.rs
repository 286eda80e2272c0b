//! How tools start processes: through a small spawner process started once,
//! or, where there is none, directly from the runtime's own process.
//!
//! *Why a spawner.* Starting a process from the runtime's process
//! (`posix_spawn`, `fork`) makes the kernel copy the whole descriptor table
//! into the child (`dup_fd`), and the child then closes every inherited
//! close-on-exec descriptor at `exec`. A daemon with 10,000 clients
//! connected pays for 10,000 sockets at every `bash` call. The spawner is
//! started when the runtime opens, before any connection exists, and execs
//! a fresh image holding a handful of descriptors; every tool process is
//! then started from there, at a cost that does not grow with the runtime's
//! connections (docs/benchmarks.md, "Tool spawns and open connections").
//!
//! *The protocol* (`spawner/protocol.rs`): the runtime creates the child's
//! three pipes and a socket pair of its own, sends a `spawn` request (argv,
//! cwd, the whole environment: the child's is exactly what a direct spawn
//! would give it) over the spawner's `SOCK_SEQPACKET` socket with the
//! child's ends attached (`SCM_RIGHTS`), and gets back the pid, which leads
//! a new process group, on the child's socket.
//! The caller then adopts the group (`ProcessGroup`, recorded in the ledger)
//! as it would a child of its own; the command itself still waits behind
//! `bash`'s gate until then. The exit status comes back on the child's
//! socket too. The spawner does not reap an exited child until the runtime
//! closes that socket (after its `killpg`), so a process group id the
//! runtime may still signal never names anyone else (`spawner/serve.rs`).
//! One socket per child keeps the runtime's side to a task awaiting its own
//! descriptor: no reader task, no routing table, and a spawner that dies
//! closes every child's socket, which is how the waiting calls hear of it.
//!
//! *Failures.* A spawner that cannot be started (no such program, it does
//! not answer) leaves the runtime spawning directly, logged once; so is a
//! request too large for one message (an environment over 128 KiB). One that
//! dies is started again at the next spawn; the calls it was running end
//! with an error result (their exit status is lost; their groups are killed
//! by their `ProcessGroup`s), never a stuck turn.

mod pool;
mod protocol;
mod serve;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::pipe::PipeFlags;
use tokio::io::Interest;
use tokio::net::unix::pipe;

use crate::sandbox::{self, Confinement, SandboxError};
use protocol::{Reply, MAX_MESSAGE};
pub use serve::{serve, serve_stdin};

/// How long a spawner may take to say it is ready, and to answer a spawn.
/// It answers in microseconds; past this it is taken for hung.
const PATIENCE: Duration = Duration::from_secs(10);

/// The program that serves as the spawner: it must call
/// [`serve_stdin`] (the `keel` binary does for `keel spawner`, and
/// keel-actors ships `keel-spawner`, which does nothing else).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnerCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// The daemon's data directory, which the spawner hides from what it
    /// starts (`sandbox::hide_in_namespace`); the runtime sets it.
    pub hide: Option<PathBuf>,
}

impl SpawnerCommand {
    /// This process's own binary with `args`, through `/proc/self/exe`, so
    /// that a binary replaced on disk since it started still starts its
    /// own spawner.
    pub fn this_binary<I, A>(args: I) -> SpawnerCommand
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        SpawnerCommand {
            program: PathBuf::from("/proc/self/exe"),
            args: args.into_iter().map(Into::into).collect(),
            hide: None,
        }
    }
}

/// What to start: `argv` in `cwd`, with exactly the environment `env`,
/// confined as `confinement` says if given (`sandbox.rs`).
#[derive(Debug)]
pub struct Launch<'a> {
    pub argv: &'a [OsString],
    pub env: &'a [(OsString, OsString)],
    pub cwd: &'a Path,
    pub confinement: Option<&'a Confinement>,
}

/// Starts tool processes (see the module docs). Cheap to clone; every
/// clone uses the same spawner process.
#[derive(Debug, Clone, Default)]
pub struct Spawner {
    /// `None`: spawn directly.
    helper: Option<Arc<HelperSlot>>,
}

impl Spawner {
    /// A spawner that starts every process directly from this process.
    pub fn direct() -> Spawner {
        Spawner { helper: None }
    }

    /// Start the spawner process `command` now. If it cannot be started,
    /// the spawner spawns directly (logged once); it never fails.
    pub async fn start(command: SpawnerCommand) -> Spawner {
        let spawner = Spawner::new(command);
        // Starting it now, before the runtime opens connections, is what
        // keeps its one costly spawn cheap.
        let _ = spawner.uses_helper().await;
        spawner
    }

    /// Start processes through the spawner process `command`, started at
    /// the first spawn (on the tokio runtime of that spawn, which it then
    /// needs for as long as it runs). A runtime starts it at once instead
    /// ([`Spawner::start`]).
    pub fn new(command: SpawnerCommand) -> Spawner {
        Spawner {
            helper: Some(Arc::new(HelperSlot {
                current: tokio::sync::Mutex::new(None),
                given_up: AtomicBool::new(false),
                command,
            })),
        }
    }

    /// Whether processes are started by a spawner process now (false once
    /// it could not be started, and for [`Spawner::direct`]).
    pub async fn uses_helper(&self) -> bool {
        match &self.helper {
            Some(slot) => slot.helper().await.is_some(),
            None => false,
        }
    }

    /// Tell the spawner process, if one runs, that this runtime may act
    /// for `length` more: unless told again by then, it kills every
    /// process group it started (a node's lease, docs/nodes.md; the
    /// spawner is not paused when this process is). A spawner that is not
    /// running is not started for this; one that is gone is left so.
    pub async fn renew_lease(&self, length: Duration) {
        let Some(slot) = &self.helper else {
            return;
        };
        let helper = match slot.current.lock().await.as_ref() {
            Some(helper) if !helper.is_dead() => helper.clone(),
            _ => return,
        };
        let millis = u64::try_from(length.as_millis()).unwrap_or(u64::MAX);
        let request = protocol::Request::Lease { millis }.encode();
        let sent = helper
            .socket
            .async_io(Interest::WRITABLE, || {
                protocol::send(helper.socket.as_fd(), &request, &[])
            })
            .await;
        if let Err(error) = sent {
            tracing::warn!(%error, "cannot renew the spawner's lease");
        }
    }

    /// Start `launch` leading a new process group, its stdin, stdout and
    /// stderr piped back. The command must do nothing before it reads a
    /// word from its stdin (bash's gate): a spawner that dies before it
    /// answers may have started it, and the request then goes to the next
    /// spawner, so the copy that was started must find its stdin closed
    /// and exit. The caller adopts the group right away (see
    /// [`ProcessGroup::adopt`](crate::process_group::ProcessGroup::adopt)).
    pub async fn spawn(&self, launch: &Launch<'_>) -> io::Result<Launched> {
        if let Some(slot) = &self.helper {
            // A spawner found gone when it is handed the request is started
            // again once, and the request sent again: nothing had started.
            // Gone twice, or a request too large for one message: this one
            // is started directly.
            for _ in 0..2 {
                let Some(helper) = slot.helper().await else {
                    break;
                };
                match helper.spawn(launch).await {
                    Ok(launched) => return Ok(launched),
                    Err(SpawnError::Io(error)) => return Err(error),
                    Err(SpawnError::Gone) => continue,
                    Err(SpawnError::TooLarge) => break,
                }
            }
        }
        spawn_direct(launch)
    }
}

/// A started process: its pid (the leader and id of its own process group),
/// the runtime's ends of its pipes, and its exit status to come.
#[derive(Debug)]
pub struct Launched {
    pub pid: u32,
    /// The gate's word goes here; then it is closed.
    pub stdin: pipe::Sender,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    pub exit: ChildExit,
}

/// The exit to come of a started process. Dropping it before the exit was
/// seen kills the leader (as `kill_on_drop` does); the group is the
/// caller's `ProcessGroup`'s to kill, before this is dropped.
#[derive(Debug)]
pub struct ChildExit(Exit);

#[derive(Debug)]
enum Exit {
    /// A child of this process.
    Direct(tokio::process::Child),
    /// A child of the spawner process.
    Helper(HelperChild),
}

impl ChildExit {
    /// Wait for the leader to exit. Cancel-safe; call it until it returned
    /// once.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        match &mut self.0 {
            Exit::Direct(child) => child.wait().await,
            Exit::Helper(child) => child.wait().await,
        }
    }
}

/// `program` as `execvp` would find it on the `PATH` of `env`: a path
/// already, or the first executable file of that name in its
/// directories; as it is if none (the spawn then fails as it would have).
///
/// Given a path, `std` starts the child with `posix_spawn` (a `vfork`);
/// given a bare name with an environment of its own, it must fork instead
/// (the child's `PATH` is not the parent's), copying the spawning
/// process's page tables at every spawn.
///
/// A name found is remembered for [`FOUND_FRESH`]: every call of a tool
/// starts the same program (`bash`) on the same `PATH`, and the search is
/// a `statx` per directory before it.
fn on_path(program: &OsString, env: &[(OsString, OsString)]) -> OsString {
    use std::os::unix::ffi::OsStrExt as _;
    if program.as_bytes().contains(&b'/') {
        return program.clone();
    }
    let Some((_, path)) = env.iter().rev().find(|(name, _)| name == "PATH") else {
        return program.clone();
    };
    let key = (program.clone(), path.clone());
    let mut found = FOUND
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((at, resolved)) = found.get(&key) {
        if at.elapsed() < FOUND_FRESH {
            return resolved.clone();
        }
    }
    let resolved = search(program, path);
    if found.len() >= 64 {
        found.clear();
    }
    found.insert(key, (std::time::Instant::now(), resolved.clone()));
    resolved
}

/// Names found on a `PATH` lately ([`on_path`]): by name and `PATH`, when
/// and where.
type Found = HashMap<(OsString, OsString), (std::time::Instant, OsString)>;
static FOUND: std::sync::LazyLock<std::sync::Mutex<Found>> =
    std::sync::LazyLock::new(|| std::sync::Mutex::new(HashMap::new()));

/// How long a name found on a `PATH` is taken as found there.
const FOUND_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// `program` in the first directory of `path` holding an executable file
/// of that name; as it is if none.
fn search(program: &OsString, path: &OsStr) -> OsString {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::split_paths(path)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(program))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
        .map_or_else(|| program.clone(), PathBuf::into_os_string)
}

/// The three pipes of a child: its ends and ours.
struct Pipes {
    child: [OwnedFd; 3],
    stdin: pipe::Sender,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
}

/// Three new pipes. Our ends are made non-blocking here and handed to
/// tokio as they are: `from_owned_fd` would first ask the kernel whether
/// each is a pipe and what its flags are, two system calls per pipe that
/// tell nothing new. The child's ends stay blocking.
fn pipes() -> io::Result<Pipes> {
    let (stdin_read, stdin_write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    let (stdout_read, stdout_write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    let (stderr_read, stderr_write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    for ours in [&stdin_write, &stdout_read, &stderr_read] {
        rustix::io::ioctl_fionbio(ours, true)?;
    }
    Ok(Pipes {
        child: [stdin_read, stdout_write, stderr_write],
        stdin: pipe::Sender::from_owned_fd_unchecked(stdin_write)?,
        stdout: pipe::Receiver::from_owned_fd_unchecked(stdout_read)?,
        stderr: pipe::Receiver::from_owned_fd_unchecked(stderr_read)?,
    })
}

/// Start `launch` from this process.
fn spawn_direct(launch: &Launch<'_>) -> io::Result<Launched> {
    let Some(program) = launch.argv.first() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no program to run",
        ));
    };
    let Pipes {
        child: [stdin, stdout, stderr],
        stdin: our_stdin,
        stdout: our_stdout,
        stderr: our_stderr,
    } = pipes()?;
    let mut command = tokio::process::Command::new(on_path(program, launch.env));
    command
        .arg0(program)
        .args(launch.argv.get(1..).unwrap_or_default())
        .env_clear()
        .envs(launch.env.iter().map(|(name, value)| (name, value)))
        .current_dir(launch.cwd)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .process_group(0)
        // Belt and braces: the group's drop kills the leader too, but this
        // also covers a failure between spawn and adoption.
        .kill_on_drop(true);
    let child = match launch.confinement {
        Some(confinement) => {
            spawn_confined_on_tokio(confinement, move || command.spawn(), |child| child.id())?
        }
        None => command.spawn()?,
    };
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("the process exited before it could be watched"))?;
    Ok(Launched {
        pid,
        stdin: our_stdin,
        stdout: our_stdout,
        stderr: our_stderr,
        exit: ChildExit(Exit::Direct(child)),
    })
}

/// Start a process with `spawn`, which registers it with tokio (a
/// `tokio::process` spawn), confined as `confinement` says: the confining
/// thread is not one of tokio's, so it enters this runtime first. A
/// refusal to confine is an error holding the [`SandboxError`].
pub(crate) fn spawn_confined_on_tokio<T: Send>(
    confinement: &Confinement,
    spawn: impl FnOnce() -> io::Result<T> + Send,
    pid: impl FnOnce(&T) -> Option<u32>,
) -> io::Result<T> {
    let handle = tokio::runtime::Handle::current();
    sandbox::confined(
        confinement,
        move || {
            let _runtime = handle.enter();
            spawn()
        },
        pid,
    )
    .map_err(|error| match error {
        SandboxError::Spawn(error) => error,
        refused => io::Error::other(refused),
    })
}

/// The spawner process of a [`Spawner`], started again when it died.
#[derive(Debug)]
struct HelperSlot {
    command: SpawnerCommand,
    /// The running spawner; replaced when found dead.
    current: tokio::sync::Mutex<Option<Arc<Helper>>>,
    /// Set once a start failed: from then on processes are spawned directly.
    given_up: AtomicBool,
}

impl HelperSlot {
    /// The running spawner, started (again) if need be; `None` once one
    /// could not be started.
    async fn helper(&self) -> Option<Arc<Helper>> {
        if self.given_up.load(Ordering::Acquire) {
            return None;
        }
        let mut current = self.current.lock().await;
        if let Some(helper) = current.as_ref() {
            if !helper.is_dead() {
                return Some(helper.clone());
            }
            tracing::warn!("the process spawner died; starting it again");
        }
        match Helper::start(&self.command).await {
            Ok(helper) => {
                let helper = Arc::new(helper);
                *current = Some(helper.clone());
                Some(helper)
            }
            Err(error) => {
                *current = None;
                self.given_up.store(true, Ordering::Release);
                tracing::warn!(
                    program = %self.command.program.display(),
                    %error,
                    "cannot start the process spawner; tools start their processes directly \
                     (each spawn then copies this process's descriptor table)"
                );
                None
            }
        }
    }
}

/// Why the spawner did not start a process.
enum SpawnError {
    /// The request does not fit in one message (a huge environment):
    /// start it directly instead.
    TooLarge,
    /// The spawner was gone before it answered: nothing ran (a child it
    /// may have started waits at its gate, and exits when our end of its
    /// stdin closes).
    Gone,
    Io(io::Error),
}

impl From<io::Error> for SpawnError {
    fn from(error: io::Error) -> Self {
        SpawnError::Io(error)
    }
}

/// A running spawner process and the runtime's end of its socket.
#[derive(Debug)]
struct Helper {
    /// Where spawn requests go (see `Helper::start`).
    socket: tokio::net::UnixStream,
    /// The spawner process; killed when the helper is dropped (it would
    /// exit anyway, its socket closed).
    process: Mutex<tokio::process::Child>,
    /// Set once the spawner failed a request or a child's reply socket
    /// closed early: it is gone.
    dead: AtomicBool,
}

impl Helper {
    async fn start(command: &SpawnerCommand) -> io::Result<Helper> {
        let (ours, theirs) = seqpacket_pair()?;
        let mut process = tokio::process::Command::new(&command.program);
        process
            .args(&command.args)
            // Its children get the environment each request carries, and
            // the spawner itself carries none of the runtime's, so nothing
            // that looks for the runtime's processes by it finds this one.
            .env_clear();
        if let Some(data_dir) = &command.hide {
            process.env(sandbox::SPAWNER_HIDE_ENV, data_dir);
        }
        let process = process
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let helper = Helper {
            socket: ours,
            process: Mutex::new(process),
            dead: AtomicBool::new(false),
        };
        match tokio::time::timeout(PATIENCE, receive(&helper.socket)).await {
            Ok(Ok(Some(Reply::Ready))) => Ok(helper),
            Ok(Ok(_)) => Err(io::Error::other(
                "the spawner exited or spoke out of turn instead of saying it is ready",
            )),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(io::Error::other("the spawner did not say it is ready")),
        }
    }

    /// Whether the spawner is known gone: it failed us, or its process
    /// exited (a `waitpid(WNOHANG)`).
    fn is_dead(&self) -> bool {
        if self.dead.load(Ordering::Acquire) {
            return true;
        }
        let exited = self
            .process
            .lock()
            .map(|mut process| !matches!(process.try_wait(), Ok(None)))
            .unwrap_or(true);
        if exited {
            self.dead.store(true, Ordering::Release);
        }
        exited
    }

    async fn spawn(self: &Arc<Helper>, launch: &Launch<'_>) -> Result<Launched, SpawnError> {
        let request = protocol::encode_spawn(
            launch.cwd.as_os_str(),
            launch.argv,
            launch.env,
            launch.confinement,
        );
        if request.len() > MAX_MESSAGE {
            return Err(SpawnError::TooLarge);
        }
        let Pipes {
            child: [child_stdin, child_stdout, child_stderr],
            stdin,
            stdout,
            stderr,
        } = pipes()?;
        // The child's own socket: its replies come back here, and closing
        // our end releases it.
        let (replies, theirs) = seqpacket_pair()?;
        let fds = [
            child_stdin.as_fd(),
            child_stdout.as_fd(),
            child_stderr.as_fd(),
            theirs.as_fd(),
        ];
        let sent = self
            .socket
            .async_io(Interest::WRITABLE, || {
                protocol::send(self.socket.as_fd(), &request, &fds)
            })
            .await;
        // Our copies of the child's ends: the child holds its own now, and
        // its output ends only when every write end is closed.
        drop((child_stdin, child_stdout, child_stderr, theirs));
        if sent.is_err() {
            self.dead.store(true, Ordering::Release);
            return Err(SpawnError::Gone);
        }
        let pid = match tokio::time::timeout(PATIENCE, receive(&replies)).await {
            Ok(Ok(Some(Reply::Spawned { pid }))) => pid,
            Ok(Ok(Some(Reply::Failed { errno }))) if errno != 0 => {
                return Err(SpawnError::Io(io::Error::from_raw_os_error(errno)))
            }
            Ok(Ok(Some(Reply::Refused { why }))) => {
                return Err(SpawnError::Io(io::Error::other(SandboxError::Refused(why))))
            }
            Ok(Ok(Some(_))) => return Err(SpawnError::Io(io::Error::other("the spawner failed"))),
            // The spawner is gone without an answer. It may have taken the
            // request on its way out: a SIGKILLed spawner's socket stays
            // open, and takes messages, until the last of its threads has
            // exited, after its main thread already shows as a zombie. Had
            // it started the child, the child waits at its gate for a `go`
            // that never comes: our end of its stdin closes as this
            // returns, so it exits without running anything. Nothing ran,
            // so the request is the next spawner's.
            Ok(Ok(None) | Err(_)) => {
                self.dead.store(true, Ordering::Release);
                return Err(SpawnError::Gone);
            }
            Err(_) => {
                self.dead.store(true, Ordering::Release);
                return Err(SpawnError::Io(io::Error::other(format!(
                    "the process spawner did not answer within {} s",
                    PATIENCE.as_secs()
                ))));
            }
        };
        Ok(Launched {
            pid,
            stdin,
            stdout,
            stderr,
            exit: ChildExit(Exit::Helper(HelperChild {
                pid,
                replies,
                helper: self.clone(),
                exited: false,
            })),
        })
    }
}

/// A `SOCK_SEQPACKET` socket pair, both ends close-on-exec: ours
/// non-blocking, in tokio's reactor, theirs for the spawner. tokio's
/// `UnixStream` is only the readiness of the descriptor here (its reads and
/// writes are never used: each message goes through `sendmsg` and `recvmsg`
/// in `async_io`), which holds for a `SOCK_SEQPACKET` socket as for a
/// stream; its `AsyncFd` would need unsafe code to register.
fn seqpacket_pair() -> io::Result<(tokio::net::UnixStream, OwnedFd)> {
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::io::ioctl_fionbio(&ours, true)?;
    let ours = tokio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(ours))?;
    Ok((ours, theirs))
}

/// The next reply on `socket`; `None` when the other end closed. Replies
/// carry no descriptors; a malformed one is skipped.
async fn receive(socket: &tokio::net::UnixStream) -> io::Result<Option<Reply>> {
    // Room for a refusal's reason.
    let mut buffer = [0_u8; 4096];
    loop {
        let received = socket
            .async_io(Interest::READABLE, || {
                protocol::receive(socket.as_fd(), &mut buffer)
            })
            .await?;
        let Some(received) = received else {
            return Ok(None);
        };
        if let Some(reply) = Reply::decode(&received.bytes) {
            return Ok(Some(reply));
        }
    }
}

/// The exit to come of a child of the spawner.
#[derive(Debug)]
struct HelperChild {
    pid: u32,
    /// The child's own socket: its exit comes here; dropping it is the
    /// release (the spawner may reap the leader).
    replies: tokio::net::UnixStream,
    /// Keeps the spawner for as long as the child is ours, and hears of
    /// its death.
    helper: Arc<Helper>,
    /// Set once the exit was reported.
    exited: bool,
}

impl HelperChild {
    async fn wait(&mut self) -> io::Result<ExitStatus> {
        match receive(&self.replies).await {
            Ok(Some(Reply::Exited { status })) => {
                self.exited = true;
                Ok(ExitStatus::from_raw(status))
            }
            Ok(_) | Err(_) => {
                // Only the spawner's end closing ends this socket early.
                self.helper.dead.store(true, Ordering::Release);
                Err(io::Error::other(
                    "the process spawner died, so the command's exit status is unknown",
                ))
            }
        }
    }
}

impl Drop for HelperChild {
    fn drop(&mut self) {
        if !self.exited && !self.helper.is_dead() {
            // Unreleased (our socket is still open), the leader is not
            // reaped, so its pid is still its own: the same promise as
            // `kill_on_drop`.
            if let Some(pid) = i32::try_from(self.pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        // Then `replies` closes: the release.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::fcntl::{fcntl, FcntlArg, OFlag};

    fn non_blocking(fd: impl AsFd) -> bool {
        let flags = fcntl(fd, FcntlArg::F_GETFL).expect("the flags of our own pipe");
        OFlag::from_bits_truncate(flags).contains(OFlag::O_NONBLOCK)
    }

    /// tokio takes our ends as they are, so they must be non-blocking
    /// (a blocking read would hold a worker thread); the child's must
    /// stay blocking, as a program expects of its stdio.
    #[tokio::test]
    async fn our_ends_of_the_pipes_are_non_blocking_and_the_childs_are_not() {
        let pipes = pipes().expect("three pipes");
        for child in &pipes.child {
            assert!(!non_blocking(child));
        }
        assert!(non_blocking(&pipes.stdin));
        assert!(non_blocking(&pipes.stdout));
        assert!(non_blocking(&pipes.stderr));
    }
}
