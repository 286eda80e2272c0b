//! Kernel confinement for the processes tools start (docs/sandbox.md): a
//! filesystem that is read-only but for the directories a call may write
//! and blind to the ones it may not read (the daemon's data directory), no
//! IP network unless the policy allows it (and never the daemon's own
//! port), no signals or abstract sockets beyond the call's own processes,
//! and no leaving the call's process group. Enforced by the kernel,
//! inherited by everything the process starts, and never silently skipped:
//! a kernel that cannot enforce it is an error, not an unconfined process.
//!
//! *How, without unsafe code.* Landlock's `landlock_restrict_self` and a
//! seccomp filter both confine the calling *thread* and every process it
//! starts afterwards. [`spawn_confined`] starts the process from a thread
//! of its own that confines itself first and ends right after, so the
//! rest of the spawning process stays free; no `pre_exec` hook runs after
//! `fork` (which the workspace's `forbid(unsafe_code)` rules out anyway).
//! The file tools confine their own short-lived threads the same way
//! ([`confine_files`]).
//!
//! - Filesystem: Landlock rules allow reading (and executing) everything
//!   beneath `/` except the hidden paths and `/dev` (but its harmless
//!   devices), and everything beneath the writable ones. Landlock only
//!   allows, so "all but the data directory" is every sibling along the
//!   path down to it; its ancestors themselves cannot be listed then (`ls
//!   /` fails where `/` holds a hidden path's ancestor), reading files
//!   elsewhere works. A hidden path beneath a writable one cannot be hidden
//!   that way; the spawner process hides the data directory in a mount
//!   namespace of its own ([`hide_in_namespace`]), and a process that has
//!   not refuses to start the command.
//! - Network: a Landlock layer of its own (built once per policy and
//!   reused: "every port but the daemon's" is 65,534 rules) allows TCP
//!   connections to the allowed ports; a seccomp filter refuses sockets of
//!   the families and types Landlock does not cover (UDP, raw, packet).
//! - Scopes (ABI 6): signals only to processes in the same domain (the
//!   call's own), abstract Unix sockets only within it.
//! - Nothing outlives the call: the process starts as the first process
//!   (pid 1) of a PID namespace of its own, and when it exits the kernel
//!   kills everything else in it, whatever process group or session it
//!   moved to. The confining thread enters the namespace for its children
//!   (`unshare(CLONE_NEWPID)`), which needs `CAP_SYS_ADMIN` in its user
//!   namespace: the spawner has it in its own ([`hide_in_namespace`]), a
//!   daemon running as root has it. Where it fails, seccomp refuses
//!   `setsid` instead, which keeps a command from leaving its session but
//!   not its process group (docs/sandbox.md says so).

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use keel_core::config::NetworkAccess;

mod egress;
pub use egress::{proxy_environment, PROXY_VARIABLES};
use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, NetPort, PathBeneath,
    PathFd, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The Landlock ABI keel's rules are written for: 6 adds the signal and
/// abstract-socket scopes to 4's TCP rules and 5's device ioctls.
const ABI_NEEDED: ABI = ABI::V6;

/// The devices a confined process may read (and `/dev/null`, write); the
/// rest of `/dev` (disks among them, which a root daemon's tools could
/// otherwise read raw) is hidden.
const DEVICES: [&str; 5] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// What a confined process may do.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Confinement {
    /// Directories (or files) it may write beneath, besides reading.
    pub writable: Vec<PathBuf>,
    /// Paths it may neither read nor write (the daemon's data directory):
    /// nothing beneath them is reachable, but a writable path beneath one.
    pub hidden: Vec<PathBuf>,
    /// Which IP network it may use.
    pub network: NetworkAccess,
    /// TCP ports it may never connect to, whatever `network` says (the
    /// daemon's own).
    pub blocked_ports: Vec<u16>,
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
    /// The kernel (or this process) cannot enforce the confinement;
    /// nothing was started.
    Unsupported { what: String },
    /// A path of the confinement cannot be opened.
    Path { path: PathBuf, error: io::Error },
    /// The process could not be started (after confining).
    Spawn(io::Error),
    /// The spawner process refused, in its words.
    Refused(String),
}

impl fmt::Display for SandboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxError::Unsupported { what } => write!(
                f,
                "the command cannot be confined ({what}), so it was not run"
            ),
            SandboxError::Path { path, error } => {
                write!(f, "cannot confine to {}: {error}", path.display())
            }
            SandboxError::Spawn(error) => write!(f, "cannot start the command: {error}"),
            SandboxError::Refused(why) => f.write_str(why),
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
        let seccomp = build_filter(&NetworkAccess::Off, true).is_ok_and(|filters| {
            filters
                .iter()
                .all(|filter| seccompiler::apply_filter(filter).is_ok())
        });
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
    confined(
        confinement,
        move || command.spawn(),
        |child| Some(child.id()),
    )
}

/// Whether [`spawn_confining_this_thread`] can start a process confined
/// as `confinement` says: every confinement but a network list of hosts,
/// whose way out is served from a thread that is not confined
/// ([`spawn_confined`] does that).
pub fn confines_in_place(confinement: &Confinement) -> bool {
    !matches!(confinement.network, NetworkAccess::Hosts(_))
}

/// Confine the calling thread as `confinement` says, then start `command`
/// from it: [`spawn_confined`] without a thread of its own, for a caller
/// that is itself a thread started for this one call and ending with it
/// (the spawner's, which then waits for the child). The thread stays
/// confined, and so does everything it starts afterwards; waiting for the
/// child and talking on descriptors it already holds are unaffected.
/// Nothing is started unless every restriction is enforced; a
/// confinement [`confines_in_place`] refuses is an error.
pub fn spawn_confining_this_thread(
    mut command: Command,
    confinement: &Confinement,
) -> Result<Child, SandboxError> {
    if !confines_in_place(confinement) {
        return Err(SandboxError::Unsupported {
            what: "a network list of hosts is served from a thread that is not confined".to_owned(),
        });
    }
    Restrictions::prepare(confinement, Layers::Process)?.apply()?;
    command.spawn().map_err(SandboxError::Spawn)
}

/// Run `spawn` (which starts a process) on a short-lived thread confined
/// as `confinement` says, and give what it returned: for callers that
/// start processes other than with `std::process::Command`. `pid` tells
/// the started process's pid, which a network list of hosts serves until
/// that process exits (`sandbox/egress.rs`).
pub fn confined<T: Send>(
    confinement: &Confinement,
    spawn: impl FnOnce() -> io::Result<T> + Send,
    pid: impl FnOnce(&T) -> Option<u32>,
) -> Result<T, SandboxError> {
    // Everything that can be made ready is, on this thread: the confining
    // one only restricts itself and spawns, and ends.
    let layers = Restrictions::prepare(confinement, Layers::Process)?;
    let (started, listeners) = on_confined_thread(move || {
        let listeners = layers.apply()?;
        Ok((spawn().map_err(SandboxError::Spawn)?, listeners))
    })?;
    if let Some(listeners) = listeners {
        // Served from this thread's namespace. If it cannot be, the call
        // has no way out at all, which allows less than its list.
        let served = pid(&started)
            .ok_or_else(|| io::Error::other("the process is gone"))
            .and_then(|pid| egress::serve(listeners, pid));
        if let Err(error) = served {
            tracing::warn!(%error, "a confined call's network list cannot be served: it has no network");
        }
    }
    Ok(started)
}

/// Confine the calling thread's filesystem access as `confinement` says
/// (the network and process rules do not apply: the file tools open no
/// sockets and start nothing). For a thread of its own, which stays
/// confined until it ends. A hidden path beneath a writable one is left to
/// the caller's own checks: Landlock cannot hide it, and this process has
/// no namespace that does.
pub fn confine_files(confinement: &Confinement) -> Result<(), SandboxError> {
    Restrictions::prepare(confinement, Layers::Files)?
        .apply()
        .map(|_| ())
}

/// Run `work` on a short-lived thread of its own and give its result.
fn on_confined_thread<T: Send>(
    work: impl FnOnce() -> Result<T, SandboxError> + Send,
) -> Result<T, SandboxError> {
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("keel-confine".to_owned())
            .stack_size(CONFINING_STACK)
            .spawn_scoped(scope, work)
            .map_err(|error| SandboxError::Unsupported {
                what: format!("no thread to confine: {error}"),
            })?;
        thread.join().unwrap_or_else(|_| {
            Err(SandboxError::Unsupported {
                what: "the confining thread failed".to_owned(),
            })
        })
    })
}

/// The confining thread's stack: it lists directories and builds rules,
/// nothing deep.
const CONFINING_STACK: usize = 256 * 1024;

/// Which rules a thread takes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layers {
    /// Everything: for a thread about to start a tool's process.
    Process,
    /// The filesystem only: for a file tool's own thread.
    Files,
}

/// The restrictions a thread takes on (and what it starts from then on),
/// made ready by [`Restrictions::prepare`] and taken on by
/// [`Restrictions::apply`]: three Landlock layers, which the kernel
/// intersects, and for a process a seccomp filter.
///
/// 1. what may be reached at all: everything beneath `/` but the hidden
///    paths (and most of `/dev`), with every right, listed and opened at
///    most [`READ_RULES_FRESH`] ago ([`reach_layer`]);
/// 2. where this call may write: the writable paths, handling only the
///    rights that change something (`AccessFs::from_write`), with the
///    signal and abstract-socket scopes for a process;
/// 3. the network's (processes only): TCP to the allowed ports, built once
///    per policy ([`network_layer`]).
///
/// So reading goes wherever the first layer allows, and writing only
/// where both do; the costly first layer is shared by every call with the
/// same hidden paths, the second is a handful of rules. They are taken on
/// fewest rules first ([`in_order_of_size`]): a layer taken on copies
/// every rule of the layers before it.
struct Restrictions {
    layers: Layers,
    network: Option<Layer>,
    reach: Layer,
    write: Layer,
    /// The network policy the kernel's own rules enforce: for a list of
    /// hosts, everything, inside a network namespace of the call's own.
    network_access: NetworkAccess,
    /// For a list of hosts, what the call's way out lets through.
    egress: Option<Arc<egress::Rules>>,
}

impl Restrictions {
    fn prepare(confinement: &Confinement, layers: Layers) -> Result<Restrictions, SandboxError> {
        let unsupported = |what: String| SandboxError::Unsupported { what };
        let hidden: Vec<PathBuf> = confinement
            .hidden
            .iter()
            .map(|path| canonical(path))
            .collect();
        let writable: Vec<PathBuf> = confinement
            .writable
            .iter()
            .map(|path| canonical(path))
            .collect();
        // What Landlock hides: not what this process hid already (the
        // spawner's namespace shows an empty directory there); and a path
        // beneath a writable one cannot be (its writable ancestor would
        // have no rule of its own), so a process is refused, and the file
        // tools' own path checks refuse it.
        let mut landlock_hidden = Vec::new();
        for path in &hidden {
            if layers == Layers::Process && hidden_by_namespace(path) {
                continue;
            }
            if let Some(outer) = writable.iter().find(|outer| path.starts_with(outer)) {
                if layers == Layers::Process {
                    return Err(unsupported(format!(
                        "{} is inside {}, which the command may write, and this process \
                         could not hide it in a mount namespace (are user namespaces \
                         disabled?)",
                        path.display(),
                        outer.display()
                    )));
                }
                continue;
            }
            landlock_hidden.push(path.clone());
        }
        landlock_hidden.push(PathBuf::from("/dev"));
        landlock_hidden.sort();
        landlock_hidden.dedup();

        // A list of hosts: the kernel's rules allow every port, in a
        // network namespace whose only way out is keel's (egress.rs).
        let (network_access, blocked_ports, egress) = match &confinement.network {
            NetworkAccess::Hosts(allowed) => (
                NetworkAccess::All,
                Vec::new(),
                Some(Arc::new(egress::Rules {
                    allowed: allowed.clone(),
                    blocked_ports: confinement.blocked_ports.clone(),
                })),
            ),
            network => (network.clone(), confinement.blocked_ports.clone(), None),
        };
        // No network layer where it would allow everything: a list of
        // hosts (the namespace is the limit) or `all` with no port
        // blocked. "Every port but one" is 65,534 rules, which the kernel
        // copies into each layer taken on after it.
        let network = match layers {
            Layers::Process
                if egress.is_none()
                    && !(network_access == NetworkAccess::All && blocked_ports.is_empty()) =>
            {
                Some(network_layer(&network_access, &blocked_ports)?)
            }
            Layers::Process | Layers::Files => None,
        };
        let reach = reach_layer(landlock_hidden)?;
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_write(ABI_NEEDED))
            .map_err(|error| unsupported(format!("Landlock: {error}")))?;
        if layers == Layers::Process {
            ruleset = ruleset
                .scope(Scope::from_all(ABI_NEEDED))
                .map_err(|error| unsupported(format!("Landlock scopes: {error}")))?;
        }
        let mut write = ruleset
            .create()
            .map_err(|error| unsupported(format!("Landlock: {error}")))?;
        let mut write_rules = 0;
        for path in writable.iter().chain([&PathBuf::from("/dev/null")]) {
            let access = if path.is_dir() {
                AccessFs::from_write(ABI_NEEDED)
            } else {
                AccessFs::from_write(ABI_NEEDED) & AccessFs::from_file(ABI_NEEDED)
            };
            let fd = PathFd::new(path).map_err(|error| SandboxError::Path {
                path: path.clone(),
                error: io::Error::other(error.to_string()),
            })?;
            write = write
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|error| {
                    unsupported(format!("Landlock rule for {}: {error}", path.display()))
                })?;
            write_rules += 1;
        }
        // The filters are built (once) here, not on the confining thread.
        if layers == Layers::Process {
            process_filters(&network_access, true)?;
            process_filters(&network_access, false)?;
        }
        Ok(Restrictions {
            layers,
            network,
            reach,
            write: Layer {
                ruleset: write,
                rules: write_rules,
                what: "filesystem write",
            },
            network_access,
            egress: egress.filter(|_| layers == Layers::Process),
        })
    }

    /// Take the restrictions on: the calling thread, and what it starts
    /// from now on. For a network list of hosts, the thread first enters
    /// a network namespace of its own, and what listens there for the
    /// call's way out is given back, to be served ([`egress::serve`]).
    fn apply(self) -> Result<Option<egress::Listeners>, SandboxError> {
        let unsupported = |what: String| SandboxError::Unsupported { what };
        let listeners = match self.egress {
            Some(rules) => Some(egress::enter(rules).map_err(|error| {
                unsupported(format!(
                    "a network list that names hosts needs a network namespace of the \
                     call's own, which this process cannot make: {error}"
                ))
            })?),
            None => None,
        };
        // Whether what this thread starts is the first process of a PID
        // namespace of its own (see the module docs).
        let own_pids = self.layers == Layers::Process
            && nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID).is_ok();
        for Layer { ruleset, what, .. } in in_order_of_size(self.write, self.reach, self.network) {
            ruleset
                .restrict_self()
                .map_err(|error| unsupported(format!("Landlock {what}: {error}")))
                .and_then(|status| fully(status, what))?;
        }
        if self.layers == Layers::Process {
            for filter in process_filters(&self.network_access, !own_pids)?.iter() {
                seccompiler::apply_filter(filter)
                    .map_err(|error| unsupported(format!("seccomp: {error}")))?;
            }
        }
        Ok(listeners)
    }
}

/// One Landlock layer, ready to be taken on, and how many rules it holds.
struct Layer {
    ruleset: RulesetCreated,
    rules: usize,
    /// What it restricts, for an error.
    what: &'static str,
}

/// The layers in the order to take them on: fewest rules first. Taking a
/// layer on makes a new domain holding a copy of every rule of the domain
/// before it, so each layer's rules are copied once per layer after it;
/// the layers intersect, so their order changes nothing else. With the
/// large layer last (the reach layer's few hundred rules where `/tmp` is
/// busy; the network's 65,534 for "every port but the daemon's") its rules
/// are copied once instead of once per later layer.
fn in_order_of_size(write: Layer, reach: Layer, network: Option<Layer>) -> Vec<Layer> {
    let mut layers: Vec<Layer> = [Some(write), Some(reach), network]
        .into_iter()
        .flatten()
        .collect();
    layers.sort_by_key(|layer| layer.rules);
    layers
}

/// Refuse a Landlock layer that did not take in full.
fn fully(status: landlock::RestrictionStatus, what: &str) -> Result<(), SandboxError> {
    if status.ruleset == RulesetStatus::FullyEnforced {
        Ok(())
    } else {
        Err(SandboxError::Unsupported {
            what: format!("Landlock enforced the {what} rules {:?}", status.ruleset),
        })
    }
}

/// The Landlock network layers built so far, by what they allow: "every
/// port but the daemon's" takes 65,534 rules, too many to add at each
/// spawn, so a layer is built once and each confined thread restricts
/// itself with a copy of its descriptor.
type NetworkKey = (NetworkAccess, Vec<u16>);
static NETWORK_LAYERS: LazyLock<Mutex<HashMap<NetworkKey, (RulesetCreated, usize)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The network layer for `network` with `blocked` ports never allowed.
fn network_layer(network: &NetworkAccess, blocked: &[u16]) -> Result<Layer, SandboxError> {
    let unsupported = |what: String| SandboxError::Unsupported { what };
    let key = (network.clone(), blocked.to_vec());
    let mut layers = NETWORK_LAYERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some((layer, rules)) = layers.get(&key) {
        return layer
            .try_clone()
            .map(|ruleset| Layer {
                ruleset,
                rules: *rules,
                what: "network",
            })
            .map_err(|error| unsupported(format!("Landlock network: {error}")));
    }
    let handled = match network {
        // Neither bind nor connect: seccomp refuses the sockets anyway.
        NetworkAccess::Off => AccessNet::from_all(ABI_NEEDED),
        NetworkAccess::All | NetworkAccess::Ports(_) | NetworkAccess::Hosts(_) => {
            AccessNet::ConnectTcp.into()
        }
    };
    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(handled)
        .and_then(|ruleset| ruleset.create())
        .map_err(|error| unsupported(format!("Landlock network: {error}")))?;
    let ports: Vec<u16> = match network {
        NetworkAccess::Off => Vec::new(),
        NetworkAccess::All => (0..=u16::MAX).collect(),
        NetworkAccess::Ports(ports) => ports.clone(),
        // Not used: a list of hosts is enforced as `All` in a namespace.
        NetworkAccess::Hosts(_) => Vec::new(),
    };
    let mut rules = 0;
    for port in ports.into_iter().filter(|port| !blocked.contains(port)) {
        rules += 1;
        created = created
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(|error| unsupported(format!("Landlock rule for port {port}: {error}")))?;
    }
    let copy = created
        .try_clone()
        .map_err(|error| unsupported(format!("Landlock network: {error}")))?;
    layers.insert(key, (created, rules));
    Ok(Layer {
        ruleset: copy,
        rules,
        what: "network",
    })
}

/// Paths resolved lately, and when: a confined spawn resolves its hidden
/// and writable paths (a `stat` per component each), which are the same
/// for the calls of a conversation.
static CANONICAL: LazyLock<Mutex<HashMap<PathBuf, (Instant, PathBuf)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// `path` with symlinks, `.` and `..` resolved (as it is if it cannot be),
/// as resolved at most [`READ_RULES_FRESH`] ago.
fn canonical(path: &Path) -> PathBuf {
    let mut resolved = CANONICAL.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((at, canonical)) = resolved.get(path) {
        if at.elapsed() < READ_RULES_FRESH {
            return canonical.clone();
        }
    }
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    if resolved.len() > 1024 {
        resolved.retain(|_, (at, _)| at.elapsed() < READ_RULES_FRESH);
    }
    resolved.insert(path.to_owned(), (Instant::now(), canonical.clone()));
    canonical
}

/// How long a listing of what may be reached serves: listing the
/// siblings along a hidden path, opening each and adding its rule is most
/// of a confined spawn's cost (a few hundred rules where `/tmp` is busy),
/// and they change rarely.
const READ_RULES_FRESH: Duration = Duration::from_secs(1);

/// The reach layers built lately, by their hidden paths, with when each
/// was listed.
type ReachLayers = HashMap<Vec<PathBuf>, (Instant, RulesetCreated, usize)>;
static REACH_LAYERS: LazyLock<Mutex<ReachLayers>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The layer of what may be reached at all with `hidden` hidden: every
/// right beneath `/` but beneath the hidden paths (and of `/dev`, reading
/// and writing its harmless devices only), listed and built at most
/// [`READ_RULES_FRESH`] ago. A path listed but gone by the time it is
/// opened (another process's temporary file beside a hidden path's
/// ancestor) is left out, which allows less.
fn reach_layer(hidden: Vec<PathBuf>) -> Result<Layer, SandboxError> {
    let unsupported = |what: String| SandboxError::Unsupported { what };
    let mut layers = REACH_LAYERS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((listed, layer, rules)) = layers.get(&hidden) {
        if listed.elapsed() < READ_RULES_FRESH {
            return layer
                .try_clone()
                .map(|ruleset| Layer {
                    ruleset,
                    rules: *rules,
                    what: "filesystem",
                })
                .map_err(|error| unsupported(format!("Landlock: {error}")));
        }
    }
    let listed = Instant::now();
    let created = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI_NEEDED))
        .and_then(|ruleset| ruleset.create())
        .map_err(|error| unsupported(format!("Landlock: {error}")))?;
    let mut paths = readable(Path::new("/"), &hidden);
    let device = AccessFs::from_file(ABI_NEEDED);
    paths.extend(DEVICES.iter().map(|path| (PathBuf::from(path), device)));
    let (created, rules) = allow_reaching(created, paths)?;
    let copy = created
        .try_clone()
        .map_err(|error| unsupported(format!("Landlock: {error}")))?;
    // Old listings go; a handful of hidden sets is all a runtime has.
    layers.retain(|_, (at, _, _)| at.elapsed() < READ_RULES_FRESH);
    layers.insert(hidden, (listed, created, rules));
    Ok(Layer {
        ruleset: copy,
        rules,
        what: "filesystem",
    })
}

/// Add a rule allowing what each of `paths` allows; how many were added.
/// A path listed a moment ago may be gone (another process's temporary
/// file beside a hidden path's ancestor): it is left out, which allows
/// less.
fn allow_reaching(
    mut created: RulesetCreated,
    paths: Vec<(PathBuf, landlock::BitFlags<AccessFs>)>,
) -> Result<(RulesetCreated, usize), SandboxError> {
    let mut rules = 0;
    for (path, access) in paths {
        let Ok(fd) = PathFd::new(&path) else {
            continue;
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|error| SandboxError::Unsupported {
                what: format!("Landlock rule for {}: {error}", path.display()),
            })?;
        rules += 1;
    }
    Ok((created, rules))
}

/// Every path beneath `root` that may be reached, with what may be done
/// there (everything: the write layer limits writing): `root` whole if nothing hidden is beneath it, else its entries,
/// each the same way, leaving the hidden ones out.
fn readable(root: &Path, hidden: &[PathBuf]) -> Vec<(PathBuf, landlock::BitFlags<AccessFs>)> {
    if hidden.iter().any(|hidden| hidden == root) {
        return Vec::new();
    }
    if !hidden.iter().any(|hidden| hidden.starts_with(root)) {
        let access = if root.is_dir() {
            AccessFs::from_all(ABI_NEEDED)
        } else {
            AccessFs::from_file(ABI_NEEDED)
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

/// The seccomp filters built so far, by network policy.
type Filters = Arc<[BpfProgram]>;
/// A filter's key: the network policy, and whether `setsid` is refused.
type FilterKey = (NetworkAccess, bool);
static FILTERS: LazyLock<Mutex<HashMap<FilterKey, Filters>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The seccomp filters for a process under `network`: `io_uring_setup`
/// refused (its requests could open sockets without the `socket`
/// syscall) and the sockets the network policy rules out (`EACCES`); with
/// `no_setsid`, `setsid` too (`EPERM`), where no PID namespace keeps the
/// call's processes together. Everything else is allowed.
fn process_filters(network: &NetworkAccess, no_setsid: bool) -> Result<Filters, SandboxError> {
    let key = (network.clone(), no_setsid);
    let mut filters = FILTERS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(filter) = filters.get(&key) {
        return Ok(filter.clone());
    }
    let built: Filters = build_filter(network, no_setsid)
        .map_err(|error| SandboxError::Unsupported {
            what: format!("seccomp: {error}"),
        })?
        .into();
    filters.insert(key, built.clone());
    Ok(built)
}

fn build_filter(
    network: &NetworkAccess,
    no_setsid: bool,
) -> Result<Vec<BpfProgram>, seccompiler::Error> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)?;
    let arg = |index: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value)
    };
    // Families any policy allows: Unix sockets, and netlink (routing
    // queries, no way out of the machine).
    let local = [AF_UNIX, AF_NETLINK];
    let socket_rules: Vec<SeccompRule> = match network {
        // A list of hosts: the call's network namespace is the limit.
        NetworkAccess::All | NetworkAccess::Hosts(_) => Vec::new(),
        NetworkAccess::Off => vec![SeccompRule::new(
            local
                .iter()
                .map(|family| arg(0, SeccompCmpOp::Ne, *family))
                .collect::<Result<_, _>>()?,
        )?],
        NetworkAccess::Ports(_) => {
            // Other families are refused, and IP sockets of any type but a
            // stream: Landlock rules TCP by port, UDP it cannot.
            let mut rules = vec![SeccompRule::new(
                local
                    .iter()
                    .chain(&[AF_INET, AF_INET6])
                    .map(|family| arg(0, SeccompCmpOp::Ne, *family))
                    .collect::<Result<_, _>>()?,
            )?];
            for family in [AF_INET, AF_INET6] {
                for kind in NOT_STREAMS {
                    rules.push(SeccompRule::new(vec![
                        arg(0, SeccompCmpOp::Eq, family)?,
                        arg(1, SeccompCmpOp::MaskedEq(SOCK_TYPE_MASK), kind)?,
                    ])?);
                }
            }
            rules
        }
    };
    let mut refused_with_eacces = BTreeMap::from([(SYS_IO_URING_SETUP, Vec::new())]);
    if !socket_rules.is_empty() {
        refused_with_eacces.insert(SYS_SOCKET, socket_rules);
    }
    // One filter has one action for what its rules match: `EACCES` for
    // the network, `EPERM` for the session, so two filters.
    let mut filters: Vec<BpfProgram> = vec![SeccompFilter::new(
        refused_with_eacces,
        SeccompAction::Allow,
        SeccompAction::Errno(EACCES),
        arch,
    )?
    .try_into()?];
    if no_setsid {
        filters.push(
            SeccompFilter::new(
                BTreeMap::from([(SYS_SETSID, Vec::new())]),
                SeccompAction::Allow,
                SeccompAction::Errno(EPERM),
                arch,
            )?
            .try_into()?,
        );
    }
    Ok(filters)
}
/// The paths this process hid in a mount namespace of its own
/// ([`hide_in_namespace`]), which Landlock need not hide then.
static NAMESPACE_HIDDEN: OnceLock<Vec<PathBuf>> = OnceLock::new();

fn hidden_by_namespace(path: &Path) -> bool {
    NAMESPACE_HIDDEN
        .get()
        .is_some_and(|hidden| hidden.iter().any(|hidden| path.starts_with(hidden)))
}

/// The environment variable the runtime names the data directory in for
/// its spawner process, which hides it ([`hide_in_namespace`]) before it
/// starts anything.
pub const SPAWNER_HIDE_ENV: &str = "KEEL_SPAWNER_HIDE";

/// Move this process into user and mount namespaces of its own in which
/// `data_dir` is an empty, read-only directory, so that nothing this
/// process starts can see the data directory, even where Landlock cannot
/// hide it (inside a working directory a command may write). Then
/// once more into a nested pair, so that what was mounted is locked: a
/// process of the nested namespaces cannot unmount it, whatever its
/// capabilities there.
///
/// For the spawner process, which starts single-threaded (user namespaces
/// cannot be entered by a process with threads) and never needs the data
/// directory. An error leaves this process as it was, or in namespaces
/// where nothing is hidden; either way [`spawn_confined`] then refuses
/// what only the namespace could have confined.
pub fn hide_in_namespace(data_dir: &Path) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    use nix::sched::{unshare, CloneFlags};

    let data_dir = std::fs::canonicalize(data_dir)
        .map_err(|error| format!("cannot resolve {}: {error}", data_dir.display()))?;
    let uid = nix::unistd::geteuid();
    let gid = nix::unistd::getegid();
    let enter = || -> Result<(), String> {
        unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
            .map_err(|error| format!("cannot enter user and mount namespaces: {error}"))?;
        // Only this user, mapped to itself: files keep their owners.
        std::fs::write("/proc/self/setgroups", "deny")
            .and_then(|()| std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")))
            .and_then(|()| std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")))
            .map_err(|error| format!("cannot map this user into its namespace: {error}"))
    };
    enter()?;
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(|error| format!("cannot make the mounts private: {error}"))?;
    mount(
        Some("tmpfs"),
        &data_dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )
    .map_err(|error| format!("cannot cover {}: {error}", data_dir.display()))?;
    mount(
        none,
        &data_dir,
        none,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        none,
    )
    .map_err(|error| format!("cannot make {} read-only: {error}", data_dir.display()))?;
    enter()?;
    let _ = NAMESPACE_HIDDEN.set(vec![data_dir]);
    Ok(())
}

/// Whether an environment variable of the daemon holds a secret a tool
/// must not see: keel's own settings (the token among them) and anything
/// named like a key, token, secret or password (the providers' keys).
pub fn is_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("KEEL_")
        || ["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL"]
            .iter()
            .any(|word| upper.contains(word))
}

/// This process's environment without its secrets ([`is_secret`]).
///
/// Read once, at the first call: keel never changes its own environment
/// (nothing in it calls `set_var`), so every tool call would otherwise
/// list and filter the same variables again (docs/sandbox.md).
pub fn tool_environment() -> Vec<(OsString, OsString)> {
    static ENVIRONMENT: std::sync::OnceLock<Vec<(OsString, OsString)>> = std::sync::OnceLock::new();
    ENVIRONMENT
        .get_or_init(|| {
            std::env::vars_os()
                .filter(|(name, _)| name.to_str().is_some_and(|name| !is_secret(name)))
                .collect()
        })
        .clone()
}

const EACCES: u32 = 13;
const EPERM: u32 = 1;
const AF_UNIX: u64 = 1;
const AF_INET: u64 = 2;
const AF_INET6: u64 = 10;
const AF_NETLINK: u64 = 16;
/// The low bits of `socket`'s type argument (the rest are flags such as
/// `SOCK_CLOEXEC`).
const SOCK_TYPE_MASK: u64 = 0xf;
/// Every socket type but `SOCK_STREAM`: datagram, raw, RDM, seqpacket,
/// DCCP, packet.
const NOT_STREAMS: [u64; 6] = [2, 3, 4, 5, 6, 10];
#[cfg(target_arch = "x86_64")]
const SYS_SOCKET: i64 = 41;
#[cfg(target_arch = "x86_64")]
const SYS_IO_URING_SETUP: i64 = 425;
#[cfg(target_arch = "x86_64")]
const SYS_SETSID: i64 = 112;
#[cfg(target_arch = "aarch64")]
const SYS_SOCKET: i64 = 198;
#[cfg(target_arch = "aarch64")]
const SYS_IO_URING_SETUP: i64 = 425;
#[cfg(target_arch = "aarch64")]
const SYS_SETSID: i64 = 157;

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
        let (_, rules) = allow_reaching(created, paths).unwrap();
        assert_eq!(rules, 1);
    }

    fn layer(rules: usize, what: &'static str) -> Layer {
        let ruleset = Ruleset::default()
            .handle_access(AccessFs::from_all(ABI::V1))
            .and_then(|ruleset| ruleset.create())
            .unwrap();
        Layer {
            ruleset,
            rules,
            what,
        }
    }

    /// The layers are taken on fewest rules first, so the large one's rules
    /// are copied once: the reach layer last under `off` (no port rule),
    /// the network's last under "every port but the daemon's".
    #[test]
    fn layers_are_taken_on_fewest_rules_first() {
        let order = |layers: Vec<Layer>| layers.iter().map(|layer| layer.what).collect::<Vec<_>>();
        let off = in_order_of_size(
            layer(3, "filesystem write"),
            layer(240, "filesystem"),
            Some(layer(0, "network")),
        );
        assert_eq!(order(off), ["network", "filesystem write", "filesystem"]);
        let all = in_order_of_size(
            layer(3, "filesystem write"),
            layer(240, "filesystem"),
            Some(layer(65_534, "network")),
        );
        assert_eq!(order(all), ["filesystem write", "filesystem", "network"]);
        let files = in_order_of_size(layer(3, "filesystem write"), layer(240, "filesystem"), None);
        assert_eq!(order(files), ["filesystem write", "filesystem"]);
    }
}
