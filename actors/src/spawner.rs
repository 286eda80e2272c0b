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
//! connections (BENCHMARKS.md, "Tool spawns and open connections").
//!
//! *The protocol* (`spawner/protocol.rs`): the runtime creates the child's
//! three pipes, sends a `spawn` request (argv, cwd, the whole environment:
//! the child's is exactly what a direct spawn would give it) over a
//! `SOCK_SEQPACKET` socket pair with the child's ends attached
//! (`SCM_RIGHTS`), and gets back the pid, which leads a new process group.
//! The caller then adopts the group (`ProcessGroup`, recorded in the ledger)
//! as it would a child of its own; the command itself still waits behind
//! `bash`'s gate until then. Exit statuses come back over the socket. The
//! spawner does not reap an exited child until the runtime releases it
//! (after its `killpg`), so a process group id the runtime may still signal
//! never names anyone else (`spawner/serve.rs`).
//!
//! *Failures.* A spawner that cannot be started (no such program, it does
//! not answer) leaves the runtime spawning directly, logged once. One that
//! dies is started again at the next spawn; the calls it was running end
//! with an error result (their exit status is lost; their groups are killed
//! by their `ProcessGroup`s), never a stuck turn.

mod protocol;
mod serve;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::pipe::PipeFlags;
use tokio::io::Interest;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use protocol::{Reply, Request, MAX_MESSAGE};
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
        }
    }
}

/// What to start: `argv` in `cwd`, with the runtime's environment plus `env`.
#[derive(Debug)]
pub struct Launch<'a> {
    pub argv: &'a [OsString],
    pub env: &'a [(OsString, OsString)],
    pub cwd: &'a Path,
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

    /// Start `launch` leading a new process group, its stdin, stdout and
    /// stderr piped back. The caller adopts the group right away (see
    /// [`ProcessGroup::adopt`](crate::process_group::ProcessGroup::adopt)).
    pub async fn spawn(&self, launch: &Launch<'_>) -> io::Result<Launched> {
        if let Some(slot) = &self.helper {
            if let Some(helper) = slot.helper().await {
                match helper.spawn(launch).await {
                    Err(SpawnError::TooLarge) => {}
                    Err(SpawnError::Io(error)) => return Err(error),
                    Ok(launched) => return Ok(launched),
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

/// The three pipes of a child: its ends and ours.
struct Pipes {
    child: [OwnedFd; 3],
    stdin: pipe::Sender,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
}

fn pipes() -> io::Result<Pipes> {
    let (stdin_read, stdin_write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    let (stdout_read, stdout_write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    let (stderr_read, stderr_write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    Ok(Pipes {
        child: [stdin_read, stdout_write, stderr_write],
        stdin: pipe::Sender::from_owned_fd(stdin_write)?,
        stdout: pipe::Receiver::from_owned_fd(stdout_read)?,
        stderr: pipe::Receiver::from_owned_fd(stderr_read)?,
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
    let child = tokio::process::Command::new(program)
        .args(launch.argv.get(1..).unwrap_or_default())
        .envs(launch.env.iter().map(|(name, value)| (name, value)))
        .current_dir(launch.cwd)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .process_group(0)
        // Belt and braces: the group's drop kills the leader too, but this
        // also covers a failure between spawn and adoption.
        .kill_on_drop(true)
        .spawn()?;
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
    link: Arc<Link>,
    /// Reads replies and routes them to their children.
    reader: tokio::task::JoinHandle<()>,
    /// The spawner process; killed when the helper is dropped (it would
    /// exit anyway, its socket closed).
    _process: tokio::process::Child,
    next_id: AtomicU64,
}

/// What the helper and its reader task share.
#[derive(Debug)]
struct Link {
    /// Our end of the socket pair (see `Helper::start`).
    socket: tokio::net::UnixStream,
    /// Where each child's replies go, by request id.
    children: Mutex<HashMap<u64, mpsc::UnboundedSender<Reply>>>,
    /// Set when the socket closed or failed: the spawner is gone.
    dead: AtomicBool,
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Helper {
    async fn start(command: &SpawnerCommand) -> io::Result<Helper> {
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        rustix::io::ioctl_fionbio(&ours, true)?;
        let process = tokio::process::Command::new(&command.program)
            .args(&command.args)
            // Its children get the environment each request carries, and
            // the spawner itself carries none of the runtime's, so nothing
            // that looks for the runtime's processes by it finds this one.
            .env_clear()
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let link = Arc::new(Link {
            // tokio's `UnixStream` is only the readiness of the descriptor
            // here (its reads and writes are never used: each message goes
            // through `sendmsg` and `recvmsg` in `async_io`), which holds
            // for a `SOCK_SEQPACKET` socket as for a stream; its `AsyncFd`
            // would need unsafe code to register.
            socket: tokio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(ours))?,
            children: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
        });
        let mut buffer = vec![0_u8; MAX_MESSAGE];
        match tokio::time::timeout(PATIENCE, link.receive(&mut buffer)).await {
            Ok(Ok(Some(Reply::Ready))) => {}
            Ok(Ok(_)) => {
                return Err(io::Error::other(
                    "the spawner exited or spoke out of turn instead of saying it is ready",
                ))
            }
            Ok(Err(error)) => return Err(error),
            Err(_) => return Err(io::Error::other("the spawner did not say it is ready")),
        }
        let reader = tokio::spawn(read_replies(link.clone(), buffer));
        Ok(Helper {
            link,
            reader,
            _process: process,
            next_id: AtomicU64::new(1),
        })
    }

    fn is_dead(&self) -> bool {
        self.link.dead.load(Ordering::Acquire)
    }

    async fn spawn(self: &Arc<Helper>, launch: &Launch<'_>) -> Result<Launched, SpawnError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // The child's environment: ours, with the launch's on top.
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(name, _)| launch.env.iter().all(|(added, _)| added != name))
            .collect();
        env.extend(launch.env.iter().cloned());
        let request = Request::Spawn {
            id,
            cwd: launch.cwd.as_os_str().to_owned(),
            argv: launch.argv.to_vec(),
            env,
        }
        .encode();
        if request.len() > MAX_MESSAGE {
            return Err(SpawnError::TooLarge);
        }
        let Pipes {
            child,
            stdin,
            stdout,
            stderr,
        } = pipes()?;
        let (replies_to, mut replies) = mpsc::unbounded_channel();
        self.link.lock().insert(id, replies_to);
        let [child_stdin, child_stdout, child_stderr] = &child;
        let fds = [
            child_stdin.as_fd(),
            child_stdout.as_fd(),
            child_stderr.as_fd(),
        ];
        let sent = self
            .link
            .socket
            .async_io(Interest::WRITABLE, || {
                protocol::send(self.link.socket.as_fd(), &request, &fds)
            })
            .await;
        // Our copies of the child's ends: the child holds its own now, and
        // its output ends only when every write end is closed.
        drop(child);
        if let Err(error) = sent {
            self.link.lock().remove(&id);
            self.link.dead.store(true, Ordering::Release);
            return Err(SpawnError::Io(io::Error::new(
                error.kind(),
                format!("cannot reach the process spawner: {error}"),
            )));
        }
        let pid = match tokio::time::timeout(PATIENCE, replies.recv()).await {
            Ok(Some(Reply::Spawned { pid, .. })) => pid,
            Ok(Some(Reply::Failed { errno, .. })) if errno != 0 => {
                return Err(SpawnError::Io(io::Error::from_raw_os_error(errno)))
            }
            Ok(Some(_)) => return Err(SpawnError::Io(io::Error::other("the spawner failed"))),
            Ok(None) => {
                return Err(SpawnError::Io(io::Error::other(
                    "the process spawner died before it answered",
                )))
            }
            Err(_) => {
                self.link.lock().remove(&id);
                self.link.dead.store(true, Ordering::Release);
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
                id,
                pid,
                replies,
                helper: self.clone(),
                exited: false,
            })),
        })
    }
}

impl Link {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, mpsc::UnboundedSender<Reply>>> {
        // The map is consistent after every step, so a panic elsewhere
        // while it was held changes nothing.
        self.children
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next reply; `None` when the spawner is gone.
    async fn receive(&self, buffer: &mut [u8]) -> io::Result<Option<Reply>> {
        loop {
            let received = self
                .socket
                .async_io(Interest::READABLE, || {
                    protocol::receive(self.socket.as_fd(), &mut *buffer)
                })
                .await?;
            let Some(received) = received else {
                return Ok(None);
            };
            // Replies carry no descriptors; a malformed one is skipped.
            if let Some(reply) = Reply::decode(&received.bytes) {
                return Ok(Some(reply));
            }
        }
    }

    /// Tell the spawner it may reap child `id`: at once if the socket takes
    /// it (it nearly always does), else from a task.
    fn release(self: &Arc<Link>, id: u64) {
        let message = Request::Release { id }.encode();
        match protocol::send(self.socket.as_fd(), &message, &[]) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let link = self.clone();
                    runtime.spawn(async move {
                        let _ = link
                            .socket
                            .async_io(Interest::WRITABLE, || {
                                protocol::send(link.socket.as_fd(), &message, &[])
                            })
                            .await;
                    });
                }
                // With no runtime left the spawner's socket closes soon,
                // and a spawner whose runtime is gone reaps everything.
            }
            _ => {}
        }
    }
}

/// Route the spawner's replies to the children they are about, until it
/// is gone; then every child still waiting hears so (its channel closes).
async fn read_replies(link: Arc<Link>, mut buffer: Vec<u8>) {
    while let Ok(Some(reply)) = link.receive(&mut buffer).await {
        match reply {
            Reply::Ready => {}
            Reply::Spawned { id, .. } => {
                let mut children = link.lock();
                if children.get(&id).is_some_and(|to| to.send(reply).is_err()) {
                    // The caller gave up (cancelled) before the answer: its
                    // child stays behind its gate, whose stdin just closed,
                    // and exits; that exit is released below.
                    children.remove(&id);
                }
            }
            Reply::Failed { id, .. } => {
                if let Some(to) = link.lock().remove(&id) {
                    let _ = to.send(reply);
                }
            }
            Reply::Exited { id, .. } => {
                let to = link.lock().remove(&id);
                if to.is_none_or(|to| to.send(reply).is_err()) {
                    // Nobody waits for it: nobody will release it either.
                    link.release(id);
                }
            }
        }
    }
    link.dead.store(true, Ordering::Release);
    link.lock().clear();
}

/// The exit to come of a child of the spawner.
#[derive(Debug)]
struct HelperChild {
    id: u64,
    pid: u32,
    replies: mpsc::UnboundedReceiver<Reply>,
    /// Keeps the spawner (and its socket) for as long as the child is ours.
    helper: Arc<Helper>,
    /// Set once the exit was reported.
    exited: bool,
}

impl HelperChild {
    async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            match self.replies.recv().await {
                Some(Reply::Exited { status, .. }) => {
                    self.exited = true;
                    return Ok(ExitStatus::from_raw(status));
                }
                Some(_) => {}
                None => {
                    return Err(io::Error::other(
                        "the process spawner died, so the command's exit status is unknown",
                    ))
                }
            }
        }
    }
}

impl Drop for HelperChild {
    fn drop(&mut self) {
        if !self.exited && !self.helper.is_dead() {
            // Unreleased, the leader is not reaped, so its pid is still
            // its own: the same promise as `kill_on_drop`.
            if let Some(pid) = i32::try_from(self.pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        self.helper.link.release(self.id);
    }
}
