//! The way out of a call whose network is a list of hosts
//! (docs/sandbox.md, "A list of hosts"). The kernel's rules know ports,
//! not hosts, so such a call gets a network namespace of its own, with
//! nothing in it but its loopback: no route out, no DNS. keel listens in
//! that namespace and carries allowed connections out from its own:
//!
//! - an HTTP proxy at `127.0.0.1:PORT` ([`proxy_port`]; the call's
//!   `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` name it): `CONNECT
//!   host:port` (HTTPS, and any TCP a client tunnels) and plain `http://`
//!   requests, each to a host and port the list allows, by the name the
//!   client gave; anything else is answered `403` and never connected;
//! - for each entry naming this machine's loopback (`localhost`,
//!   `127.0.0.1`, `::1`), a listener at that same address and port, so
//!   that a client that ignores proxies reaches it as it would outside.
//!
//! The namespace is entered by the thread that then confines itself and
//! starts the call's process ([`enter`]), so the process and everything it
//! starts are in it; the listening and connecting are done by threads of
//! the starting process that stayed in its own namespace ([`serve`]), until
//! the call's first process exits (its PID namespace, and every process in
//! it, ends then): then every listener and connection is closed.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keel_core::config::HostPort;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST,
};
use netlink_packet_route::link::{LinkFlags, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use rustix::event::{PollFd, PollFlags};

/// Where a call's proxy listens in its namespace: 3128 (the port proxies
/// are known by), or the first port above it that no loopback entry of
/// the list takes for itself.
pub fn proxy_port(allowed: &[HostPort]) -> u16 {
    let mut port = 3128;
    while allowed
        .iter()
        .any(|entry| entry.is_loopback() && entry.port == port)
    {
        port += 1;
    }
    port
}

/// The environment that points a call's clients at its proxy (and takes
/// away any `NO_PROXY` that would send them around it, into a namespace
/// with no way out).
pub fn proxy_environment(allowed: &[HostPort]) -> Vec<(&'static str, String)> {
    let url = format!("http://127.0.0.1:{}", proxy_port(allowed));
    [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .into_iter()
    .map(|name| (name, url.clone()))
    .collect()
}

/// The variables [`proxy_environment`] replaces or removes.
pub const PROXY_VARIABLES: [&str; 8] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
];

/// What a call may reach.
#[derive(Debug)]
pub(super) struct Rules {
    pub allowed: Vec<HostPort>,
    /// Never, whatever the list says (the daemon's own port).
    pub blocked_ports: Vec<u16>,
}

impl Rules {
    /// Why a connection to `host:port` is refused, or `None`.
    fn refusal(&self, host: &str, port: u16) -> Option<String> {
        if self.blocked_ports.contains(&port) {
            return Some(format!(
                "port {port} is keel's own and no tool may connect to it"
            ));
        }
        if self.allowed.iter().any(|entry| entry.allows(host, port)) {
            return None;
        }
        let list: Vec<String> = self.allowed.iter().map(HostPort::to_string).collect();
        Some(format!(
            "{host}:{port} is not on this conversation's network list ({})",
            list.join(", ")
        ))
    }
}

/// What [`enter`] listens on, for [`serve`].
#[derive(Debug)]
pub(super) struct Listeners {
    rules: Arc<Rules>,
    /// The proxy's, and a forwarder's with where it forwards to.
    listening: Vec<(TcpListener, Option<(String, u16)>)>,
}

/// Move the calling thread into a network namespace of its own (what it
/// starts from now on is in it), bring its loopback up and listen there:
/// the proxy, and a forwarder for each loopback entry. Needs
/// `CAP_SYS_ADMIN` in this process's user namespace (the spawner has it
/// in its own).
pub(super) fn enter(rules: Arc<Rules>) -> io::Result<Listeners> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
    loopback_up()?;
    let mut listening = Vec::new();
    let proxy = proxy_port(&rules.allowed);
    listening.push((
        TcpListener::bind((Ipv4Addr::LOCALHOST, proxy))?,
        None::<(String, u16)>,
    ));
    for entry in rules.allowed.iter().filter(|entry| entry.is_loopback()) {
        if rules.blocked_ports.contains(&entry.port) {
            continue;
        }
        let addresses: Vec<IpAddr> = match entry.host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()],
        };
        for address in addresses {
            match TcpListener::bind((address, entry.port)) {
                Ok(listener) => {
                    listening.push((listener, Some((entry.host.clone(), entry.port))));
                }
                // A kernel without IPv6 has no `::1` to listen on.
                Err(_) if address.is_ipv6() && entry.host == "localhost" => {}
                Err(error) => return Err(error),
            }
        }
    }
    for (listener, _) in &listening {
        listener.set_nonblocking(true)?;
    }
    Ok(Listeners { rules, listening })
}

/// Bring up the loopback of the calling thread's network namespace (a
/// new namespace's is down: no address, not even `127.0.0.1`), with one
/// `RTM_SETLINK` on index 1, which a new namespace's loopback always has.
fn loopback_up() -> io::Result<()> {
    let mut socket = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
    let mut link = LinkMessage::default();
    link.header.index = 1;
    link.header.flags = LinkFlags::Up;
    link.header.change_mask = LinkFlags::Up;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK;
    let mut request = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::SetLink(link)),
    );
    request.finalize();
    let mut bytes = vec![0; request.buffer_len()];
    request.serialize(&mut bytes);
    socket.send(&bytes, 0)?;
    let mut reply = vec![0; 4096];
    let read = socket.recv(&mut &mut reply[..], 0)?;
    let answer =
        NetlinkMessage::<RouteNetlinkMessage>::deserialize(reply.get(..read).unwrap_or_default())
            .map_err(|error| io::Error::other(format!("netlink: {error}")))?;
    match answer.payload {
        NetlinkPayload::Error(error) => match error.code {
            None => Ok(()),
            Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
        },
        _ => Ok(()),
    }
}

/// Serve `listeners` from a thread of this process's own namespace until
/// the process `pid` (the call's first, in its PID namespace) exits.
pub(super) fn serve(listeners: Listeners, pid: u32) -> io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| io::Error::other("no such process"))?;
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
    std::thread::Builder::new()
        .name("keel-egress".to_owned())
        .stack_size(THREAD_STACK)
        .spawn(move || run(listeners, pidfd))?;
    Ok(())
}

/// The most connections one call has open through keel at once; more
/// are closed as they come.
const MAX_CONNECTIONS: usize = 64;

/// How long a client has to say where it goes, and keel to connect there.
const HANDSHAKE: Duration = Duration::from_secs(30);

/// The longest request head the proxy reads.
const MAX_HEAD: usize = 16 * 1024;

/// A connection thread's stack: it copies bytes, nothing deep.
const THREAD_STACK: usize = 128 * 1024;

/// The open connections, by number, to close when the call ends.
#[derive(Default)]
struct Open {
    ended: bool,
    next: u64,
    streams: HashMap<u64, Vec<TcpStream>>,
}

type Shared = Arc<Mutex<Open>>;

fn run(listeners: Listeners, pidfd: OwnedFd) {
    let Listeners { rules, listening } = listeners;
    let open: Shared = Arc::default();
    loop {
        let mut polled: Vec<PollFd<'_>> = listening
            .iter()
            .map(|(listener, _)| PollFd::new(listener, PollFlags::IN))
            .chain([PollFd::new(&pidfd, PollFlags::IN)])
            .collect();
        match rustix::event::poll(&mut polled, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
        let ready: Vec<bool> = polled.iter().map(|fd| !fd.revents().is_empty()).collect();
        if ready.last().copied().unwrap_or(true) {
            break;
        }
        for ((listener, target), ready) in listening.iter().zip(ready) {
            if !ready {
                continue;
            }
            while let Ok((client, _)) = listener.accept() {
                let id = {
                    let mut open = open.lock().unwrap_or_else(PoisonError::into_inner);
                    if open.streams.len() >= MAX_CONNECTIONS {
                        continue;
                    }
                    open.next += 1;
                    let id = open.next;
                    if let Ok(copy) = client.try_clone() {
                        open.streams.insert(id, vec![copy]);
                    }
                    id
                };
                let rules = rules.clone();
                let target = target.clone();
                let shared = open.clone();
                let started = std::thread::Builder::new()
                    .name("keel-egress-conn".to_owned())
                    .stack_size(THREAD_STACK)
                    .spawn(move || {
                        connection(client, target, &rules, id, &shared);
                        shared
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .streams
                            .remove(&id);
                    });
                if started.is_err() {
                    open.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .streams
                        .remove(&id);
                }
            }
        }
    }
    // The call is over: nothing it opened stays open.
    let mut open = open.lock().unwrap_or_else(PoisonError::into_inner);
    open.ended = true;
    for stream in open.streams.values().flatten() {
        let _ = stream.shutdown(Shutdown::Both);
    }
}

/// Carry one connection: where it goes (the forwarder's target, or what
/// the client asks the proxy for), then its bytes both ways.
fn connection(
    client: TcpStream,
    target: Option<(String, u16)>,
    rules: &Rules,
    id: u64,
    open: &Shared,
) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_read_timeout(Some(HANDSHAKE));
    let outcome = match target {
        Some((host, port)) => match rules.refusal(&host, port) {
            Some(_) => return,
            None => connect(&host, port).map(|upstream| (upstream, Vec::new(), false)),
        },
        None => match proxy_request(&client, rules) {
            Ok(Ok(route)) => connect(&route.host, route.port)
                .map(|upstream| (upstream, route.preface, route.tunnel)),
            Ok(Err(answer)) => {
                let _ = (&client).write_all(answer.as_bytes());
                return;
            }
            Err(_) => return,
        },
    };
    let (upstream, preface, tunnel) = match outcome {
        Ok(connected) => connected,
        Err(error) => {
            let _ = (&client).write_all(
                answer(
                    "502 Bad Gateway",
                    &format!("keel could not connect: {error}"),
                )
                .as_bytes(),
            );
            return;
        }
    };
    {
        let mut shared = open.lock().unwrap_or_else(PoisonError::into_inner);
        if shared.ended {
            return;
        }
        if let (Ok(copy), Some(streams)) = (upstream.try_clone(), shared.streams.get_mut(&id)) {
            streams.push(copy);
        }
    }
    let _ = client.set_read_timeout(None);
    if tunnel
        && (&client)
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .is_err()
    {
        return;
    }
    if (&upstream).write_all(&preface).is_err() {
        return;
    }
    let (Ok(client_in), Ok(upstream_out)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let outbound = std::thread::Builder::new()
        .name("keel-egress-out".to_owned())
        .stack_size(THREAD_STACK)
        .spawn(move || copy_then_close(client_in, upstream_out));
    copy_then_close(upstream, client);
    if let Ok(outbound) = outbound {
        let _ = outbound.join();
    }
}

/// Copy `from` to `to` until `from` ends, then end `to`'s writing side.
fn copy_then_close(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

/// Connect from this process's namespace to `host:port`, trying each of
/// its addresses.
fn connect(host: &str, port: u16) -> io::Result<TcpStream> {
    let host = host
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(host);
    let addresses: Vec<SocketAddr> =
        std::net::ToSocketAddrs::to_socket_addrs(&(host, port))?.collect();
    let mut last = io::Error::other(format!("{host} has no address"));
    for address in addresses {
        match TcpStream::connect_timeout(&address, HANDSHAKE) {
            Ok(stream) => return Ok(stream),
            Err(error) => last = error,
        }
    }
    Err(last)
}

/// Where a proxy client goes, and what to send there first.
struct Route {
    host: String,
    port: u16,
    /// `CONNECT`: answer `200` and carry bytes; else the request, rewritten
    /// for the origin server, is the preface.
    tunnel: bool,
    preface: Vec<u8>,
}

/// Read a proxy request from `client` and decide: `Ok(Ok(route))` to
/// connect, `Ok(Err(answer))` to refuse with `answer`, `Err` if the client
/// went away or never finished its request.
fn proxy_request(client: &TcpStream, rules: &Rules) -> io::Result<Result<Route, String>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0_u8; 4096];
    loop {
        let read = (&*client).read(&mut chunk)?;
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(chunk.get(..read).unwrap_or_default());
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&head) {
            Ok(httparse::Status::Complete(length)) => {
                return Ok(route(
                    &request,
                    head.get(length..).unwrap_or_default(),
                    rules,
                ));
            }
            Ok(httparse::Status::Partial) if head.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) => {
                return Ok(Err(answer(
                    "431 Request Header Fields Too Large",
                    "keel's proxy reads request heads of 16 KiB at most",
                )))
            }
            Err(error) => {
                return Ok(Err(answer(
                    "400 Bad Request",
                    &format!("keel's proxy cannot read this request: {error}"),
                )))
            }
        }
    }
}

fn route(request: &httparse::Request<'_, '_>, body: &[u8], rules: &Rules) -> Result<Route, String> {
    let method = request.method.unwrap_or_default();
    let target = request.path.unwrap_or_default();
    let (host, port, tunnel, path) = if method.eq_ignore_ascii_case("CONNECT") {
        let authority: http::uri::Authority = target
            .parse()
            .map_err(|_| answer("400 Bad Request", "CONNECT needs host:port"))?;
        let port = authority
            .port_u16()
            .ok_or_else(|| answer("400 Bad Request", "CONNECT needs host:port"))?;
        (authority.host().to_owned(), port, true, String::new())
    } else {
        let uri: http::Uri = target.parse().map_err(|_| {
            answer(
                "400 Bad Request",
                "keel's proxy takes CONNECT host:port or an http:// URL",
            )
        })?;
        if uri.scheme_str() != Some("http") {
            return Err(answer(
                "400 Bad Request",
                "keel's proxy takes CONNECT host:port or an http:// URL",
            ));
        }
        let host = uri.host().unwrap_or_default().to_owned();
        let path = uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
            .to_owned();
        (host, uri.port_u16().unwrap_or(80), false, path)
    };
    if let Some(why) = rules.refusal(&host, port) {
        return Err(answer(
            "403 Forbidden",
            &format!("keel's sandbox refused: {why} (docs/sandbox.md)"),
        ));
    }
    let mut preface = Vec::new();
    if !tunnel {
        // The request as the origin server expects it: its path, without
        // what was for the proxy.
        preface.extend_from_slice(format!("{method} {path} HTTP/1.1\r\n").as_bytes());
        for header in request.headers.iter() {
            if header.name.to_ascii_lowercase().starts_with("proxy-") {
                continue;
            }
            preface.extend_from_slice(header.name.as_bytes());
            preface.extend_from_slice(b": ");
            preface.extend_from_slice(header.value);
            preface.extend_from_slice(b"\r\n");
        }
        preface.extend_from_slice(b"\r\n");
    }
    preface.extend_from_slice(body);
    Ok(Route {
        host,
        port,
        tunnel,
        preface,
    })
}

/// A whole HTTP answer with `status` and `message` as its text.
fn answer(status: &str, message: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{message}\n",
        message.len() + 1
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The entries of a network list that names hosts.
    fn allowed(entries: &[&str]) -> Vec<HostPort> {
        match keel_core::config::NetworkAccess::parse_list(entries.iter().copied()).unwrap() {
            keel_core::config::NetworkAccess::Hosts(allowed) => allowed,
            other => panic!("not a host list: {other:?}"),
        }
    }

    fn rules(entries: &[&str]) -> Rules {
        Rules {
            allowed: allowed(entries),
            blocked_ports: vec![7000],
        }
    }

    fn parse(head: &str, rules: &Rules) -> Result<Route, String> {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut request = httparse::Request::new(&mut headers);
        let httparse::Status::Complete(length) = request.parse(head.as_bytes()).unwrap() else {
            panic!("complete");
        };
        route(&request, &head.as_bytes()[length..], rules)
    }

    #[test]
    fn the_proxy_routes_what_the_list_allows_and_refuses_the_rest() {
        let rules = rules(&["github.com:443", "example.org:80", "*:7000", "[::1]:8080"]);
        let tunnel = parse(
            "CONNECT github.com:443 HTTP/1.1\r\nHost: github.com:443\r\n\r\n",
            &rules,
        )
        .unwrap();
        assert_eq!(
            (tunnel.host.as_str(), tunnel.port, tunnel.tunnel),
            ("github.com", 443, true)
        );
        assert!(tunnel.preface.is_empty());
        let v6 = parse("CONNECT [::1]:8080 HTTP/1.1\r\n\r\n", &rules).unwrap();
        assert_eq!(v6.port, 8080);

        let plain = parse(
            "GET http://example.org/a?b=1 HTTP/1.1\r\nHost: example.org\r\nProxy-Connection: keep-alive\r\n\r\nbody",
            &rules,
        )
        .unwrap();
        assert_eq!(
            (plain.host.as_str(), plain.port, plain.tunnel),
            ("example.org", 80, false)
        );
        assert_eq!(
            String::from_utf8(plain.preface).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: example.org\r\n\r\nbody"
        );

        for (head, status) in [
            ("CONNECT github.com:22 HTTP/1.1\r\n\r\n", "403"),
            ("CONNECT api.github.com:443 HTTP/1.1\r\n\r\n", "403"),
            ("CONNECT 140.82.112.3:443 HTTP/1.1\r\n\r\n", "403"),
            ("GET http://example.org:8080/ HTTP/1.1\r\n\r\n", "403"),
            ("CONNECT anything:7000 HTTP/1.1\r\n\r\n", "403"),
            ("GET https://github.com/ HTTP/1.1\r\n\r\n", "400"),
            ("GET / HTTP/1.1\r\nHost: github.com\r\n\r\n", "400"),
            ("CONNECT github.com HTTP/1.1\r\n\r\n", "400"),
        ] {
            let refused = parse(head, &rules).err().unwrap_or_default();
            assert!(
                refused.starts_with(&format!("HTTP/1.1 {status}")),
                "{head}: {refused}"
            );
        }
        let refused = parse("CONNECT github.com:22 HTTP/1.1\r\n\r\n", &rules)
            .err()
            .unwrap();
        assert!(
            refused.contains("github.com:22 is not on this conversation's network list"),
            "{refused}"
        );
        let keel = parse("CONNECT anything:7000 HTTP/1.1\r\n\r\n", &rules)
            .err()
            .unwrap();
        assert!(keel.contains("keel's own"), "{keel}");
    }

    #[test]
    fn the_proxy_port_steps_aside_for_a_loopback_entry() {
        assert_eq!(proxy_port(&allowed(&["github.com:443"])), 3128);
        assert_eq!(proxy_port(&allowed(&["github.com:3128"])), 3128);
        assert_eq!(
            proxy_port(&allowed(&["localhost:3128", "127.0.0.1:3129"])),
            3130
        );
    }
}
