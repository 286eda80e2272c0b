//! Kernel confinement for the processes tools start (docs/sandbox.md): a
//! filesystem that is read-only but for the directories a call may write
//! and blind to the ones it may not read (the daemon's data directory), no
//! IP network, and no signals or abstract sockets beyond the call's own
//! processes. Enforced by the kernel, inherited by everything the process
//! starts, and never silently skipped: a kernel that cannot enforce it is
//! an error, not an unconfined process.
//!
//! *How, without unsafe code.* Landlock's `landlock_restrict_self` and a
//! seccomp filter both confine the calling *thread* and every process it
//! starts afterwards. [`spawn_confined`] starts the process from a thread
//! of its own that confines itself first and ends right after, so the
//! rest of the spawning process stays free; no `pre_exec` hook runs after
//! `fork` (which the workspace's `forbid(unsafe_code)` rules out anyway).
//!
//! - Filesystem: Landlock rules allow reading (and executing) everything
//!   beneath `/` except the hidden paths, and everything beneath the
//!   writable ones. Landlock only allows, so "all but the data directory"
//!   is every sibling along the path down to it; its ancestors themselves
//!   cannot be listed then (`ls /` fails where `/` holds a hidden path's
//!   ancestor), reading files elsewhere works.
//! - Network: Landlock (ABI 4) refuses TCP bind and connect with no port
//!   allowed; a seccomp filter refuses IP sockets of any kind (UDP is not
//!   Landlock's) and `io_uring_setup` (whose requests could open sockets
//!   without the `socket` syscall).
//! - Scopes (ABI 6): signals only to processes in the same domain (the
//!   call's own), abstract Unix sockets only within it.
//!
//! Not yet wired to tools (issue 30 goes on): the policy per conversation,
//! the spawner's protocol carrying it, and the file tools obeying it.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The Landlock ABI keel's rules are written for: 6 adds the signal and
/// abstract-socket scopes to 4's TCP rules and 5's device ioctls.
const ABI_NEEDED: ABI = ABI::V6;

/// What a confined process may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confinement {
    /// Directories (or files) it may write beneath, besides reading.
    pub writable: Vec<PathBuf>,
    /// Paths it may neither read nor write (the daemon's data directory):
    /// nothing beneath them is reachable.
    pub hidden: Vec<PathBuf>,
    /// Whether it may use the IP network at all.
    pub network: bool,
}

/// What the running kernel can enforce, probed once at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protections {
    /// The Landlock ABI the kernel offers (`None`: no Landlock).
    pub landlock_abi: Option<u32>,
    /// Whether a seccomp filter could be installed.
    pub seccomp: bool,
}

impl Protections {
    /// Whether [`spawn_confined`] can enforce a confinement here.
    pub fn enough(&self) -> bool {
        self.landlock_abi.is_some_and(|abi| abi >= 6) && self.seccomp
    }
}

impl fmt::Display for Protections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.landlock_abi {
            Some(abi) => write!(f, "Landlock ABI {abi}")?,
            None => f.write_str("no Landlock")?,
        }
        f.write_str(if self.seccomp {
            ", seccomp"
        } else {
            ", no seccomp"
        })
    }
}

/// Why a process could not be started confined.
#[derive(Debug)]
pub enum SandboxError {
    /// The kernel cannot enforce the confinement; nothing was started.
    Unsupported { what: String },
    /// A path of the confinement cannot be opened.
    Path { path: PathBuf, error: io::Error },
    /// The process could not be started (after confining).
    Spawn(io::Error),
}

impl fmt::Display for SandboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxError::Unsupported { what } => write!(
                f,
                "this kernel cannot confine the command ({what}), so it was not run"
            ),
            SandboxError::Path { path, error } => {
                write!(f, "cannot confine to {}: {error}", path.display())
            }
            SandboxError::Spawn(error) => write!(f, "cannot start the command: {error}"),
        }
    }
}

impl std::error::Error for SandboxError {}

/// What this kernel can enforce: a thread of its own confines itself with
/// a ruleset that handles everything and a filter that allows everything,
/// and reports what took.
pub fn probe() -> Protections {
    let probed = std::thread::spawn(|| {
        let landlock = Ruleset::default()
            .handle_access(AccessFs::from_all(ABI::V1))
            .and_then(|ruleset| ruleset.create())
            .and_then(|ruleset| ruleset.restrict_self());
        let landlock_abi = match landlock {
            Ok(status) => match status.landlock {
                LandlockStatus::Available {
                    effective_abi,
                    kernel_abi,
                } => Some(kernel_abi.map_or(abi_number(effective_abi), |abi| {
                    u32::try_from(abi).unwrap_or(0)
                })),
                _ => None,
            },
            Err(_) => None,
        };
        let seccomp =
            network_filter().is_ok_and(|filter| seccompiler::apply_filter(&filter).is_ok());
        Protections {
            landlock_abi,
            seccomp,
        }
    })
    .join();
    probed.unwrap_or(Protections {
        landlock_abi: None,
        seccomp: false,
    })
}

fn abi_number(abi: ABI) -> u32 {
    match abi {
        ABI::Unsupported => 0,
        ABI::V1 => 1,
        ABI::V2 => 2,
        ABI::V3 => 3,
        ABI::V4 => 4,
        ABI::V5 => 5,
        ABI::V6 => 6,
        _ => 7,
    }
}

/// Start `command` confined as `confinement` says: from a thread that
/// confines itself first, so the process and all it starts are confined
/// and the caller is not. Nothing is started unless every restriction is
/// enforced.
pub fn spawn_confined(
    mut command: Command,
    confinement: &Confinement,
) -> Result<Child, SandboxError> {
    let confinement = confinement.clone();
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                confine_this_thread(&confinement)?;
                command.spawn().map_err(SandboxError::Spawn)
            })
            .join()
            .unwrap_or_else(|_| {
                Err(SandboxError::Unsupported {
                    what: "the confining thread failed".to_owned(),
                })
            })
    })
}

/// Confine the calling thread (and what it starts from now on).
fn confine_this_thread(confinement: &Confinement) -> Result<(), SandboxError> {
    let unsupported = |what: String| SandboxError::Unsupported { what };
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI_NEEDED))
        .and_then(|ruleset| ruleset.scope(Scope::from_all(ABI_NEEDED)))
        .map_err(|error| unsupported(format!("Landlock: {error}")))?;
    if !confinement.network {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(ABI_NEEDED))
            .map_err(|error| unsupported(format!("Landlock network: {error}")))?;
    }
    let mut created = ruleset
        .create()
        .map_err(|error| unsupported(format!("Landlock: {error}")))?;
    let hidden: Vec<PathBuf> = confinement
        .hidden
        .iter()
        .map(|path| std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()))
        .collect();
    created = allow_reading(created, readable(Path::new("/"), &hidden))?;
    for path in confinement
        .writable
        .iter()
        .chain([&PathBuf::from("/dev/null")])
    {
        let access = if path.is_dir() {
            AccessFs::from_all(ABI_NEEDED)
        } else {
            AccessFs::from_file(ABI_NEEDED)
        };
        let fd = PathFd::new(path).map_err(|error| SandboxError::Path {
            path: path.clone(),
            error: io::Error::other(error.to_string()),
        })?;
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|error| {
                unsupported(format!("Landlock rule for {}: {error}", path.display()))
            })?;
    }
    let status = created
        .restrict_self()
        .map_err(|error| unsupported(format!("Landlock: {error}")))?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(unsupported(format!(
            "Landlock enforced the rules {:?}",
            status.ruleset
        )));
    }
    if !confinement.network {
        let filter = network_filter().map_err(|error| unsupported(format!("seccomp: {error}")))?;
        seccompiler::apply_filter(&filter)
            .map_err(|error| unsupported(format!("seccomp: {error}")))?;
    }
    Ok(())
}

/// Add a rule allowing what each of `paths` allows. A path listed a
/// moment ago may be gone (another process's temporary file beside a
/// hidden path's ancestor): it allowed reading only, so it is left out,
/// which allows less.
fn allow_reading(
    mut created: RulesetCreated,
    paths: Vec<(PathBuf, landlock::BitFlags<AccessFs>)>,
) -> Result<RulesetCreated, SandboxError> {
    for (path, access) in paths {
        let Ok(fd) = PathFd::new(&path) else {
            continue;
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|error| SandboxError::Unsupported {
                what: format!("Landlock rule for {}: {error}", path.display()),
            })?;
    }
    Ok(created)
}

/// Every path beneath `root` that may be read, with what may be done
/// there: `root` whole if nothing hidden is beneath it, else its entries,
/// each the same way, leaving the hidden ones out.
fn readable(root: &Path, hidden: &[PathBuf]) -> Vec<(PathBuf, landlock::BitFlags<AccessFs>)> {
    if hidden.iter().any(|hidden| hidden == root) {
        return Vec::new();
    }
    let read = AccessFs::from_read(ABI_NEEDED);
    if !hidden.iter().any(|hidden| hidden.starts_with(root)) {
        let access = if root.is_dir() {
            read
        } else {
            read & AccessFs::from_file(ABI_NEEDED)
        };
        return vec![(root.to_owned(), access)];
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).collect();
    paths.sort();
    paths
        .iter()
        .flat_map(|path| readable(path, hidden))
        .collect()
}

/// A seccomp filter that refuses IP sockets (`socket` with `AF_INET` or
/// `AF_INET6`) and `io_uring_setup`, with `EACCES`, and allows everything
/// else.
fn network_filter() -> Result<BpfProgram, seccompiler::Error> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)?;
    let family = |value: u64| -> Result<SeccompRule, seccompiler::Error> {
        Ok(SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            value,
        )?])?)
    };
    const AF_INET: u64 = 2;
    const AF_INET6: u64 = 10;
    let filter = SeccompFilter::new(
        BTreeMap::from([
            (SYS_SOCKET, vec![family(AF_INET)?, family(AF_INET6)?]),
            // No rule: refused whatever its arguments.
            (SYS_IO_URING_SETUP, Vec::new()),
        ]),
        SeccompAction::Allow,
        SeccompAction::Errno(EACCES),
        arch,
    )?;
    Ok(filter.try_into()?)
}

const EACCES: u32 = 13;
#[cfg(target_arch = "x86_64")]
const SYS_SOCKET: i64 = 41;
#[cfg(target_arch = "x86_64")]
const SYS_IO_URING_SETUP: i64 = 425;
#[cfg(target_arch = "aarch64")]
const SYS_SOCKET: i64 = 198;
#[cfg(target_arch = "aarch64")]
const SYS_IO_URING_SETUP: i64 = 425;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A path gone between the listing and the rules (as another test's
    /// temporary directory beside a hidden one is) is left out, not an
    /// error that would refuse the command: it was there to be read only.
    #[test]
    fn a_readable_path_gone_meanwhile_is_left_out() {
        let created = Ruleset::default()
            .handle_access(AccessFs::from_all(ABI::V1))
            .and_then(|ruleset| ruleset.create())
            .unwrap();
        let read = AccessFs::from_read(ABI::V1);
        let paths = vec![
            (PathBuf::from("/nonexistent/keel-sandbox-test"), read),
            (PathBuf::from("/"), read),
        ];
        assert!(allow_reading(created, paths).is_ok());
    }
}
