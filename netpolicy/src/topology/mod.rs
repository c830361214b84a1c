//! The per-Domain network topology that enforces a [`CompiledPolicy`].
//!
//! ```text
//!  sandbox netns            sidecar (router) netns                 host netns
//!  eth0 S/31 ──veth── lzs0 G/31   [policy routes]   lzup0 Us/31 ──veth── lzh<ID> Uh/31 ── host routes
//!  default via G              forwarding on              S/31 via Us, forwarding on lzh<ID>
//! ```
//!
//! * Each Domain takes one /30 of the Lazaret pool: `S`,`G` (sandbox link) and
//!   `Us`,`Uh` (uplink). The pool is checked against the host's routes. An
//!   IPv6-enabled Domain also gets the same four addresses in the IPv6 pool
//!   (a ULA /96 with the IPv4 address as its last 32 bits), as two /127 links.
//! * The sidecar's main table (254) holds one route per policy rule: allowed
//!   prefixes via `Uh` out of `lzup0` (`onlink`, because `Uh/32` itself is
//!   denied), denied prefixes as `unreachable` routes. IPv4 forwarding is on in
//!   the sidecar. IPv6 is either policed the same way (forwarding on), or
//!   disabled: forwarding off and `::/0 unreachable`.
//!   The sidecar's ICMP rate limits are off, so every denied connection fails
//!   at once with "No route to host" rather than timing out.
//! * Spoofed sources: IPv4 has a strict `rp_filter` on `lzs0`; IPv6 has no
//!   such switch, so rules blackhole every packet from the sandbox whose
//!   source is not the sandbox's address (link-local sources, which the
//!   kernel never forwards, stay allowed for neighbour discovery).
//! * Escalation channel: the self-guard (rules sending the sandbox's packets
//!   to a table where the sidecar's own addresses are unreachable) has one
//!   exception, IPv4 TCP from the sandbox link to the gateway's
//!   [`ESCALATION_PORT`], for the coordinator's listener in the sidecar
//!   ([`DomainNetwork::bind_escalation_listener`]). The sidecar's nftables
//!   filter only hooks forwarding, so it never sees that traffic.
//! * The sidecar's interfaces keep IPv6 link-local addresses (the kernel
//!   sends no neighbour solicitation without one); rules refuse the sandbox
//!   every link-local destination for the guarded protocols. The sidecar
//!   accepts no router advertisements or redirects and ignores echo requests.
//! * The sandbox's only routes are its link route and `default via G`; whatever
//!   root inside does to its own netstack, packets still cross the sidecar.
//! * Sidecar and sandbox namespaces are held only by descriptors in
//!   [`DomainNetwork`]: if the coordinator dies they vanish with their veths.
//!   The host-side veth end is named `lzh<SidecarId>` so leftovers of a
//!   crashed run can be found by [`remove_stale`].
//! * Host side: forwarding is enabled on `lzh<ID>` and on the host interfaces
//!   that carry routes for allowed prefixes; their original values are kept in
//!   the state file and restored when the last Lazaret uplink is gone. For
//!   IPv6 that is the per-interface `force_forwarding` (Linux 6.17+); the
//!   host's global IPv6 forwarding is never changed (see `forwarding`).
//! * Host side, source NAT and forward guard: one nftables table per Domain
//!   (`inet lazaret-<ID>`, see [`nat`] and `nft::host_table`) masquerades the
//!   sandbox's addresses on the way out, forwards nothing into `lzh<ID>` but
//!   replies (`ct state` established or related: a LAN peer that routes the
//!   pool via the host gets nowhere) and nothing out of it but the sandbox's
//!   own addresses. Its chains only drop, and only packets of `lzh<ID>`, so
//!   the host's other forwarding is untouched.
//! * Sidecar packet filter (`inet lazaret-filter`, `nft::sidecar_filter`):
//!   routes cannot match ports, so a DNS resolver that only its DNS route
//!   opens (the LAN router, say) gets UDP and TCP port 53 from the sandbox
//!   and every other packet to it is rejected.
//! * Refused destinations (`refused`): every table of the sidecar that
//!   rejects counts what it rejects, and `lazaret-filter` counts what the
//!   routes refuse, per destination, protocol and port, in bounded sets
//!   ([`refused_destinations`], for `lazaret policy log`).
//! * [`DomainNetwork::verify_installed`] reads all of it back: routes, rules,
//!   sysctls, and both nftables tables, chain by chain and rule by rule.
//! * Live host addresses (`live`): [`HostWatcher`] follows the host's address
//!   and route notifications and [`DomainNetwork::refresh_host`] moves the
//!   sidecar to the policy recompiled with the host's addresses and on-link
//!   networks now (new denials first, removals last), then reads it back.
//! * [`debug_view`] prints any namespace's links, addresses, routes of every
//!   table and rules, like `ip`, for `lazaret debug`.

mod debug;
mod dns_server;
mod forwarding;
mod live;
pub mod nat;
pub mod netns;
mod nft;
mod nftcodec;
mod nftset;
mod refused;

use std::fmt;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::TryStreamExt;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::IpProtocol;
use rtnetlink::packet_route::address::{AddressAttribute, AddressHeaderFlags};
use rtnetlink::packet_route::link::{InfoData, InfoVeth, LinkAttribute};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleFlags, RuleMessage, RulePortRange};
use rtnetlink::{Handle, IpVersion, LinkUnspec, LinkVeth, RouteMessageBuilder};

pub use lazaret_protocol::escalation::ESCALATION_PORT;

pub use debug::debug_view;
pub use dns_server::{LockedResolver, RefusedName, ResolverSettings, read_refused_log};
pub use live::{HostWatch, HostWatcher, PolicyUpdate};
pub use netns::Netns;
pub use nft::{LOCKED_TABLE, SIDECAR_FILTER_TABLE, locked_set_name};
pub use nftset::{SetElement, put_elements, set_addresses};
pub use refused::{REFUSED_SET_SIZE, REFUSED_TIMEOUT, RefusedDestination};

/// The destinations the sidecar in namespace `sidecar` refused to the
/// sandbox recently (see `refused`: routes, the resolver filter and locked
/// mode alike), most refused first. Runs on a thread of its own inside
/// that namespace.
pub fn refused_destinations(sidecar: &Netns) -> Result<Vec<RefusedDestination>, TopologyError> {
    sidecar.run(|| {
        let tables = nat::list_tables()?;
        let mut found = Vec::new();
        for name in [SIDECAR_FILTER_TABLE, LOCKED_TABLE] {
            if tables.iter().any(|t| t.family == nftcodec::NFPROTO_INET && t.name == name) {
                found.extend(refused::read_table(name)?);
            }
        }
        Ok(refused::merge(found))
    })
}

use forwarding::Switch;

use crate::policy::{CompiledPolicy, PolicyError, PolicyInput, PolicyRoute, RouteKind, compile};
use crate::prefix::Prefix;

/// Name prefix of the host-side uplink veth ends Lazaret owns.
pub const HOST_LINK_PREFIX: &str = "lzh";
/// The sidecar's interface towards the sandbox.
pub const SIDECAR_INNER_LINK: &str = "lzs0";
/// The sidecar's interface towards the host.
pub const SIDECAR_UPLINK: &str = "lzup0";
/// The sandbox's interface.
pub const SANDBOX_LINK: &str = "eth0";
/// The default Lazaret address pool.
pub const DEFAULT_POOL: &str = "100.96.0.0/16";
/// The default Lazaret IPv6 pool: a ULA /96 ("laz ar" in ASCII) whose last
/// 32 bits are a Domain's IPv4 address.
pub const DEFAULT_POOL6: &str = "fd6c:617a:6172::/96";
const MAIN_TABLE: u32 = 254;

/// Everything that can go wrong while building, checking or removing a topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A netlink request failed.
    #[error("netlink: {action}: {source}")]
    Netlink {
        /// What was being done.
        action: String,
        /// The rtnetlink error.
        source: rtnetlink::Error,
    },
    /// A namespace syscall failed.
    #[error("{action}: {errno} (Lazaret needs root, or CAP_SYS_ADMIN and CAP_NET_ADMIN, for the Domain network)")]
    Namespace {
        /// The syscall.
        action: &'static str,
        /// The error number.
        errno: nix::errno::Errno,
    },
    /// A file operation failed.
    #[error("{action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A worker thread panicked.
    #[error("a network namespace worker thread panicked")]
    ThreadPanicked,
    /// The policy did not compile.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The pool overlaps a route of the host.
    #[error("the Lazaret address pool {pool} collides with the host route {route} (dev {device}); configure another pool")]
    PoolCollision {
        /// The pool.
        pool: Prefix,
        /// The colliding route.
        route: Prefix,
        /// Its interface.
        device: String,
    },
    /// Every /30 of the pool is in use.
    #[error("the Lazaret address pool {pool} has no free /30 left; stop a Domain or configure a larger pool")]
    PoolExhausted {
        /// The pool.
        pool: Prefix,
    },
    /// The pool is not usable.
    #[error("the Lazaret address pool {pool} is invalid: {reason}")]
    InvalidPool {
        /// The pool.
        pool: Prefix,
        /// Why.
        reason: &'static str,
    },
    /// Another Domain took the same /30 concurrently.
    #[error("address slot {slot} was taken concurrently by another Domain")]
    SlotTaken {
        /// The /30.
        slot: Prefix,
    },
    /// IPv6 is enabled but the host cannot forward it for one interface only.
    #[error(
        "IPv6 is enabled for this Domain, but the host's IPv6 forwarding is off and this kernel has no per-interface \
         switch for it (net.ipv6.conf.*.force_forwarding, Linux 6.17 or later). Lazaret does not turn on global IPv6 \
         forwarding: that also makes the host ignore router advertisements on every interface. Set `ipv6 = false` for \
         this profile, or turn on net.ipv6.conf.all.forwarding yourself (with accept_ra = 2 on interfaces that rely on \
         router advertisements)"
    )]
    Ipv6ForwardingUnavailable,
    /// An expected interface is missing.
    #[error("interface {0} not found")]
    LinkMissing(String),
    /// The Domain network was already torn down.
    #[error("the Domain network has already been torn down")]
    TornDown,
    /// An interface name that cannot be used in a /proc path.
    #[error("refusing unusual interface name {0:?}")]
    BadInterfaceName(String),
    /// A route message the kernel accepted but we could not build.
    #[error("cannot build route for {prefix}: {reason}")]
    RouteBuild {
        /// The destination.
        prefix: Prefix,
        /// The builder's complaint.
        reason: String,
    },
    /// The forwarding state file is unreadable.
    #[error("forwarding state file {path}: {reason}")]
    StateFile {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// An nftables object could not be built.
    #[error("nftables: {action}: {reason}")]
    Nftables {
        /// What was being done.
        action: String,
        /// Why.
        reason: String,
    },
    /// What is installed differs from the compiled policy.
    #[error("installed network policy differs from the compiled one:{}", .differences.iter().map(|d| format!("\n  - {d}")).collect::<String>())]
    Mismatch {
        /// Each difference, human readable.
        differences: Vec<String>,
    },
}

fn netlink_error(action: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> TopologyError {
    let action = action.into();
    move |source| TopologyError::Netlink { action, source }
}

/// A random, runtime-unique identifier of one sidecar instance (40 bits,
/// shown as 10 hex digits). It names the host-side veth `lzh<ID>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SidecarId(u64);

impl SidecarId {
    /// A fresh random ID from the kernel's random source.
    pub fn random() -> Result<SidecarId, TopologyError> {
        let mut bytes = [0u8; 8];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut file| file.read_exact(&mut bytes[..5]))
            .map_err(|source| TopologyError::Io { action: "read /dev/urandom".into(), source })?;
        Ok(SidecarId(u64::from_le_bytes(bytes)))
    }

    /// The host-side uplink interface name, `lzh` + 10 hex digits (13 bytes).
    pub fn host_link_name(&self) -> String {
        format!("{HOST_LINK_PREFIX}{self}")
    }

    /// The ID encoded in a host-side interface name, if it is one of ours.
    pub fn from_host_link_name(name: &str) -> Option<SidecarId> {
        name.strip_prefix(HOST_LINK_PREFIX)?.parse().ok()
    }
}

impl fmt::Display for SidecarId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:010x}", self.0)
    }
}

/// Why a text is not a Sidecar ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a Sidecar ID (10 lowercase hex digits)")]
pub struct SidecarIdError(String);

impl FromStr for SidecarId {
    type Err = SidecarIdError;

    fn from_str(text: &str) -> Result<SidecarId, SidecarIdError> {
        if text.len() != 10 || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(SidecarIdError(text.to_string()));
        }
        u64::from_str_radix(text, 16).map(SidecarId).map_err(|_| SidecarIdError(text.to_string()))
    }
}

/// Settings for building Domain topologies on one host.
#[derive(Debug, Clone)]
pub struct TopologyConfig {
    /// The IPv4 pool Domains take their /30s from.
    pub pool: Prefix,
    /// The IPv6 pool (/96 or shorter) of IPv6-enabled Domains: a Domain's
    /// IPv6 addresses are this prefix with its IPv4 addresses as the last 32 bits.
    pub pool6: Prefix,
    /// Refuse a pool that overlaps host routes (other than Lazaret's own).
    pub check_pool_collisions: bool,
    /// Where the host's original forwarding values are recorded (a trusted,
    /// host-private path, e.g. under the Storage Root).
    pub forwarding_state_file: PathBuf,
}

impl TopologyConfig {
    /// The default pools ([`DEFAULT_POOL`], [`DEFAULT_POOL6`]) with collision checks on.
    pub fn new(forwarding_state_file: PathBuf) -> TopologyConfig {
        TopologyConfig {
            pool: Prefix::truncating(IpAddr::V4(Ipv4Addr::new(100, 96, 0, 0)), 16),
            pool6: Prefix::truncating(IpAddr::V6(Ipv6Addr::new(0xfd6c, 0x617a, 0x6172, 0, 0, 0, 0, 0)), 96),
            check_pool_collisions: true,
            forwarding_state_file,
        }
    }
}

/// The four addresses of one Domain's /30.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DomainAddresses {
    /// The IPv6 counterparts (used only when IPv6 is enabled for the Domain).
    pub v6: DomainAddresses6,
    /// The /30 taken from the pool.
    pub slot: Prefix,
    /// The sandbox's address (`eth0`, /31 with `sidecar_inner`).
    pub sandbox: Ipv4Addr,
    /// The sidecar's address towards the sandbox: the sandbox's gateway.
    pub sidecar_inner: Ipv4Addr,
    /// The sidecar's uplink address.
    pub sidecar_uplink: Ipv4Addr,
    /// The host's end of the uplink: the sidecar's gateway.
    pub host_uplink: Ipv4Addr,
}

/// A Domain's IPv6 addresses: the IPv6 pool with the IPv4 addresses as the
/// last 32 bits. Two /127 links (RFC 6164), like the IPv4 /31s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DomainAddresses6 {
    /// The sandbox's address.
    pub sandbox: Ipv6Addr,
    /// The sidecar's address towards the sandbox: the sandbox's gateway.
    pub sidecar_inner: Ipv6Addr,
    /// The sidecar's uplink address.
    pub sidecar_uplink: Ipv6Addr,
    /// The host's end of the uplink: the sidecar's gateway.
    pub host_uplink: Ipv6Addr,
}

impl DomainAddresses6 {
    /// The sandbox link (/127: sandbox + sidecar_inner).
    pub fn sandbox_link(&self) -> Prefix {
        Prefix::truncating(IpAddr::V6(self.sandbox), 127)
    }

    /// The sidecar's own IPv6 addresses, which the self-guard keeps out of
    /// reach (its link-local ones: see [`sidecar_rules`]).
    fn sidecar_own(&self) -> [Prefix; 2] {
        [Prefix::host(IpAddr::V6(self.sidecar_inner)), Prefix::host(IpAddr::V6(self.sidecar_uplink))]
    }
}

impl DomainAddresses {
    fn for_slot(slot: Prefix, pool6: Prefix) -> Option<DomainAddresses> {
        let nth = |i| match slot.nth(i) {
            Some(IpAddr::V4(address)) => Some(address),
            _ => None,
        };
        let IpAddr::V6(base) = pool6.network() else { return None };
        if pool6.prefix_len() > 96 {
            return None;
        }
        let embed = |address: Ipv4Addr| Ipv6Addr::from_bits(base.to_bits() | u128::from(address.to_bits()));
        let (sandbox, sidecar_inner, sidecar_uplink, host_uplink) = (nth(0)?, nth(1)?, nth(2)?, nth(3)?);
        Some(DomainAddresses {
            v6: DomainAddresses6 {
                sandbox: embed(sandbox),
                sidecar_inner: embed(sidecar_inner),
                sidecar_uplink: embed(sidecar_uplink),
                host_uplink: embed(host_uplink),
            },
            slot,
            sandbox,
            sidecar_inner,
            sidecar_uplink,
            host_uplink,
        })
    }

    /// The sandbox link (/31: sandbox + sidecar_inner).
    pub fn sandbox_link(&self) -> Prefix {
        Prefix::truncating(IpAddr::V4(self.sandbox), 31)
    }

    /// The sidecar's own IPv4 addresses, which the self-guard keeps out of reach.
    fn sidecar_own(&self) -> [Prefix; 2] {
        [Prefix::host(IpAddr::V4(self.sidecar_inner)), Prefix::host(IpAddr::V4(self.sidecar_uplink))]
    }
}

#[derive(Debug, Clone)]
struct HostRoute {
    prefix: Prefix,
    oif: Option<u32>,
    table: u32,
    protocol: RouteProtocol,
    kind: RouteType,
    gateway: Option<IpAddr>,
}

#[derive(Debug, Default)]
struct NetView {
    links: Vec<(u32, String)>,
    addresses: Vec<(u32, IpAddr)>,
    routes: Vec<HostRoute>,
}

impl NetView {
    fn link_name(&self, index: u32) -> String {
        self.links.iter().find(|(i, _)| *i == index).map(|(_, n)| n.clone()).unwrap_or_else(|| format!("#{index}"))
    }
    fn link_index(&self, name: &str) -> Option<u32> {
        self.links.iter().find(|(_, n)| n == name).map(|(i, _)| *i)
    }
    fn is_lazaret_link(&self, index: u32) -> bool {
        SidecarId::from_host_link_name(&self.link_name(index)).is_some()
    }
}

fn route_address(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(a) => Some(IpAddr::V4(*a)),
        RouteAddress::Inet6(a) => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

fn parse_route(message: &RouteMessage) -> Option<HostRoute> {
    let v4 = match message.header.address_family {
        AddressFamily::Inet => true,
        AddressFamily::Inet6 => false,
        _ => return None,
    };
    let mut destination = None;
    let mut oif = None;
    let mut gateway = None;
    let mut table = u32::from(message.header.table);
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Destination(address) => destination = route_address(address),
            RouteAttribute::Oif(index) => oif = Some(*index),
            RouteAttribute::Gateway(address) => gateway = route_address(address),
            RouteAttribute::Table(id) => table = *id,
            _ => {}
        }
    }
    let network = destination.unwrap_or_else(|| Prefix::any(v4).network());
    Some(HostRoute {
        prefix: Prefix::truncating(network, message.header.destination_prefix_length),
        oif,
        table,
        protocol: message.header.protocol,
        kind: message.header.kind,
        gateway,
    })
}

async fn net_view(handle: &Handle) -> Result<NetView, TopologyError> {
    let mut view = NetView { links: net_view_links(handle).await?, ..NetView::default() };
    let mut addresses = handle.address().get().execute();
    while let Some(address) = addresses.try_next().await.map_err(netlink_error("list addresses"))? {
        let local = address.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let plain = address.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        if let Some(ip) = local.or(plain) {
            view.addresses.push((address.header.index, ip));
        }
    }
    for v4 in [true, false] {
        let query =
            if v4 { RouteMessageBuilder::<Ipv4Addr>::new().build() } else { RouteMessageBuilder::<std::net::Ipv6Addr>::new().build() };
        let mut routes = handle.route().get(query).execute();
        while let Some(route) = routes.try_next().await.map_err(netlink_error("list routes"))? {
            if let Some(parsed) = parse_route(&route) {
                view.routes.push(parsed);
            }
        }
    }
    Ok(view)
}

async fn link_index(handle: &Handle, name: &str) -> Result<u32, TopologyError> {
    net_view_links(handle)
        .await?
        .into_iter()
        .find(|(_, n)| n == name)
        .map(|(i, _)| i)
        .ok_or_else(|| TopologyError::LinkMissing(name.to_string()))
}

async fn net_view_links(handle: &Handle) -> Result<Vec<(u32, String)>, TopologyError> {
    let mut found = Vec::new();
    let mut links = handle.link().get().execute();
    while let Some(link) = links.try_next().await.map_err(netlink_error("list links"))? {
        for attribute in &link.attributes {
            if let LinkAttribute::IfName(name) = attribute {
                found.push((link.header.index, name.clone()));
            }
        }
    }
    Ok(found)
}

async fn link_up(handle: &Handle, name: &str) -> Result<u32, TopologyError> {
    let index = link_index(handle, name).await?;
    handle.link().set(LinkUnspec::new_with_index(index).up().build()).execute().await.map_err(netlink_error(format!("set {name} up")))?;
    Ok(index)
}

/// Creates the veth pair `name`/`peer` with `peer` born directly in the
/// namespace `peer_netns`: moving an existing interface between namespaces
/// costs an RCU grace period (~35 ms here), creating it there costs ~2 ms.
async fn add_veth(handle: &Handle, name: &str, peer: &str, peer_netns: i32) -> Result<(), TopologyError> {
    let peer_message = LinkUnspec::new_with_name(peer).setns_by_fd(peer_netns).build();
    handle
        .link()
        .add(LinkVeth::new(name, peer).set_info_data(InfoData::Veth(InfoVeth::Peer(peer_message))).build())
        .execute()
        .await
        .map_err(netlink_error(format!("create veth {name}/{peer}")))
}

/// Adds `address/len` to interface `index`; IPv6 addresses skip duplicate
/// address detection (`nodad`: both ends of every link are ours), so they are
/// usable at once instead of after a second of DAD.
async fn add_address(handle: &Handle, index: u32, name: &str, address: IpAddr, len: u8) -> Result<(), TopologyError> {
    let mut request = handle.address().add(index, address, len).replace();
    if address.is_ipv6() {
        request.message_mut().header.flags |= AddressHeaderFlags::Nodad;
    }
    request.execute().await.map_err(netlink_error(format!("add {address}/{len} to {name}")))
}

/// The sidecar route for one policy route: `unreachable`, or via the host's
/// end of the uplink (`uplink`: its interface index and the gateway of each family).
fn route_message(route: &PolicyRoute, uplink: (u32, Ipv4Addr, Ipv6Addr)) -> Result<RouteMessage, TopologyError> {
    let build_error = |reason: String| TopologyError::RouteBuild { prefix: route.prefix, reason };
    let builder = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(route.prefix.network(), route.prefix.prefix_len())
        .map_err(|e| build_error(e.to_string()))?
        .table_id(MAIN_TABLE);
    let (index, gateway4, gateway6) = uplink;
    let gateway = if route.prefix.is_v4() { IpAddr::V4(gateway4) } else { IpAddr::V6(gateway6) };
    let message = match route.kind {
        RouteKind::Unreachable => builder.kind(RouteType::Unreachable).build(),
        RouteKind::Uplink => builder.gateway(gateway).map_err(|e| build_error(e.to_string()))?.output_interface(index).onlink().build(),
    };
    Ok(message)
}

/// Routing table of the sidecar's self-guard (see [`install_self_guard_table`]).
const SELF_GUARD_TABLE: u32 = 200;
/// Priority of the rules sending packets from the sandbox to the self-guard.
const SELF_GUARD_PRIORITY: u32 = 500;
/// Priority of the self-guard's one exception: the escalation channel, TCP
/// from the sandbox to its gateway's [`ESCALATION_PORT`], goes straight to
/// `lookup local` (see [`DomainNetwork::bind_escalation_listener`]).
const ESCALATION_PRIORITY: u32 = 490;
/// Where the locked-mode resolver listens (on the sandbox's gateway).
pub const DNS_PORT: u16 = 53;
/// Listen backlog of the escalation listener (the kernel caps it at
/// `net.core.somaxconn`): every session of a Domain may connect at once.
const ESCALATION_BACKLOG: i32 = 1024;
/// Priority the `lookup local` rule is moved to, after the self-guard.
const LOCAL_RULE_PRIORITY: u32 = 1000;
/// The kernel's local routing table.
const LOCAL_TABLE: u32 = 255;
/// The kernel's `main` and `default` rules (priority, table); IPv6 has no `default` rule.
const KERNEL_RULES: [(u32, u32); 2] = [(32766, MAIN_TABLE), (32767, 253)];

/// Priority of the IPv6 rule that lets link-local sources (neighbour
/// discovery) past the spoof guard; the kernel never forwards them.
const LINK_LOCAL_SOURCE_PRIORITY: u32 = 400;
/// Priority of the IPv6 rule that lets the sandbox's own address past it.
const SANDBOX_SOURCE_PRIORITY: u32 = 401;
/// Priority of the IPv6 rule that blackholes every other source from the sandbox.
const SPOOF_GUARD_PRIORITY: u32 = 402;
/// Priority of the IPv6 rules that refuse the sandbox the sidecar's link-local addresses.
const LINK_LOCAL_GUARD_PRIORITY: u32 = 450;
/// IPv6 link-local unicast, fe80::/10.
const LINK_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0);

/// IP protocols whose packets from the sandbox go through the self-guard.
/// The rules match on the protocol so that ARP (which the kernel routes with
/// protocol 0) still resolves the gateway; a protocol missing here that is
/// sent to a sidecar address only learns that the address exists (the
/// kernel answers "protocol unreachable"), as nothing listens there.
/// ICMPv6 is not guarded (see [`guarded_protocols`]).
const GUARDED_PROTOCOLS: [IpProtocol; 11] = [
    IpProtocol::Icmp,
    IpProtocol::Tcp,
    IpProtocol::Udp,
    IpProtocol::Sctp,
    IpProtocol::Dccp,
    IpProtocol::Udplite,
    IpProtocol::Gre,
    IpProtocol::Ipip,
    IpProtocol::Ipv6,
    IpProtocol::Esp,
    IpProtocol::Ah,
];

/// The guarded protocols of one family. IPv6 leaves out ICMPv6, which carries
/// neighbour discovery for the sandbox's gateway address; the sidecar ignores
/// IPv6 echo requests, so ICMPv6 only shows that the gateway exists.
fn guarded_protocols(v4: bool) -> impl Iterator<Item = IpProtocol> {
    GUARDED_PROTOCOLS.into_iter().filter(move |protocol| v4 || *protocol != IpProtocol::Icmp)
}

fn link_local() -> Prefix {
    Prefix::truncating(IpAddr::V6(LINK_LOCAL), 10)
}

/// One routing rule of the sidecar: what is installed, and what a dump is
/// compared with, so both come from the same list ([`sidecar_rules`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SidecarRule {
    priority: u32,
    iif: Option<String>,
    source: Option<Prefix>,
    destination: Option<Prefix>,
    protocol: Option<IpProtocol>,
    /// `dport START-END` (with a TCP/UDP `protocol`).
    destination_ports: Option<(u16, u16)>,
    action: RuleAction,
    /// The table looked up by a `ToTable` rule; 0 for the other actions.
    table: u32,
    /// The priority a `Goto` rule continues at.
    goto: Option<u32>,
    /// `not`: inverts every selector of the rule (never used by Lazaret).
    inverted: bool,
}

impl SidecarRule {
    /// A rule for packets arriving from the sandbox link.
    fn from_sandbox(priority: u32, action: RuleAction) -> SidecarRule {
        SidecarRule { iif: Some(SIDECAR_INNER_LINK.to_string()), ..SidecarRule::any(priority, action) }
    }

    /// A rule for every packet.
    fn any(priority: u32, action: RuleAction) -> SidecarRule {
        SidecarRule {
            priority,
            iif: None,
            source: None,
            destination: None,
            protocol: None,
            destination_ports: None,
            action,
            table: 0,
            goto: None,
            inverted: false,
        }
    }

    fn parse(message: &RuleMessage) -> SidecarRule {
        let header = &message.header;
        let mut rule = SidecarRule::any(0, header.action);
        rule.table = u32::from(header.table);
        rule.inverted = header.flags.contains(RuleFlags::Invert);
        for attribute in &message.attributes {
            match attribute {
                RuleAttribute::Priority(priority) => rule.priority = *priority,
                RuleAttribute::Table(table) => rule.table = *table,
                RuleAttribute::Iifname(name) => rule.iif = Some(name.clone()),
                RuleAttribute::Source(address) => rule.source = Some(Prefix::truncating(*address, header.src_len)),
                RuleAttribute::Destination(address) => rule.destination = Some(Prefix::truncating(*address, header.dst_len)),
                RuleAttribute::IpProtocol(protocol) => rule.protocol = Some(*protocol),
                RuleAttribute::DestinationPortRange(range) => rule.destination_ports = Some((range.start, range.end)),
                RuleAttribute::Goto(target) => rule.goto = Some(*target),
                _ => {}
            }
        }
        if rule.action != RuleAction::ToTable {
            // rtnetlink sends `main` with every rule; only `ToTable` looks it up.
            rule.table = 0;
        }
        rule
    }

    async fn add(&self, handle: &Handle, v4: bool) -> Result<(), TopologyError> {
        let mut request = handle.rule().add().priority(self.priority).action(self.action);
        if self.table != 0 {
            request = request.table_id(self.table);
        }
        if let Some(iif) = &self.iif {
            request = request.input_interface(iif.clone());
        }
        let message = request.message_mut();
        message.header.family = if v4 { AddressFamily::Inet } else { AddressFamily::Inet6 };
        if self.inverted {
            message.header.flags |= RuleFlags::Invert;
        }
        if let Some(source) = self.source {
            message.header.src_len = source.prefix_len();
            message.attributes.push(RuleAttribute::Source(source.network()));
        }
        if let Some(destination) = self.destination {
            message.header.dst_len = destination.prefix_len();
            message.attributes.push(RuleAttribute::Destination(destination.network()));
        }
        message.attributes.extend(self.protocol.map(RuleAttribute::IpProtocol));
        message
            .attributes
            .extend(self.destination_ports.map(|(start, end)| RuleAttribute::DestinationPortRange(RulePortRange { start, end })));
        message.attributes.extend(self.goto.map(RuleAttribute::Goto));
        request.execute().await.map_err(netlink_error(format!("add sidecar rule {self}")))
    }
}

impl fmt::Display for SidecarRule {
    /// Like `ip rule`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.priority)?;
        if self.inverted {
            f.write_str(" not")?;
        }
        if let Some(iif) = &self.iif {
            write!(f, " iif {iif}")?;
        }
        write!(f, " from {}", self.source.map_or("all".to_string(), |p| p.to_string()))?;
        if let Some(destination) = self.destination {
            write!(f, " to {destination}")?;
        }
        if let Some(protocol) = self.protocol {
            write!(f, " ipproto {protocol:?}")?;
        }
        if let Some((start, end)) = self.destination_ports {
            write!(f, " dport {start}-{end}")?;
        }
        match (self.action, self.goto) {
            (RuleAction::ToTable, _) => write!(f, " lookup {}", self.table),
            (RuleAction::Goto, Some(target)) => write!(f, " goto {target}"),
            (action, _) => write!(f, " {action:?}"),
        }
    }
}

/// One address family of the sidecar's rules, with the address its rules name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GuardFamily {
    /// IPv4: the sandbox's gateway (the sidecar's inner address), where the
    /// escalation channel is let through, and with `resolver` (locked
    /// mode) UDP and TCP port 53, where Lazaret's resolver listens.
    V4 { gateway: Ipv4Addr, resolver: bool },
    /// IPv6: the sandbox's address, the only source the spoof guard lets pass.
    V6 { sandbox: Ipv6Addr },
}

impl GuardFamily {
    fn is_v4(self) -> bool {
        matches!(self, GuardFamily::V4 { .. })
    }

    fn name(self) -> &'static str {
        if self.is_v4() { "IPv4" } else { "IPv6" }
    }
}

/// The rules the sidecar holds for one family, in priority order: for
/// IPv6 the spoof guard and the link-local guard first; for IPv4 the
/// escalation channel's exception; then the self-guard; then the kernel's
/// `lookup local`, moved behind it (see [`install_self_guard_table`]).
/// IPv6 has no exception: the sidecar refuses the sandbox every IPv6
/// address of its own.
fn sidecar_rules(family: GuardFamily) -> Vec<SidecarRule> {
    let v4 = family.is_v4();
    let mut rules = Vec::new();
    if let GuardFamily::V4 { gateway, resolver: true } = family {
        // Locked mode: the sandbox's only resolver listens on the gateway.
        for protocol in [IpProtocol::Udp, IpProtocol::Tcp] {
            rules.push(SidecarRule {
                destination: Some(Prefix::host(IpAddr::V4(gateway))),
                protocol: Some(protocol),
                destination_ports: Some((DNS_PORT, DNS_PORT)),
                table: LOCAL_TABLE,
                ..SidecarRule::from_sandbox(ESCALATION_PRIORITY, RuleAction::ToTable)
            });
        }
    }
    if let GuardFamily::V4 { gateway, .. } = family {
        // TCP to the gateway's escalation port is delivered (to the
        // coordinator's listener, see `bind_escalation_listener`) instead of
        // meeting the self-guard; `rp_filter` on the sandbox link already
        // makes its source the sandbox's address.
        rules.push(SidecarRule {
            destination: Some(Prefix::host(IpAddr::V4(gateway))),
            protocol: Some(IpProtocol::Tcp),
            destination_ports: Some((ESCALATION_PORT, ESCALATION_PORT)),
            table: LOCAL_TABLE,
            ..SidecarRule::from_sandbox(ESCALATION_PRIORITY, RuleAction::ToTable)
        });
    }
    if let GuardFamily::V6 { sandbox } = family {
        // IPv6's stand-in for `rp_filter`: packets from the sandbox whose
        // source is neither its address nor link-local (neighbour discovery;
        // the kernel never forwards those) are blackholed, silently, as an ICMP
        // error would go to the forged source. (A rule's `not` would invert
        // all its selectors, the interface included, so the guard is "permit
        // these two, drop the rest".)
        for (priority, source) in [(LINK_LOCAL_SOURCE_PRIORITY, link_local()), (SANDBOX_SOURCE_PRIORITY, Prefix::host(IpAddr::V6(sandbox)))]
        {
            rules.push(SidecarRule {
                source: Some(source),
                goto: Some(LINK_LOCAL_GUARD_PRIORITY),
                ..SidecarRule::from_sandbox(priority, RuleAction::Goto)
            });
        }
        rules.push(SidecarRule::from_sandbox(SPOOF_GUARD_PRIORITY, RuleAction::Blackhole));
        // The sidecar's interfaces have link-local addresses (neighbour
        // discovery needs them), which the self-guard's table cannot hide: a
        // link-local lookup only matches routes on the incoming interface.
        // So these rules refuse them outright.
        for protocol in guarded_protocols(false) {
            rules.push(SidecarRule {
                destination: Some(link_local()),
                protocol: Some(protocol),
                ..SidecarRule::from_sandbox(LINK_LOCAL_GUARD_PRIORITY, RuleAction::Unreachable)
            });
        }
    }
    for protocol in guarded_protocols(v4) {
        rules.push(SidecarRule {
            protocol: Some(protocol),
            table: SELF_GUARD_TABLE,
            ..SidecarRule::from_sandbox(SELF_GUARD_PRIORITY, RuleAction::ToTable)
        });
    }
    rules.push(SidecarRule { table: LOCAL_TABLE, ..SidecarRule::any(LOCAL_RULE_PRIORITY, RuleAction::ToTable) });
    rules
}

/// Differences between the rules dumped from the sidecar (`found`) and
/// `expected` plus the kernel's own `main` (and `default`) rules: a missing
/// rule, and any other rule at all (the kernel's priority-0 `lookup local`
/// among them).
fn rule_differences(family: &str, expected: &[SidecarRule], found: &[SidecarRule]) -> Vec<String> {
    let kernel = |rule: &SidecarRule| {
        let plain = SidecarRule { table: rule.table, ..SidecarRule::any(rule.priority, RuleAction::ToTable) };
        *rule == plain && KERNEL_RULES.contains(&(rule.priority, rule.table))
    };
    let missing = expected.iter().filter(|rule| !found.contains(rule)).map(|rule| format!("sidecar {family} rule missing: {rule}"));
    let unexpected = found
        .iter()
        .filter(|rule| !expected.contains(rule) && !kernel(rule))
        .map(|rule| format!("unexpected sidecar {family} rule: {rule}"));
    missing.chain(unexpected).collect()
}

/// The rules of one family in the namespace of `handle`.
async fn dump_rules(handle: &Handle, v4: bool) -> Result<Vec<RuleMessage>, TopologyError> {
    handle.rule().get(if v4 { IpVersion::V4 } else { IpVersion::V6 }).execute().try_collect().await.map_err(netlink_error("list rules"))
}

/// Installs [`sidecar_rules`] for one family and then deletes the kernel's
/// priority-0 `lookup local` rule, which the list has re-added behind the
/// self-guard.
async fn install_rules(handle: &Handle, family: GuardFamily) -> Result<(), TopologyError> {
    let v4 = family.is_v4();
    for rule in sidecar_rules(family) {
        rule.add(handle, v4).await?;
    }
    let first_local = dump_rules(handle, v4).await?.into_iter().find(|message| {
        let rule = SidecarRule::parse(message);
        rule.priority == 0 && rule.table == LOCAL_TABLE
    });
    if let Some(message) = first_local {
        handle.rule().del(message).execute().await.map_err(netlink_error("delete the priority-0 local rule"))?;
    }
    Ok(())
}

/// Makes the sidecar's own addresses of one family unreachable from the sandbox.
///
/// The kernel delivers packets for a namespace's own addresses through the
/// `local` table, whose rule (priority 0) comes before any route, so the
/// router would answer the sandbox on its transit addresses (a TCP reset,
/// an echo reply): the leak docs/platform.md describes. The `lookup local` rule
/// is therefore moved behind rules ([`sidecar_rules`]) that send every packet
/// of the [`GUARDED_PROTOCOLS`] arriving from the sandbox link to a small
/// table: `unreachable` for each sidecar address, `throw` for the rest
/// (which then continues to `local` and `main`).
async fn install_self_guard_table(handle: &Handle, v4: bool, own: &[Prefix]) -> Result<(), TopologyError> {
    let build_error = |prefix: Prefix, reason: String| TopologyError::RouteBuild { prefix, reason };
    for prefix in own {
        let message = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(prefix.network(), prefix.prefix_len())
            .map_err(|e| build_error(*prefix, e.to_string()))?
            .table_id(SELF_GUARD_TABLE)
            .kind(RouteType::Unreachable)
            .build();
        handle.route().add(message).execute().await.map_err(netlink_error(format!("add self-guard route {prefix}")))?;
    }
    let any = Prefix::any(v4);
    let throw = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(any.network(), 0)
        .map_err(|e| build_error(any, e.to_string()))?
        .table_id(SELF_GUARD_TABLE)
        .kind(RouteType::Throw)
        .build();
    handle.route().add(throw).execute().await.map_err(netlink_error("add self-guard throw route"))?;
    Ok(())
}

/// Differences between the sidecar's rules and self-guard table of one
/// family and what [`install_rules`] and [`install_self_guard_table`] install.
async fn self_guard_differences(handle: &Handle, guard: GuardFamily, own: &[Prefix]) -> Result<Vec<String>, TopologyError> {
    let v4 = guard.is_v4();
    let family = guard.name();
    let found: Vec<SidecarRule> = dump_rules(handle, v4).await?.iter().map(SidecarRule::parse).collect();
    let mut differences = rule_differences(family, &sidecar_rules(guard), &found);
    let query = if v4 {
        RouteMessageBuilder::<Ipv4Addr>::new().table_id(SELF_GUARD_TABLE).build()
    } else {
        RouteMessageBuilder::<Ipv6Addr>::new().table_id(SELF_GUARD_TABLE).build()
    };
    let mut routes = handle.route().get(query).execute();
    let mut unreachable = Vec::new();
    let mut throw = false;
    while let Some(route) = routes.try_next().await.map_err(netlink_error("list self-guard routes"))? {
        let table = route
            .attributes
            .iter()
            .find_map(|a| if let RouteAttribute::Table(t) = a { Some(*t) } else { None })
            .unwrap_or(u32::from(route.header.table));
        if table != SELF_GUARD_TABLE {
            continue;
        }
        let destination = route.attributes.iter().find_map(|a| match a {
            RouteAttribute::Destination(address) => route_address(address),
            _ => None,
        });
        match (route.header.kind, route.header.destination_prefix_length, destination) {
            (RouteType::Unreachable, len, Some(ip)) if len > 0 => unreachable.push(Prefix::truncating(ip, len)),
            (RouteType::Throw, 0, _) => throw = true,
            (kind, len, dst) => differences.push(format!("unexpected {family} self-guard route {dst:?}/{len} {kind:?}")),
        }
    }
    for prefix in own {
        if !unreachable.contains(prefix) {
            differences.push(format!("self-guard route unreachable {prefix} missing"));
        }
    }
    for prefix in &unreachable {
        if !own.contains(prefix) {
            differences.push(format!("unexpected self-guard route unreachable {prefix}"));
        }
    }
    if !throw {
        differences.push(format!("{family} self-guard throw route missing"));
    }
    Ok(differences)
}

/// The sidecar's sysctls, in the order they are written (before any
/// interface exists, so the `default` ones apply to all of them).
fn sidecar_sysctls(ipv6: bool) -> [(&'static str, &'static str); 9] {
    [
        ("/proc/sys/net/ipv4/ip_forward", "1"),
        // Answer every denied packet at once (ICMP unreachable) instead of
        // letting the per-peer rate limit turn denials into slow timeouts; the
        // only peer of this router is its own sandbox.
        ("/proc/sys/net/ipv4/icmp_ratelimit", "0"),
        ("/proc/sys/net/ipv6/icmp/ratelimit", "0"),
        ("/proc/sys/net/ipv6/conf/all/forwarding", if ipv6 { "1" } else { "0" }),
        // A disabled family does not exist on the sidecar's interfaces at all.
        ("/proc/sys/net/ipv6/conf/default/disable_ipv6", if ipv6 { "0" } else { "1" }),
        // Link-local addresses (which neighbour discovery needs) usable at
        // once: both ends of every link are ours.
        ("/proc/sys/net/ipv6/conf/default/accept_dad", "0"),
        // Root in the sandbox must not reconfigure the router.
        ("/proc/sys/net/ipv6/conf/default/accept_ra", "0"),
        ("/proc/sys/net/ipv6/conf/default/accept_redirects", "0"),
        // ICMPv6 is not behind the self-guard (neighbour discovery needs it).
        ("/proc/sys/net/ipv6/icmp/echo_ignore_all", "1"),
    ]
}

/// How the host namespace of the calling thread can forward IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ipv6Forwarding {
    /// Global IPv6 forwarding is already on (the host is a router).
    Global,
    /// Off, but the kernel has per-interface `force_forwarding`.
    PerInterface,
    /// Off, and only the global switch exists (Linux before 6.17).
    Unavailable,
}

fn ipv6_forwarding_here() -> Result<Ipv6Forwarding, TopologyError> {
    Ok(if forwarding::read_sysctl(Path::new(forwarding::IPV6_GLOBAL_FORWARDING))? == "1" {
        Ipv6Forwarding::Global
    } else if Path::new(forwarding::IPV6_FORCE_FORWARDING_ALL).exists() {
        Ipv6Forwarding::PerInterface
    } else {
        Ipv6Forwarding::Unavailable
    })
}

/// Host interfaces (not loopback, not Lazaret's) that carry a main-table
/// route of one family for an allowed prefix: forwarding must be on there
/// for the replies.
fn egress_interfaces(view: &NetView, policy: &CompiledPolicy, v4: bool) -> Vec<String> {
    let allowed: Vec<Prefix> =
        policy.routes().into_iter().filter(|r| r.kind == RouteKind::Uplink && r.prefix.is_v4() == v4).map(|r| r.prefix).collect();
    let mut egress: Vec<String> = view
        .routes
        .iter()
        .filter(|r| r.table == MAIN_TABLE && r.prefix.is_v4() == v4 && r.kind == RouteType::Unicast)
        .filter(|r| allowed.iter().any(|a| a.overlaps(&r.prefix)))
        .filter_map(|r| r.oif)
        .map(|oif| view.link_name(oif))
        .filter(|name| name != "lo" && SidecarId::from_host_link_name(name).is_none())
        .collect();
    egress.sort();
    egress.dedup();
    egress
}

/// Differences between the sandbox namespace's routes and its link routes
/// plus one default route per enabled family via the sidecar.
fn sandbox_route_differences(view: &NetView, addresses: &DomainAddresses, ipv6: bool) -> Vec<String> {
    let mut differences = Vec::new();
    let gateway4 = IpAddr::V4(addresses.sidecar_inner);
    let gateway6 = IpAddr::V6(addresses.v6.sidecar_inner);
    for route in view.routes.iter().filter(|r| r.table == MAIN_TABLE) {
        let kernel = route.protocol == RouteProtocol::Kernel;
        let expected = if route.prefix.is_v4() {
            (kernel && route.prefix == addresses.sandbox_link()) || (route.prefix.prefix_len() == 0 && route.gateway == Some(gateway4))
        } else {
            // Link routes (the /127, link-local) belong to the kernel.
            (kernel && route.kind == RouteType::Unicast && route.gateway.is_none())
                || (ipv6 && route.prefix.prefix_len() == 0 && route.gateway == Some(gateway6))
        };
        if !expected {
            differences.push(format!("unexpected sandbox route {} via {:?}", route.prefix, route.gateway));
        }
    }
    let has_default = |gateway: IpAddr| view.routes.iter().any(|r| r.prefix.prefix_len() == 0 && r.gateway == Some(gateway));
    if !has_default(gateway4) {
        differences.push(format!("sandbox has no default route via {}", addresses.sidecar_inner));
    }
    if ipv6 && !has_default(gateway6) {
        differences.push(format!("sandbox has no IPv6 default route via {}", addresses.v6.sidecar_inner));
    }
    differences
}

/// Differences between the sidecar's nftables state and `filter`, its only
/// table: nothing else may be there (no table accepts or rewrites anything).
fn sidecar_filter_differences(filter: &nft::TableSpec, locked: Option<&nft::TableSpec>) -> Result<Vec<String>, TopologyError> {
    let mut differences: Vec<String> = filter.differences()?.into_iter().map(|d| format!("sidecar {d}")).collect();
    if let Some(locked) = locked {
        differences.extend(locked.differences()?.into_iter().map(|d| format!("sidecar {d}")));
    }
    let ours = |name: &str| name == filter.name || locked.is_some_and(|l| l.name == name);
    for table in nat::list_tables()? {
        if !(table.family == nftcodec::NFPROTO_INET && ours(&table.name)) {
            differences.push(format!("unexpected nftables table {} (family {}) in the sidecar", table.name, table.family));
        }
    }
    Ok(differences)
}

fn inner_rp_filter() -> PathBuf {
    PathBuf::from(format!("/proc/sys/net/ipv4/conf/{SIDECAR_INNER_LINK}/rp_filter"))
}

/// Names of the interfaces in the calling thread's namespace (sync, via
/// `/proc/thread-self/net/dev`, so it can run under the forwarding lock).
fn interface_names_here() -> Result<Vec<String>, TopologyError> {
    let text = std::fs::read_to_string("/proc/thread-self/net/dev")
        .map_err(|source| TopologyError::Io { action: "read /proc/thread-self/net/dev".into(), source })?;
    Ok(text.lines().skip(2).filter_map(|line| line.split(':').next()).map(|name| name.trim().to_string()).collect())
}

/// Restores host forwarding if no Lazaret uplink remains (checked under the
/// state file's lock, so a Domain starting meanwhile is never undercut).
/// Runs in the host namespace.
fn restore_forwarding_if_unused(state_file: &Path) -> Result<(), TopologyError> {
    forwarding::restore_unless(state_file, || Ok(interface_names_here()?.iter().any(|name| SidecarId::from_host_link_name(name).is_some())))
}

/// Differences between the policy routes in the sidecar's main table
/// (`view`, a dump of the sidecar) and `expected`.
fn policy_route_differences(view: &NetView, addresses: &DomainAddresses, expected: &[PolicyRoute]) -> Vec<String> {
    let mut differences = Vec::new();
    let uplink = view.link_index(SIDECAR_UPLINK);
    let gateways = [IpAddr::V4(addresses.host_uplink), IpAddr::V6(addresses.v6.host_uplink)];
    let mut installed = Vec::new();
    for route in view.routes.iter().filter(|r| r.table == MAIN_TABLE && r.protocol != RouteProtocol::Kernel) {
        match route.kind {
            RouteType::Unreachable => installed.push(PolicyRoute { prefix: route.prefix, kind: RouteKind::Unreachable }),
            RouteType::Unicast if route.gateway.is_some_and(|g| gateways.contains(&g)) && route.oif.is_some() && route.oif == uplink => {
                installed.push(PolicyRoute { prefix: route.prefix, kind: RouteKind::Uplink })
            }
            other => differences.push(format!(
                "unexpected sidecar route {} type {:?} via {:?} dev {}",
                route.prefix,
                other,
                route.gateway,
                route.oif.map(|i| view.link_name(i)).unwrap_or_else(|| "-".into())
            )),
        }
    }
    installed.sort();
    for route in expected {
        if !installed.contains(route) {
            differences.push(format!("missing sidecar route {} {:?}", route.prefix, route.kind));
        }
    }
    for route in &installed {
        if !expected.contains(route) {
            differences.push(format!("extra sidecar route {} {:?}", route.prefix, route.kind));
        }
    }
    differences
}

/// One Domain's sandbox + sidecar network, with its policy installed.
/// Dropping it tears it down (best effort); prefer [`DomainNetwork::teardown`].
#[derive(Debug)]
pub struct DomainNetwork {
    id: SidecarId,
    host: Netns,
    sidecar: Option<Netns>,
    sandbox: Option<Netns>,
    addresses: DomainAddresses,
    /// The installed policy; [`DomainNetwork::refresh_host`] replaces it
    /// (under this lock, which also keeps a verification from seeing an
    /// update half done). Shared with the locked resolver, which checks
    /// every answered address against the current policy.
    policy: Arc<Mutex<CompiledPolicy>>,
    /// What the policy is recompiled from when the host's addresses change.
    input: PolicyInput,
    config: TopologyConfig,
    state_file: PathBuf,
}

/// How many times [`DomainNetwork::create`] tries for a /30 that another
/// Domain starting at the same moment also picked.
const SLOT_ATTEMPTS: u32 = 12;

/// The first /30 of `pool` that holds none of `used`, searching from slot
/// `search_from` (modulo the pool's number of slots) and wrapping around.
fn free_slot(pool: Prefix, used: &[IpAddr], search_from: u64) -> Option<Prefix> {
    let slots = 1u128 << (30 - pool.prefix_len());
    let start = u128::from(search_from) % slots;
    (0..slots).map(|i| (start + i) % slots).filter_map(|i| pool.subnet(30, i)).find(|slot| !used.iter().any(|ip| slot.contains(*ip)))
}

fn random_u64() -> Result<u64, TopologyError> {
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut bytes))
        .map_err(|source| TopologyError::Io { action: "read /dev/urandom".into(), source })?;
    Ok(u64::from_le_bytes(bytes))
}

impl DomainNetwork {
    /// Builds the topology of one Domain with `host` as the host namespace,
    /// installs `input`'s policy (completed with the host's addresses, the
    /// Domain's uplink address and the pools), and verifies it by read-back.
    pub fn create(host: &Netns, config: &TopologyConfig, input: &PolicyInput) -> Result<DomainNetwork, TopologyError> {
        let (pool, pool6) = (config.pool, config.pool6);
        if !pool.is_v4() || pool.prefix_len() > 30 {
            return Err(TopologyError::InvalidPool { pool, reason: "it must be an IPv4 prefix of length /30 or shorter" });
        }
        if pool6.is_v4() || pool6.prefix_len() > 96 {
            return Err(TopologyError::InvalidPool { pool: pool6, reason: "it must be an IPv6 prefix of length /96 or shorter" });
        }
        // Decided once, before anything is built: how the host forwards IPv6.
        let ipv6_forwarding = if input.ipv6 {
            match host.run(ipv6_forwarding_here)? {
                Ipv6Forwarding::Unavailable => return Err(TopologyError::Ipv6ForwardingUnavailable),
                available => Some(available),
            }
        } else {
            None
        };
        // The first try takes the pool's first free /30 (a lone Domain's
        // addresses are predictable). Domains started at the same moment all
        // pick that same slot and every one of them that sees the clash backs
        // off (see `build_host`), so a retry starts its search at a random
        // slot, after a random pause: concurrent starts spread out instead of
        // colliding again.
        let mut last_error = None;
        for attempt in 0..SLOT_ATTEMPTS {
            let search_from = if attempt == 0 { 0 } else { random_u64()? };
            match DomainNetwork::try_create(host, config, input, ipv6_forwarding, search_from) {
                Err(TopologyError::SlotTaken { slot }) => {
                    last_error = Some(TopologyError::SlotTaken { slot });
                    std::thread::sleep(std::time::Duration::from_millis(random_u64()? % 20));
                }
                other => return other,
            }
        }
        Err(last_error.unwrap_or(TopologyError::PoolExhausted { pool }))
    }

    fn try_create(
        host: &Netns,
        config: &TopologyConfig,
        input: &PolicyInput,
        ipv6_forwarding: Option<Ipv6Forwarding>,
        search_from: u64,
    ) -> Result<DomainNetwork, TopologyError> {
        let (pool, pool6) = (config.pool, config.pool6);
        let view = host.netlink(async |handle| net_view(&handle).await)?;
        if config.check_pool_collisions {
            let pools: &[Prefix] = if input.ipv6 { &[pool, pool6] } else { &[pool] };
            for route in view.routes.iter().filter(|r| r.table == MAIN_TABLE && r.prefix.prefix_len() > 0) {
                let ours = route.oif.is_some_and(|oif| view.is_lazaret_link(oif));
                if let Some(pool) = pools.iter().find(|pool| !ours && route.prefix.overlaps(pool)) {
                    let device = route.oif.map(|oif| view.link_name(oif)).unwrap_or_else(|| "-".into());
                    return Err(TopologyError::PoolCollision { pool: *pool, route: route.prefix, device });
                }
            }
        }
        let used: Vec<IpAddr> = view.addresses.iter().filter(|(index, _)| view.is_lazaret_link(*index)).map(|(_, ip)| *ip).collect();
        let slot = free_slot(pool, &used, search_from).ok_or(TopologyError::PoolExhausted { pool })?;
        let addresses = DomainAddresses::for_slot(slot, pool6).ok_or(TopologyError::InvalidPool { pool, reason: "slot outside pool" })?;

        let policy = compile(&complete_input(&view, config, input, Some(&addresses)))?;

        // Each new namespace takes a few ms of kernel set-up: make both at once.
        let (sidecar, sandbox) = std::thread::scope(|scope| {
            let sidecar = scope.spawn(Netns::create);
            let sandbox = Netns::create();
            (netns::thread_result(sidecar.join()), sandbox)
        });
        let (sidecar, sandbox) = (sidecar?, sandbox?);
        let network = DomainNetwork {
            id: SidecarId::random()?,
            host: host.try_clone()?,
            sidecar: Some(sidecar),
            sandbox: Some(sandbox),
            addresses,
            policy: Arc::new(Mutex::new(policy)),
            input: input.clone(),
            config: config.clone(),
            state_file: config.forwarding_state_file.clone(),
        };
        // On any failure, `network` is dropped and its Drop tears down what exists.
        network.build_sidecar()?;
        network.readdress_sandbox()?;
        network.build_host(&view, ipv6_forwarding)?;
        network.verify_installed()?;
        Ok(network)
    }

    fn namespaces(&self) -> Result<(&Netns, &Netns), TopologyError> {
        match (&self.sidecar, &self.sandbox) {
            (Some(sidecar), Some(sandbox)) => Ok((sidecar, sandbox)),
            _ => Err(TopologyError::TornDown),
        }
    }

    fn ipv6(&self) -> bool {
        self.input.ipv6
    }

    /// The installed policy, locked (a panic elsewhere cannot poison it for good:
    /// the policy itself is only ever replaced whole).
    fn locked_policy(&self) -> MutexGuard<'_, CompiledPolicy> {
        self.policy.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The installed policy itself, for the locked resolver's threads.
    pub(crate) fn shared_policy(&self) -> Arc<Mutex<CompiledPolicy>> {
        self.policy.clone()
    }

    fn build_sidecar(&self) -> Result<(), TopologyError> {
        let (sidecar, sandbox) = self.namespaces()?;
        let sandbox_fd = sandbox.as_fd().as_raw_fd();
        let host_fd = self.host.as_fd().as_raw_fd();
        let host_link = self.id.host_link_name();
        let addresses = self.addresses;
        let (routes, port53_only, locked_filter) = {
            let policy = self.locked_policy();
            (
                policy.routes(),
                policy.port53_only_resolvers(),
                policy.locked().then(|| nft::locked_table(&policy.names().ports(), &policy.allowed_prefixes())),
            )
        };
        let locked = locked_filter.is_some();
        let ipv6 = self.ipv6();
        let filter = nft::sidecar_filter(&port53_only);
        sidecar.netlink(async move |handle| {
            // Sysctls are per namespace: this thread is inside the sidecar.
            for (path, value) in sidecar_sysctls(ipv6) {
                forwarding::write_sysctl(Path::new(path), value)?;
            }
            link_up(&handle, "lo").await?;
            add_veth(&handle, SIDECAR_INNER_LINK, SANDBOX_LINK, sandbox_fd).await?;
            add_veth(&handle, SIDECAR_UPLINK, &host_link, host_fd).await?;
            let inner = link_index(&handle, SIDECAR_INNER_LINK).await?;
            add_address(&handle, inner, SIDECAR_INNER_LINK, addresses.sidecar_inner.into(), 31).await?;
            // Strict reverse-path filter: packets from the sandbox must carry its
            // own source address, so no spoofed source leaves (SNAT matches S only).
            forwarding::write_sysctl(&inner_rp_filter(), "1")?;
            let uplink = link_index(&handle, SIDECAR_UPLINK).await?;
            add_address(&handle, uplink, SIDECAR_UPLINK, addresses.sidecar_uplink.into(), 31).await?;
            if ipv6 {
                add_address(&handle, inner, SIDECAR_INNER_LINK, addresses.v6.sidecar_inner.into(), 127).await?;
                add_address(&handle, uplink, SIDECAR_UPLINK, addresses.v6.sidecar_uplink.into(), 127).await?;
            }
            link_up(&handle, SIDECAR_INNER_LINK).await?;
            link_up(&handle, SIDECAR_UPLINK).await?;
            for route in &routes {
                let message = route_message(route, (uplink, addresses.host_uplink, addresses.v6.host_uplink))?;
                handle
                    .route()
                    .add(message)
                    .execute()
                    .await
                    .map_err(netlink_error(format!("add sidecar route {} {:?}", route.prefix, route.kind)))?;
            }
            install_self_guard_table(&handle, true, &addresses.sidecar_own()).await?;
            install_rules(&handle, GuardFamily::V4 { gateway: addresses.sidecar_inner, resolver: locked }).await?;
            if ipv6 {
                install_self_guard_table(&handle, false, &addresses.v6.sidecar_own()).await?;
                install_rules(&handle, GuardFamily::V6 { sandbox: addresses.v6.sandbox }).await?;
            }
            // Resolvers only their DNS route opens: port 53 only (routes cannot match ports).
            filter.install()?;
            // Locked mode: only allowed names' addresses and allowed prefixes.
            match &locked_filter {
                Some(table) => table.install(),
                None => Ok(()),
            }
        })
    }

    /// (Re-)addresses the sandbox side: `eth0` up with its /31 (and /127) and
    /// the default route(s) via the sidecar. runsc's netstack mode strips the
    /// addresses from the namespace, so call this before every start of the sandbox.
    pub fn readdress_sandbox(&self) -> Result<(), TopologyError> {
        let (_, sandbox) = self.namespaces()?;
        let addresses = self.addresses;
        let ipv6 = self.ipv6();
        sandbox.netlink(async move |handle| {
            link_up(&handle, "lo").await?;
            let index = link_index(&handle, SANDBOX_LINK).await?;
            add_address(&handle, index, SANDBOX_LINK, addresses.sandbox.into(), 31).await?;
            if ipv6 {
                add_address(&handle, index, SANDBOX_LINK, addresses.v6.sandbox.into(), 127).await?;
            }
            link_up(&handle, SANDBOX_LINK).await?;
            let default = RouteMessageBuilder::<Ipv4Addr>::new().gateway(addresses.sidecar_inner).output_interface(index).build();
            handle.route().add(default).replace().execute().await.map_err(netlink_error("add sandbox default route"))?;
            if ipv6 {
                let default6 = RouteMessageBuilder::<Ipv6Addr>::new().gateway(addresses.v6.sidecar_inner).output_interface(index).build();
                handle.route().add(default6).replace().execute().await.map_err(netlink_error("add sandbox IPv6 default route"))?;
            }
            Ok(())
        })
    }

    /// The host side; `ipv6_forwarding` is how the host forwards IPv6 (given
    /// exactly when IPv6 is enabled for the Domain).
    fn build_host(&self, view: &NetView, ipv6_forwarding: Option<Ipv6Forwarding>) -> Result<(), TopologyError> {
        let host_link = self.id.host_link_name();
        let addresses = self.addresses;
        let state_file = self.state_file.clone();
        let ipv6 = self.ipv6();
        let (egress, egress6) = {
            let policy = self.locked_policy();
            (egress_interfaces(view, &policy, true), if ipv6 { egress_interfaces(view, &policy, false) } else { Vec::new() })
        };
        let slot = addresses.slot;
        let id = self.id;
        self.host.netlink(async move |handle| {
            let index = link_index(&handle, &host_link).await?;
            add_address(&handle, index, &host_link, addresses.host_uplink.into(), 31).await?;
            if ipv6 {
                add_address(&handle, index, &host_link, addresses.v6.host_uplink.into(), 127).await?;
                // Its link-local address (which the host's neighbour discovery
                // towards the sidecar needs) usable at once, not after DAD.
                forwarding::write_sysctl(&PathBuf::from(format!("/proc/sys/net/ipv6/conf/{host_link}/accept_dad")), "0")?;
            }
            link_up(&handle, &host_link).await?;
            // Another Domain may have picked the same /30 at the same moment.
            let view = net_view(&handle).await?;
            let clash = view.addresses.iter().any(|(i, ip)| *i != index && view.is_lazaret_link(*i) && slot.contains(*ip));
            if clash {
                return Err(TopologyError::SlotTaken { slot });
            }
            let sandbox_link = addresses.sandbox_link();
            let back = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(Ipv4Addr::from_bits(u32::from(addresses.sandbox) & !1), sandbox_link.prefix_len())
                .gateway(addresses.sidecar_uplink)
                .output_interface(index)
                .build();
            handle.route().add(back).execute().await.map_err(netlink_error(format!("add host route {sandbox_link} via {host_link}")))?;
            forwarding::enable_owned(Switch::Ipv4, &host_link)?;
            forwarding::enable(&state_file, Switch::Ipv4, &egress)?;
            if ipv6 {
                let sandbox_link6 = addresses.v6.sandbox_link();
                let back6 = RouteMessageBuilder::<Ipv6Addr>::new()
                    .destination_prefix(Ipv6Addr::from_bits(addresses.v6.sandbox.to_bits() & !1), sandbox_link6.prefix_len())
                    .gateway(addresses.v6.sidecar_uplink)
                    .output_interface(index)
                    .build();
                handle
                    .route()
                    .add(back6)
                    .execute()
                    .await
                    .map_err(netlink_error(format!("add host route {sandbox_link6} via {host_link}")))?;
                // With global IPv6 forwarding on, the host already forwards.
                if ipv6_forwarding == Some(Ipv6Forwarding::PerInterface) {
                    forwarding::enable_owned(Switch::Ipv6, &host_link)?;
                    forwarding::enable(&state_file, Switch::Ipv6, &egress6)?;
                }
            }
            nat::install(id, addresses.sandbox, ipv6.then_some(addresses.v6.sandbox))
        })
    }

    /// Dumps the sidecar's routing tables and rules and the sandbox's routes
    /// over netlink and checks them against the compiled policy; also checks
    /// that the sidecar forwards IPv4 (and IPv6 exactly when it is enabled),
    /// that it filters spoofed sources, that its nftables filter (port 53
    /// only for resolvers the policy otherwise denies) is exactly the
    /// expected one, and that the host's table (NAT and forward guard) is.
    /// Call it after [`Self::readdress_sandbox`] and before starting runsc:
    /// runsc's netstack mode strips the sandbox namespace's addresses (and
    /// with them its default route) once it runs.
    pub fn verify_installed(&self) -> Result<(), TopologyError> {
        let (sidecar, sandbox) = self.namespaces()?;
        // Held throughout: an update of the host's addresses waits.
        let policy = self.locked_policy();
        let addresses = self.addresses;
        let ipv6 = self.ipv6();
        let mut differences = Vec::new();
        let (own, own6) = (addresses.sidecar_own(), addresses.v6.sidecar_own());
        let filter = nft::sidecar_filter(&policy.port53_only_resolvers());
        let locked_filter = policy.locked().then(|| nft::locked_table(&policy.names().ports(), &policy.allowed_prefixes()));
        let locked = locked_filter.is_some();
        let (view, sysctls, guard) = sidecar.netlink(async move |handle| {
            let view = net_view(&handle).await?;
            let mut sysctls = Vec::new();
            for (path, _) in sidecar_sysctls(ipv6) {
                sysctls.push(forwarding::read_sysctl(Path::new(path))?);
            }
            let rp_filter = inner_rp_filter();
            sysctls.push(forwarding::read_sysctl(&rp_filter)?);
            let mut guard =
                self_guard_differences(&handle, GuardFamily::V4 { gateway: addresses.sidecar_inner, resolver: locked }, &own).await?;
            if ipv6 {
                guard.extend(self_guard_differences(&handle, GuardFamily::V6 { sandbox: addresses.v6.sandbox }, &own6).await?);
            }
            guard.extend(sidecar_filter_differences(&filter, locked_filter.as_ref())?);
            Ok((view, sysctls, guard))
        })?;
        differences.extend(guard);
        let expected_sysctls =
            sidecar_sysctls(ipv6).into_iter().map(|(p, v)| (p.to_string(), v)).chain([(inner_rp_filter().display().to_string(), "1")]);
        for ((path, expected), actual) in expected_sysctls.zip(&sysctls) {
            if actual != expected {
                differences.push(format!("sidecar {path} is {actual}, expected {expected}"));
            }
        }
        differences.extend(policy_route_differences(&view, &addresses, &policy.routes()));
        let sandbox_view = sandbox.netlink(async |handle| net_view(&handle).await)?;
        differences.extend(sandbox_route_differences(&sandbox_view, &addresses, ipv6));
        let host_table = nft::host_table(self.id, addresses.sandbox, ipv6.then_some(addresses.v6.sandbox));
        differences.extend(self.host.run(|| host_table.differences())?.into_iter().map(|d| format!("host {d}")));
        if differences.is_empty() { Ok(()) } else { Err(TopologyError::Mismatch { differences }) }
    }

    /// This sidecar's runtime-unique ID (record it with the Domain).
    pub fn sidecar_id(&self) -> SidecarId {
        self.id
    }

    /// The Domain's addresses.
    pub fn addresses(&self) -> DomainAddresses {
        self.addresses
    }

    /// The installed policy (for `policy show`/`explain` of a running
    /// Domain): a copy, as [`Self::refresh_host`] may replace it any time.
    pub fn policy(&self) -> CompiledPolicy {
        self.locked_policy().clone()
    }

    /// Where the escalation channel listens: the sandbox's gateway (the
    /// sidecar's inner address) and [`ESCALATION_PORT`], the one address and
    /// port of the sidecar that the self-guard lets the sandbox reach.
    pub fn escalation_address(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.addresses.sidecar_inner, ESCALATION_PORT))
    }

    /// A TCP listener on [`Self::escalation_address`], created inside the
    /// sidecar namespace (a socket stays in the namespace it was created
    /// in, whichever thread accepts on it later): close-on-exec, backlog
    /// 1024 (at most `net.core.somaxconn`). Only the sandbox reaches it:
    /// other Domains' sidecars deny the pool, and the host's processes,
    /// whose route to the sandbox link crosses the sidecar, get no reply
    /// (the sidecar routes none of the host's addresses, its uplink's end
    /// included: they are denied host and transit addresses).
    pub fn bind_escalation_listener(&self) -> Result<TcpListener, TopologyError> {
        let (sidecar, _) = self.namespaces()?;
        let address = SocketAddrV4::new(self.addresses.sidecar_inner, ESCALATION_PORT);
        sidecar.run(move || listen_tcp(address, ESCALATION_BACKLOG))
    }

    /// The sandbox namespace, for runsc (see [`Netns::proc_path`]).
    pub fn sandbox_netns(&self) -> Option<&Netns> {
        self.sandbox.as_ref()
    }

    /// The sidecar (router) namespace.
    pub fn sidecar_netns(&self) -> Option<&Netns> {
        self.sidecar.as_ref()
    }

    /// Removes exactly this Domain's resources: the uplink veth pair (with the
    /// host route through it), its namespaces (once nothing else holds them),
    /// and the host's forwarding changes if this was the last Domain.
    pub fn teardown(mut self) -> Result<(), TopologyError> {
        self.teardown_inner()
    }

    fn teardown_inner(&mut self) -> Result<(), TopologyError> {
        let id = self.id;
        let host_link = self.id.host_link_name();
        let host = &self.host;
        // Deleting a veth and deleting an nftables table each wait for the
        // kernel (RCU grace periods) and do not depend on each other: do both at once.
        let (link_result, nat_result) = std::thread::scope(|scope| {
            let nat = scope.spawn(|| host.run(|| nat::remove_where(|table| table == id).map(drop)));
            let link = host.netlink(async move |handle| {
                let found = net_view_links(&handle).await?.into_iter().find(|(_, name)| *name == host_link);
                if let Some((index, _)) = found {
                    handle.link().del(index).execute().await.map_err(netlink_error(format!("delete {host_link}")))?;
                }
                Ok(())
            });
            (link, netns::thread_result(nat.join()))
        });
        let state_file = self.state_file.clone();
        let restore_result = link_result.and(nat_result).and_then(|()| host.run(|| restore_forwarding_if_unused(&state_file)));
        // The namespaces go away with their last descriptor (and process).
        self.sidecar = None;
        self.sandbox = None;
        restore_result
    }
}

impl Drop for DomainNetwork {
    fn drop(&mut self) {
        if self.sidecar.is_some() || self.sandbox.is_some() {
            // Best effort: errors cannot be reported from Drop.
            let _ = self.teardown_inner();
        }
    }
}

/// A listening TCP socket on `address` in the calling thread's namespace,
/// close-on-exec, with `backlog` (std's `TcpListener::bind` fixes 128).
fn listen_tcp(address: SocketAddrV4, backlog: i32) -> Result<TcpListener, TopologyError> {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockProtocol, SockType, SockaddrIn, bind, listen, setsockopt, socket, sockopt,
    };
    let failed = |action: &'static str| move |errno| TopologyError::Namespace { action, errno };
    let socket = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, SockProtocol::Tcp)
        .map_err(failed("socket(AF_INET, SOCK_STREAM) for the escalation listener"))?;
    setsockopt(&socket, sockopt::ReuseAddr, &true).map_err(failed("setsockopt(SO_REUSEADDR) on the escalation listener"))?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&socket), &SockaddrIn::from(address)).map_err(failed("bind the escalation listener"))?;
    let backlog = Backlog::new(backlog).map_err(failed("listen backlog of the escalation listener"))?;
    listen(&socket, backlog).map_err(failed("listen on the escalation listener"))?;
    Ok(TcpListener::from(socket))
}

/// Removes Lazaret uplinks and NAT tables in `host` whose Sidecar ID is not in
/// `alive` (leftovers of crashed runs), then restores host forwarding if no Lazaret
/// uplink remains. Returns the IDs removed.
pub fn remove_stale(host: &Netns, alive: &[SidecarId], forwarding_state_file: &Path) -> Result<Vec<SidecarId>, TopologyError> {
    let alive = alive.to_vec();
    remove_matching(host, forwarding_state_file, move |id| !alive.contains(&id))
}

/// Removes exactly the uplinks and NAT tables of the Sidecar IDs in `ids`
/// (those a crashed run of one Domain recorded), leaving every other
/// Domain's alone, then restores host forwarding if no Lazaret uplink
/// remains. Returns the IDs that had something to remove.
pub fn remove_sidecars(host: &Netns, ids: &[SidecarId], forwarding_state_file: &Path) -> Result<Vec<SidecarId>, TopologyError> {
    let ids = ids.to_vec();
    remove_matching(host, forwarding_state_file, move |id| ids.contains(&id))
}

fn remove_matching(
    host: &Netns,
    forwarding_state_file: &Path,
    is_stale: impl Fn(SidecarId) -> bool + Send + 'static,
) -> Result<Vec<SidecarId>, TopologyError> {
    let state_file = forwarding_state_file.to_path_buf();
    host.netlink(async move |handle| {
        let mut removed = Vec::new();
        for (index, name) in net_view_links(&handle).await? {
            if let Some(id) = SidecarId::from_host_link_name(&name) {
                if is_stale(id) {
                    handle.link().del(index).execute().await.map_err(netlink_error(format!("delete stale {name}")))?;
                    removed.push(id);
                }
            }
        }
        for id in nat::remove_where(&is_stale)? {
            if !removed.contains(&id) {
                removed.push(id);
            }
        }
        restore_forwarding_if_unused(&state_file)?;
        Ok(removed)
    })
}

/// Sidecar IDs that own a Lazaret NAT table in `host` (diagnostics, tests).
pub fn nat_tables(host: &Netns) -> Result<Vec<SidecarId>, TopologyError> {
    host.run(nat::owned_tables)
}

/// Whether an IPv6-enabled Domain can forward through `host`: its global
/// IPv6 forwarding is on, or the kernel has per-interface `force_forwarding`.
pub fn host_can_forward_ipv6(host: &Netns) -> Result<bool, TopologyError> {
    Ok(host.run(ipv6_forwarding_here)? != Ipv6Forwarding::Unavailable)
}

/// Whether `host` has a global IPv6 route (a default or 2000::/3 route that
/// is not unreachable): the config's `ipv6` default is false without one.
pub fn host_has_global_ipv6_route(host: &Netns) -> Result<bool, TopologyError> {
    let view = host.netlink(async |handle| net_view(&handle).await)?;
    let global: Prefix = Prefix::truncating(IpAddr::V6(std::net::Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0)), 3);
    Ok(view.routes.iter().any(|route| {
        !route.prefix.is_v4()
            && route.table == MAIN_TABLE
            && route.kind == RouteType::Unicast
            && (route.prefix.prefix_len() == 0 || global.covers(&route.prefix))
    }))
}

/// The host's on-link networks (its LAN): the main-table link routes the
/// kernel (or router advertisements) made for the host's addresses, on
/// interfaces other than loopback and Lazaret's own. Routes an operator or a
/// VPN added (`0.0.0.0/1 dev wg0`) are not networks of the host's addresses
/// and do not count, nor do default routes.
fn host_networks(view: &NetView) -> Vec<Prefix> {
    let mut networks: Vec<Prefix> = view
        .routes
        .iter()
        .filter(|route| route.table == MAIN_TABLE && route.kind == RouteType::Unicast && route.gateway.is_none())
        .filter(|route| matches!(route.protocol, RouteProtocol::Kernel | RouteProtocol::Ra) && route.prefix.prefix_len() > 0)
        .filter_map(|route| Some((route.prefix, route.oif?)))
        .filter(|(_, oif)| view.link_name(*oif) != "lo" && !view.is_lazaret_link(*oif))
        .filter(|(prefix, oif)| view.addresses.iter().any(|(index, ip)| index == oif && prefix.contains(*ip)))
        .map(|(prefix, _)| prefix)
        .collect();
    networks.sort();
    networks.dedup();
    networks
}

/// Adds what the topology knows to the configured policy: the host's
/// addresses, the pools (other Domains) and, when known, the Domain's uplink.
fn complete_input(view: &NetView, config: &TopologyConfig, input: &PolicyInput, addresses: Option<&DomainAddresses>) -> PolicyInput {
    let mut full = input.clone();
    // Addresses on Lazaret's own uplinks are the pools' (denied as other
    // Domains or as this Domain's transit) or link-local (fe80::/10): not
    // host addresses, or every Domain's start would change every other's table.
    full.host_addresses
        .extend(view.addresses.iter().filter(|(index, _)| !view.is_lazaret_link(*index)).map(|(_, ip)| *ip).filter(|ip| !ip.is_loopback()));
    full.host_networks.extend(host_networks(view));
    if let Some(addresses) = addresses {
        full.own_addresses.push(Prefix::host(IpAddr::V4(addresses.host_uplink)));
        if input.ipv6 {
            full.own_addresses.push(Prefix::host(IpAddr::V6(addresses.v6.host_uplink)));
        }
    }
    full.other_domains.push(config.pool);
    if input.ipv6 {
        full.other_domains.push(config.pool6);
    }
    full
}

/// The policy a Domain would get on `host` now (its host addresses and the
/// pool included), for `lazaret policy show`/`explain` without a running
/// Domain. `host` is normally [`Netns::of_current_thread`]. The running
/// Domain's table additionally holds its uplink's /32 (inside the pool, so
/// every verdict is the same).
pub fn host_policy(host: &Netns, config: &TopologyConfig, input: &PolicyInput) -> Result<CompiledPolicy, TopologyError> {
    let view = host.netlink(async |handle| net_view(&handle).await)?;
    Ok(compile(&complete_input(&view, config, input, None))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_id_round_trip_and_link_names() {
        let id = SidecarId(0x00ab_cdef_0123);
        assert_eq!(id.to_string(), "abcdef0123");
        assert_eq!(id.host_link_name(), "lzhabcdef0123");
        assert!(id.host_link_name().len() <= 15);
        assert_eq!(SidecarId::from_host_link_name("lzhabcdef0123"), Some(id));
        assert_eq!(SidecarId::from_host_link_name("lzhABCDEF0123"), None);
        assert_eq!(SidecarId::from_host_link_name("eth0"), None);
        assert_eq!(SidecarId::from_host_link_name("lzh123"), None);
        assert!("abcdef012".parse::<SidecarId>().is_err());
    }

    #[test]
    fn free_slot_searches_from_the_given_slot_and_wraps() {
        let pool: Prefix = "100.96.0.0/28".parse().expect("valid test input");
        let ip = |s: &str| -> IpAddr { s.parse().expect("valid test input") };
        let slot = |s: &str| -> Option<Prefix> { Some(s.parse().expect("valid test input")) };
        let used = [ip("100.96.0.1"), ip("100.96.0.10")];
        assert_eq!(free_slot(pool, &used, 0), slot("100.96.0.4/30"));
        assert_eq!(free_slot(pool, &used, 2), slot("100.96.0.12/30"));
        // 7 % 4 = 3: the last slot is free.
        assert_eq!(free_slot(pool, &used, 7), slot("100.96.0.12/30"));
        let full = [ip("100.96.0.12"), ip("100.96.0.6")];
        assert_eq!(free_slot(pool, &[&used[..], &full[..]].concat(), 3), None);
        // u64::MAX % 4 = 3, taken: it wraps to the first slot.
        assert_eq!(free_slot(pool, &[ip("100.96.0.13")], u64::MAX), slot("100.96.0.0/30"));
    }

    #[test]
    fn random_ids_differ_and_fit_40_bits() {
        let a = SidecarId::random().expect("valid test input");
        let b = SidecarId::random().expect("valid test input");
        assert_ne!(a, b);
        assert!(a.0 < (1 << 40) && b.0 < (1 << 40));
    }

    #[test]
    fn sidecar_rules_read_like_ip_rule() {
        let gateway = Ipv4Addr::new(100, 96, 0, 5);
        let v4: Vec<String> = sidecar_rules(GuardFamily::V4 { gateway, resolver: false }).iter().map(ToString::to_string).collect();
        assert_eq!(v4.len(), 1 + GUARDED_PROTOCOLS.len() + 1);
        assert_eq!(v4[0], "490: iif lzs0 from all to 100.96.0.5/32 ipproto Tcp dport 7418-7418 lookup 255");
        assert_eq!(v4[1], "500: iif lzs0 from all ipproto Icmp lookup 200");
        assert_eq!(v4.last().map(String::as_str), Some("1000: from all lookup 255"));
        // The exception is the only rule with a port, and the only one ahead of the self-guard.
        assert_eq!(v4.iter().filter(|rule| rule.contains("dport")).count(), 1);
        assert_eq!(v4.iter().filter(|rule| !rule.starts_with("500:") && !rule.starts_with("1000:")).count(), 1);
        let sandbox: Ipv6Addr = "fd6c:617a:6172::6460:4".parse().expect("valid test input");
        let v6: Vec<String> = sidecar_rules(GuardFamily::V6 { sandbox }).iter().map(ToString::to_string).collect();
        assert_eq!(
            &v6[..3],
            [
                "400: iif lzs0 from fe80::/10 goto 450",
                "401: iif lzs0 from fd6c:617a:6172::6460:4/128 goto 450",
                "402: iif lzs0 from all Blackhole",
            ]
        );
        assert_eq!(v6[3], "450: iif lzs0 from all to fe80::/10 ipproto Tcp Unreachable");
        // ICMPv6 (neighbour discovery) is guarded nowhere.
        assert!(!v6.iter().any(|rule| rule.contains("Icmp")), "{v6:?}");
        assert_eq!(v6.len(), 3 + 2 * (GUARDED_PROTOCOLS.len() - 1) + 1);
        // IPv6 has no exception: nothing of the sidecar's is let through.
        assert!(!v6.iter().any(|rule| rule.contains("dport") || rule.starts_with(&format!("{ESCALATION_PRIORITY}:"))), "{v6:?}");
    }

    #[test]
    fn rule_differences_report_missing_and_every_extra_rule() {
        let sandbox: Ipv6Addr = "fd6c:617a:6172::6460:4".parse().expect("valid test input");
        let expected = sidecar_rules(GuardFamily::V6 { sandbox });
        let main = SidecarRule { table: MAIN_TABLE, ..SidecarRule::any(32766, RuleAction::ToTable) };
        let mut found = expected.clone();
        found.push(main.clone());
        assert_eq!(rule_differences("IPv6", &expected, &found), Vec::<String>::new());

        // The kernel's own local rule left at priority 0, ahead of every guard.
        found.push(SidecarRule { table: LOCAL_TABLE, ..SidecarRule::any(0, RuleAction::ToTable) });
        // The spoof guard written with `not`, which also inverts `iif`.
        let spoof = found.iter().position(|rule| rule.priority == SPOOF_GUARD_PRIORITY).expect("spoof guard");
        found[spoof] = SidecarRule { source: Some(Prefix::host(IpAddr::V6(sandbox))), inverted: true, ..found[spoof].clone() };
        // A rule that looks like the kernel's `main`, at the wrong priority.
        found.push(SidecarRule { priority: 300, ..main });
        assert_eq!(
            rule_differences("IPv6", &expected, &found),
            [
                "sidecar IPv6 rule missing: 402: iif lzs0 from all Blackhole",
                "unexpected sidecar IPv6 rule: 402: not iif lzs0 from fd6c:617a:6172::6460:4/128 Blackhole",
                "unexpected sidecar IPv6 rule: 0: from all lookup 255",
                "unexpected sidecar IPv6 rule: 300: from all lookup 254",
            ]
        );

        // The escalation exception widened to every port is no longer the expected one.
        let expected = sidecar_rules(GuardFamily::V4 { gateway: Ipv4Addr::new(100, 96, 0, 5), resolver: false });
        let mut found = expected.clone();
        found[0].destination_ports = Some((1, u16::MAX));
        assert_eq!(
            rule_differences("IPv4", &expected, &found),
            [
                "sidecar IPv4 rule missing: 490: iif lzs0 from all to 100.96.0.5/32 ipproto Tcp dport 7418-7418 lookup 255",
                "unexpected sidecar IPv4 rule: 490: iif lzs0 from all to 100.96.0.5/32 ipproto Tcp dport 1-65535 lookup 255",
            ]
        );
    }

    #[test]
    fn host_networks_are_the_link_routes_of_host_addresses() {
        let ip = |text: &str| -> IpAddr { text.parse().expect("valid test input") };
        let prefix = |text: &str| -> Prefix { text.parse().expect("valid test input") };
        let route = |text: &str, oif: u32, protocol: RouteProtocol, gateway: Option<&str>| HostRoute {
            prefix: prefix(text),
            oif: Some(oif),
            table: MAIN_TABLE,
            protocol,
            kind: RouteType::Unicast,
            gateway: gateway.map(ip),
        };
        let view = NetView {
            links: vec![(1, "lo".into()), (2, "eth0".into()), (3, "wg0".into()), (4, "lzhabcdef0123".into())],
            addresses: vec![
                (1, ip("127.0.0.1")),
                (2, ip("192.168.1.20")),
                (2, ip("2a02:8070:1:2::20")),
                (2, ip("2a02:8070:9::5")),
                (2, ip("fe80::1")),
                (3, ip("10.8.0.2")),
                (4, ip("100.96.0.3")),
            ],
            routes: vec![
                route("127.0.0.0/8", 1, RouteProtocol::Kernel, None),
                route("192.168.1.0/24", 2, RouteProtocol::Kernel, None),
                route("2a02:8070:1:2::/64", 2, RouteProtocol::Kernel, None),
                // DHCPv6 gives a /128; the on-link prefix comes from a router advertisement.
                route("2a02:8070:9::/64", 2, RouteProtocol::Ra, None),
                route("fe80::/64", 2, RouteProtocol::Kernel, None),
                route("::/0", 2, RouteProtocol::Ra, Some("fe80::99")),
                route("0.0.0.0/0", 2, RouteProtocol::Boot, Some("192.168.1.1")),
                // wg-quick's split default routes hold wg0's address but are no LAN.
                route("0.0.0.0/1", 3, RouteProtocol::Boot, None),
                route("10.8.0.0/24", 3, RouteProtocol::Kernel, None),
                // An on-link route without an address of the host in it.
                route("172.20.0.0/16", 2, RouteProtocol::Kernel, None),
                route("100.96.0.2/31", 4, RouteProtocol::Kernel, None),
            ],
        };
        assert_eq!(
            host_networks(&view),
            ["10.8.0.0/24", "192.168.1.0/24", "2a02:8070:1:2::/64", "2a02:8070:9::/64", "fe80::/64"].map(prefix).to_vec()
        );
    }

    #[test]
    fn domain_addresses_from_slot() {
        let slot: Prefix = "100.96.0.4/30".parse().expect("valid test input");
        let pool6: Prefix = DEFAULT_POOL6.parse().expect("valid test input");
        let addresses = DomainAddresses::for_slot(slot, pool6).expect("valid test input");
        assert_eq!(addresses.sandbox, Ipv4Addr::new(100, 96, 0, 4));
        assert_eq!(addresses.sidecar_inner, Ipv4Addr::new(100, 96, 0, 5));
        assert_eq!(addresses.sidecar_uplink, Ipv4Addr::new(100, 96, 0, 6));
        assert_eq!(addresses.host_uplink, Ipv4Addr::new(100, 96, 0, 7));
        assert_eq!(addresses.sandbox_link().to_string(), "100.96.0.4/31");
        assert_eq!(addresses.v6.sandbox, "fd6c:617a:6172::6460:4".parse::<Ipv6Addr>().expect("valid test input"));
        assert_eq!(addresses.v6.sidecar_inner, "fd6c:617a:6172::6460:5".parse::<Ipv6Addr>().expect("valid test input"));
        assert_eq!(addresses.v6.sidecar_uplink, "fd6c:617a:6172::6460:6".parse::<Ipv6Addr>().expect("valid test input"));
        assert_eq!(addresses.v6.host_uplink, "fd6c:617a:6172::6460:7".parse::<Ipv6Addr>().expect("valid test input"));
        assert_eq!(addresses.v6.sandbox_link().to_string(), "fd6c:617a:6172::6460:4/127");
        // The pool's own configured constant matches the default config.
        assert_eq!(TopologyConfig::new(PathBuf::new()).pool6, pool6);
        // A pool too long to hold an IPv4 address is refused.
        assert_eq!(DomainAddresses::for_slot(slot, "fd00::/100".parse().expect("valid test input")), None);
    }
}
