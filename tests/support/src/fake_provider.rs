//! `keel mock-llm --port 0` as a child process, and the address its banner
//! announces: the fake provider as the benches and the end-to-end tests
//! run it, in a process of its own (so that its memory and CPU are not
//! counted with what is measured).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};

/// The line `keel mock-llm` prints once its socket is bound, before its
/// base URL.
pub const BANNER: &str = "mock-llm listening on ";

/// How long the fake provider may take to announce its address.
const START_PATIENCE: Duration = Duration::from_secs(10);

/// A running `keel mock-llm`; dropping it kills the process.
#[derive(Debug)]
pub struct FakeProvider {
    child: Child,
    /// `http://127.0.0.1:PORT`, as the banner said.
    url: String,
}

impl FakeProvider {
    /// Start `keel mock-llm --port 0 EXTRA_ARGS` from the binary at `keel`
    /// and wait for its banner. Its stdout is drained from then on, so it
    /// never blocks on a full pipe; its stderr is this process's.
    pub fn start(keel: &Path, extra_args: &[&str]) -> anyhow::Result<FakeProvider> {
        let mut child = Command::new(keel)
            .args(["mock-llm", "--port", "0"])
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} mock-llm", keel.display()))?;
        let stdout = child.stdout.take().context("stdout is piped")?;
        // From here on, the guard kills the child whatever happens.
        let mut provider = FakeProvider {
            child,
            url: String::new(),
        };
        // A thread reads the banner, then drains stdout until the child
        // exits.
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next();
            let _ = sender.send(first);
            for _ in lines {}
        });
        let line = match receiver.recv_timeout(START_PATIENCE) {
            Ok(Some(Ok(line))) => line,
            Ok(Some(Err(error))) => return Err(error).context("reading mock-llm's stdout"),
            Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = provider.child.wait();
                return Err(anyhow!(
                    "mock-llm exited before announcing its address: {status:?}"
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(anyhow!(
                    "mock-llm did not announce its address within {START_PATIENCE:?}"
                ))
            }
        };
        let url = line
            .trim()
            .strip_prefix(BANNER)
            .with_context(|| format!("unexpected first line from mock-llm: {line:?}"))?;
        anyhow::ensure!(
            url.starts_with("http://127.0.0.1:"),
            "mock-llm should listen on loopback: {url}"
        );
        provider.url = url.to_owned();
        Ok(provider)
    }

    /// `http://127.0.0.1:PORT`, without a trailing `/`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status once it has exited, waiting at most `patience`;
    /// `None` if it still runs then.
    pub fn wait_for_exit(&mut self, patience: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for mock-llm")? {
                return Ok(Some(status));
            }
            if started.elapsed() >= patience {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
