//! The sandbox policy of a conversation's tools, carried out
//! (docs/sandbox.md): which policy applies to a call, and what it means
//! for the processes and file tools of that call (a [`Confinement`] for
//! `sandbox.rs` to enforce, a private temporary directory, an environment
//! without the daemon's secrets), or why the call may not run at all.
//!
//! Nothing here confines anything itself; it decides, and refuses with a
//! message for the model (naming the setting that would allow running
//! unconfined) where the kernel cannot enforce what the policy asks.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use keel_core::config::{NetworkAccess, SandboxMode, SandboxPolicy};

use crate::sandbox::{self, Confinement, Protections};

/// The daemon setting that lets conversations run unconfined.
pub const FULL_ACCESS_SETTING: &str = "KEEL_SANDBOX_FULL_ACCESS=allow";

/// What a refusal to confine adds: the settings that would run the call
/// unconfined.
pub const UNCONFINED_HINT: &str = "Tools run unconfined only under the conversation's \
     sandbox.mode full-access, which the daemon allows with KEEL_SANDBOX_FULL_ACCESS=allow";

/// Whether a spawn failed because the process could not be confined.
pub fn is_refusal(error: &std::io::Error) -> bool {
    error
        .get_ref()
        .is_some_and(|inner| inner.is::<sandbox::SandboxError>())
}

/// How a runtime confines tools: its operator's settings. The default is
/// `workspace-write` with no network and no full access.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxSettings {
    /// The policy of conversations that name none.
    pub default: SandboxPolicy,
    /// Whether a conversation may run its tools unconfined
    /// ([`SandboxMode::FullAccess`]).
    pub allow_full_access: bool,
    /// The daemon's data directory (token, store, process ledger): never
    /// visible to a tool. Confined calls' temporary directories are made
    /// in its `tmp`.
    pub data_dir: Option<PathBuf>,
    /// The port of the daemon's API, which no tool may connect to.
    pub api_port: Option<u16>,
    /// What the kernel provides; `None`: probed when the runtime opens.
    /// Tests set it to see what a kernel without Landlock does.
    pub protections: Option<Protections>,
}

/// A runtime's sandbox: its settings and what the kernel provides.
#[derive(Debug)]
pub struct ToolSandbox {
    settings: SandboxSettings,
    protections: Protections,
    /// Where confined calls' temporary directories are made.
    tmp_root: PathBuf,
    /// The daemon's API port once known (0: none), see
    /// [`ToolSandbox::block_port`].
    api_port: AtomicU32,
    /// Temporary directories of calls that ended, emptied, for later
    /// calls: making and removing one per call had the file system
    /// allocate and free an inode each time, which showed under load
    /// (docs/benchmarks.md, "The tool sandbox").
    spare_tmp: Arc<Mutex<Vec<PathBuf>>>,
}

/// The most emptied temporary directories kept for later calls.
const MAX_SPARE_TMP: usize = 256;

impl ToolSandbox {
    /// The sandbox of a runtime opened with `settings`: the kernel is
    /// probed unless they say what it provides.
    pub fn new(mut settings: SandboxSettings) -> ToolSandbox {
        // Paths as the tools will be given them: absolute, and as short as
        // the file system says.
        settings.data_dir = settings.data_dir.map(|dir| {
            std::fs::canonicalize(&dir)
                .or_else(|_| std::path::absolute(&dir))
                .unwrap_or(dir)
        });
        let protections = settings.protections.unwrap_or_else(sandbox::probe);
        let tmp_root = tmp_root(settings.data_dir.as_deref());
        // What calls that ended with a crash left there.
        let _ = std::fs::remove_dir_all(&tmp_root);
        sweep_orphans(&std::env::temp_dir());
        let api_port = AtomicU32::new(settings.api_port.map_or(0, u32::from));
        ToolSandbox {
            settings,
            protections,
            tmp_root,
            api_port,
            spare_tmp: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Keep tools from connecting to `port` (the daemon's API, known once
    /// its listener is bound) from the next call on.
    pub fn block_port(&self, port: u16) {
        self.api_port.store(u32::from(port), Ordering::Relaxed);
    }

    fn blocked_ports(&self) -> Vec<u16> {
        u16::try_from(self.api_port.load(Ordering::Relaxed))
            .ok()
            .filter(|port| *port != 0)
            .into_iter()
            .collect()
    }

    pub fn settings(&self) -> &SandboxSettings {
        &self.settings
    }

    pub fn protections(&self) -> Protections {
        self.protections
    }

    /// The policy a conversation's calls run under: its own, or the
    /// runtime's default.
    pub fn policy_of(&self, own: Option<&SandboxPolicy>) -> SandboxPolicy {
        own.cloned()
            .unwrap_or_else(|| self.settings.default.clone())
    }

    /// A temporary directory for a call: one an ended call left (emptied),
    /// else a new one.
    fn take_tmp(&self) -> Result<PathBuf, String> {
        let spare = self
            .spare_tmp
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        if let Some(path) = spare {
            return Ok(path);
        }
        let cannot = |error: std::io::Error| {
            format!(
                "cannot make the call's temporary directory in {}: {error}",
                self.tmp_root.display()
            )
        };
        create_private_dir(&self.tmp_root).map_err(cannot)?;
        if let Some(data_dir) = &self.settings.data_dir {
            // For a sweep by a later runtime, should this one not clear it
            // ([`sweep_orphans`]).
            let _ = std::fs::write(
                self.tmp_root.join(DATA_DIR_MARK),
                data_dir.as_os_str().as_encoded_bytes(),
            );
        }
        Ok(tempfile::Builder::new()
            .prefix("call-")
            .tempdir_in(&self.tmp_root)
            .map_err(cannot)?
            .keep())
    }

    /// What is hidden from every tool: the data directory.
    fn hidden(&self) -> Vec<PathBuf> {
        self.settings.data_dir.iter().cloned().collect()
    }
}

/// A runtime's directory of temporary directories goes with it: its
/// spares (emptied when their calls ended; every call has ended, as each
/// holds the sandbox), then the directory itself if nothing else is there.
/// Something else is there only when another runtime opened on the same
/// data directory meanwhile (an in-process restart), whose calls keep it.
impl Drop for ToolSandbox {
    fn drop(&mut self) {
        let spares = std::mem::take(
            &mut *self
                .spare_tmp
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for spare in spares {
            let _ = std::fs::remove_dir_all(spare);
        }
        remove_if_only_marked(&self.tmp_root);
    }
}

/// The file in a runtime's directory of temporary directories that names
/// its data directory.
const DATA_DIR_MARK: &str = ".data-dir";

/// Remove `root` if it holds nothing but its [`DATA_DIR_MARK`].
fn remove_if_only_marked(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let only_marked = entries
        .flatten()
        .all(|entry| entry.file_name() == DATA_DIR_MARK);
    if only_marked {
        let _ = std::fs::remove_file(root.join(DATA_DIR_MARK));
        let _ = std::fs::remove_dir(root);
    }
}

/// Remove the directories of temporary directories in `temp_dir` whose
/// data directory is gone: a runtime that never closed (killed, or a test
/// over a temporary data directory) left them, and none will open on that
/// data directory again to clear them. Each is named after its data
/// directory's hash; the data directory itself is in its
/// [`DATA_DIR_MARK`]. One without a mark is left alone.
fn sweep_orphans(temp_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(temp_dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .as_encoded_bytes()
            .starts_with(b"keel-tools-")
        {
            continue;
        }
        let root = entry.path();
        let Ok(named) = std::fs::read(root.join(DATA_DIR_MARK)) else {
            continue;
        };
        let Ok(named) = String::from_utf8(named) else {
            continue;
        };
        if !Path::new(&named).exists() {
            let _ = std::fs::remove_dir_all(&root);
        }
    }
}

/// Make `dir` (mode 0700) if it is not there.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(dir),
        done => done,
    }
}

/// Where a runtime makes its calls' temporary directories: beside the
/// system's temporary files, named after the data directory (so a runtime
/// opened again on it clears what a crash left), or after this process.
fn tmp_root(data_dir: Option<&Path>) -> PathBuf {
    use sha2::Digest as _;
    let name = match data_dir {
        Some(dir) => {
            let digest = sha2::Sha256::digest(dir.as_os_str().as_encoded_bytes());
            let hex: String = digest
                .iter()
                .take(8)
                .map(|byte| format!("{byte:02x}"))
                .collect();
            format!("keel-tools-{hex}")
        }
        None => format!("keel-tools-{}", std::process::id()),
    };
    std::env::temp_dir().join(name)
}

/// One call's sandbox: its runtime's and its conversation's policy.
#[derive(Debug, Clone)]
pub struct CallSandbox {
    pub runtime: Arc<ToolSandbox>,
    pub policy: SandboxPolicy,
}

/// What a call's process runs with.
#[derive(Debug)]
pub struct Prepared {
    /// `None`: unconfined (full access).
    pub confinement: Option<Confinement>,
    /// The environment it gets: the runtime's without its secrets, with
    /// `TMPDIR` its private temporary directory.
    pub env: Vec<(OsString, OsString)>,
    /// Removed (with what the call left there) when dropped.
    _tmp: Option<PrivateTmp>,
}

/// A call's temporary directory: emptied when dropped and kept for a
/// later call, or removed.
#[derive(Debug)]
struct PrivateTmp {
    path: PathBuf,
    spare: Arc<Mutex<Vec<PathBuf>>>,
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        if empty(&self.path).is_ok() {
            let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
            if spare.len() < MAX_SPARE_TMP {
                spare.push(std::mem::take(&mut self.path));
                return;
            }
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Remove everything in `dir`, keeping `dir`.
fn empty(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

impl CallSandbox {
    /// A sandbox that confines nothing (full access allowed), for tests and
    /// callers that run tools outside a runtime.
    pub fn unconfined() -> CallSandbox {
        CallSandbox {
            runtime: Arc::new(ToolSandbox::new(SandboxSettings {
                default: SandboxPolicy {
                    mode: SandboxMode::FullAccess,
                    network: NetworkAccess::All,
                },
                allow_full_access: true,
                protections: Some(Protections {
                    landlock_abi: None,
                    seccomp: false,
                }),
                ..SandboxSettings::default()
            })),
            policy: SandboxPolicy {
                mode: SandboxMode::FullAccess,
                network: NetworkAccess::All,
            },
        }
    }

    /// Whether the policy lets the file tools write in the working
    /// directory; `Err` says why not, for the model.
    pub fn may_write(&self) -> Result<(), String> {
        match self.policy.mode {
            SandboxMode::ReadOnly => Err("this conversation's sandbox is read-only, so its \
                 tools write nothing (its sandbox.mode can be changed to workspace-write)"
                .to_owned()),
            SandboxMode::WorkspaceWrite | SandboxMode::FullAccess => {
                self.full_access_allowed()?;
                Ok(())
            }
        }
    }

    /// Whether the call's processes and file tools are to be confined
    /// (not under `full-access`), or why the call may not run at all.
    fn must_confine(&self) -> Result<bool, String> {
        self.full_access_allowed()?;
        if self.policy.mode == SandboxMode::FullAccess {
            return Ok(false);
        }
        if !self.runtime.protections.enough() {
            return Err(self.cannot_confine());
        }
        Ok(true)
    }

    fn full_access_allowed(&self) -> Result<(), String> {
        if self.policy.mode == SandboxMode::FullAccess && !self.runtime.settings.allow_full_access {
            return Err(format!(
                "this conversation's sandbox is full-access, which this daemon does not allow \
                 ({FULL_ACCESS_SETTING} in its configuration does), so nothing was run"
            ));
        }
        Ok(())
    }

    /// Why this kernel cannot confine the call, naming the settings that
    /// would let it run unconfined.
    fn cannot_confine(&self) -> String {
        format!(
            "this kernel cannot confine tools ({}; the sandbox needs Landlock ABI 6, Linux \
             6.10 or later, and seccomp), and this conversation's sandbox is {}, so nothing \
             was run. {UNCONFINED_HINT}",
            self.runtime.protections,
            self.policy.mode.as_str()
        )
    }

    /// The confinement of the file tools' thread: `None` when unconfined.
    pub fn file_confinement(&self, cwd: &Path) -> Result<Option<Confinement>, String> {
        if !self.must_confine()? {
            return Ok(None);
        }
        Ok(Some(Confinement {
            writable: match self.policy.mode {
                SandboxMode::WorkspaceWrite => vec![cwd.to_owned()],
                SandboxMode::ReadOnly | SandboxMode::FullAccess => Vec::new(),
            },
            hidden: self.runtime.hidden(),
            network: NetworkAccess::Off,
            blocked_ports: Vec::new(),
        }))
    }

    /// Paths the file tools must refuse whatever Landlock does (it cannot
    /// hide a path beneath the working directory the tools may write).
    pub fn forbidden(&self) -> Vec<PathBuf> {
        self.runtime.hidden()
    }

    /// Prepare a call's process: its confinement, its private temporary
    /// directory and its environment (plus `extra`), or why it may not run.
    pub fn prepare(&self, cwd: &Path, extra: &[(OsString, OsString)]) -> Result<Prepared, String> {
        let confine = self.must_confine()?;
        let mut env = sandbox::tool_environment();
        env.extend(extra.iter().cloned());
        if !confine {
            return Ok(Prepared {
                confinement: None,
                env,
                _tmp: None,
            });
        }
        let tmp = PrivateTmp {
            path: self.runtime.take_tmp()?,
            spare: self.runtime.spare_tmp.clone(),
        };
        for name in ["TMPDIR", "TMP", "TEMP"] {
            env.retain(|(key, _)| key != name);
            env.push((name.into(), tmp.path.as_os_str().to_owned()));
        }
        // A list of hosts: the call's only way out is keel's proxy.
        if let NetworkAccess::Hosts(allowed) = &self.policy.network {
            env.retain(|(key, _)| !sandbox::PROXY_VARIABLES.iter().any(|name| key == *name));
            env.extend(
                sandbox::proxy_environment(allowed)
                    .into_iter()
                    .map(|(name, value)| (name.into(), value.into())),
            );
        }
        let mut writable = vec![tmp.path.clone()];
        if self.policy.mode == SandboxMode::WorkspaceWrite {
            writable.push(cwd.to_owned());
        }
        Ok(Prepared {
            confinement: Some(Confinement {
                writable,
                hidden: self.runtime.hidden(),
                network: self.policy.network.clone(),
                blocked_ports: self.runtime.blocked_ports(),
            }),
            env,
            _tmp: Some(tmp),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A call's temporary directory serves a later call once the first is
    /// over, emptied: nothing one call left there is seen by the next.
    #[test]
    fn a_temporary_directory_is_emptied_and_kept_for_a_later_call() {
        let data = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let runtime = Arc::new(ToolSandbox::new(SandboxSettings {
            data_dir: Some(data.path().to_owned()),
            protections: Some(Protections {
                landlock_abi: Some(7),
                seccomp: true,
            }),
            ..SandboxSettings::default()
        }));
        let call = CallSandbox {
            policy: runtime.policy_of(None),
            runtime,
        };
        let tmpdir = |prepared: &Prepared| {
            prepared
                .env
                .iter()
                .find(|(name, _)| name == "TMPDIR")
                .map(|(_, value)| PathBuf::from(value))
                .unwrap()
        };
        let first = call.prepare(work.path(), &[]).unwrap();
        let dir = tmpdir(&first);
        std::fs::write(dir.join("left"), "x").unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub").join("deep"), "x").unwrap();
        // Two at once get two directories.
        let beside = call.prepare(work.path(), &[]).unwrap();
        assert_ne!(tmpdir(&beside), dir);
        drop(first);
        let second = call.prepare(work.path(), &[]).unwrap();
        assert_eq!(tmpdir(&second), dir, "kept for the next call");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "and emptied");
        drop((second, beside));
    }

    /// A runtime's temporary directories go when it does, and so do those
    /// of runtimes whose data directory is gone; another runtime's, whose
    /// data directory is there, stay.
    #[test]
    fn temporary_directories_do_not_outlive_their_runtime() {
        let settings = |data: &Path| SandboxSettings {
            data_dir: Some(data.to_owned()),
            protections: Some(Protections {
                landlock_abi: Some(7),
                seccomp: true,
            }),
            ..SandboxSettings::default()
        };
        let work = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        let runtime = Arc::new(ToolSandbox::new(settings(data.path())));
        let root = runtime.tmp_root.clone();
        let call = CallSandbox {
            policy: runtime.policy_of(None),
            runtime,
        };
        let prepared = call.prepare(work.path(), &[]).unwrap();
        assert!(root.is_dir());
        drop((prepared, call));
        assert!(!root.exists(), "removed with its runtime");

        // Two runtimes left theirs (killed); one's data directory is gone.
        let kept_data = tempfile::tempdir().unwrap();
        let gone_data = tempfile::tempdir().unwrap();
        let mut left = Vec::new();
        for data in [kept_data.path(), gone_data.path()] {
            let runtime = Arc::new(ToolSandbox::new(settings(data)));
            let call = CallSandbox {
                policy: runtime.policy_of(None),
                runtime,
            };
            let prepared = call.prepare(work.path(), &[]).unwrap();
            left.push(call.runtime.tmp_root.clone());
            // As a kill leaves it: nothing dropped.
            std::mem::forget((prepared, call));
        }
        let gone = gone_data.path().to_owned();
        drop(gone_data);
        assert!(!gone.exists());
        sweep_orphans(&std::env::temp_dir());
        assert!(left[0].is_dir(), "its data directory is there");
        assert!(!left[1].exists(), "its data directory is gone");
        let _ = std::fs::remove_dir_all(&left[0]);
    }
}
