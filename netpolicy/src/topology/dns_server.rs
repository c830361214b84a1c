//! The locked Domain's resolver at run time: threads of the process that
//! owns the [`DomainNetwork`] (the coordinator's Domain daemon), no child
//! process, no new privileges.
//!
//! * It listens on the sandbox's gateway, UDP and TCP port 53: sockets
//!   created inside the sidecar namespace (a socket stays in the namespace
//!   it was made in). The self-guard lets the sandbox reach exactly that.
//! * Its serving threads live in the host namespace, so each upstream query
//!   gets a fresh socket (a random source port) there: the sidecar's own
//!   addresses are no source the host forwards.
//! * Decisions are [`crate::resolver`]'s: refused names are answered at
//!   once and never leave; for an allowed name the resolver asks upstream
//!   a query it writes itself (the question alone), rebuilds the answer
//!   from the CNAME chain of the name asked and the addresses at its end
//!   that the Domain's current policy lets the sandbox reach and that are
//!   none of Lazaret's own (the upstream resolvers, the Domain's
//!   addresses), puts those addresses into the name sets of
//!   `inet lazaret-locked` (through a worker thread inside the sidecar
//!   namespace, acknowledged by the kernel) and only then answers the
//!   sandbox, so the sandbox cannot connect before the address is open.
//!   Nothing of the upstream's message reaches the sandbox verbatim.
//! * At most [`MAX_OPENED`] (set, address) pairs are open at once; an
//!   answer that would open more gets SERVFAIL.
//! * An address several names (or answers) opened keeps the latest expiry.
//! * Dropping the [`LockedResolver`] stops and joins every thread (within
//!   about [`POLL`]); the sockets close with them.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::nftset::{SetElement, put_elements};
use super::{DNS_PORT, DomainNetwork, Netns, TopologyError, nft};
use crate::dnswire::{self, Question, Rcode, Response};
use crate::names::NamePolicy;
use crate::policy::CompiledPolicy;
use crate::resolver::{self, QueryDecision, TtlClamp};

/// How often idle threads look at the stop flag.
pub const POLL: Duration = Duration::from_millis(100);
/// At most this many queries wait for the upstream at once (more get SERVFAIL).
const MAX_IN_FLIGHT: usize = 64;
/// At most this many TCP connections at once.
const MAX_TCP: usize = 16;
/// A TCP client must send each query within this time.
const TCP_IDLE: Duration = Duration::from_secs(5);
/// Largest UDP message read (EDNS sizes included).
const UDP_MAX: usize = 4096;
/// At most this many distinct refused names are remembered.
const MAX_LOGGED: usize = 1024;
/// At most this many (set, address) pairs are open at once: names the
/// agent controls must not grow the kernel's sets without bound.
pub const MAX_OPENED: usize = 4096;

/// How the resolver runs.
#[derive(Debug, Clone)]
pub struct ResolverSettings {
    /// The Domain's upstream resolvers, in order.
    pub upstream: Vec<IpAddr>,
    /// The clamp of answer TTLs (see [`TtlClamp`]).
    pub clamp: TtlClamp,
    /// How long one upstream may take to answer.
    pub upstream_timeout: Duration,
    /// Where the refused names are kept for `lazaret policy log` (JSON, a
    /// list of [`RefusedName`], rewritten at most once a second and at stop).
    pub log_file: Option<std::path::PathBuf>,
}

impl ResolverSettings {
    /// Defaults for `upstream`: TTLs clamped to 30 s .. 1 h, 2 s per upstream.
    pub fn new(upstream: Vec<IpAddr>) -> ResolverSettings {
        ResolverSettings { upstream, clamp: TtlClamp::default(), upstream_timeout: Duration::from_secs(2), log_file: None }
    }
}

/// A name the resolver refused: how often, and when last.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefusedName {
    /// The name as asked (lower case).
    pub name: String,
    /// How many queries.
    pub count: u64,
    /// When the last one came, as seconds since the Unix epoch.
    pub last_unix: u64,
}

#[derive(Default)]
struct RefusedLog {
    names: BTreeMap<String, (u64, u64)>,
    dropped: u64,
    /// Changed since the log file was last written.
    dirty: bool,
}

/// A batch of set elements for the nf_tables thread, and where its result goes.
type SetJob = (Vec<SetElement>, mpsc::Sender<Result<(), TopologyError>>);

struct Shared {
    names: NamePolicy,
    /// The Domain's installed policy (the host watcher replaces it).
    policy: Arc<Mutex<CompiledPolicy>>,
    /// Addresses no answer may hand out or open: the upstream resolvers
    /// and the Domain's own addresses.
    plumbing: Vec<IpAddr>,
    /// Keys and counter of the upstream queries' IDs.
    id_keys: std::collections::hash_map::RandomState,
    next_id: std::sync::atomic::AtomicU64,
    settings: ResolverSettings,
    stop: AtomicBool,
    in_flight: AtomicUsize,
    tcp_open: AtomicUsize,
    /// (set, address) -> expiry: the latest wins when several answers share an address.
    opened: Mutex<HashMap<(String, IpAddr), Instant>>,
    refused: Mutex<RefusedLog>,
    nft: Mutex<mpsc::Sender<SetJob>>,
}

/// The running resolver; dropping it stops it.
pub struct LockedResolver {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for LockedResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockedResolver").field("threads", &self.threads.len()).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Spawns a thread that first enters `netns` (a clone is moved in).
fn spawn_in(netns: &Netns, name: &str, work: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, TopologyError> {
    let netns = netns.try_clone()?;
    let (ready, entered) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let result = crate::sys::enter_network_namespace(netns.as_fd());
            let ok = result.is_ok();
            let _ = ready.send(result);
            drop(netns);
            if ok {
                work();
            }
        })
        .map_err(|source| TopologyError::Io { action: format!("spawn thread {name}"), source })?;
    match entered.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(errno)) => Err(TopologyError::Namespace { action: "setns(CLONE_NEWNET) for the resolver", errno }),
        Err(_) => Err(TopologyError::Io { action: format!("thread {name}"), source: std::io::Error::other("exited early") }),
    }
}

impl DomainNetwork {
    /// Starts the locked Domain's resolver on [`Self::resolver_address`]
    /// with the installed policy's name rules.
    pub fn start_resolver(&self, settings: ResolverSettings) -> Result<LockedResolver, TopologyError> {
        let (sidecar, _) = self.namespaces()?;
        let policy = self.policy();
        let address = self.resolver_address();
        let (udp, tcp) = sidecar.run(move || {
            let udp = UdpSocket::bind(address)
                .map_err(|source| TopologyError::Io { action: format!("bind the resolver's UDP socket {address}"), source })?;
            let tcp = super::listen_tcp(SocketAddrV4::new(*address.ip(), DNS_PORT), 128)?;
            Ok((udp, tcp))
        })?;
        udp.set_read_timeout(Some(POLL)).map_err(|source| TopologyError::Io { action: "resolver socket timeout".into(), source })?;
        tcp.set_nonblocking(true).map_err(|source| TopologyError::Io { action: "resolver listener non-blocking".into(), source })?;

        let (requests, jobs) = mpsc::channel::<SetJob>();
        let addresses = self.addresses;
        let mut plumbing: Vec<IpAddr> = policy.resolvers().to_vec();
        plumbing.extend(settings.upstream.iter().copied());
        plumbing.extend([addresses.sandbox, addresses.sidecar_inner, addresses.sidecar_uplink, addresses.host_uplink].map(IpAddr::V4));
        plumbing.extend(
            [addresses.v6.sandbox, addresses.v6.sidecar_inner, addresses.v6.sidecar_uplink, addresses.v6.host_uplink].map(IpAddr::V6),
        );
        let shared = Arc::new(Shared {
            names: policy.names().clone(),
            policy: self.shared_policy(),
            plumbing,
            id_keys: std::collections::hash_map::RandomState::new(),
            next_id: std::sync::atomic::AtomicU64::new(0),
            settings,
            stop: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            tcp_open: AtomicUsize::new(0),
            opened: Mutex::new(HashMap::new()),
            refused: Mutex::new(RefusedLog::default()),
            nft: Mutex::new(requests),
        });
        let mut resolver = LockedResolver { shared: shared.clone(), threads: Vec::new() };
        // The sets live in the sidecar: its netfilter socket is opened there.
        resolver.threads.push(spawn_in(sidecar, "lazaret-dns-nft", move || {
            for (elements, done) in jobs {
                let _ = done.send(put_elements(nft::LOCKED_TABLE, &elements));
            }
        })?);
        let udp_shared = shared.clone();
        resolver.threads.push(spawn_in(&self.host, "lazaret-dns-udp", move || serve_udp(udp, udp_shared))?);
        let tcp_shared = shared.clone();
        resolver.threads.push(spawn_in(&self.host, "lazaret-dns-tcp", move || serve_tcp(tcp, tcp_shared))?);
        if shared.settings.log_file.is_some() {
            let log_shared = shared;
            let thread = std::thread::Builder::new()
                .name("lazaret-dns-log".into())
                .spawn(move || {
                    let mut ticks = 0u32;
                    while !log_shared.stop.load(Ordering::SeqCst) {
                        std::thread::sleep(POLL);
                        ticks += 1;
                        if ticks % 10 == 0 {
                            write_log(&log_shared);
                        }
                    }
                    write_log(&log_shared);
                })
                .map_err(|source| TopologyError::Io { action: "spawn the resolver's log thread".into(), source })?;
            resolver.threads.push(thread);
        }
        Ok(resolver)
    }

    /// The resolvers the sandbox's /etc/resolv.conf names: in locked mode
    /// only Lazaret's (the gateway), else the Domain's upstream resolvers.
    pub fn sandbox_resolvers(&self) -> Vec<IpAddr> {
        let policy = self.policy();
        if policy.locked() { vec![IpAddr::V4(self.addresses.sidecar_inner)] } else { policy.resolvers().to_vec() }
    }

    /// Where the locked resolver listens: the sandbox's gateway, port 53
    /// (what the sandbox's resolv.conf names in locked mode).
    pub fn resolver_address(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.addresses.sidecar_inner, DNS_PORT)
    }
}

impl LockedResolver {
    /// The names refused so far, most frequent first.
    pub fn refused_names(&self) -> Vec<RefusedName> {
        refused_list(&lock(&self.shared.refused))
    }

    /// Stops and joins every thread.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Closing the channel ends the nftables worker.
        let (closed, _) = mpsc::channel();
        *lock(&self.shared.nft) = closed;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        // Handler threads hold `shared` until their query is done (at most
        // the upstream timeouts); they touch nothing but their own sockets.
    }
}

impl Drop for LockedResolver {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn refused_list(log: &RefusedLog) -> Vec<RefusedName> {
    let mut names: Vec<RefusedName> =
        log.names.iter().map(|(name, (count, last))| RefusedName { name: name.clone(), count: *count, last_unix: *last }).collect();
    names.sort_by(|a, b| b.count.cmp(&a.count).then(a.name.cmp(&b.name)));
    names
}

/// Rewrites the log file (a temporary file renamed over it) if anything changed.
fn write_log(shared: &Shared) {
    let Some(path) = &shared.settings.log_file else { return };
    let names = {
        let mut log = lock(&shared.refused);
        if !log.dirty {
            return;
        }
        log.dirty = false;
        refused_list(&log)
    };
    let Ok(text) = serde_json::to_string(&names) else { return };
    let temporary = path.with_extension("tmp");
    if std::fs::write(&temporary, text).is_ok() {
        let _ = std::fs::rename(&temporary, path);
    }
}

/// Reads a log file written by a running resolver (for `lazaret policy log`).
pub fn read_refused_log(path: &std::path::Path) -> std::io::Result<Vec<RefusedName>> {
    let text = std::fs::read_to_string(path)?;
    serde_json::from_str(&text).map_err(std::io::Error::other)
}

fn note_refused(shared: &Shared, name: String) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut log = lock(&shared.refused);
    log.dirty = true;
    if let Some(entry) = log.names.get_mut(&name) {
        entry.0 += 1;
        entry.1 = now;
    } else if log.names.len() < MAX_LOGGED {
        log.names.insert(name, (1, now));
    } else {
        log.dropped += 1;
    }
}

/// A fresh ID for an upstream query: a keyed hash of a counter, so that
/// nothing outside this process can predict it.
fn fresh_id(shared: &Shared) -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = shared.id_keys.build_hasher();
    hasher.write_u64(shared.next_id.fetch_add(1, Ordering::Relaxed));
    hasher.finish() as u16
}

/// Answers one query (UDP or TCP): the reply to send back, if any.
fn answer(shared: &Shared, query: &[u8], tcp: bool) -> Option<Vec<u8>> {
    match resolver::decide_query(&shared.names, query) {
        QueryDecision::Ignore => None,
        QueryDecision::Reply { reply, refused } => {
            if let Some(name) = refused {
                note_refused(shared, name);
            }
            Some(reply)
        }
        QueryDecision::Forward { question, .. } => {
            let servfail = || dnswire::refusal(query, Some(question.end), Rcode::ServFail);
            let id = fresh_id(shared);
            let Some(upstream_query) = resolver::upstream_query(id, &question) else {
                return Some(servfail());
            };
            let Some(response) = ask_upstream(shared, &upstream_query, id, &question, tcp) else {
                return Some(servfail());
            };
            let rcode = match response.header.rcode() {
                0 => Rcode::NoError,
                3 => Rcode::NxDomain,
                _ => return Some(servfail()),
            };
            let rebuilt = {
                let policy = lock(&shared.policy);
                resolver::rebuild(&shared.names, &question, &response, shared.settings.clamp, |address| {
                    resolver::may_open(&policy, &shared.plumbing, address)
                })
            };
            let Some(reply) = dnswire::answer(query, rcode, &rebuilt.records) else {
                return Some(servfail());
            };
            if open(shared, &rebuilt.openings).is_err() {
                // Not opened, so not answered: the sandbox could not connect anyway.
                return Some(servfail());
            }
            if !tcp && reply.len() > dnswire::UDP_REPLY_MAX {
                return Some(dnswire::truncated(query, question.end, rcode));
            }
            Some(reply)
        }
    }
}

/// Adds the openings to the sets (keeping a later expiry already there) and
/// waits for the kernel's acknowledgement. Refused, opening nothing, if
/// more than [`MAX_OPENED`] pairs would be open.
fn open(shared: &Shared, openings: &[resolver::Opening]) -> Result<(), TopologyError> {
    if openings.is_empty() {
        return Ok(());
    }
    let now = Instant::now();
    let mut elements = Vec::new();
    {
        let mut opened = lock(&shared.opened);
        opened.retain(|_, expiry| *expiry > now);
        let keys: Vec<(String, IpAddr)> =
            openings.iter().map(|opening| (nft::locked_set_name(opening.address.is_ipv4(), opening.port), opening.address)).collect();
        let new = keys.iter().filter(|key| !opened.contains_key(*key)).count();
        if opened.len() + new > MAX_OPENED {
            return Err(TopologyError::Io {
                action: "resolver: open an answer's addresses".into(),
                source: std::io::Error::other("too many addresses open"),
            });
        }
        for (key, opening) in keys.into_iter().zip(openings) {
            let set = key.0.clone();
            let expiry = now + opening.lifetime;
            let entry = opened.entry(key).or_insert(expiry);
            if *entry < expiry {
                *entry = expiry;
            }
            elements.push(SetElement { set, address: opening.address, timeout: entry.saturating_duration_since(now) });
        }
    }
    let (done, result) = mpsc::channel();
    lock(&shared.nft)
        .send((elements, done))
        .map_err(|_| TopologyError::Io { action: "resolver: nftables worker".into(), source: std::io::Error::other("stopped") })?;
    result.recv().map_err(|_| TopologyError::Io { action: "resolver: nftables worker".into(), source: std::io::Error::other("stopped") })?
}

/// The upstreams' answer to `query` (ID `id`, for `question`), tried in
/// order (this thread is in the host namespace). Over UDP, a truncated
/// answer is asked again over TCP.
fn ask_upstream(shared: &Shared, query: &[u8], id: u16, question: &Question, tcp: bool) -> Option<Response> {
    let timeout = shared.settings.upstream_timeout;
    for upstream in &shared.settings.upstream {
        let server = SocketAddr::new(*upstream, DNS_PORT);
        let matching = |bytes: Option<Vec<u8>>| bytes.and_then(|bytes| resolver::matching_response(id, question, &bytes));
        let mut response = matching(if tcp { ask_tcp(server, query, timeout) } else { ask_udp(server, query, timeout) });
        if !tcp && response.as_ref().is_some_and(|r| r.header.truncated()) {
            response = matching(ask_tcp(server, query, timeout));
        }
        if let Some(response) = response.filter(|r| !r.header.truncated()) {
            return Some(response);
        }
    }
    None
}

fn ask_udp(server: SocketAddr, query: &[u8], timeout: Duration) -> Option<Vec<u8>> {
    let local: SocketAddr = if server.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
    let socket = UdpSocket::bind(local).ok()?;
    socket.connect(server).ok()?;
    socket.set_read_timeout(Some(timeout)).ok()?;
    socket.send(query).ok()?;
    let deadline = Instant::now() + timeout;
    let mut buffer = vec![0; UDP_MAX];
    // A connected socket only receives from the server; skip stray datagrams with other IDs.
    while Instant::now() < deadline {
        let n = socket.recv(&mut buffer).ok()?;
        if buffer.get(..2) == query.get(..2) {
            return Some(buffer[..n].to_vec());
        }
    }
    None
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

fn ask_tcp(server: SocketAddr, query: &[u8], timeout: Duration) -> Option<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&server, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    write_framed(&mut stream, query)?;
    read_framed(&mut stream)
}

/// Counts a handler thread in and out.
struct Slot<'a>(&'a AtomicUsize);

impl<'a> Slot<'a> {
    fn take(counter: &'a AtomicUsize, limit: usize) -> Option<Slot<'a>> {
        if counter.fetch_add(1, Ordering::SeqCst) >= limit {
            counter.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Slot(counter))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn serve_udp(socket: UdpSocket, shared: Arc<Shared>) {
    let Ok(socket) = socket.try_clone().map(Arc::new) else { return };
    let mut buffer = vec![0; UDP_MAX];
    while !shared.stop.load(Ordering::SeqCst) {
        let Ok((n, client)) = socket.recv_from(&mut buffer) else { continue };
        let query = buffer[..n].to_vec();
        // Refusals and malformed queries are answered here, at once.
        if !matches!(resolver::decide_query(&shared.names, &query), QueryDecision::Forward { .. }) {
            if let Some(reply) = answer(&shared, &query, false) {
                let _ = socket.send_to(&reply, client);
            }
            continue;
        }
        let (socket, shared) = (socket.clone(), shared.clone());
        let _ = std::thread::Builder::new().name("lazaret-dns-query".into()).spawn(move || {
            let Some(_slot) = Slot::take(&shared.in_flight, MAX_IN_FLIGHT) else {
                let _ = socket.send_to(&dnswire::refusal(&query, None, Rcode::ServFail), client);
                return;
            };
            if let Some(reply) = answer(&shared, &query, false) {
                let _ = socket.send_to(&reply, client);
            }
        });
    }
}

fn serve_tcp(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        let Ok((mut stream, _)) = listener.accept() else {
            std::thread::sleep(POLL / 4);
            continue;
        };
        let shared = shared.clone();
        let _ = std::thread::Builder::new().name("lazaret-dns-tcp-conn".into()).spawn(move || {
            let Some(_slot) = Slot::take(&shared.tcp_open, MAX_TCP) else { return };
            if stream.set_nonblocking(false).is_err()
                || stream.set_read_timeout(Some(TCP_IDLE)).is_err()
                || stream.set_write_timeout(Some(TCP_IDLE)).is_err()
            {
                return;
            }
            // A few queries per connection, then the client reconnects.
            for _ in 0..16 {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Some(query) = read_framed(&mut stream) else { return };
                match answer(&shared, &query, true) {
                    Some(reply) => {
                        if write_framed(&mut stream, &reply).is_none() {
                            return;
                        }
                    }
                    None => return,
                }
            }
        });
    }
}
