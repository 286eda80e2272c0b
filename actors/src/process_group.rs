//! Process groups of tool subprocesses: killed as a whole when their tool
//! call ends or is cancelled, and recorded on disk so that a runtime that
//! crashed can kill the ones that outlived it.
//!
//! A tool such as `bash` starts a child that may start children of its own
//! (`make -j`, `sleep 30 &`). Killing only the direct child leaves the rest
//! running and holding the output pipes, so every tool child leads its own
//! process group (`process_group(0)`) and [`ProcessGroup`] sends `SIGKILL` to
//! the whole group with `killpg`, on [`ProcessGroup::kill`] or on drop.
//! Cancelling a tool call drops its future, so drop is the path that matters.
//!
//! Drop does not run when the runtime itself is killed (`SIGKILL`, OOM), so
//! each group is also written to a [`ProcessLedger`]: a line in an
//! append-only file before the tool does any work, and another when the
//! group is killed. At boot, [`ProcessLedger::reap_survivors`] kills what is left.
//! A pid can be reused once its process is gone, so the ledger keeps the
//! group leader's start time (and the boot id) and never kills a process
//! whose start does not match.
//!
//! This is Linux-only: start times come from `/proc/<pid>/stat`.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read as _, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// A running process group, killed (`SIGKILL` to every member) when dropped.
///
/// Holding one is the promise that nothing of the group outlives the holder:
/// the tool that spawned the group keeps it in its future, so a cancelled
/// call (a dropped future) kills the group too.
#[derive(Debug)]
pub struct ProcessGroup {
    /// Equal to the leader's pid: the leader was spawned with `process_group(0)`.
    pgid: u32,
    /// Where the group is recorded; the record goes when the group is killed.
    ledger: Option<Arc<ProcessLedger>>,
    /// False once `kill` ran, so a second kill (or the drop after an explicit
    /// kill) sends nothing: the pgid may have been reused by then.
    alive: bool,
}

impl ProcessGroup {
    /// Take ownership of the group led by a child spawned with
    /// `process_group(0)`, so `pgid` is the child's pid. With a ledger, the
    /// group is recorded before this returns; if that fails the
    /// group is killed and the error returned, since a group the ledger does
    /// not know about could outlive a crash unnoticed.
    ///
    /// Call it right after spawning, before the child is waited for: only an
    /// unreaped leader guarantees that `pgid` still names this group.
    pub fn adopt(
        pgid: u32,
        ledger: Option<Arc<ProcessLedger>>,
        label: &str,
    ) -> io::Result<ProcessGroup> {
        // killpg(0) would signal our own group and killpg(1) init's, so a bad
        // pgid here must never reach a kill.
        if pgid <= 1 || i32::try_from(pgid).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{pgid} is not a process group a tool could lead"),
            ));
        }
        // Built before recording so that a failed record still kills the group
        // (by the drop on the error path).
        let mut group = ProcessGroup {
            pgid,
            ledger: None,
            alive: true,
        };
        if let Some(ledger) = ledger {
            ledger.record(pgid, label)?;
            group.ledger = Some(ledger);
        }
        Ok(group)
    }

    pub fn pgid(&self) -> u32 {
        self.pgid
    }

    /// `SIGKILL` every process of the group and forget its ledger record.
    /// Idempotent: only the first call sends a signal.
    pub fn kill(&mut self) {
        if !self.alive {
            return;
        }
        self.alive = false;
        // ESRCH (no such group) means every member is gone already, which is
        // what we want; EPERM cannot happen for our own children. Either way
        // there is nothing more a drop could do, so the error is dropped.
        let _ = signal_group(self.pgid, Signal::SIGKILL);
        if let Some(ledger) = &self.ledger {
            // A record left behind is harmless: at boot its start time no
            // longer matches a live process (or no process exists), so the
            // reaper deletes it without killing anything.
            let _ = ledger.remove(self.pgid);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether some process (a zombie included) is still in group `pgid`.
pub(crate) fn group_exists(pgid: u32) -> bool {
    // EPERM: a process we may not signal is in it, so it exists.
    !matches!(signal_group(pgid, None), Err(Errno::ESRCH | Errno::EINVAL))
}

/// Send `signal` to every process of group `pgid`; `None` only checks that
/// the group exists.
fn signal_group(pgid: u32, signal: impl Into<Option<Signal>>) -> nix::Result<()> {
    let pgid = i32::try_from(pgid).map_err(|_| Errno::EINVAL)?;
    killpg(Pid::from_raw(pgid), signal)
}

/// The list of running tool process groups, kept on disk so that it outlives
/// the runtime: an append-only file (`groups.jsonl` in the ledger's
/// directory) with a line when a group starts and a line when it is killed.
///
/// A start line is `{"v":1,"pgid":N,"start_time":T,"boot_id":B,"label":L}`:
/// `start_time` is field 22 of `/proc/<pgid>/stat` (the leader's start, in
/// clock ticks since boot), `boot_id` is `/proc/sys/kernel/random/boot_id`
/// (start times restart at every boot), `label` says whose group it is (the
/// tool call id). An end line is `{"v":1,"end":N,"start_time":T}`.
///
/// **Nothing is fsynced, on purpose.** The ledger answers one question:
/// which tool processes outlived the runtime that started them. A write
/// that returned is in the kernel's page cache, which survives the death of
/// the process that wrote it (`SIGKILL`, OOM, a panic); only a kernel crash
/// or a power cut loses it, and those kill every tool process too, so there
/// is nothing left to find. (The boot id makes records from before a reboot
/// harmless.) One `write` per start and per end is the whole cost; the file
/// is emptied whenever no group runs and it has grown past
/// [`COMPACT_AT`] bytes, and at boot once its survivors are reaped.
///
/// Earlier versions kept one file per group, named after its pgid; those
/// are still read (and reaped) at boot.
#[derive(Debug)]
pub struct ProcessLedger {
    dir: PathBuf,
    /// This boot's id, read once.
    boot_id: String,
    log: Mutex<Log>,
}

#[derive(Debug)]
struct Log {
    /// Opened with `O_APPEND`: every line lands at the end, even after the
    /// file is emptied.
    file: fs::File,
    /// The groups recorded and not yet killed: pgid to the leader's start
    /// time. A pgid names one group at a time: it is recorded while its
    /// leader is alive and unreaped, so no other process can hold the pid.
    live: HashMap<u32, u64>,
    /// Bytes appended since the file was last emptied.
    written: u64,
}

/// Past this many bytes, the file is emptied the next time no group runs.
pub const COMPACT_AT: u64 = 64 * 1024;

/// The ledger file in the ledger's directory.
const LOG_FILE: &str = "groups.jsonl";

/// What [`ProcessLedger::reap_survivors`] did with one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    pub pgid: u32,
    /// The record's label; empty if the record could not be read.
    pub label: String,
    /// True if a surviving group was sent `SIGKILL`; false if the group was
    /// gone, its pid now belongs to another process, or the record was
    /// unreadable.
    pub killed: bool,
}

/// The record format's version; a record of another version is not trusted.
const RECORD_VERSION: u64 = 1;

impl ProcessLedger {
    /// The ledger kept in `dir`, created if missing. Opening reads nothing
    /// and changes nothing: what a crashed run left is for
    /// [`ProcessLedger::reap_survivors`].
    pub fn open(dir: &Path) -> io::Result<ProcessLedger> {
        fs::create_dir_all(dir)?;
        let path = dir.join(LOG_FILE);
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path)?;
        let written = file.metadata()?.len();
        Ok(ProcessLedger {
            dir: dir.to_path_buf(),
            boot_id: boot_id(),
            log: Mutex::new(Log {
                file,
                live: HashMap::new(),
                written,
            }),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The ledger file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }

    /// Record group `pgid` (led by the live process `pgid`) under `label`.
    /// Once this returns, a runtime started after this one dies finds the
    /// group (see the type's documentation for why no fsync is needed).
    pub fn record(&self, pgid: u32, label: &str) -> io::Result<()> {
        let start_time = start_time(pgid)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("process {pgid} is gone before it could be recorded"),
            )
        })?;
        let mut line = serde_json::json!({
            "v": RECORD_VERSION,
            "pgid": pgid,
            "start_time": start_time,
            "boot_id": self.boot_id,
            "label": label,
        })
        .to_string();
        line.push('\n');
        let mut log = self.lock();
        log.append(line.as_bytes())?;
        log.live.insert(pgid, start_time);
        Ok(())
    }

    /// Forget group `pgid`. A group that is not recorded is fine: it was
    /// never recorded or was already forgotten.
    pub fn remove(&self, pgid: u32) -> io::Result<()> {
        let mut log = self.lock();
        let Some(start_time) = log.live.remove(&pgid) else {
            return Ok(());
        };
        if log.live.is_empty() && log.written >= COMPACT_AT {
            // Nothing runs, so no line in the file is still needed.
            log.file.set_len(0)?;
            log.written = 0;
            return Ok(());
        }
        let line =
            format!("{{\"v\":{RECORD_VERSION},\"end\":{pgid},\"start_time\":{start_time}}}\n");
        log.append(line.as_bytes())
    }

    /// The groups the file records as running (started and not ended), in
    /// pgid order, read from disk: what a runtime starting now would reap.
    pub fn recorded(&self) -> io::Result<Vec<(u32, String)>> {
        let bytes = fs::read(self.path())?;
        let mut recorded: Vec<(u32, String)> = replay(&bytes)
            .into_values()
            .map(|record| (record.pgid, record.label))
            .collect();
        recorded.sort();
        Ok(recorded)
    }

    /// At boot, before any tool runs: kill every recorded group that is still
    /// running, then delete every record. A group is killed only if its
    /// leader's start time (and boot) match the record, so a pid the kernel
    /// has since given to an unrelated process is never touched. Records are
    /// reported in pgid order.
    ///
    /// Fails only if the ledger cannot be read or emptied; a record of the
    /// older one-file-per-group layout that cannot be parsed is reported as
    /// not killed, and a torn line of the file (a crash mid-write: its group
    /// never ran a command, since the record comes first) is skipped.
    pub fn reap_survivors(&self) -> io::Result<Vec<Reaped>> {
        let mut log = self.lock();
        let mut reaped = Vec::new();
        for record in replay(&fs::read(self.path())?).into_values() {
            reaped.push(Reaped {
                pgid: record.pgid,
                killed: reap(&record),
                label: record.label,
            });
        }
        log.file.set_len(0)?;
        log.written = 0;
        log.live.clear();
        drop(log);
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let Some(pgid) = path
                .file_name()
                .and_then(|name| name.to_str())
                .and_then(|name| name.parse::<u32>().ok())
            else {
                // The ledger file, or not a record of ours (an editor's
                // backup, say): leave it.
                continue;
            };
            let outcome = match fs::read(&path).ok().and_then(|bytes| parse_record(&bytes)) {
                Some(record) if record.pgid == pgid => Reaped {
                    pgid,
                    killed: reap(&record),
                    label: record.label,
                },
                // Torn by a crash mid-write, or foreign: without a start time
                // nothing proves the pid is still ours, so nothing is killed.
                _ => Reaped {
                    pgid,
                    label: String::new(),
                    killed: false,
                },
            };
            let _ = fs::remove_file(&path);
            reaped.push(outcome);
        }
        reaped.sort_by_key(|outcome| outcome.pgid);
        Ok(reaped)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        // The lock guards a file handle and a map that every step leaves
        // consistent, so a panic elsewhere while it was held changes nothing.
        self.log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Log {
    /// One `write` of a whole line (a short write, which regular files do
    /// not do in practice, would be finished by `write_all`).
    fn append(&mut self, line: &[u8]) -> io::Result<()> {
        self.file.write_all(line)?;
        self.written += line.len() as u64;
        Ok(())
    }
}

/// The groups a ledger file records as running: every start line whose
/// group has no end line after it, by pgid. Lines that do not parse are
/// skipped.
fn replay(bytes: &[u8]) -> HashMap<u32, Record> {
    let mut running: HashMap<u32, Record> = HashMap::new();
    for line in bytes.split(|byte| *byte == b'\n') {
        if let Some(record) = parse_record(line) {
            running.insert(record.pgid, record);
        } else if let Some((pgid, start_time)) = parse_end(line) {
            if running
                .get(&pgid)
                .is_some_and(|record| record.start_time == start_time)
            {
                running.remove(&pgid);
            }
        }
    }
    running
}

/// An end line: the pgid and start time of the group it ends.
fn parse_end(bytes: &[u8]) -> Option<(u32, u64)> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    if value.get("v")?.as_u64()? != RECORD_VERSION {
        return None;
    }
    Some((
        u32::try_from(value.get("end")?.as_u64()?).ok()?,
        value.get("start_time")?.as_u64()?,
    ))
}

/// Wait until no process of the groups `pgids` runs any more: each member
/// has exited or is a zombie (dead, waiting for whoever adopted it to reap
/// it), or `patience` ran out. Returns the groups that still had a running
/// member then.
///
/// `SIGKILL` is delivered asynchronously: `killpg` returns before the
/// members die, and on a loaded machine one may run on for milliseconds.
/// Boot waits here, so that once a runtime is up nothing of the crashed
/// run it reaped is still running (a crash drill checks exactly that).
pub async fn wait_gone(pgids: &[u32], patience: std::time::Duration) -> Vec<u32> {
    let started = std::time::Instant::now();
    loop {
        let running = running_groups(pgids);
        if running.is_empty() || started.elapsed() >= patience {
            return running;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// The groups of `pgids` with a member that runs (is not a zombie), from
/// `/proc/<pid>/stat` of every process.
fn running_groups(pgids: &[u32]) -> Vec<u32> {
    if pgids.is_empty() {
        return Vec::new();
    }
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut running: Vec<u32> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| read_stat(pid).ok())
        .filter_map(|stat| parse_state_and_group(&stat))
        .filter(|(state, pgid)| !matches!(state, 'Z' | 'X') && pgids.contains(pgid))
        .map(|(_, pgid)| pgid)
        .collect();
    running.sort_unstable();
    running.dedup();
    running
}

/// Fields 3 (state) and 5 (process group) of a `/proc/<pid>/stat` line,
/// counted from the last `)` as in [`parse_start_time`].
fn parse_state_and_group(stat: &str) -> Option<(char, u32)> {
    let (_, after_name) = stat.rsplit_once(')')?;
    let mut fields = after_name.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgid = fields.nth(1)?.parse().ok()?;
    Some((state, pgid))
}

/// A parsed ledger record.
struct Record {
    pgid: u32,
    start_time: u64,
    boot_id: String,
    label: String,
}

fn parse_record(bytes: &[u8]) -> Option<Record> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    if value.get("v")?.as_u64()? != RECORD_VERSION {
        return None;
    }
    Some(Record {
        pgid: u32::try_from(value.get("pgid")?.as_u64()?).ok()?,
        start_time: value.get("start_time")?.as_u64()?,
        boot_id: value.get("boot_id")?.as_str()?.to_owned(),
        label: value.get("label")?.as_str()?.to_owned(),
    })
}

/// Kill the recorded group if it provably still is the one recorded.
/// Returns whether a signal was sent.
fn reap(record: &Record) -> bool {
    // Start times count from boot: after a reboot a match would be chance,
    // and nothing from before the reboot can be running anyway.
    if record.boot_id != boot_id() {
        return false;
    }
    // The leader is alive only if it is unreaped; a crashed runtime's
    // children are reparented and reaped by init, so a group whose leader
    // exited is not found here even if some of its members live on. Killing
    // such a group would need proof the pgid was not reused, which /proc
    // cannot give, so it is left alone.
    match start_time(record.pgid) {
        Ok(Some(start_time)) if start_time == record.start_time => {
            signal_group(record.pgid, Signal::SIGKILL).is_ok()
        }
        _ => false,
    }
}

/// The start time of process `pid` (field 22 of `/proc/<pid>/stat`, clock
/// ticks since boot), or `None` if there is no such process.
fn start_time(pid: u32) -> io::Result<Option<u64>> {
    let stat = match read_stat(pid) {
        Ok(stat) => stat,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    parse_start_time(&stat).map(Some).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("cannot read the start time in /proc/{pid}/stat"),
        )
    })
}

/// The longest `/proc/<pid>/stat` line: 52 fields of at most 20 digits,
/// and a command name of at most 64 bytes, with room to spare.
const STAT_LINE: usize = 2048;

/// `/proc/<pid>/stat`, read in one go. `fs::read_to_string` asks the
/// file's size first and then reads in growing steps from 32 bytes (a
/// proc file says it is empty): seven system calls where one read does,
/// and each spawn records one (`start_time`). Reading through `take`
/// into a buffer of the longest line asks no size and reads until the
/// end.
fn read_stat(pid: u32) -> io::Result<String> {
    let mut line = Vec::with_capacity(STAT_LINE);
    fs::File::open(format!("/proc/{pid}/stat"))?
        .take(STAT_LINE as u64)
        .read_to_end(&mut line)?;
    String::from_utf8(line).map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
}

/// Field 22 of a `/proc/<pid>/stat` line. Field 2 is the command name in
/// parentheses and may itself hold spaces and parentheses, so fields are
/// counted from the last `)`: field 3 is the first after it.
fn parse_start_time(stat: &str) -> Option<u64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// This boot's id, or an empty string where the kernel does not provide one
/// (then only start times guard against reused pids).
fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_even_with_parentheses_in_the_name() {
        let stat = "4242 (we (ird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    1 2 0 0 20 0 1 0 987654 1000 200";
        assert_eq!(parse_start_time(stat), Some(987_654));
    }

    #[test]
    fn a_stat_read_in_one_go_is_the_whole_line() {
        let pid = std::process::id();
        let whole = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let read = read_stat(pid).unwrap();
        // The fields that move (times, faults) may differ between the two
        // reads; the start time and the group do not.
        assert!(read.ends_with('\n'), "{read:?}");
        assert_eq!(parse_start_time(&read), parse_start_time(&whole));
        assert!(parse_start_time(&read).is_some());
        assert_eq!(
            parse_state_and_group(&read).map(|(_, group)| group),
            parse_state_and_group(&whole).map(|(_, group)| group)
        );
        assert_eq!(
            read_stat(u32::MAX).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn state_and_group_are_fields_3_and_5_even_with_parentheses_in_the_name() {
        let stat = "4242 (we (ird) name) Z 1 777 4242 0 -1 4194560 100 0 0 0";
        assert_eq!(parse_state_and_group(stat), Some(('Z', 777)));
        assert_eq!(parse_state_and_group("4242 (cut) S 1"), None);
    }

    #[tokio::test]
    async fn a_killed_group_is_waited_for_until_nothing_of_it_runs() {
        use std::os::unix::process::CommandExt as _;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        let patience = std::time::Duration::from_secs(10);
        // Alive: still running when a short patience runs out.
        assert_eq!(
            wait_gone(&[pgid], std::time::Duration::ZERO).await,
            vec![pgid]
        );
        signal_group(pgid, Signal::SIGKILL).unwrap();
        // Unreaped by us, the child is a zombie once dead: that is gone.
        assert_eq!(wait_gone(&[pgid], patience).await, Vec::<u32>::new());
        let _ = child.wait();
        assert_eq!(wait_gone(&[], patience).await, Vec::<u32>::new());
    }

    #[test]
    fn a_truncated_stat_line_has_no_start_time() {
        assert_eq!(parse_start_time("4242 (sh) S 1 4242"), None);
        assert_eq!(parse_start_time("garbage"), None);
    }

    #[test]
    fn records_of_another_version_are_not_trusted() {
        let v2 = br#"{"v":2,"pgid":5,"start_time":1,"boot_id":"","label":"x"}"#;
        assert!(parse_record(v2).is_none());
        let v1 = br#"{"v":1,"pgid":5,"start_time":1,"boot_id":"","label":"x"}"#;
        assert!(parse_record(v1).is_some());
    }
}
