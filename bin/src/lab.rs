//! A `keel serve` of this very binary, run as a child process over a data
//! dir of the caller's, on one loopback port for all its lives: what the
//! drills kill and restart and what `keel bench` measures from `/proc`
//! (its own process only, apart from the caller and the fake provider).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};

use crate::client::Client;

/// Each life's processes, the daemon's tools included (they inherit its
/// environment), carry its number in this variable.
pub const LIFE_ENV: &str = "KEEL_DRILL_LIFE";

/// How long a daemon may take to answer `/healthz`.
const READY_PATIENCE: Duration = Duration::from_secs(60);

pub struct ChildDaemon {
    exe: PathBuf,
    /// Where its logs go and its working directory.
    dir: PathBuf,
    data_dir: PathBuf,
    addr: String,
    token: String,
    mock_url: String,
    env: Vec<(String, String)>,
    life: u32,
    child: Option<Child>,
}

impl ChildDaemon {
    /// A daemon to be, over `dir/data`, using the fake provider at
    /// `mock_url`, on a free loopback port, with `token`.
    pub fn new(dir: &Path, mock_url: &str, token: &str) -> anyhow::Result<ChildDaemon> {
        let port = lasting_port()?;
        Ok(ChildDaemon {
            exe: std::env::current_exe().context("finding this keel binary")?,
            dir: dir.to_path_buf(),
            data_dir: dir.join("data"),
            addr: format!("127.0.0.1:{port}"),
            token: token.to_owned(),
            mock_url: mock_url.to_owned(),
            env: Vec::new(),
            life: 0,
            child: None,
        })
    }

    /// Set `name` in every life's environment.
    pub fn env(&mut self, name: &str, value: &str) {
        self.env.push((name.to_owned(), value.to_owned()));
    }

    pub fn client(&self) -> Client {
        Client::new(&self.addr, Some(self.token.clone()))
    }

    /// The number of the current (or last) life; 0 before the first.
    pub fn life(&self) -> u32 {
        self.life
    }

    /// The running daemon's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Start the next life (its stderr goes to `dir/daemon-N.log`).
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        self.life += 1;
        let log =
            std::fs::File::create(self.log_path()).context("creating the daemon's log file")?;
        let mut command = Command::new(&self.exe);
        command
            .arg("serve")
            .current_dir(&self.dir)
            .env("KEEL_DATA_DIR", &self.data_dir)
            .env("KEEL_ADDR", &self.addr)
            .env("KEEL_TOKEN", &self.token)
            .env("KEEL_PROVIDER", "mock")
            .env("KEEL_MOCK_URL", &self.mock_url)
            // The fake provider speaks OpenAI's wire too; a conversation
            // created with `provider: openai` reaches it there.
            .env("OPENAI_BASE_URL", format!("{}/v1", self.mock_url))
            .env("KEEL_SHUTDOWN_GRACE_MS", "2000")
            .env(LIFE_ENV, self.life.to_string())
            // Not to outlive this process, however it ends.
            .env(
                crate::serve::EXIT_WITH_PARENT_ENV,
                std::process::id().to_string(),
            )
            .env_remove("KEEL_CONFIG")
            .env_remove("KEEL_STORE")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (name, value) in &self.env {
            command.env(name, value);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {} serve", self.exe.display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("daemon-{}.log", self.life))
    }

    /// Wait until the daemon answers `/healthz`; how long that took.
    pub async fn ready(&mut self, client: &Client) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            if client.health().await.is_ok() {
                return Ok(started.elapsed());
            }
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(5).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    return Err(anyhow!(
                        "the daemon (life {}) exited with {status} at start-up; the end of its log:\n{}",
                        self.life,
                        tail.join("\n")
                    ));
                }
            }
            if started.elapsed() > READY_PATIENCE {
                return Err(anyhow!(
                    "the daemon (life {}) did not answer /healthz within {READY_PATIENCE:?}",
                    self.life
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().context("killing the daemon")?;
            child.wait().context("reaping the daemon")?;
        }
        Ok(())
    }

    /// SIGTERM, and wait for the graceful stop.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            let pid =
                nix::unistd::Pid::from_raw(i32::try_from(child.id()).context("the daemon's pid")?);
            if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).is_err() {
                child.kill().ok();
            }
            child.wait().context("waiting for the daemon to stop")?;
        }
        Ok(())
    }
}

impl Drop for ChildDaemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

/// A free loopback port outside the kernel's ephemeral range, so that no
/// outgoing connection (the drill's own clients make thousands) and no
/// other bind to port 0 takes it while the daemon is down between two
/// lives: every life binds the same port.
fn lasting_port() -> anyhow::Result<u16> {
    let (low, high) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(|bound| bound.parse::<u16>());
            Some((bounds.next()?.ok()?, bounds.next()?.ok()?))
        })
        .unwrap_or((32_768, 60_999));
    // Below the range if there is room there, else above it.
    let span = if low > 11_000 {
        10_000..low
    } else {
        high.saturating_add(1)..u16::MAX
    };
    for _ in 0..500 {
        let port = fastrand::u16(span.clone());
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(anyhow!(
        "no free loopback port between {} and {} for the daemon",
        span.start,
        span.end
    ))
}

/// The process on this machine listening on TCP `port`, from `/proc`: the
/// socket's inode in `/proc/net/tcp` (or `tcp6`), then the process
/// holding it among `/proc/*/fd`. `None` when nobody here listens on it,
/// or the holder's file descriptors cannot be read (another user's).
pub fn listener_pid(port: u16) -> Option<u32> {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .find_map(|table| listening_inode(&table, port))?;
    let socket = format!("socket:[{inode}]");
    pids().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == socket.as_str())
            })
        })
    })
}

/// The pids of every process on this machine, from `/proc`.
pub fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
}

/// The inode of the socket listening on `port` in a `/proc/net/tcp` table:
/// rows of `sl local_address rem_address st … inode`, the address as
/// `HEXIP:HEXPORT` and `0A` for LISTEN.
fn listening_inode(table: &str, port: u16) -> Option<u64> {
    table.lines().skip(1).find_map(|row| {
        let fields: Vec<&str> = row.split_whitespace().collect();
        let local_port = fields.get(1)?.rsplit(':').next()?;
        let listening = *fields.get(3)? == "0A";
        (listening && u16::from_str_radix(local_port, 16).ok()? == port)
            .then(|| fields.get(9)?.parse().ok())
            .flatten()
    })
}

/// CPU time (user + system) process `pid` has used, from `/proc`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), 1-based from
    // field 3: utime is field 14, stime field 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = clock_ticks()?;
    Some(Duration::from_secs_f64(
        (utime + stime) as f64 / ticks as f64,
    ))
}

/// Resident memory of process `pid` in bytes (VmRSS), from `/proc`.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn clock_ticks() -> Option<u64> {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|ticks| u64::try_from(ticks).ok())
}

/// Processes (not zombies) whose environment holds `marker` (`NAME=value`)
/// and a numeric `tag` variable: `(pid, the tag's value, command line)`.
/// A drill marks the processes of its daemons and their tools this way.
pub fn processes_with_env(marker: &str, tag: &str) -> Vec<(u32, u32, String)> {
    let tag_prefix = format!("{tag}=");
    let mut found = Vec::new();
    for pid in pids() {
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = environ.split(|byte| *byte == 0).collect();
        if !vars.contains(&marker.as_bytes()) {
            continue;
        }
        let Some(value) = vars.iter().find_map(|var| {
            std::str::from_utf8(var)
                .ok()?
                .strip_prefix(&tag_prefix)?
                .parse::<u32>()
                .ok()
        }) else {
            continue;
        };
        if !is_running(pid) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
            .unwrap_or_default();
        found.push((pid, value, cmdline.trim().to_owned()));
    }
    found
}

/// Whether process `pid` exists and is not a zombie.
pub fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|end| stat[end + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// The port of `HOST:PORT` or an `http://` URL.
pub fn port_of(addr: &str) -> Option<u16> {
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    reqwest::Url::parse(&url).ok()?.port_or_known_default()
}

/// How many of a conversation's subscribers have seen its turns end: the
/// sender of the next message waits on it with one wake per turn. (A wake
/// per subscriber, a channel message each, would take from the two cores
/// the CPU that the daemon being measured needs.)
#[derive(Debug)]
pub struct TurnTally {
    subscribers: usize,
    /// Turn ends seen, over all subscribers.
    seen: AtomicUsize,
    /// A follower went away before its last turn.
    failed: AtomicBool,
    notify: tokio::sync::Notify,
}

impl TurnTally {
    pub fn new(subscribers: usize) -> Arc<TurnTally> {
        Arc::new(TurnTally {
            subscribers: subscribers.max(1),
            seen: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            notify: tokio::sync::Notify::new(),
        })
    }

    /// One subscriber's side.
    pub fn follower(self: &Arc<TurnTally>) -> TallyFollower {
        TallyFollower {
            tally: self.clone(),
            finished: false,
        }
    }

    /// Wait until every subscriber has seen `turns` turns end; an error
    /// if a follower went away first.
    pub async fn wait_for(&self, turns: usize) -> anyhow::Result<()> {
        let target = turns * self.subscribers;
        while self.seen.load(Ordering::Acquire) < target {
            if self.failed.load(Ordering::Acquire) {
                return Err(anyhow!("a subscriber stopped reading"));
            }
            // A notice given before this wait is kept for it (`Notify`'s
            // permit), so none is missed between the check and the wait.
            self.notify.notified().await;
        }
        Ok(())
    }
}

/// A subscriber's side of a [`TurnTally`]. Dropped before
/// [`TallyFollower::finish`] (its task failed or panicked), it tells the
/// waiter.
#[derive(Debug)]
pub struct TallyFollower {
    tally: Arc<TurnTally>,
    finished: bool,
}

impl TallyFollower {
    pub fn turn_completed(&self) {
        let seen = self.tally.seen.fetch_add(1, Ordering::AcqRel) + 1;
        if seen.is_multiple_of(self.tally.subscribers) {
            self.tally.notify.notify_one();
        }
    }

    /// Every turn was seen.
    pub fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for TallyFollower {
    fn drop(&mut self) {
        if !self.finished {
            self.tally.failed.store(true, Ordering::Release);
            self.tally.notify.notify_one();
        }
    }
}

/// A frame of the daemon's event stream as the benches read it: scanned
/// for the little they need rather than parsed, so that the reading
/// client, which shares the machine with the daemon it measures, takes as
/// little of its CPU as it can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scanned {
    Snapshot,
    Canonical {
        seq: u64,
        kind: ScannedKind,
    },
    Live {
        lagged: bool,
    },
    /// The daemon's `event: error` frame, its data as sent.
    Error(String),
    Other,
}

/// The canonical event types the benches watch for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScannedKind {
    UserMessage,
    ToolResult,
    TurnCompleted,
    Other,
}

/// Splits an event stream's body (de-chunked bytes, as they come) into
/// [`Scanned`] frames.
#[derive(Debug, Default)]
pub struct FrameScanner {
    body: Vec<u8>,
}

impl FrameScanner {
    pub fn push(&mut self, bytes: &[u8]) {
        self.body.extend_from_slice(bytes);
    }

    /// The next whole frame pushed, if any.
    pub fn next_frame(&mut self) -> Option<Scanned> {
        let end = find(&self.body, b"\n\n")?;
        let frame = scan_frame(&self.body[..end]);
        self.body.drain(..end + 2);
        Some(frame)
    }
}

/// A frame's event name and, for a canonical one, its seq and type: the
/// first `"seq":` and `"type":"` of its data are the event's own (they come
/// before any nested object, and a quote inside a string is escaped).
fn scan_frame(block: &[u8]) -> Scanned {
    let mut event: &[u8] = b"";
    let mut data: &[u8] = b"";
    for line in block.split(|&byte| byte == b'\n') {
        if let Some(name) = line.strip_prefix(b"event: ") {
            event = name;
        } else if let Some(value) = line.strip_prefix(b"data: ") {
            data = value;
        }
    }
    match event {
        b"snapshot" => Scanned::Snapshot,
        b"canonical" => {
            let Some(digits) = after(data, b"\"seq\":") else {
                return Scanned::Other;
            };
            let seq =
                digits
                    .iter()
                    .take_while(|byte| byte.is_ascii_digit())
                    .fold(0u64, |seq, digit| {
                        seq.saturating_mul(10)
                            .saturating_add(u64::from(digit - b'0'))
                    });
            let kind = match after(data, b"\"type\":\"") {
                Some(rest) if rest.starts_with(b"user_message\"") => ScannedKind::UserMessage,
                Some(rest) if rest.starts_with(b"tool_result\"") => ScannedKind::ToolResult,
                Some(rest) if rest.starts_with(b"turn_completed\"") => ScannedKind::TurnCompleted,
                _ => ScannedKind::Other,
            };
            Scanned::Canonical { seq, kind }
        }
        b"live" => Scanned::Live {
            lagged: find(data, b"\"type\":\"lagged\"").is_some(),
        },
        b"error" => Scanned::Error(String::from_utf8_lossy(data).into_owned()),
        _ => Scanned::Other,
    }
}

fn after<'a>(haystack: &'a [u8], needle: &[u8]) -> Option<&'a [u8]> {
    find(haystack, needle).map(|at| &haystack[at + needle.len()..])
}

/// The first `needle` in `haystack`. The needles here are short and
/// searched once each, so this jumps between their first byte's places
/// (`memchr`) rather than building a substring searcher per call.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, _) = needle.split_first()?;
    memchr::memchr_iter(first, haystack).find(|&at| haystack[at..].starts_with(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_socket_is_found_by_its_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1E61 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:1E62 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1\n";
        assert_eq!(listening_inode(table, 0x1E61), Some(4242));
        // Connected, not listening.
        assert_eq!(listening_inode(table, 0x1E62), None);
        assert_eq!(listening_inode(table, 80), None);

        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("a port");
        let port = listener.local_addr().expect("its address").port();
        assert_eq!(listener_pid(port), Some(std::process::id()));
    }

    #[test]
    fn the_daemon_port_is_outside_the_ephemeral_range() {
        let port = lasting_port().expect("a port");
        if let Ok(text) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") {
            let bounds: Vec<u16> = text
                .split_whitespace()
                .filter_map(|bound| bound.parse().ok())
                .collect();
            assert!(port < bounds[0] || port > bounds[1], "{port} in {bounds:?}");
        }
    }

    #[test]
    fn this_process_has_used_cpu_and_holds_memory() {
        let pid = std::process::id();
        let spin = Instant::now();
        let mut sum = 0u64;
        while spin.elapsed() < Duration::from_millis(30) {
            sum = sum.wrapping_add(1);
        }
        assert!(sum > 0);
        assert!(cpu_time(pid).is_some_and(|cpu| cpu > Duration::ZERO));
        assert!(rss_bytes(pid).is_some_and(|rss| rss > 1024 * 1024));
        assert_eq!(cpu_time(u32::MAX), None);
    }

    #[test]
    fn ports_come_from_addresses_and_urls() {
        assert_eq!(port_of("127.0.0.1:7777"), Some(7777));
        assert_eq!(port_of("http://localhost:8080"), Some(8080));
        assert_eq!(port_of("http://localhost"), Some(80));
        assert_eq!(port_of("not an address"), None);
    }

    #[tokio::test]
    async fn a_tally_waits_for_every_subscriber_and_hears_of_one_that_went_away() {
        let tally = TurnTally::new(2);
        let first = tally.follower();
        let second = tally.follower();
        first.turn_completed();
        let waiting = tokio::spawn({
            let tally = tally.clone();
            async move { tally.wait_for(1).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "one of two has seen the turn end");
        second.turn_completed();
        waiting.await.unwrap().unwrap();

        first.turn_completed();
        first.finish();
        drop(second);
        let error = tally.wait_for(2).await.unwrap_err();
        assert!(error.to_string().contains("stopped reading"), "{error}");
    }

    #[test]
    fn frames_are_scanned_for_their_kind_seq_and_type() {
        let mut scanner = FrameScanner::default();
        scanner.push(b"event: snapshot\ndata: {\"id\":\"c-1\"}\n\nevent: canonical\nid: 7\ndata: {\"id\":\"c-1:7\",\"seq\":7,");
        assert_eq!(scanner.next_frame(), Some(Scanned::Snapshot));
        assert_eq!(scanner.next_frame(), None, "a frame cut in two waits");
        scanner.push(
            b"\"type\":\"user_message\",\"text\":\"say \\\"type\\\":\\\"turn_completed\\\"\"}\n\n",
        );
        assert_eq!(
            scanner.next_frame(),
            Some(Scanned::Canonical {
                seq: 7,
                kind: ScannedKind::UserMessage
            })
        );
        scanner.push(b"event: live\ndata: {\"type\":\"lagged\",\"missed\":3}\n\nevent: live\ndata: {\"type\":\"state_changed\"}\n\n");
        assert_eq!(scanner.next_frame(), Some(Scanned::Live { lagged: true }));
        assert_eq!(scanner.next_frame(), Some(Scanned::Live { lagged: false }));
        scanner.push(b"event: canonical\ndata: {\"seq\":12,\"type\":\"turn_completed\"}\n\nevent: error\ndata: {\"code\":\"x\"}\n\n");
        assert_eq!(
            scanner.next_frame(),
            Some(Scanned::Canonical {
                seq: 12,
                kind: ScannedKind::TurnCompleted
            })
        );
        assert_eq!(
            scanner.next_frame(),
            Some(Scanned::Error("{\"code\":\"x\"}".to_owned()))
        );
        assert_eq!(scanner.next_frame(), None);
    }
}
