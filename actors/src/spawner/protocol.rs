//! What the runtime and its spawner process say to each other over
//! `SOCK_SEQPACKET` socket pairs: one message per datagram, its fields
//! NUL-terminated byte strings (argv, environment entries and paths
//! cannot hold a NUL, and may not be UTF-8), the first field the kind.
//!
//! On the spawner's socket (its stdin) the spawner says `ready` once, and
//! the runtime sends `spawn` requests with four descriptors attached
//! (`SCM_RIGHTS`): the child's stdin, stdout and stderr, and one end of a
//! socket pair of the child's own. On that one the spawner answers
//! `spawned` with the pid or `failed` with the errno, then `exited` with
//! the raw wait status; the runtime closing its end is the release (it is
//! done with the child's process group: the leader may be reaped).
//!
//! A `lease` request (no descriptors) carries a number of milliseconds:
//! the runtime may act that much longer; unless another `lease` comes by
//! then, the spawner kills every group it started and has not reaped.
//!
//! A `spawn-confined` request carries the child's confinement
//! (`sandbox.rs`) between the cwd and the argv: the network (`off`, `all`,
//! `ports` with a count and the ports, or `hosts` with a count and a host
//! and a port for each), the blocked ports (a count and
//! the ports), the writable paths and the hidden paths (each a count and
//! the paths). A child that cannot be confined is not started: the answer
//! is `refused` with the reason.

use std::ffi::{OsStr, OsString};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use keel_core::config::{HostPort, NetworkAccess};

use crate::sandbox::Confinement;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// The largest message either side sends or reads. A request is its argv,
/// its cwd and the whole environment; one that does not fit is started
/// directly instead (`spawner.rs`).
pub(crate) const MAX_MESSAGE: usize = 128 * 1024;

/// A request from the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// Start `argv` in `cwd` with exactly `env`, leading a new process
    /// group, with the first three descriptors that came along as its
    /// stdio; the fourth is where its replies go.
    /// Confined as `confinement` says, if given.
    Spawn {
        cwd: OsString,
        argv: Vec<OsString>,
        env: Vec<(OsString, OsString)>,
        confinement: Option<Confinement>,
    },
    /// The runtime may act for `millis` more (a node's lease, docs/nodes.md):
    /// unless renewed by then, the spawner kills every process group it
    /// started that is not reaped yet. No descriptors come along.
    Lease { millis: u64 },
}

/// A reply from the spawner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Sent once, when the spawner is up.
    Ready,
    Spawned {
        pid: u32,
    },
    /// `errno` is the OS error of the failed spawn (0 if there was none).
    Failed {
        errno: i32,
    },
    /// The child could not be confined as asked, so it was not started.
    Refused {
        why: String,
    },
    /// The child exited; `status` is its raw wait status
    /// (`ExitStatus::from_raw`). It stays unreaped until released.
    Exited {
        status: i32,
    },
}

impl Request {
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Request::Spawn {
                cwd,
                argv,
                env,
                confinement,
            } => encode_spawn(cwd, argv, env, confinement.as_ref()),
            Request::Lease { millis } => {
                let mut out = Vec::new();
                field(&mut out, b"lease");
                field(&mut out, millis.to_string().as_bytes());
                out
            }
        }
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Request> {
        let mut fields = fields(bytes)?.into_iter();
        match fields.next()? {
            kind @ (b"spawn" | b"spawn-confined") => {
                let cwd = OsStr::from_bytes(fields.next()?).to_owned();
                let confinement = if kind == b"spawn-confined" {
                    Some(decode_confinement(&mut fields)?)
                } else {
                    None
                };
                let argc: usize = number(fields.next()?)?;
                let mut argv = Vec::with_capacity(argc.min(1024));
                for _ in 0..argc {
                    argv.push(OsString::from_vec(fields.next()?.to_vec()));
                }
                let mut env = Vec::new();
                for entry in fields {
                    // The name ends at the first '=' (a name cannot hold one).
                    let at = entry.iter().position(|byte| *byte == b'=')?;
                    let (name, value) = entry.split_at(at);
                    env.push((
                        OsString::from_vec(name.to_vec()),
                        OsString::from_vec(value.get(1..)?.to_vec()),
                    ));
                }
                Some(Request::Spawn {
                    cwd,
                    argv,
                    env,
                    confinement,
                })
            }
            b"lease" => Some(Request::Lease {
                millis: number(fields.next()?)?,
            }),
            _ => None,
        }
    }
}

/// A [`Request::Spawn`] encoded from borrowed parts: the runtime encodes
/// each call's request without copying its environment first.
pub(crate) fn encode_spawn(
    cwd: &OsStr,
    argv: &[OsString],
    env: &[(OsString, OsString)],
    confinement: Option<&Confinement>,
) -> Vec<u8> {
    let size = cwd.len()
        + argv.iter().map(|arg| arg.len() + 1).sum::<usize>()
        + env
            .iter()
            .map(|(name, value)| name.len() + value.len() + 2)
            .sum::<usize>();
    let mut out = Vec::with_capacity(size + 64);
    field(
        &mut out,
        if confinement.is_some() {
            b"spawn-confined"
        } else {
            b"spawn"
        },
    );
    field(&mut out, cwd.as_bytes());
    if let Some(confinement) = confinement {
        encode_confinement(&mut out, confinement);
    }
    field(&mut out, argv.len().to_string().as_bytes());
    for arg in argv {
        field(&mut out, arg.as_bytes());
    }
    for (name, value) in env {
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
        field(&mut out, value.as_bytes());
    }
    out
}

fn encode_confinement(out: &mut Vec<u8>, confinement: &Confinement) {
    let ports = |out: &mut Vec<u8>, ports: &[u16]| {
        field(out, ports.len().to_string().as_bytes());
        for port in ports {
            field(out, port.to_string().as_bytes());
        }
    };
    let paths = |out: &mut Vec<u8>, paths: &[PathBuf]| {
        field(out, paths.len().to_string().as_bytes());
        for path in paths {
            field(out, path.as_os_str().as_bytes());
        }
    };
    match &confinement.network {
        NetworkAccess::Off => field(out, b"off"),
        NetworkAccess::All => field(out, b"all"),
        NetworkAccess::Ports(allowed) => {
            field(out, b"ports");
            ports(out, allowed);
        }
        NetworkAccess::Hosts(allowed) => {
            field(out, b"hosts");
            field(out, allowed.len().to_string().as_bytes());
            for entry in allowed {
                field(out, entry.host.as_bytes());
                field(out, entry.port.to_string().as_bytes());
            }
        }
    }
    ports(out, &confinement.blocked_ports);
    paths(out, &confinement.writable);
    paths(out, &confinement.hidden);
}

fn decode_confinement<'a>(fields: &mut impl Iterator<Item = &'a [u8]>) -> Option<Confinement> {
    fn ports<'a>(fields: &mut impl Iterator<Item = &'a [u8]>) -> Option<Vec<u16>> {
        let count: usize = number(fields.next()?)?;
        (0..count.min(u16::MAX as usize + 1))
            .map(|_| number(fields.next()?))
            .collect()
    }
    fn paths<'a>(fields: &mut impl Iterator<Item = &'a [u8]>) -> Option<Vec<PathBuf>> {
        let count: usize = number(fields.next()?)?;
        (0..count.min(1024))
            .map(|_| Some(PathBuf::from(OsStr::from_bytes(fields.next()?))))
            .collect()
    }
    let network = match fields.next()? {
        b"off" => NetworkAccess::Off,
        b"all" => NetworkAccess::All,
        b"ports" => NetworkAccess::Ports(ports(fields)?),
        b"hosts" => {
            let count: usize = number(fields.next()?)?;
            NetworkAccess::Hosts(
                (0..count.min(4096))
                    .map(|_| {
                        Some(HostPort {
                            host: std::str::from_utf8(fields.next()?).ok()?.to_owned(),
                            port: number(fields.next()?)?,
                        })
                    })
                    .collect::<Option<_>>()?,
            )
        }
        _ => return None,
    };
    Some(Confinement {
        network,
        blocked_ports: ports(fields)?,
        writable: paths(fields)?,
        hidden: paths(fields)?,
    })
}

impl Reply {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let numbers: Vec<String> = match self {
            Reply::Ready => {
                field(&mut out, b"ready");
                Vec::new()
            }
            Reply::Spawned { pid } => {
                field(&mut out, b"spawned");
                vec![pid.to_string()]
            }
            Reply::Failed { errno } => {
                field(&mut out, b"failed");
                vec![errno.to_string()]
            }
            Reply::Refused { why } => {
                field(&mut out, b"refused");
                // A NUL would end the field early; none is in a message.
                vec![why.replace('\0', " ")]
            }
            Reply::Exited { status } => {
                field(&mut out, b"exited");
                vec![status.to_string()]
            }
        };
        for number in numbers {
            field(&mut out, number.as_bytes());
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Reply> {
        let fields = fields(bytes)?;
        let reply = match fields.as_slice() {
            [b"ready"] => Reply::Ready,
            [b"spawned", pid] => Reply::Spawned { pid: number(pid)? },
            [b"failed", errno] => Reply::Failed {
                errno: number(errno)?,
            },
            [b"exited", status] => Reply::Exited {
                status: number(status)?,
            },
            [b"refused", why] => Reply::Refused {
                why: String::from_utf8_lossy(why).into_owned(),
            },
            _ => return None,
        };
        Some(reply)
    }
}

fn field(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(bytes);
    out.push(0);
}

/// The NUL-terminated fields of a message; `None` if the last is not
/// terminated.
fn fields(bytes: &[u8]) -> Option<Vec<&[u8]>> {
    let body = bytes.strip_suffix(&[0])?;
    Some(body.split(|byte| *byte == 0).collect())
}

fn number<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// Send one message with `fds` attached (none for most).
pub(crate) fn send(
    socket: BorrowedFd<'_>,
    message: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors for one message",
        ));
    }
    let sent = rustix::net::sendmsg(
        socket,
        &[IoSlice::new(message)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != message.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "a message went out cut short",
        ));
    }
    Ok(())
}

/// One received message and the descriptors that came with it (close-on-exec).
pub(crate) struct Received {
    pub(crate) bytes: Vec<u8>,
    pub(crate) fds: Vec<OwnedFd>,
}

/// Receive one message into `buffer`; `None` at end of stream (the peer is
/// gone). A message cut short (longer than the buffer) is an error.
pub(crate) fn receive(socket: impl AsFd, buffer: &mut [u8]) -> io::Result<Option<Received>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(buffer)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if received.bytes == 0 {
        return Ok(None);
    }
    if received.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a message was longer than the buffer",
        ));
    }
    let bytes = buffer.get(..received.bytes).unwrap_or_default().to_vec();
    Ok(Some(Received { bytes, fds }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_round_trips() {
        let lease = Request::Lease { millis: 2_700 };
        assert_eq!(Request::decode(&lease.encode()), Some(lease));
        assert_eq!(Request::decode(b"lease\0soon\0"), None);
    }

    #[test]
    fn requests_round_trip_with_bytes_that_are_not_utf8() {
        let spawn = Request::Spawn {
            cwd: OsString::from_vec(b"/tmp/\xff".to_vec()),
            argv: vec!["bash".into(), "-c".into(), "echo a=b".into(), "".into()],
            env: vec![
                ("A".into(), "x=y".into()),
                ("EMPTY".into(), "".into()),
                (OsString::from_vec(b"N\xfe".to_vec()), "v".into()),
            ],
            confinement: None,
        };
        assert_eq!(Request::decode(&spawn.encode()), Some(spawn));
    }

    #[test]
    fn confinements_round_trip() {
        for network in [
            NetworkAccess::Off,
            NetworkAccess::All,
            NetworkAccess::Ports(vec![443, 8080]),
            NetworkAccess::Ports(Vec::new()),
            NetworkAccess::Hosts(vec![
                HostPort {
                    host: "github.com".to_owned(),
                    port: 443,
                },
                HostPort {
                    host: "::1".to_owned(),
                    port: 8080,
                },
            ]),
        ] {
            let spawn = Request::Spawn {
                cwd: "/work".into(),
                argv: vec!["bash".into()],
                env: vec![("PATH".into(), "/bin".into())],
                confinement: Some(Confinement {
                    writable: vec!["/work".into(), PathBuf::from(OsStr::from_bytes(b"/t\xff"))],
                    hidden: vec!["/data".into()],
                    network,
                    blocked_ports: vec![7878],
                }),
            };
            assert_eq!(Request::decode(&spawn.encode()), Some(spawn));
        }
    }

    #[test]
    fn replies_round_trip() {
        for reply in [
            Reply::Ready,
            Reply::Spawned { pid: 4242 },
            Reply::Failed { errno: 2 },
            Reply::Exited { status: 9 },
            Reply::Refused {
                why: "no Landlock".to_owned(),
            },
        ] {
            assert_eq!(Reply::decode(&reply.encode()), Some(reply.clone()));
        }
    }

    #[test]
    fn malformed_messages_decode_to_nothing() {
        assert_eq!(Request::decode(b"spawn\0"), None);
        assert_eq!(Request::decode(b"release\x001\0"), None);
        assert_eq!(Request::decode(b"spawn\0/\x002\0bash\0"), None);
        assert_eq!(Request::decode(b"spawn\0/\x000\0NOEQUALS\0"), None);
        assert_eq!(Reply::decode(b"spawned\0"), None);
        assert_eq!(Reply::decode(b"exited\0x\0"), None);
        assert_eq!(Reply::decode(b"spawned\x001"), None);
        assert_eq!(Reply::decode(b""), None);
    }
}
