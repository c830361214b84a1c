//! Privileged tests of locked egress (`egress = "locked"`): the sidecar's
//! resolver and the timed name sets. Each test builds its own host and fake
//! internet in namespaces it created, with a fake upstream DNS server in
//! the "world"; nothing reaches the machine's real interfaces. They fail
//! (never skip) without root.

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lazaret_netpolicy::dnswire::{self, AnswerRecord, Header, Rcode, RecordData, TYPE_A};
use lazaret_netpolicy::names::{NameRule, parse_name_rule};
use lazaret_netpolicy::policy::{PolicyInput, parse_prefixes};
use lazaret_netpolicy::resolver::TtlClamp;
use lazaret_netpolicy::topology::{
    DomainNetwork, LOCKED_TABLE, Netns, ResolverSettings, TopologyConfig, TopologyError, locked_set_name, refused_destinations,
    set_addresses,
};
use support::*;

/// What the allowed name resolves to (through a CNAME).
const NAMED: Ipv4Addr = Ipv4Addr::new(11, 2, 2, 2);
/// A public address no allowed name resolves to.
const UNNAMED: Ipv4Addr = Ipv4Addr::new(11, 4, 4, 4);
/// What the port-restricted name resolves to.
const PORTED: Ipv4Addr = Ipv4Addr::new(11, 3, 3, 3);
/// What the short-lived name resolves to.
const SHORT: Ipv4Addr = Ipv4Addr::new(11, 5, 5, 5);
/// A TCP port nothing listens on in the world.
const CLOSED_PORT: u16 = 9090;

fn rule(text: &str) -> NameRule {
    let (pattern, port) = parse_name_rule(text).expect("valid rule");
    NameRule { pattern, port, origin: format!("test.toml:{text}") }
}

fn input() -> PolicyInput {
    PolicyInput {
        locked: true,
        names: vec![rule("allowed.example"), rule("ported.example:8080"), rule("short.example")],
        allow: parse_prefixes(&[("10.222.0.0/16", "test.toml:1:1")]).expect("prefix"),
        dns: vec![IpAddr::V4(RESOLVER)],
        ..PolicyInput::default()
    }
}

/// The world's DNS server on RESOLVER:53 (UDP and TCP): a CNAME for
/// allowed.example, TTL 1 for short.example; every name it is asked is
/// recorded.
struct FakeDns {
    asked: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn fake_answer(query: &[u8]) -> Option<Vec<u8>> {
    let (_, question) = dnswire::parse_query(query).ok()?;
    let a = |name: &str, ttl, address: Ipv4Addr| AnswerRecord { name: name.into(), ttl, data: RecordData::A(address) };
    let records = match (question.name.as_str(), question.qtype) {
        ("allowed.example", TYPE_A) => vec![
            AnswerRecord { name: "allowed.example".into(), ttl: 300, data: RecordData::Cname("edge.cdn.example".into()) },
            a("edge.cdn.example", 300, NAMED),
        ],
        ("ported.example", TYPE_A) => vec![a("ported.example", 300, PORTED)],
        ("short.example", TYPE_A) => vec![a("short.example", 1, SHORT)],
        // Anything else it would answer too: the point is that it is never asked.
        (name, TYPE_A) => vec![a(name, 300, UNNAMED)],
        _ => vec![],
    };
    dnswire::answer(query, Rcode::NoError, &records)
}

impl FakeDns {
    fn start(world: &Netns) -> FakeDns {
        let (udp, tcp) = world
            .run(|| {
                let address = SocketAddr::new(IpAddr::V4(RESOLVER), 53);
                let io = |source| TopologyError::Io { action: "fake DNS".into(), source };
                let udp = UdpSocket::bind(address).map_err(io)?;
                let tcp = std::net::TcpListener::bind(address).map_err(io)?;
                Ok((udp, tcp))
            })
            .expect("fake DNS sockets");
        udp.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        tcp.set_nonblocking(true).expect("non-blocking");
        let asked = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (asked_udp, stop_udp) = (asked.clone(), stop.clone());
        let udp_thread = std::thread::spawn(move || {
            let mut buffer = [0u8; 1500];
            while !stop_udp.load(Ordering::SeqCst) {
                let Ok((n, peer)) = udp.recv_from(&mut buffer) else { continue };
                if let Ok((_, q)) = dnswire::parse_query(&buffer[..n]) {
                    asked_udp.lock().expect("lock").push(q.name);
                }
                if let Some(reply) = fake_answer(&buffer[..n]) {
                    let _ = udp.send_to(&reply, peer);
                }
            }
        });
        let (asked_tcp, stop_tcp) = (asked.clone(), stop.clone());
        let tcp_thread = std::thread::spawn(move || {
            use std::io::{Read, Write};
            while !stop_tcp.load(Ordering::SeqCst) {
                let Ok((mut stream, _)) = tcp.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut length = [0u8; 2];
                if stream.read_exact(&mut length).is_err() {
                    continue;
                }
                let mut query = vec![0; usize::from(u16::from_be_bytes(length))];
                if stream.read_exact(&mut query).is_err() {
                    continue;
                }
                if let Ok((_, q)) = dnswire::parse_query(&query) {
                    asked_tcp.lock().expect("lock").push(format!("tcp:{}", q.name));
                }
                if let Some(reply) = fake_answer(&query) {
                    let _ = stream.write_all(&[&(reply.len() as u16).to_be_bytes()[..], &reply].concat());
                }
            }
        });
        FakeDns { asked, stop, threads: vec![udp_thread, tcp_thread] }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().expect("lock").clone()
    }
}

impl Drop for FakeDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// UDP echo servers on `addresses` in the world, port PORT (one socket per
/// address, so each reply leaves from the address the datagram was sent to).
fn udp_echo(world: &Netns, addresses: &[Ipv4Addr], stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let sockets: Vec<UdpSocket> = addresses
        .iter()
        .map(|address| {
            let address = *address;
            world
                .run(move || UdpSocket::bind((address, PORT)).map_err(|source| TopologyError::Io { action: "udp echo".into(), source }))
                .expect("udp echo")
        })
        .collect();
    for socket in &sockets {
        socket.set_nonblocking(true).expect("non-blocking");
    }
    std::thread::spawn(move || {
        let mut buffer = [0u8; 512];
        while !stop.load(Ordering::SeqCst) {
            for socket in &sockets {
                if let Ok((n, peer)) = socket.recv_from(&mut buffer) {
                    let _ = socket.send_to(&buffer[..n], peer);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// Asks `resolver` for `name` (A) over UDP or TCP from inside `ns`.
fn resolve(ns: &Netns, resolver: SocketAddr, name: &str, tcp: bool) -> (u8, Vec<IpAddr>) {
    let name = name.to_string();
    ns.run(move || {
        let io = |source| TopologyError::Io { action: "resolve".into(), source };
        let query = dnswire::query(0x4242, &name, TYPE_A).expect("query");
        let reply = if tcp {
            use std::io::{Read, Write};
            let mut stream = TcpStream::connect_timeout(&resolver, Duration::from_secs(5)).map_err(io)?;
            stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(io)?;
            stream.write_all(&[&(query.len() as u16).to_be_bytes()[..], &query].concat()).map_err(io)?;
            let mut length = [0u8; 2];
            stream.read_exact(&mut length).map_err(io)?;
            let mut reply = vec![0; usize::from(u16::from_be_bytes(length))];
            stream.read_exact(&mut reply).map_err(io)?;
            reply
        } else {
            let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(io)?;
            socket.set_read_timeout(Some(Duration::from_secs(5))).map_err(io)?;
            socket.send_to(&query, resolver).map_err(io)?;
            let mut buffer = [0u8; 1500];
            let (n, _) = socket.recv_from(&mut buffer).map_err(io)?;
            buffer[..n].to_vec()
        };
        let header = Header::parse(&reply).expect("reply header");
        let addresses = dnswire::parse_response(&reply).map(|r| r.answers.iter().filter_map(|a| a.address()).collect()).unwrap_or_default();
        Ok((header.rcode(), addresses))
    })
    .expect("resolve worker")
}

/// Sends one UDP datagram to `target` from inside `ns`; whether an echo came back.
fn udp_roundtrip(ns: &Netns, target: SocketAddr) -> bool {
    ns.run(move || {
        let io = |source| TopologyError::Io { action: "udp".into(), source };
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(io)?;
        // Bounds a lost datagram; the assertion is on whether the echo came.
        socket.set_read_timeout(Some(Duration::from_millis(500))).map_err(io)?;
        socket.send_to(b"ping", target).map_err(io)?;
        let mut buffer = [0u8; 16];
        Ok(socket.recv_from(&mut buffer).is_ok_and(|(n, _)| &buffer[..n] == b"ping"))
    })
    .expect("udp worker")
}

#[test]
fn locked_domain_reaches_only_what_allowed_names_resolve_to() {
    let net = FakeInternet::new();
    for address in [NAMED, UNNAMED, PORTED, SHORT] {
        ip_in(&net.world, &["addr", "add", &format!("{address}/32"), "dev", "lo"]);
    }
    let dns = FakeDns::start(&net.world);
    let stop_echo = Arc::new(AtomicBool::new(false));
    let echo = udp_echo(&net.world, &[NAMED, UNNAMED], stop_echo.clone());
    let before = net.host_snapshot();

    let domain = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &input())
        .unwrap_or_else(|error| panic!("building the locked Domain network failed: {error}"));
    let mut settings = ResolverSettings::new(vec![IpAddr::V4(RESOLVER)]);
    // Test-only lower clamp: short.example's 1-second TTL is kept as it is.
    settings.clamp = TtlClamp { min: Duration::from_secs(1), max: Duration::from_secs(3600) };
    let resolver = domain.start_resolver(settings).expect("start resolver");
    let server = SocketAddr::V4(domain.resolver_address());
    let sandbox = domain.sandbox_netns().expect("sandbox netns");

    // Nothing is open before a name is resolved.
    assert_eq!(connect_from(sandbox, NAMED), Reach::Unreachable, "not yet resolved");
    // The upstream resolver itself is out of the sandbox's reach.
    assert!(!resolve_direct(sandbox, RESOLVER), "the upstream resolver must not answer the sandbox");

    // The allowed name resolves (through its CNAME) and its address opens, TCP and UDP.
    assert_eq!(resolve(sandbox, server, "Allowed.Example", false), (Rcode::NoError as u8, vec![IpAddr::V4(NAMED)]));
    assert_eq!(connect_from(sandbox, NAMED), Reach::Connected);
    assert!(udp_roundtrip(sandbox, SocketAddr::new(IpAddr::V4(NAMED), PORT)), "UDP to the resolved address");
    // TCP DNS too.
    assert_eq!(resolve(sandbox, server, "allowed.example", true), (Rcode::NoError as u8, vec![IpAddr::V4(NAMED)]));
    assert!(dns.asked().contains(&"tcp:allowed.example".to_string()), "{:?}", dns.asked());

    // A public address nobody resolved stays closed, TCP and UDP.
    assert_eq!(connect_from(sandbox, UNNAMED), Reach::Unreachable);
    assert!(!udp_roundtrip(sandbox, SocketAddr::new(IpAddr::V4(UNNAMED), PORT)));

    // Another name is refused without asking upstream, however long and random.
    let exfil =
        "x7f3a9c0d2e4b6a8c0e2f4a6b8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a0b.c4d6e8f0a2b4c6d8e0f2a4b6c8d0e2f4a6b8c0d2e4f6a8.data.evil.example";
    assert_eq!(resolve(sandbox, server, exfil, false), (Rcode::Refused as u8, vec![]));
    assert_eq!(resolve(sandbox, server, exfil, true), (Rcode::Refused as u8, vec![]));
    assert!(!dns.asked().iter().any(|name| name.contains("evil")), "the refused name reached upstream: {:?}", dns.asked());
    let refused = resolver.refused_names();
    assert_eq!((refused[0].name.as_str(), refused[0].count), (exfil, 2));

    // A name with a port opens that port only.
    assert_eq!(resolve(sandbox, server, "ported.example", false).1, vec![IpAddr::V4(PORTED)]);
    assert_eq!(connect_from(sandbox, PORTED), Reach::Connected);
    assert_eq!(
        connect_to(sandbox, SocketAddr::new(IpAddr::V4(PORTED), CLOSED_PORT)),
        Reach::Unreachable,
        "other port rejected by the sidecar, not refused by the server"
    );
    assert_eq!(
        connect_to(sandbox, SocketAddr::new(IpAddr::V4(NAMED), CLOSED_PORT)),
        Reach::Other("Connection refused (os error 111)".into()),
        "the unported name opens every port"
    );

    // A short TTL closes the address again once the answer's lifetime is over.
    assert_eq!(resolve(sandbox, server, "short.example", false).1, vec![IpAddr::V4(SHORT)]);
    assert_eq!(connect_from(sandbox, SHORT), Reach::Connected);
    let set = locked_set_name(true, None);
    let sidecar = domain.sidecar_netns().expect("sidecar netns");
    let deadline = Instant::now() + Duration::from_secs(20);
    while sidecar.run(|| set_addresses(LOCKED_TABLE, &set)).expect("dump set").iter().any(|(a, _)| *a == IpAddr::V4(SHORT)) {
        assert!(Instant::now() < deadline, "short.example's address never expired");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(connect_from(sandbox, SHORT), Reach::Unreachable, "closed after the TTL");
    // The long-lived one is still open.
    assert_eq!(connect_from(sandbox, NAMED), Reach::Connected);
    // An allow_egress prefix is open without a name.
    assert_eq!(connect_from(sandbox, ALLOWED_PRIVATE), Reach::Connected);

    // What the locked filter refused is counted; what it let through is not.
    let refused = refused_destinations(sidecar).expect("refused destinations");
    let counted = |address: Ipv4Addr, protocol: u8, port: u16| {
        refused.iter().any(|r| r.address == IpAddr::V4(address) && r.protocol == protocol && r.port == Some(port) && r.packets >= 1)
    };
    assert!(counted(UNNAMED, 6, PORT) && counted(UNNAMED, 17, PORT), "the unnamed address, TCP and UDP: {refused:?}");
    assert!(counted(RESOLVER, 17, 53), "the upstream resolver asked directly: {refused:?}");
    assert!(counted(PORTED, 6, CLOSED_PORT), "the port a ported name does not open: {refused:?}");
    assert!(counted(SHORT, 6, PORT), "the expired name's address: {refused:?}");
    assert!(!refused.iter().any(|r| r.address == IpAddr::V4(ALLOWED_PRIVATE)), "an allowed prefix: {refused:?}");
    assert!(
        !refused.iter().any(|r| r.address == IpAddr::V4(NAMED) && r.protocol == 17),
        "UDP to the named address went through: {refused:?}"
    );
    assert!(!refused.iter().any(|r| r.address == IpAddr::V4(PORTED) && r.port == Some(PORT)), "the ported name's port: {refused:?}");
    domain.verify_installed().expect("read back");
    resolver.stop();
    domain.teardown().expect("teardown");
    stop_echo.store(true, Ordering::SeqCst);
    let _ = echo.join();
    assert_eq!(net.host_snapshot(), before, "the test host is exactly as before");
}

/// Whether the upstream resolver answers a query sent to it directly from `ns`.
fn resolve_direct(ns: &Netns, upstream: Ipv4Addr) -> bool {
    ns.run(move || {
        let io = |source| TopologyError::Io { action: "direct".into(), source };
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(io)?;
        socket.set_read_timeout(Some(Duration::from_millis(500))).map_err(io)?;
        let query = dnswire::query(1, "allowed.example", TYPE_A).expect("query");
        socket.send_to(&query, (upstream, 53)).map_err(io)?;
        let mut buffer = [0u8; 512];
        Ok(socket.recv_from(&mut buffer).is_ok())
    })
    .expect("direct worker")
}
