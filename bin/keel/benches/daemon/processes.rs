//! The processes measured: `keel serve` on a free port with its own data
//! dir, and this process itself, read from /proc.

use super::*;

/// `keel serve` on a free port, with its own data dir, the mock as its
/// provider and a fixed token.
pub(crate) struct Daemon {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    pub(crate) _dir: tempfile::TempDir,
}

impl Daemon {
    pub(crate) fn start(mock_url: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command.arg("serve").current_dir(&work);
        // Nothing from this shell's keel or provider settings.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if ["KEEL_", "ANTHROPIC_", "OPENAI_"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
            {
                command.env_remove(name.as_ref());
            }
        }
        let mut child = command
            .env("KEEL_ADDR", "127.0.0.1:0")
            .env("KEEL_DATA_DIR", dir.path().join("data"))
            .env("KEEL_TOKEN", TOKEN)
            .env("KEEL_PROVIDER", "mock")
            .env("KEEL_MOCK_URL", mock_url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start keel serve");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let addr = loop {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "keel serve exited before listening"
            );
            if let Some(addr) = line.trim().strip_prefix("keel listening on http://") {
                break addr.parse().unwrap();
            }
        };
        // Keep reading, so a line the daemon prints later never blocks it.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = stdout.read_to_end(&mut sink);
        });
        Daemon {
            child,
            addr,
            _dir: dir,
        }
    }

    pub(crate) fn rss_bytes(&self) -> u64 {
        rss_bytes(self.child.id()).unwrap()
    }

    /// utime + stime (every thread of the process, finished ones too;
    /// not its children).
    pub(crate) fn cpu_seconds(&self) -> f64 {
        cpu_time(self.child.id()).unwrap().as_secs_f64()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn self_rss_bytes() -> u64 {
    rss_bytes(std::process::id()).unwrap()
}

pub(crate) fn self_cpu_seconds() -> f64 {
    cpu_time(std::process::id()).unwrap().as_secs_f64()
}
