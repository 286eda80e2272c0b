//! Shared helpers: finding the real `keel` binary and running it.

#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use keel_actors::provider::{Endpoint, ProviderConfig, Timeouts};
use keel_test_support::FakeProvider;
use serde_json::Value;

/// The `keel` binary Cargo built beside this test: the test runs as
/// `target/<profile>/deps/e2e-HASH`, the binary is `target/<profile>/keel`.
pub fn keel_bin() -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test knows its own path");
    let profile_dir = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let bin = profile_dir.join(format!("keel{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "the keel binary is not at {}; build it first with `cargo build -p keel`, \
         or run the tests with `cargo test --workspace`, which builds it",
        bin.display()
    );
    bin
}

/// Run `keel ARGS` to its end and return what it printed.
pub fn keel(args: &[&str]) -> Output {
    let bin = keel_bin();
    Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("could not run {}: {err}", bin.display()))
}

/// Run `keel ARGS`, require success, and parse stdout as JSON lines.
pub fn keel_json_lines(args: &[&str]) -> Vec<serde_json::Value> {
    let output = keel(args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "keel {args:?} failed with {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|err| panic!("not JSON ({err}): {line}"))
        })
        .collect()
}

/// A running `keel mock-llm --port 0`: the fake provider server, on a free
/// loopback port (keel-test-support's `FakeProvider`). Dropping the guard
/// kills the process.
pub struct MockLlm {
    provider: FakeProvider,
    http: reqwest::Client,
}

impl MockLlm {
    /// Start the fake provider and wait for its `mock-llm listening on
    /// http://127.0.0.1:PORT` line.
    pub fn start() -> MockLlm {
        let provider = FakeProvider::start(&keel_bin(), &[])
            .unwrap_or_else(|error| panic!("starting mock-llm: {error:#}"));
        MockLlm {
            provider,
            http: keel_api::http::client(),
        }
    }

    /// `http://127.0.0.1:PORT`, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        self.provider.url()
    }

    /// Both providers on this mock, by their SDK conventions: Anthropic's
    /// base without the version, OpenAI's with `/v1`. Built explicitly,
    /// never from the process environment.
    pub fn provider_config(&self, timeouts: Timeouts) -> ProviderConfig {
        ProviderConfig {
            anthropic: Endpoint {
                base_url: self.provider.url().to_owned(),
                api_key: Some("sk-ant-e2e".to_owned()),
            },
            openai: Endpoint {
                base_url: format!("{}/v1", self.provider.url()),
                api_key: Some("sk-openai-e2e".to_owned()),
            },
            mock_url: None,
            timeouts,
        }
    }

    /// Queue script entries (`POST /_mock/script`); panics if the mock
    /// refuses them, so a typo in a test fails loudly.
    pub async fn push_script(&self, script: Value) {
        let response = self
            .http
            .post(format!("{}/_mock/script", self.provider.url()))
            .json(&script)
            .send()
            .await
            .expect("POST /_mock/script");
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(
            status.is_success(),
            "the mock refused the script {script}: {status} {body}"
        );
    }

    /// Set the fake's context window (`POST /_mock/settings`); `None`
    /// takes it away. Panics if the fake refuses.
    pub async fn set_context_window(&self, tokens: Option<u64>) {
        let response = self
            .http
            .post(format!("{}/_mock/settings", self.provider.url()))
            .json(&serde_json::json!({ "context_window": tokens }))
            .send()
            .await
            .expect("POST /_mock/settings");
        assert!(
            response.status().is_success(),
            "the mock refused the settings: {}",
            response.text().await.unwrap_or_default()
        );
    }

    /// Every request recorded so far (`GET /_mock/requests`).
    pub async fn requests(&self) -> Vec<Value> {
        self.get_requests(&format!("{}/_mock/requests", self.provider.url()))
            .await
    }

    /// The recorded requests once at least `n_requests` are recorded and
    /// none is still pending (`GET /_mock/requests?wait_ended=N`). Panics
    /// if that does not happen within 5 s: the mock never sleeps longer.
    pub async fn wait_ended(&self, n_requests: usize) -> Vec<Value> {
        let url = format!(
            "{}/_mock/requests?wait_ended={n_requests}&timeout_ms=5000",
            self.provider.url()
        );
        let records = self.get_requests(&url).await;
        let settled = records.len() >= n_requests
            && records.iter().all(|record| record["outcome"] != "pending");
        assert!(
            settled,
            "waited for {n_requests} ended requests, the mock has: {}",
            serde_json::to_string_pretty(&records).unwrap_or_default()
        );
        records
    }

    async fn get_requests(&self, url: &str) -> Vec<Value> {
        let response = self
            .http
            .get(url)
            .send()
            .await
            .expect("GET /_mock/requests");
        assert!(
            response.status().is_success(),
            "GET {url}: {}",
            response.status()
        );
        let records: Value = response.json().await.expect("the recording is JSON");
        match records {
            Value::Array(records) => records,
            other => panic!("the recording is not an array: {other}"),
        }
    }
}

/// Whether no running process of group `pgid` is left. A killed process
/// whose parent died is reparented to init, which reaps it when it gets to
/// it (seconds, in some containers); such a zombie runs nothing, so it
/// counts as gone.
pub fn group_is_gone(pgid: i32) -> bool {
    use nix::errno::Errno;
    use nix::sys::signal::killpg;
    use nix::unistd::Pid;
    match killpg(Pid::from_raw(pgid), None) {
        Err(Errno::ESRCH) => true,
        _ => group_member_states(pgid).iter().all(|&state| state == 'Z'),
    }
}

/// The state letter of every process in group `pgid`, from /proc.
pub fn group_member_states(pgid: i32) -> Vec<char> {
    let mut states = Vec::new();
    for pid in keel_test_support::pids() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, fields)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = fields.split_whitespace().collect();
        // After the name: state (field 3), ppid (4), pgrp (5).
        if fields.get(2) == Some(&pgid.to_string().as_str()) {
            states.extend(fields[0].chars().next());
        }
    }
    states
}

/// A Python with the official MCP SDK (`tests/mcp/requirements.txt`), for
/// the MCP servers of the tests (docs/mcp.md): `KEEL_TEST_PYTHON` if set,
/// else a virtual environment made once under the target directory with
/// `python3 -m venv` and pip (PyPI), shared by every test of this run.
pub fn mcp_python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| match std::env::var_os("KEEL_TEST_PYTHON") {
            Some(python) => PathBuf::from(python),
            None => venv_python("mcp-python", "mcp/requirements.txt"),
        })
        .clone()
}

/// A Python with LangGraph's own SDK (`tests/langgraph/requirements.txt`),
/// for the LangGraph API's tests (docs/langgraph.md): a virtual
/// environment made once under the target directory.
pub fn langgraph_python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| venv_python("langgraph-python", "langgraph/requirements.txt"))
        .clone()
}

/// The `python` of a virtual environment `name` under the target
/// directory with `requirements` (relative to `tests/`) installed from
/// PyPI; made again when the requirements change.
fn venv_python(name: &str, requirements: &str) -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let python = venv.join("bin").join("python");
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join(requirements);
    let ready = venv.join("installed");
    let wanted = std::fs::read_to_string(&requirements)
        .unwrap_or_else(|error| panic!("{}: {error}", requirements.display()));
    if std::fs::read_to_string(&ready).ok().as_deref() == Some(wanted.as_str()) {
        return python;
    }
    let run = |command: &mut std::process::Command, what: &str| {
        let output = command
            .output()
            .unwrap_or_else(|error| panic!("{what}: {error}"));
        assert!(
            output.status.success(),
            "{what} failed (these tests need python3 with venv and pip, and PyPI):\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(
        std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv),
        "python3 -m venv",
    );
    run(
        std::process::Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "-r"])
            .arg(&requirements),
        &format!("pip install -r {}", requirements.display()),
    );
    std::fs::write(&ready, wanted).expect("the venv's marker");
    python
}

/// `tests/mcp/slow_server.py`: the tests' MCP server.
pub fn mcp_slow_server() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/slow_server.py")
}

/// The version of `@modelcontextprotocol/server-everything` (npm) the MCP
/// tests run: the reference server of the protocol's own authors.
pub const EVERYTHING_VERSION: &str = "2026.8.31";

/// `@modelcontextprotocol/server-everything`'s entry point, installed once
/// with npm under the target directory (`KEEL_TEST_EVERYTHING` names one
/// installed elsewhere); run it with `node`.
pub fn everything_server() -> PathBuf {
    static SERVER: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SERVER
        .get_or_init(|| {
            if let Some(server) = std::env::var_os("KEEL_TEST_EVERYTHING") {
                return PathBuf::from(server);
            }
            let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mcp-node");
            let entry =
                prefix.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
            let ready = prefix.join("installed");
            if std::fs::read_to_string(&ready).ok().as_deref() == Some(EVERYTHING_VERSION) {
                return entry;
            }
            std::fs::create_dir_all(&prefix).expect("the npm prefix");
            let output = Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
                .arg(&prefix)
                .arg(format!(
                    "@modelcontextprotocol/server-everything@{EVERYTHING_VERSION}"
                ))
                .output()
                .unwrap_or_else(|error| panic!("npm: {error} (the MCP tests need node and npm)"));
            assert!(
                output.status.success() && entry.is_file(),
                "npm install of server-everything failed:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            std::fs::write(&ready, EVERYTHING_VERSION).expect("the install's marker");
            entry
        })
        .clone()
}

/// The `node` that runs npm's servers: the one on `PATH`, as a path (the
/// daemon checks a server's command exists).
pub fn node() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("node"))
        .find(|candidate| candidate.is_file())
        .expect("node on PATH (the MCP tests need node and npm)")
}
