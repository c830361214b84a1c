//! A fake host + fake internet, entirely inside network namespaces the test
//! creates. Nothing touches the machine's real network namespace.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use futures_util::TryStreamExt;
use lazaret_netpolicy::topology::{Netns, TopologyError};
use rtnetlink::packet_route::link::LinkAttribute;
use rtnetlink::{Handle, LinkUnspec, LinkVeth, RouteMessageBuilder};

/// The host's address on its "WAN" link.
pub const HOST_WAN: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// The fake internet's router address.
pub const WORLD_WAN: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// Port every test server listens on.
pub const PORT: u16 = 8080;
/// Servers in the fake internet (on its loopback). Not a documentation
/// address: those are special-purpose blocks that the policy denies.
pub const PUBLIC: Ipv4Addr = Ipv4Addr::new(11, 1, 1, 1);
/// An RFC 1918 server.
pub const PRIVATE_10: Ipv4Addr = Ipv4Addr::new(10, 1, 1, 1);
/// Another RFC 1918 server.
pub const PRIVATE_172: Ipv4Addr = Ipv4Addr::new(172, 16, 5, 5);
/// Cloud metadata lookalike.
pub const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// Inside 10.222.0.0/16, which the tests allow explicitly.
pub const ALLOWED_PRIVATE: Ipv4Addr = Ipv4Addr::new(10, 222, 0, 1);
/// A "DNS resolver" inside a denied range.
pub const RESOLVER: Ipv4Addr = Ipv4Addr::new(10, 1, 1, 53);
/// A server in the shared address space (CGNAT, Tailscale), RFC 6598.
pub const CGNAT: Ipv4Addr = Ipv4Addr::new(100, 64, 7, 7);
/// A server in the benchmarking block, RFC 2544.
pub const BENCHMARK: Ipv4Addr = Ipv4Addr::new(198, 18, 7, 7);
/// A server in the reserved block 240/4, RFC 1112.
pub const RESERVED: Ipv4Addr = Ipv4Addr::new(240, 7, 7, 7);
/// A "LAN router" that is also the DNS resolver (an RFC 1918 address).
pub const LAN_RESOLVER: Ipv4Addr = Ipv4Addr::new(192, 168, 7, 1);
/// The host's IPv6 address on its "WAN" link (with [`FakeInternet::with_ipv6`]).
pub const HOST_WAN6: Ipv6Addr = Ipv6Addr::new(0x2a0b, 1, 0, 0, 0, 0, 0, 2);
/// The fake internet's IPv6 router address.
pub const WORLD_WAN6: Ipv6Addr = Ipv6Addr::new(0x2a0b, 1, 0, 0, 0, 0, 0, 1);
/// A public IPv6 server (outside 2001:db8::/32, which the policy denies).
pub const PUBLIC6: Ipv6Addr = Ipv6Addr::new(0x2a0b, 0x100, 0, 0, 0, 0, 0, 1);
/// An IPv6 unique-local (ULA) server.
pub const ULA6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 1);

/// Fails loudly (never skips) when the tests cannot run.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (network namespaces, veths, nftables): run it as root, with `sudo scripts/test.sh` or `cargo test -p lazaret-netpolicy` in a root shell"
    );
}

pub fn link_index_sync(links: &[(u32, String)], name: &str) -> u32 {
    links.iter().find(|(_, n)| n == name).map(|(i, _)| *i).unwrap_or_else(|| panic!("no link {name}"))
}

pub async fn links(handle: &Handle) -> Result<Vec<(u32, String)>, TopologyError> {
    let mut found = Vec::new();
    let mut stream = handle.link().get().execute();
    while let Some(link) = stream.try_next().await.map_err(nl("list links"))? {
        for attribute in &link.attributes {
            if let LinkAttribute::IfName(name) = attribute {
                found.push((link.header.index, name.clone()));
            }
        }
    }
    Ok(found)
}

pub fn nl(action: &str) -> impl FnOnce(rtnetlink::Error) -> TopologyError {
    let action = action.to_string();
    move |source| TopologyError::Netlink { action, source }
}

pub async fn up(handle: &Handle, name: &str) -> Result<u32, TopologyError> {
    let index = link_index_sync(&links(handle).await?, name);
    handle.link().set(LinkUnspec::new_with_index(index).up().build()).execute().await.map_err(nl("up"))?;
    Ok(index)
}

/// A test host namespace joined to a "world" namespace that plays the internet.
pub struct FakeInternet {
    pub host: Netns,
    pub world: Netns,
    /// Keep alive: servers accept via the kernel backlog.
    listeners: Vec<TcpListener>,
    pub state_dir: tempfile::TempDir,
}

fn world_addresses() -> [Ipv4Addr; 10] {
    [PUBLIC, PRIVATE_10, PRIVATE_172, METADATA, ALLOWED_PRIVATE, RESOLVER, CGNAT, BENCHMARK, RESERVED, LAN_RESOLVER]
}

impl FakeInternet {
    /// An IPv4-only fake internet (the host has no IPv6 route).
    pub fn new() -> FakeInternet {
        FakeInternet::build(false)
    }

    /// A fake internet that also speaks IPv6: the host gets a global IPv6
    /// address and default route, the world [`PUBLIC6`] and [`ULA6`].
    pub fn with_ipv6() -> FakeInternet {
        FakeInternet::build(true)
    }

    fn build(ipv6: bool) -> FakeInternet {
        require_root();
        let host = Netns::create().expect("create test host netns");
        let world = Netns::create().expect("create world netns");
        let world_fd = std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(&world));
        host.netlink(async move |handle| {
            // Link-local addresses final at once, so snapshots before and after
            // a test do not differ by a finished duplicate address detection.
            std::fs::write("/proc/sys/net/ipv6/conf/default/accept_dad", "0")
                .map_err(|source| TopologyError::Io { action: "accept_dad".into(), source })?;
            up(&handle, "lo").await?;
            handle.link().add(LinkVeth::new("wan0", "wan1").build()).execute().await.map_err(nl("veth"))?;
            let peer = link_index_sync(&links(&handle).await?, "wan1");
            handle.link().set(LinkUnspec::new_with_index(peer).setns_by_fd(world_fd).build()).execute().await.map_err(nl("move"))?;
            let wan = up(&handle, "wan0").await?;
            handle.address().add(wan, IpAddr::V4(HOST_WAN), 24).execute().await.map_err(nl("addr"))?;
            let default = RouteMessageBuilder::<Ipv4Addr>::new().gateway(WORLD_WAN).output_interface(wan).build();
            handle.route().add(default).execute().await.map_err(nl("host default route"))?;
            // Start from "forwarding off" whatever the real host has.
            std::fs::write("/proc/sys/net/ipv4/conf/wan0/forwarding", "0")
                .map_err(|source| TopologyError::Io { action: "wan0 forwarding".into(), source })?;
            if ipv6 {
                add_nodad(&handle, wan, IpAddr::V6(HOST_WAN6), 64).await?;
                let default6 = RouteMessageBuilder::<Ipv6Addr>::new().gateway(WORLD_WAN6).output_interface(wan).build();
                handle.route().add(default6).execute().await.map_err(nl("host IPv6 default route"))?;
            }
            Ok(())
        })
        .expect("build test host");
        world
            .netlink(async |handle| {
                let lo = up(&handle, "lo").await?;
                for address in world_addresses() {
                    handle.address().add(lo, IpAddr::V4(address), 32).execute().await.map_err(nl("world addr"))?;
                }
                let wan = up(&handle, "wan1").await?;
                handle.address().add(wan, IpAddr::V4(WORLD_WAN), 24).execute().await.map_err(nl("addr"))?;
                if ipv6 {
                    add_nodad(&handle, wan, IpAddr::V6(WORLD_WAN6), 64).await?;
                    for address in [PUBLIC6, ULA6] {
                        add_nodad(&handle, lo, IpAddr::V6(address), 128).await?;
                    }
                }
                // No route back to the Lazaret pool: replies only work through the host's SNAT.
                Ok(())
            })
            .expect("build world");
        // Snapshots compare the host before and after a test: let the uplink's
        // carrier (and, with IPv6, its link-local address) settle first.
        for _ in 0..300 {
            let lines = snapshot(&host);
            if !lines.iter().any(|l| l.contains("Linkdown")) && (!ipv6 || lines.iter().any(|l| l.contains("LinkLocal"))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut listeners = vec![
            listen(&world, IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            // A service on the host itself, on every host address.
            listen(&host, IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        ];
        if ipv6 {
            listeners.extend([listen(&world, IpAddr::V6(PUBLIC6)), listen(&world, IpAddr::V6(ULA6)), listen(&host, IpAddr::V6(HOST_WAN6))]);
        }
        FakeInternet { host, world, listeners, state_dir: tempfile::tempdir().expect("tempdir") }
    }

    /// Peer addresses of the connections queued on the world's IPv4 server.
    pub fn world_peers(&self) -> Vec<IpAddr> {
        accepted_peers(&self.listeners[0])
    }

    /// Peer addresses of the connections queued on the world's public IPv6 server.
    pub fn world_peers6(&self) -> Vec<IpAddr> {
        accepted_peers(&self.listeners[2])
    }

    pub fn state_file(&self) -> std::path::PathBuf {
        self.state_dir.path().join("forwarding.json")
    }

    /// Sorted links, addresses and routes of the test host, for leak checks.
    pub fn host_snapshot(&self) -> Vec<String> {
        snapshot(&self.host)
    }

    pub fn host_sysctl(&self, path: &str) -> String {
        let path = path.to_string();
        self.host
            .run(move || {
                std::fs::read_to_string(&path).map(|s| s.trim().to_string()).map_err(|source| TopologyError::Io { action: path, source })
            })
            .expect("read sysctl in test host")
    }
}

pub fn snapshot(ns: &Netns) -> Vec<String> {
    ns.netlink(async |handle| {
        let mut lines: Vec<String> = links(&handle).await?.into_iter().map(|(i, n)| format!("link {i} {n}")).collect();
        let mut addresses = handle.address().get().execute();
        while let Some(a) = addresses.try_next().await.map_err(nl("addr dump"))? {
            lines.push(format!(
                "addr {:?} {:?}",
                a.header,
                a.attributes
                    .iter()
                    .filter(|x| !matches!(x, rtnetlink::packet_route::address::AddressAttribute::CacheInfo(_)))
                    .collect::<Vec<_>>()
            ));
        }
        for query in [RouteMessageBuilder::<Ipv4Addr>::new().build(), RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()] {
            let mut routes = handle.route().get(query).execute();
            while let Some(r) = routes.try_next().await.map_err(nl("route dump"))? {
                lines.push(format!(
                    "route {:?} {:?}",
                    r.header,
                    r.attributes
                        .iter()
                        .filter(|x| !matches!(
                            x,
                            rtnetlink::packet_route::route::RouteAttribute::CacheInfo(_)
                                | rtnetlink::packet_route::route::RouteAttribute::Expires(_)
                        ))
                        .collect::<Vec<_>>()
                ));
            }
        }
        // The kernel's own IPv6 link-local address changes by itself (it is
        // Tentative until duplicate address detection ends, and only then
        // gets its local route): not a trace of the code under test.
        lines.retain(|l| !(l.contains("fe80:") && (l.starts_with("addr ") || l.contains("kind: Local"))));
        lines.sort();
        Ok(lines)
    })
    .expect("snapshot")
}

fn accepted_peers(listener: &TcpListener) -> Vec<IpAddr> {
    listener.set_nonblocking(true).expect("nonblocking");
    let mut peers = Vec::new();
    while let Ok((_, peer)) = listener.accept() {
        peers.push(peer.ip());
    }
    peers
}

/// Adds an address without duplicate address detection (usable at once).
pub async fn add_nodad(handle: &Handle, index: u32, address: IpAddr, len: u8) -> Result<(), TopologyError> {
    let mut request = handle.address().add(index, address, len);
    request.message_mut().header.flags |= rtnetlink::packet_route::address::AddressHeaderFlags::Nodad;
    request.execute().await.map_err(nl("add address"))
}

fn listen(ns: &Netns, address: IpAddr) -> TcpListener {
    ns.run(move || {
        TcpListener::bind(SocketAddr::new(address, PORT))
            .map_err(|source| TopologyError::Io { action: format!("listen on {address}:{PORT}"), source })
    })
    .expect("test listener")
}

/// The outcome of a TCP connect from inside `ns`.
#[derive(Debug, PartialEq, Eq)]
pub enum Reach {
    Connected,
    /// Refused by an `unreachable` route: EHOSTUNREACH (ICMP host
    /// unreachable) or, for IPv6, ENETUNREACH (ICMPv6 "no route").
    Unreachable,
    /// Anything else (text of the error).
    Other(String),
}

pub fn connect_from(ns: &Netns, address: impl Into<IpAddr>) -> Reach {
    connect_to(ns, SocketAddr::new(address.into(), PORT))
}

/// The outcome of a TCP connect from inside `ns` to `target`.
pub fn connect_to(ns: &Netns, target: SocketAddr) -> Reach {
    ns.run(move || {
        // The timeout only bounds a broken setup; assertions are on the error kind.
        Ok(match TcpStream::connect_timeout(&target, Duration::from_secs(5)) {
            Ok(_) => Reach::Connected,
            Err(error)
                if [nix::errno::Errno::EHOSTUNREACH, nix::errno::Errno::ENETUNREACH]
                    .into_iter()
                    .any(|errno| error.raw_os_error() == Some(errno as i32)) =>
            {
                Reach::Unreachable
            }
            Err(error) => Reach::Other(error.to_string()),
        })
    })
    .expect("connect worker")
}

/// The LAN peer's address on the host's uplink segment.
pub const PEER_WAN: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 77);
/// A globally routable address the LAN peer owns (the world routes it to
/// the peer), so replies from a sandbox to it are allowed by the policy.
pub const PEER_PUBLIC: Ipv4Addr = Ipv4Addr::new(11, 77, 0, 1);

/// Runs `ip` with `args` inside `ns` (tests may build their fake network
/// with it); panics on failure.
pub fn ip_in(ns: &Netns, args: &[&str]) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let shown = args.join(" ");
    let output = ns
        .run(move || {
            std::process::Command::new("ip").args(&args).output().map_err(|source| TopologyError::Io { action: "run ip".into(), source })
        })
        .expect("ip worker");
    assert!(output.status.success(), "ip {shown}: {}", String::from_utf8_lossy(&output.stderr));
}

impl FakeInternet {
    /// A "LAN peer": a namespace on the host's uplink segment (a bridge in
    /// the world joins `wan1` and the peer), owning [`PEER_WAN`] and, on its
    /// loopback, [`PEER_PUBLIC`], with a route to `pool` via the host. Call
    /// it before any traffic, as it moves the world's address to the bridge.
    pub fn add_lan_peer(&self, pool: &str) -> Netns {
        let peer = Netns::create().expect("create LAN peer netns");
        let peer_fd = std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(&peer));
        let world_wan = format!("{WORLD_WAN}/24");
        ip_in(&self.world, &["addr", "del", &world_wan, "dev", "wan1"]);
        ip_in(&self.world, &["link", "add", "br0", "type", "bridge"]);
        ip_in(&self.world, &["link", "set", "wan1", "master", "br0"]);
        ip_in(&self.world, &["addr", "add", &world_wan, "dev", "br0"]);
        ip_in(&self.world, &["link", "set", "br0", "up"]);
        self.world
            .netlink(async move |handle| {
                handle.link().add(LinkVeth::new("lanb", "lanp").build()).execute().await.map_err(nl("peer veth"))?;
                let index = link_index_sync(&links(&handle).await?, "lanp");
                handle.link().set(LinkUnspec::new_with_index(index).setns_by_fd(peer_fd).build()).execute().await.map_err(nl("move"))
            })
            .expect("LAN peer veth");
        ip_in(&self.world, &["link", "set", "lanb", "master", "br0", "up"]);
        ip_in(&self.world, &["route", "add", &format!("{PEER_PUBLIC}/32"), "via", &PEER_WAN.to_string()]);
        // The world routes between the host and the peer's public address.
        self.world
            .run(|| {
                std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
                    .map_err(|source| TopologyError::Io { action: "world ip_forward".into(), source })
            })
            .expect("world forwarding");
        ip_in(&peer, &["link", "set", "lo", "up"]);
        ip_in(&peer, &["addr", "add", &format!("{PEER_PUBLIC}/32"), "dev", "lo"]);
        ip_in(&peer, &["addr", "add", &format!("{PEER_WAN}/24"), "dev", "lanp"]);
        ip_in(&peer, &["link", "set", "lanp", "up"]);
        ip_in(&peer, &["route", "add", pool, "via", &HOST_WAN.to_string()]);
        ip_in(&peer, &["route", "add", "default", "via", &WORLD_WAN.to_string()]);
        peer
    }
}

/// A TCP connect from `source` (an address of the calling thread's
/// namespace) to `target`, given `millis`: "connected", "timed out" or the error.
pub fn tcp_from(source: IpAddr, target: SocketAddr, millis: u16) -> String {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrStorage, bind, connect, getsockopt, socket, sockopt};
    use std::os::fd::{AsFd, AsRawFd};
    let family = if source.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let socket = socket(family, SockType::Stream, SockFlag::SOCK_NONBLOCK, None).expect("socket");
    bind(socket.as_raw_fd(), &SockaddrStorage::from(SocketAddr::new(source, 0))).expect("bind");
    match connect(socket.as_raw_fd(), &SockaddrStorage::from(target)) {
        Ok(()) => return "connected".into(),
        Err(nix::errno::Errno::EINPROGRESS) => {}
        Err(errno) => return errno.desc().to_string(),
    }
    let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLOUT)];
    match poll(&mut fds, PollTimeout::from(millis)).expect("poll") {
        0 => "timed out".into(),
        _ => match getsockopt(&socket, sockopt::SocketError).expect("SO_ERROR") {
            0 => "connected".into(),
            errno => nix::errno::Errno::from_raw(errno).desc().to_string(),
        },
    }
}

/// Runs `nft` with `args` inside `ns` (only to inspect or tamper with a
/// test's own namespaces); returns its standard output, panics on failure.
pub fn nft_in(ns: &Netns, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let shown = args.join(" ");
    let output = ns
        .run(move || {
            std::process::Command::new("nft").args(&args).output().map_err(|source| TopologyError::Io { action: "run nft".into(), source })
        })
        .expect("nft worker");
    assert!(output.status.success(), "nft {shown}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).to_string()
}
