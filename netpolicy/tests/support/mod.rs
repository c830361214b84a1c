//! A fake host + fake internet, entirely inside network namespaces the test
//! creates. Nothing touches the machine's real network namespace.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
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

/// Fails loudly (never skips) when the tests cannot run.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the topology tests need root (network namespaces, veths); run them as root: cargo test -p lazaret-netpolicy --test topology"
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
    pub fn new() -> FakeInternet {
        require_root();
        let host = Netns::create().expect("create test host netns");
        let world = Netns::create().expect("create world netns");
        let world_fd = std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(&world));
        host.netlink(async move |handle| {
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
                // No route back to the Lazaret pool: replies only work through the host's SNAT.
                Ok(())
            })
            .expect("build world");
        let listeners = vec![
            listen(&world, Ipv4Addr::UNSPECIFIED),
            // A service on the host itself, on every host address.
            listen(&host, Ipv4Addr::UNSPECIFIED),
        ];
        FakeInternet { host, world, listeners, state_dir: tempfile::tempdir().expect("tempdir") }
    }

    /// Peer addresses of the connections queued on the world's server.
    pub fn world_peers(&self) -> Vec<IpAddr> {
        let listener = &self.listeners[0];
        listener.set_nonblocking(true).expect("nonblocking");
        let mut peers = Vec::new();
        while let Ok((_, peer)) = listener.accept() {
            peers.push(peer.ip());
        }
        peers
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

fn listen(ns: &Netns, address: Ipv4Addr) -> TcpListener {
    ns.run(move || {
        TcpListener::bind(SocketAddr::new(IpAddr::V4(address), PORT))
            .map_err(|source| TopologyError::Io { action: format!("listen on {address}:{PORT}"), source })
    })
    .expect("test listener")
}

/// The outcome of a TCP connect from inside `ns`.
#[derive(Debug, PartialEq, Eq)]
pub enum Reach {
    Connected,
    /// Refused by an `unreachable` route (ICMP host unreachable / EHOSTUNREACH).
    HostUnreachable,
    /// Anything else (text of the error).
    Other(String),
}

pub fn connect_from(ns: &Netns, address: Ipv4Addr) -> Reach {
    ns.run(move || {
        // The timeout only bounds a broken setup; assertions are on the error kind.
        let target = SocketAddr::new(IpAddr::V4(address), PORT);
        Ok(match TcpStream::connect_timeout(&target, Duration::from_secs(5)) {
            Ok(_) => Reach::Connected,
            Err(error) if error.raw_os_error() == Some(nix::errno::Errno::EHOSTUNREACH as i32) => Reach::HostUnreachable,
            Err(error) => Reach::Other(error.to_string()),
        })
    })
    .expect("connect worker")
}
