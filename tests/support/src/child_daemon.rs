//! A `keel serve` run as a child process over a data dir of the caller's,
//! on one loopback port for all its lives: what the drills kill and
//! restart and what `keel bench` measures from `/proc` (its own process
//! only, apart from the caller and the fake provider). The binary is the
//! running one (`keel drill`, `keel bench`), so this rig serves the lab
//! from the product binary; the daemon itself never uses it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};

use keel_api::client::Client;

/// The daemon's `KEEL_EXIT_WITH_PARENT` (keel-daemon's
/// `daemon::EXIT_WITH_PARENT_ENV`, which the lab checks is the same): the
/// pid of the process a child daemon must not outlive.
pub const EXIT_WITH_PARENT_ENV: &str = "KEEL_EXIT_WITH_PARENT";

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
            .env(EXIT_WITH_PARENT_ENV, std::process::id().to_string())
            .env_remove("KEEL_CONFIG")
            .env_remove("KEEL_STORE")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            // The caller's MCP servers are not the drill's.
            .env_remove("KEEL_MCP_SERVERS")
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

    /// Send `signal` to the running daemon (SIGSTOP and SIGCONT: a node
    /// paused past its lease, `keel drill nodes`).
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> anyhow::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| anyhow!("the daemon is not running"))?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).context("the daemon's pid")?);
        nix::sys::signal::kill(pid, signal)
            .with_context(|| format!("sending {signal} to the daemon"))
    }

    /// Wait up to `patience` for the daemon to exit by itself, and reap
    /// it: how it exited, or `None` if it still runs.
    pub async fn exited(
        &mut self,
        patience: Duration,
    ) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let started = Instant::now();
        loop {
            let Some(child) = self.child.as_mut() else {
                return Ok(None);
            };
            if let Some(status) = child.try_wait().context("waiting for the daemon")? {
                self.child = None;
                return Ok(Some(status));
            }
            if started.elapsed() > patience {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// What the current (or last) life wrote to its log.
    pub fn output(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
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
/// other bind to port 0 takes it while the server is down between two
/// lives: every life binds the same port. The daemon's and
/// `postgres::Postgres`'s.
pub(crate) fn lasting_port() -> anyhow::Result<u16> {
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
        "no free loopback port between {} and {}",
        span.start,
        span.end
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
