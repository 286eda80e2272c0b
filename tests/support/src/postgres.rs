//! A PostgreSQL server of a test's own, with no setup: `initdb` in a
//! temporary directory, `postgres` on a private loopback port, stopped and
//! its directory removed when the test drops it. For the PostgreSQL store
//! backend's conformance suite and the daemon's end-to-end tests over it;
//! each test starts its own, so tests share nothing and run in parallel.
//!
//! The server binaries are found on `PATH`, else in Debian's
//! `/usr/lib/postgresql/VERSION/bin`, newest version first (Debian's
//! `postgresql` package does not put them on `PATH`); `KEEL_TEST_PG_BIN`
//! names their directory outright. Without them a test prints `NOT RUN`
//! and returns, unless `KEEL_REQUIRE_POSTGRES` is set (CI sets it), which
//! makes that a failure.
//!
//! PostgreSQL refuses to run as root, and tests here and in CI run as
//! root. Then `initdb` and the server run as the `postgres` user that
//! Debian's package creates, the temporary directory is that user's, and
//! the clients (`createdb`, `pg_isready`) stay root's. The child's uid and
//! gid are set between `fork` and `exec` (`CommandExt::uid`, which also
//! drops root's supplementary groups), so no `runuser` or `setpriv` sits
//! between: the child is the postmaster itself, and its signals are the
//! server's.
//!
//! If the test process dies without dropping its `Postgres` (SIGKILL, a
//! harness's timeout, `std::process::exit`), a watchdog cleans up: an `sh`
//! in a process group of its own (so Ctrl-C spares it) reads a pipe whose
//! write end only this process holds. Dropping a `Postgres` writes `stop`
//! to it; end-of-file without that word means this process died, and the
//! watchdog SIGKILLs every process working in the data directory and
//! removes the temporary directory. Ctrl-C reaches the server itself (it
//! stays in the terminal's process group), and SIGINT is PostgreSQL's fast
//! shutdown. Only a SIGKILL of the watchdog too (a whole process tree
//! killed at once) leaves a server behind: its backends go with their
//! postmaster, and its directory, `keel-pg-*` in the temporary directory,
//! stays. A parent-death signal would not do: it fires when the *thread*
//! that started the server ends, and tokio retires idle blocking threads.

use std::fs::File;
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::child_daemon::lasting_port;
use crate::procs::processes_in;

/// Set to anything, it makes a test that finds no PostgreSQL to run fail
/// instead of saying it was not run. CI sets it, and installs PostgreSQL.
pub const REQUIRE_ENV: &str = "KEEL_REQUIRE_POSTGRES";

/// The directory holding `initdb` and `postgres`, instead of looking for
/// them.
pub const BIN_ENV: &str = "KEEL_TEST_PG_BIN";

/// Where Debian's `postgresql-VERSION` packages put each version's
/// binaries, in `VERSION/bin`.
const DEBIAN_VERSIONS: &str = "/usr/lib/postgresql";

/// The superuser `initdb` creates, who every URL here connects as; also
/// the name of the database every cluster has.
const SUPERUSER: &str = "postgres";

/// Who runs the server when this process is root: the user Debian's
/// package creates.
const SERVER_USER: &str = "postgres";

/// How long a server may take to accept connections: generous, since many
/// tests may start servers at once on a small machine.
const READY_PATIENCE: Duration = Duration::from_secs(60);

/// How long a fast shutdown may take (a checkpoint of a test's data)
/// before an immediate one, and that before SIGKILL.
const STOP_PATIENCE: Duration = Duration::from_secs(20);
const IMMEDIATE_PATIENCE: Duration = Duration::from_secs(5);

/// How long the processes of a server whose postmaster is gone may take to
/// vanish once killed.
const GONE_PATIENCE: Duration = Duration::from_secs(10);

/// How many ports a start tries when another process takes the one chosen
/// before the server binds it; how many times a restart tries its own
/// port. Port allocation, not a retry of a flaky test.
const PORT_ATTEMPTS: u32 = 5;

/// The line a server logs once it accepts connections (in English: the
/// server runs with `lc_messages=C`).
const READY_LINE: &str = "database system is ready to accept connections";

/// The server's settings beside its port and socket directory: small and
/// fast, since many tests start servers at once on a two-core machine.
const SETTINGS: &[(&str, &str)] = &[
    ("listen_addresses", "127.0.0.1"),
    // Nothing flushed to disk: a test's data must outlive a crash of the
    // server, which the kernel's page cache does, never one of the
    // machine. Torn pages, which full-page writes repair, come only from
    // the machine's crash too. `synchronous_commit` stays on: a commit is
    // written to the WAL before it returns, so a SIGKILL of the server
    // loses no acknowledged commit and the crash tests mean something.
    ("fsync", "off"),
    ("full_page_writes", "off"),
    ("max_connections", "200"),
    ("shared_buffers", "16MB"),
    // No replication, so the least WAL.
    ("wal_level", "minimal"),
    ("max_wal_senders", "0"),
    // No parallel query workers: two cores shared by many servers.
    ("max_parallel_workers_per_gather", "0"),
    // Dynamic shared memory in files under the data directory rather than
    // in `/dev/shm`: removed with it however the server ended (a killed
    // one's would stay in `/dev/shm`), and no container's small `/dev/shm`
    // shared by many servers.
    ("dynamic_shared_memory_type", "mmap"),
    // A connection that never sends its start-up packet holds a backend
    // this long, and one arriving during a shutdown holds the postmaster
    // too: ten seconds rather than a minute bounds how long a drop waits
    // on a test's half-open socket.
    ("authentication_timeout", "10s"),
    // The log in English whatever the locale: start-up reads it.
    ("lc_messages", "C"),
];

/// What the watchdog runs (`sh -c`, with the data directory as `$1` and
/// the temporary directory as `$2`; see the module's doc). It ignores the
/// terminal's signals, waits for `stop` or end-of-file, and on end-of-file
/// kills every process working in the data directory (twice, a second
/// apart, in case the postmaster forked one meanwhile), removes the killed
/// server's System V shared memory segment (`Postgres::remove_crash_remains`
/// says why) and the temporary directory.
const WATCHDOG: &str = r#"trap '' HUP INT TERM
read -r word
[ "$word" = stop ] && exit 0
for round in 1 2; do
  for process in /proc/[0-9]*; do
    if [ "$(readlink "$process/cwd" 2>/dev/null)" = "$1" ]; then
      kill -KILL "${process#/proc/}" 2>/dev/null
    fi
  done
  sleep 1
done
set -- "$1" "$2" $(sed -n 7p "$1/postmaster.pid" 2>/dev/null)
[ -n "$4" ] && ipcrm -m "$4" 2>/dev/null
rm -rf "$2""#;

/// A PostgreSQL server of this test's own on `127.0.0.1`, trusting every
/// local connection as the superuser `postgres`. Dropping it stops the
/// server (fast shutdown, then SIGKILL if need be) and removes its
/// directory; no process of it outlives the drop. Its methods and its drop
/// block (they run programs and wait on them), on any thread: from async
/// code, where blocking is fine (`spawn_blocking`, a multi-threaded
/// runtime).
#[derive(Debug)]
pub struct Postgres {
    /// The directory holding `initdb` and `postgres` (the real one, where
    /// `PATH` held symlinks), and usually the clients.
    bin: PathBuf,
    /// The uid and gid the server runs as: `postgres`'s when this process
    /// is root, `None` for this process's own.
    user: Option<(u32, u32)>,
    /// The temporary directory, canonical: the cluster in `data/`, the
    /// Unix socket, and each life's log.
    dir: PathBuf,
    /// `dir/data`: the cluster, and the working directory of every process
    /// of the server (which is how they are found).
    data: PathBuf,
    /// Every life listens here.
    port: u16,
    /// The number of the current (or last) life; 0 before the first. Each
    /// life logs to `dir/server-N.log`.
    life: u32,
    /// The running postmaster, a child of this process.
    server: Option<Child>,
    /// The `sh` that kills the server and removes `dir` if this process
    /// dies without dropping this (see the module's doc).
    watchdog: Option<Child>,
}

impl Postgres {
    /// A new cluster in a temporary directory and a server on it, accepting
    /// connections. `None` after printing `NOT RUN: …` when this machine
    /// cannot run PostgreSQL (no server binaries; root with no `postgres`
    /// user), or a panic saying so if `KEEL_REQUIRE_POSTGRES` is set.
    /// Panics, with the server's log, if the server fails to start.
    pub fn start() -> Option<Postgres> {
        let (bin, user) = match installation() {
            Ok(found) => found,
            Err(missing) => {
                missing.report();
                return None;
            }
        };
        let dir = temporary_dir(user);
        let mut postgres = Postgres {
            bin,
            user,
            data: dir.join("data"),
            dir,
            port: 0,
            life: 0,
            server: None,
            watchdog: None,
        };
        // From here on, Drop (or the watchdog) cleans up whatever happens.
        postgres.watchdog = Some(postgres.watch());
        postgres.initdb();
        postgres.launch_on_a_free_port();
        Some(postgres)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`: the database every
    /// cluster has, as the superuser.
    pub fn url(&self) -> String {
        self.url_of(SUPERUSER)
    }

    /// The loopback port every life of the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The running postmaster's pid.
    pub fn pid(&self) -> Option<u32> {
        self.server.as_ref().map(Child::id)
    }

    /// The temporary directory the cluster lives in; gone after the drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Create the database `name` and return its URL (as [`Postgres::url`]
    /// with `name` for `postgres`). `name` is ASCII letters, digits, `_`
    /// and `-`, at most 63 bytes, so that the URL holds it as it is.
    /// Panics if it exists already.
    pub fn database(&self, name: &str) -> String {
        assert!(
            is_plain_name(name),
            "database name {name:?}: use ASCII letters, digits, `_` and `-`, at most 63 bytes"
        );
        let createdb = self.client("createdb").unwrap_or_else(|| {
            panic!(
                "no createdb beside {} or on PATH (apt-get install postgresql-client)",
                self.bin.display()
            )
        });
        let output = client_command(&createdb)
            .args(self.connection_args())
            // Trust needs none; never wait on a prompt.
            .arg("--no-password")
            .arg(name)
            .output()
            .unwrap_or_else(|error| panic!("running {}: {error}", createdb.display()));
        assert!(
            output.status.success(),
            "createdb {name} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        self.url_of(name)
    }

    /// Kill the server as a crash would: SIGKILL to the postmaster and to
    /// every other process of the server, with no shutdown checkpoint.
    /// Returns once they are all gone; [`Postgres::restart`] starts it
    /// again, recovering from the WAL. Nothing when it is not running.
    pub fn kill(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        self.bury_or_panic();
    }

    /// Stop the server cleanly: PostgreSQL's fast shutdown (SIGINT, which
    /// ends open sessions, where SIGTERM's smart shutdown would wait for
    /// every client to leave), then an immediate one, then SIGKILL, each
    /// when the one before takes too long. Nothing when it is not running.
    pub fn stop(&mut self) {
        self.shut_down();
        self.bury_or_panic();
    }

    /// Start the server again on the same data directory and port (cleanly
    /// stopped first if it runs), and wait until it accepts connections.
    /// Panics, with its log, if it cannot start, or if another process
    /// holds its port for long.
    pub fn restart(&mut self) {
        self.stop();
        for attempt in 1..=PORT_ATTEMPTS {
            match self.launch() {
                Ok(()) => return,
                Err(log) if attempt == PORT_ATTEMPTS => panic!(
                    "PostgreSQL cannot restart on port {}; its log:\n{log}",
                    self.port
                ),
                Err(log) if stale_lock(&log) => self.remove_crash_remains(),
                Err(_) => std::thread::sleep(Duration::from_millis(200) * attempt),
            }
        }
    }

    fn url_of(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// How a client reaches the server: over TCP, as the superuser.
    fn connection_args(&self) -> [String; 6] {
        [
            "--host",
            "127.0.0.1",
            "--port",
            &self.port.to_string(),
            "--username",
            SUPERUSER,
        ]
        .map(str::to_owned)
    }

    /// The client program `name`: beside the server's binaries, else on
    /// `PATH` (Debian's `postgresql-client` puts its wrappers in
    /// `/usr/bin`).
    fn client(&self, name: &str) -> Option<PathBuf> {
        let beside = self.bin.join(name);
        if is_executable(&beside) {
            return Some(beside);
        }
        on_path(name)
    }

    /// `program` run as the server's user, in the temporary directory.
    fn as_server(&self, program: &Path) -> Command {
        let mut command = client_command(program);
        command.current_dir(&self.dir);
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command
    }

    /// Start the watchdog (see the module's doc).
    fn watch(&self) -> Child {
        Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("keel-postgres-watchdog")
            .arg(&self.data)
            .arg(&self.dir)
            .current_dir("/")
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("starting the PostgreSQL watchdog (sh): {error}"))
    }

    fn initdb(&self) {
        let initdb = self.bin.join("initdb");
        let mut command = self.as_server(&initdb);
        command
            .arg("--pgdata")
            .arg(&self.data)
            .args(["--username", SUPERUSER, "--auth=trust"])
            // A test's cluster need not survive a crash of the machine.
            .arg("--no-sync")
            .args(["--encoding=UTF8", "--no-locale"]);
        if help_mentions(&initdb, "--no-instructions") {
            command.arg("--no-instructions");
        }
        let output = command
            .output()
            .unwrap_or_else(|error| panic!("running {}: {error}", initdb.display()));
        assert!(
            output.status.success(),
            "initdb failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The first life, on a free port; another port if someone took the
    /// one chosen before the server bound it.
    fn launch_on_a_free_port(&mut self) {
        let mut taken = Vec::new();
        for _ in 0..PORT_ATTEMPTS {
            self.port = lasting_port().unwrap_or_else(|error| panic!("{error:#}"));
            match self.launch() {
                Ok(()) => return,
                Err(log) if port_taken(&log) => taken.push(self.port),
                Err(log) => panic!("PostgreSQL refused a new cluster; its log:\n{log}"),
            }
        }
        panic!("PostgreSQL found each port it tried taken: {taken:?}");
    }

    /// Start the next life on `self.port` and wait until it accepts
    /// connections. `Err` with its log when it may start if tried again:
    /// another process held the port, or a lock file names a pid that
    /// another process took after the last life was killed. A panic with
    /// its log for any other failure.
    fn launch(&mut self) -> Result<(), String> {
        self.life += 1;
        let log_path = self.log_path();
        let log = File::create(&log_path)
            .unwrap_or_else(|error| panic!("creating {}: {error}", log_path.display()));
        let log_too = log
            .try_clone()
            .unwrap_or_else(|error| panic!("sharing {}: {error}", log_path.display()));
        let postgres = self.bin.join("postgres");
        let mut command = self.as_server(&postgres);
        command
            .arg("-D")
            .arg(&self.data)
            .args(["-p", &self.port.to_string()])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()));
        for (name, value) in SETTINGS {
            command.arg("-c").arg(format!("{name}={value}"));
        }
        let server = command
            .stdout(log_too)
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| panic!("starting {}: {error}", postgres.display()));
        self.server = Some(server);
        self.wait_until_ready()
    }

    fn wait_until_ready(&mut self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let exited = match self.server.as_mut().map(Child::try_wait) {
                Some(Ok(status)) => status,
                Some(Err(error)) => panic!("waiting for PostgreSQL: {error}"),
                None => panic!("invariant: a server was just started"),
            };
            if let Some(status) = exited {
                self.server = None;
                let log = self.log();
                if port_taken(&log) || (stale_lock(&log) && processes_in(&self.data).is_empty()) {
                    return Err(log);
                }
                panic!(
                    "PostgreSQL exited with {status} while starting on port {}; its log:\n{log}",
                    self.port
                );
            }
            if self.accepts_connections() {
                return Ok(());
            }
            if started.elapsed() > READY_PATIENCE {
                panic!(
                    "PostgreSQL did not accept connections on port {} within {READY_PATIENCE:?}; \
                     its log:\n{}",
                    self.port,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether this life is ready: its log says so, a TCP connection is
    /// accepted, and `pg_isready` (where found) agrees.
    fn accepts_connections(&self) -> bool {
        let address = SocketAddr::from(([127, 0, 0, 1], self.port));
        self.log().contains(READY_LINE)
            && TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok()
            && self.client("pg_isready").is_none_or(|pg_isready| {
                client_command(&pg_isready)
                    .args(self.connection_args())
                    .args(["--dbname", SUPERUSER, "--timeout=5", "--quiet"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|status| status.success())
            })
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("server-{}.log", self.life))
    }

    /// This life's log so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Stop the postmaster (fast, then immediate, then SIGKILL) and reap
    /// it. It is this process's child and unreaped until then, so its pid
    /// cannot have gone to another process.
    fn shut_down(&mut self) {
        let Some(mut server) = self.server.take() else {
            return;
        };
        let pid = i32::try_from(server.id()).map(nix::unistd::Pid::from_raw);
        for (signal, patience) in [
            (Signal::SIGINT, STOP_PATIENCE),
            (Signal::SIGQUIT, IMMEDIATE_PATIENCE),
        ] {
            if matches!(server.try_wait(), Ok(Some(_))) {
                return;
            }
            if let Ok(pid) = pid {
                let _ = nix::sys::signal::kill(pid, signal);
            }
            if exits_within(&mut server, patience) {
                return;
            }
        }
        let _ = server.kill();
        let _ = server.wait();
    }

    /// SIGKILL every process still working in the data directory (a
    /// killed postmaster's backends, which notice its death only in their
    /// own time) until none is left; the processes left after
    /// [`GONE_PATIENCE`].
    fn bury(&mut self) -> Vec<u32> {
        let started = Instant::now();
        loop {
            let left = processes_in(&self.data);
            if left.is_empty() {
                break;
            }
            if started.elapsed() > GONE_PATIENCE {
                return left;
            }
            for pid in left {
                if let Ok(pid) = i32::try_from(pid) {
                    let _ =
                        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Vec::new()
    }

    /// What a killed server leaves, once none of its processes is left:
    /// its lock files, and the small System V shared memory segment every
    /// server holds, which only the server removes (at a clean stop, or
    /// at the next start on the same data directory, which finds it
    /// through `postmaster.pid`). Left, each killed server's would count
    /// against the machine's limit of segments for good. The lock files
    /// go too because a restart would refuse them once another process of
    /// the server's user takes the dead postmaster's pid.
    fn remove_crash_remains(&self) {
        let lock = self.data.join("postmaster.pid");
        // Its seventh line is the segment's key and id.
        let segment = std::fs::read_to_string(&lock).ok().and_then(|text| {
            let line = text.lines().nth(6)?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        });
        if let (Some(segment), Some(ipcrm)) = (segment, on_path("ipcrm")) {
            let _ = Command::new(ipcrm)
                .args(["-m", &segment.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_file(lock);
        let _ = std::fs::remove_file(self.dir.join(format!(".s.PGSQL.{}.lock", self.port)));
    }

    fn bury_or_panic(&mut self) {
        let left = self.bury();
        assert!(
            left.is_empty(),
            "PostgreSQL processes {left:?} outlived SIGKILL for {GONE_PATIENCE:?}"
        );
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.shut_down();
        let left = self.bury();
        if left.is_empty() {
            self.remove_crash_remains();
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            if left.is_empty() {
                if let Some(mut stdin) = watchdog.stdin.take() {
                    let _ = stdin.write_all(b"stop\n");
                }
                let _ = watchdog.wait();
            } else {
                // Not a panic in a drop. The watchdog, its pipe closed
                // without `stop`, tries once more and removes the
                // directory; it is not waited for.
                eprintln!(
                    "PostgreSQL processes {left:?} in {} outlived SIGKILL; left to its watchdog",
                    self.data.display()
                );
                drop(watchdog.stdin.take());
                return;
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Why this machine cannot run a server of a test's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// No `initdb` and `postgres`.
    Binaries,
    /// This process is root, which PostgreSQL refuses, and there is no
    /// `postgres` user to run it as.
    ServerUser,
}

impl Missing {
    /// Fail if `KEEL_REQUIRE_POSTGRES` is set, else say which test is not
    /// run and why.
    fn report(self) {
        let (why, remedy) = match self {
            Missing::Binaries => (
                "no PostgreSQL server binaries were found",
                "apt-get install postgresql",
            ),
            Missing::ServerUser => (
                "PostgreSQL refuses to run as root and there is no `postgres` user to run it as",
                "apt-get install postgresql creates one",
            ),
        };
        assert!(
            std::env::var_os(REQUIRE_ENV).is_none(),
            "{REQUIRE_ENV} is set but {why} ({remedy})"
        );
        // libtest names each test's thread after the test.
        let current = std::thread::current();
        let test = current.name().filter(|name| *name != "main");
        let test = test.map_or("this test".to_owned(), |name| format!("`{name}`"));
        match self {
            Missing::Binaries => eprintln!(
                "NOT RUN: {test} needs PostgreSQL's server binaries (apt-get install postgresql, \
                 or {BIN_ENV}=/path/to/bin)"
            ),
            Missing::ServerUser => eprintln!(
                "NOT RUN: {test} needs PostgreSQL, which refuses to run as root, and there is no \
                 `postgres` user to run it as (apt-get install postgresql creates one, or run the \
                 tests as another user)"
            ),
        }
    }
}

/// The server binaries' directory, and the uid and gid to run them as.
fn installation() -> Result<(PathBuf, Option<(u32, u32)>), Missing> {
    let bin = server_bin().ok_or(Missing::Binaries)?;
    if !nix::unistd::geteuid().is_root() {
        return Ok((bin, None));
    }
    let user = nix::unistd::User::from_name(SERVER_USER)
        .ok()
        .flatten()
        .ok_or(Missing::ServerUser)?;
    Ok((bin, Some((user.uid.as_raw(), user.gid.as_raw()))))
}

/// `KEEL_TEST_PG_BIN` (a panic if it holds no server), else the first
/// directory on `PATH` holding one, else Debian's newest version's.
fn server_bin() -> Option<PathBuf> {
    if let Some(explicit) = std::env::var_os(BIN_ENV) {
        let explicit = PathBuf::from(explicit);
        let found = holds_server(&explicit);
        assert!(
            found.is_some(),
            "{BIN_ENV}={} holds no initdb and postgres",
            explicit.display()
        );
        return found;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let debian = std::fs::read_dir(DEBIAN_VERSIONS)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok());
    std::env::split_paths(&path)
        .chain(
            newest_first(debian)
                .into_iter()
                .map(|version| Path::new(DEBIAN_VERSIONS).join(version).join("bin")),
        )
        .find_map(|dir| holds_server(&dir))
}

/// Debian's version directories (`15`, `9.6`), newest first; names that
/// are not versions left out.
fn newest_first(names: impl Iterator<Item = String>) -> Vec<String> {
    let mut versions: Vec<(Vec<u32>, String)> = names
        .filter_map(|name| {
            let numbers = name
                .split('.')
                .map(|part| part.parse().ok())
                .collect::<Option<Vec<u32>>>()?;
            Some((numbers, name))
        })
        .collect();
    versions.sort_by(|left, right| right.0.cmp(&left.0));
    versions.into_iter().map(|(_, name)| name).collect()
}

/// `dir` when it holds `initdb` and `postgres`; the directory `postgres`
/// really lives in when that holds `initdb` too (a `PATH` directory of
/// symlinks to Debian's binaries does not hold the clients beside them).
fn holds_server(dir: &Path) -> Option<PathBuf> {
    let postgres = dir.join("postgres");
    if !is_executable(&dir.join("initdb")) || !is_executable(&postgres) {
        return None;
    }
    let real = std::fs::canonicalize(&postgres)
        .ok()
        .and_then(|path| Some(path.parent()?.to_path_buf()))
        .filter(|real| is_executable(&real.join("initdb")));
    Some(real.unwrap_or_else(|| dir.to_path_buf()))
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .is_ok_and(|metadata| metadata.is_file() && metadata.permissions().mode() & 0o111 != 0)
}

/// Whether `program --help` mentions `option`.
fn help_mentions(program: &Path, option: &str) -> bool {
    client_command(program)
        .arg("--help")
        .output()
        .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).contains(option))
}

/// `program` with none of the caller's `PG*` variables (a `PGHOST`,
/// `PGPORT` or `PGSSLMODE` of the developer's would send it elsewhere),
/// messages in English, and no stdin.
fn client_command(program: &Path) -> Command {
    let mut command = Command::new(program);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PG") {
            command.env_remove(name);
        }
    }
    command.env("LC_ALL", "C").stdin(Stdio::null());
    command
}

/// Whether the server's log says it could not bind its port.
fn port_taken(log: &str) -> bool {
    log.contains("could not create any TCP/IP sockets") || log.contains("Address already in use")
}

/// Whether the server's log says a lock file names a live process: after
/// a kill, another process that took the dead postmaster's pid.
fn stale_lock(log: &str) -> bool {
    log.contains("lock file") && log.contains("already exists")
}

fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

/// A new directory `keel-pg-RANDOM` (mode 0700, canonical) in the
/// temporary directory, the server user's when there is one. That user
/// must reach it: where root's temporary directory is closed to others
/// (a `TMPDIR` under `/root`), `/tmp` serves instead.
fn temporary_dir(user: Option<(u32, u32)>) -> PathBuf {
    let mut base = std::env::temp_dir();
    if user.is_some() && !open_to_others(&base) {
        base = PathBuf::from("/tmp");
    }
    let dir = loop {
        let dir = base.join(format!("keel-pg-{:016x}", fastrand::u64(..)));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => break dir,
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(error) => panic!("creating {}: {error}", dir.display()),
        }
    };
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .unwrap_or_else(|error| panic!("giving {} to {SERVER_USER}: {error}", dir.display()));
    }
    // The server's processes are found by their working directory, which
    // the kernel reports canonical.
    std::fs::canonicalize(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
}

/// Whether others may pass through `dir` and every directory above it.
fn open_to_others(dir: &Path) -> bool {
    std::fs::canonicalize(dir).is_ok_and(|dir| {
        dir.ancestors().all(|ancestor| {
            std::fs::metadata(ancestor)
                .is_ok_and(|metadata| metadata.permissions().mode() & 0o001 != 0)
        })
    })
}

/// Whether `child` exits within `patience`; it is reaped if so.
fn exits_within(child: &mut Child, patience: Duration) -> bool {
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if started.elapsed() >= patience => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[cfg(test)]
mod tests;
