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
/// Servers in the fake internet (on its loopback).
pub const PUBLIC: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
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
/// The host's IPv6 address on its "WAN" link (with [`FakeInternet::with_ipv6`]).
pub const HOST_WAN6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2);
/// The fake internet's IPv6 router address.
pub const WORLD_WAN6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
/// A public IPv6 server.
pub const PUBLIC6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 1);
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

fn world_addresses() -> [Ipv4Addr; 6] {
    [PUBLIC, PRIVATE_10, PRIVATE_172, METADATA, ALLOWED_PRIVATE, RESOLVER]
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
            std::fs::write("/proc/sys/net/ipv4/conf/wan0/forwarding", "0").map_err(|source| TopologyError::Io { action: "wan0 forwarding".into(), source })?;
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
            .run(move || std::fs::read_to_string(&path).map(|s| s.trim().to_string()).map_err(|source| TopologyError::Io { action: path, source }))
            .expect("read sysctl in test host")
    }
}

pub fn snapshot(ns: &Netns) -> Vec<String> {
    ns.netlink(async |handle| {
        let mut lines: Vec<String> = links(&handle).await?.into_iter().map(|(i, n)| format!("link {i} {n}")).collect();
        let mut addresses = handle.address().get().execute();
        while let Some(a) = addresses.try_next().await.map_err(nl("addr dump"))? {
            lines.push(format!("addr {:?} {:?}", a.header, a.attributes.iter().filter(|x| !matches!(x, rtnetlink::packet_route::address::AddressAttribute::CacheInfo(_))).collect::<Vec<_>>()));
        }
        for query in [RouteMessageBuilder::<Ipv4Addr>::new().build(), RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()] {
            let mut routes = handle.route().get(query).execute();
            while let Some(r) = routes.try_next().await.map_err(nl("route dump"))? {
                lines.push(format!("route {:?} {:?}", r.header, r.attributes.iter().filter(|x| !matches!(x, rtnetlink::packet_route::route::RouteAttribute::CacheInfo(_) | rtnetlink::packet_route::route::RouteAttribute::Expires(_))).collect::<Vec<_>>()));
            }
        }
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
    let address = address.into();
    ns.run(move || {
        // The timeout only bounds a broken setup; assertions are on the error kind.
        let target = SocketAddr::new(address, PORT);
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
