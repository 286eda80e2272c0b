//! What `/proc` says of this machine's processes: who listens on a port,
//! a keel daemon's tool spawner, CPU time and resident memory, which processes carry a marker in their
//! environment or work in a directory, whether one still runs; and the
//! machine's load average. The drills, `keel bench`, the benches, the
//! end-to-end tests and `postgres` read processes through these alone.

use std::time::Duration;

/// The process on this machine listening on TCP `port`, from `/proc`: the
/// socket's inode in `/proc/net/tcp` (or `tcp6`), then the process
/// holding it among `/proc/*/fd`. `None` when nobody here listens on it,
/// or the holder's file descriptors cannot be read (another user's).
pub fn listener_pid(port: u16) -> Option<u32> {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .find_map(|table| listening_inode(&table, port))?;
    let socket = format!("socket:[{inode}]");
    pids().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == socket.as_str())
            })
        })
    })
}

/// The pids of every process on this machine, from `/proc`.
pub fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
}

/// The inode of the socket listening on `port` in a `/proc/net/tcp` table:
/// rows of `sl local_address rem_address st … inode`, the address as
/// `HEXIP:HEXPORT` and `0A` for LISTEN.
fn listening_inode(table: &str, port: u16) -> Option<u64> {
    table.lines().skip(1).find_map(|row| {
        let fields: Vec<&str> = row.split_whitespace().collect();
        let local_port = fields.get(1)?.rsplit(':').next()?;
        let listening = *fields.get(3)? == "0A";
        (listening && u16::from_str_radix(local_port, 16).ok()? == port)
            .then(|| fields.get(9)?.parse().ok())
            .flatten()
    })
}

/// CPU time (user + system) process `pid` has used, from `/proc`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), 1-based from
    // field 3: utime is field 14, stime field 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = clock_ticks()?;
    Some(Duration::from_secs_f64(
        (utime + stime) as f64 / ticks as f64,
    ))
}

/// The tool spawner of the keel daemon `pid` (docs/tools.md): its child
/// whose command line has the argument `spawner`.
pub fn spawner_of(pid: u32) -> Option<u32> {
    pids().find(|child| {
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        let ppid = stat
            .rfind(')')
            .and_then(|end| stat.get(end + 1..))
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
        ppid == Some(pid)
            && cmdline
                .split(|byte| *byte == 0)
                .any(|arg| arg == b"spawner")
    })
}

/// Resident memory of process `pid` in bytes (VmRSS), from `/proc`.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn clock_ticks() -> Option<u64> {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|ticks| u64::try_from(ticks).ok())
}

/// Processes (not zombies) whose environment holds `marker` (`NAME=value`)
/// and a numeric `tag` variable: `(pid, the tag's value, command line)`.
/// A drill marks the processes of its daemons and their tools this way.
pub fn processes_with_env(marker: &str, tag: &str) -> Vec<(u32, u32, String)> {
    let tag_prefix = format!("{tag}=");
    let mut found = Vec::new();
    for pid in pids() {
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = environ.split(|byte| *byte == 0).collect();
        if !vars.contains(&marker.as_bytes()) {
            continue;
        }
        let Some(value) = vars.iter().find_map(|var| {
            std::str::from_utf8(var)
                .ok()?
                .strip_prefix(&tag_prefix)?
                .parse::<u32>()
                .ok()
        }) else {
            continue;
        };
        if !is_running(pid) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
            .unwrap_or_default();
        found.push((pid, value, cmdline.trim().to_owned()));
    }
    found
}

/// The machine's load averages over 1, 5 and 15 minutes, as
/// `/proc/loadavg` gives them ("unknown" where it cannot be read): what a
/// bench prints beside its figures.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Processes (not zombies: a zombie has no working directory) whose
/// working directory is `dir`, from `/proc/*/cwd`; only those whose
/// `/proc` entries this process may read (its own user's, or all as
/// root). A PostgreSQL server's processes all work in its data directory.
pub fn processes_in(dir: &std::path::Path) -> Vec<u32> {
    pids()
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir))
        .collect()
}

/// Whether process `pid` exists and is not a zombie.
pub fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|end| stat[end + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// The port of `HOST:PORT` or an `http://` URL.
pub fn port_of(addr: &str) -> Option<u16> {
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    reqwest::Url::parse(&url).ok()?.port_or_known_default()
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_listening_socket_is_found_by_its_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1E61 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:1E62 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1\n";
        assert_eq!(listening_inode(table, 0x1E61), Some(4242));
        // Connected, not listening.
        assert_eq!(listening_inode(table, 0x1E62), None);
        assert_eq!(listening_inode(table, 80), None);

        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("a port");
        let port = listener.local_addr().expect("its address").port();
        assert_eq!(listener_pid(port), Some(std::process::id()));
    }
    #[test]
    fn this_process_has_used_cpu_and_holds_memory() {
        let pid = std::process::id();
        let spin = Instant::now();
        let mut sum = 0u64;
        while spin.elapsed() < Duration::from_millis(30) {
            sum = sum.wrapping_add(1);
        }
        assert!(sum > 0);
        assert!(cpu_time(pid).is_some_and(|cpu| cpu > Duration::ZERO));
        assert!(rss_bytes(pid).is_some_and(|rss| rss > 1024 * 1024));
        assert_eq!(cpu_time(u32::MAX), None);
    }
    #[test]
    fn the_load_average_is_three_figures() {
        let load = load_average();
        assert_eq!(load.split(' ').count(), 3, "{load}");
        assert!(load.split(' ').all(|figure| figure.parse::<f64>().is_ok()));
    }
    #[test]
    fn ports_come_from_addresses_and_urls() {
        assert_eq!(port_of("127.0.0.1:7777"), Some(7777));
        assert_eq!(port_of("http://localhost:8080"), Some(8080));
        assert_eq!(port_of("http://localhost"), Some(80));
        assert_eq!(port_of("not an address"), None);
    }
}
