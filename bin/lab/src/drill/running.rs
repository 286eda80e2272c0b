//! A daemon the crash drill did not start (`keel drill crash --addr`): found
//! by its port, killed with SIGKILL, and brought back by whoever runs it (a
//! supervisor such as systemd, or `--restart CMD`, which the drill runs
//! after every kill).
//!
//! The drill cannot put a life number into such a daemon's environment, so
//! the commands it has the daemon run mark themselves instead
//! ([`mark_command`]): each tool process carries the drill's run id and the
//! pid of the daemon that started it, and [`survivors`] looks for
//! processes of a killed daemon.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};

use keel_api::client::Client;
use keel_test_support as rig;

/// Set by a marked command: the drill's run.
pub const RUN_ENV: &str = "KEEL_DRILL_RUN";
/// Set by a marked command: the pid of the daemon that started it.
pub const DAEMON_ENV: &str = "KEEL_DRILL_DAEMON";

/// How long a killed daemon gets to come back (a supervisor's restart
/// delay, its boot) before the drill gives up.
const BACK_PATIENCE: Duration = Duration::from_secs(60);
/// How long a SIGKILLed process gets to be gone.
const GONE_PATIENCE: Duration = Duration::from_secs(10);

pub struct RunningDaemon {
    addr: String,
    port: u16,
    /// Run with `sh -c` after every kill; `None`: a supervisor restarts it.
    restart: Option<String>,
    /// Where the restart command's output goes.
    dir: PathBuf,
    pid: u32,
    life: u32,
    killed: Vec<u32>,
    /// Restart commands still running (a `keel serve` in the foreground),
    /// reaped as they end.
    started: Vec<Child>,
}

impl RunningDaemon {
    /// The daemon listening at `addr` on this machine.
    pub async fn find(
        addr: &str,
        restart: Option<String>,
        dir: &Path,
        client: &Client,
    ) -> anyhow::Result<RunningDaemon> {
        // Nobody there: the client's error says so, and what to do.
        client.health().await?;
        let port = rig::port_of(addr).ok_or_else(|| anyhow!("{addr} names no TCP port"))?;
        let pid = rig::listener_pid(port).ok_or_else(|| {
            anyhow!(
                "nothing on this machine that the drill can see listens on port {port}: \
                 the drill kills the daemon, so it must run here, as a user whose \
                 processes this one may read and signal"
            )
        })?;
        Ok(RunningDaemon {
            addr: addr.to_owned(),
            port,
            restart,
            dir: dir.to_path_buf(),
            pid,
            life: 1,
            killed: Vec::new(),
            started: Vec::new(),
        })
    }

    pub fn life(&self) -> u32 {
        self.life
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The pids of the daemons killed so far.
    pub fn killed(&self) -> &[u32] {
        &self.killed
    }

    /// SIGKILL the daemon and wait until it is gone.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid).context("the daemon's pid")?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)
            .with_context(|| format!("killing the daemon (pid {})", self.pid))?;
        self.killed.push(self.pid);
        let started = Instant::now();
        while rig::is_running(self.pid) {
            self.reap();
            if started.elapsed() > GONE_PATIENCE {
                return Err(anyhow!(
                    "the daemon (pid {}) still runs {GONE_PATIENCE:?} after SIGKILL",
                    self.pid
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.reap();
        Ok(())
    }

    /// Bring the next life up (with the restart command, if any) and wait
    /// until it answers; how long that took from the kill's end.
    pub async fn next_life(&mut self, client: &Client) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.life += 1;
        if let Some(command) = &self.restart {
            let log_path = self.dir.join(format!("restart-{}.log", self.life));
            let log = std::fs::File::create(&log_path).context("creating the restart log")?;
            let child = Command::new("sh")
                .arg("-c")
                .arg(command)
                .stdin(Stdio::null())
                .stdout(log.try_clone().context("sharing the restart log")?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("running the restart command `{command}`"))?;
            self.started.push(child);
        }
        loop {
            if client.health().await.is_ok() {
                if let Some(pid) = rig::listener_pid(self.port) {
                    if !self.killed.contains(&pid) {
                        self.pid = pid;
                        return Ok(started.elapsed());
                    }
                }
            }
            self.reap();
            if started.elapsed() > BACK_PATIENCE {
                let how = match &self.restart {
                    Some(command) => format!("after `{command}`"),
                    None => "(nothing restarted it: give --restart CMD, or run it under a supervisor that restarts it)".to_owned(),
                };
                return Err(anyhow!(
                    "the daemon at {} did not come back within {BACK_PATIENCE:?} of kill {} {how}",
                    self.addr,
                    self.life - 1
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Reap the restart commands that ended (a killed `keel serve` they
    /// started in the foreground, say).
    fn reap(&mut self) {
        self.started
            .retain_mut(|child| matches!(child.try_wait(), Ok(None)));
    }
}

/// `command`, run so that it and every process it starts carry the drill's
/// `run` and the pid of the daemon that runs it (`$PPID` of the tool's
/// `bash`, which is the daemon). `exec env` keeps the tool's own pid, so
/// the group's leader is marked too.
pub fn mark_command(command: &str, run: &str) -> String {
    format!(
        "exec env {RUN_ENV}={run} {DAEMON_ENV}=$PPID bash -c {}",
        shell_quote(command)
    )
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Processes of `run` started by one of the daemons `killed` that still
/// run (not zombies): `(pid, daemon pid, command line)`.
pub fn survivors(run: &str, killed: &[u32]) -> Vec<(u32, u32, String)> {
    let run_var = format!("{RUN_ENV}={run}");
    rig::processes_with_env(&run_var, DAEMON_ENV)
        .into_iter()
        .filter(|(_, daemon, _)| killed.contains(daemon))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_command_runs_as_given_and_its_processes_carry_the_marks() {
        let run = format!("test-{}", std::process::id());
        let marked = mark_command("echo \"it's $X\"; echo $PPID; sleep 30", &run);
        // The tool's bash is started by the daemon; here, by this test.
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(&marked)
            .env("X", "fine")
            .stdout(Stdio::piped())
            .spawn()
            .expect("bash runs");
        let me = std::process::id();
        let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        use std::io::BufRead as _;
        out.read_line(&mut line).expect("a line");
        assert_eq!(line, "it's fine\n");
        line.clear();
        out.read_line(&mut line).expect("a line");
        // `exec` keeps the pid: the command runs as the process the
        // daemon started (here, this test), so its parent is the daemon.
        assert_eq!(line.trim(), me.to_string());

        let found = survivors(&run, &[me]);
        let none = survivors(&run, &[me + 1]);
        child.kill().ok();
        child.wait().ok();
        assert!(
            found
                .iter()
                .any(|(pid, daemon, _)| *pid == child.id() && *daemon == me),
            "{found:?}"
        );
        assert!(none.is_empty(), "{none:?}");
    }
}
