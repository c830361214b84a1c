//! A readable dump of one network namespace, for `lazaret debug`: what
//! `ip -d address show`, `ip route show table all` and `ip rule show` would
//! print, for IPv4 and IPv6, read over rtnetlink (no `ip` command).
//!
//! The text is for people; its format is not an interface. Lines look like
//! iproute2's, with a few deliberate differences that make a dump easier to
//! compare: every route names its table (`table main` too), and routes are
//! grouped by table.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures_util::TryStreamExt;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressMessage, AddressScope};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use rtnetlink::packet_route::route::{RouteAttribute, RouteFlags, RouteMessage, RouteProtocol, RouteScope, RouteType};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::packet_route::{AddressFamily, IpProtocol};
use rtnetlink::{Handle, RouteMessageBuilder};

use super::{LOCAL_TABLE, MAIN_TABLE, NetView, Netns, SidecarRule, TopologyError, dump_rules, netlink_error, route_address};

/// The `default` table (253), looked up by the kernel's last rule.
const DEFAULT_TABLE: u32 = 253;

/// Renders every link (flags, state, kind, addresses of both families),
/// every route of every table and every policy rule of both families in the
/// network namespace `ns`, as text lines like `ip -d address show`, `ip
/// route show table all` and `ip rule show` print them.
///
/// Runs on a dedicated thread that enters `ns` ([`Netns::netlink`]); the
/// caller's namespace is not changed. Reading needs no privilege beyond
/// being able to enter the namespace (root, or CAP_SYS_ADMIN over it).
///
/// For a sidecar, for example (abridged):
///
/// ```text
/// links:
///   2: lzs0@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 state UP
///       link/ether 1e:ba:fd:4a:1b:90 veth link-netnsid 0
///       inet 100.96.0.1/31 scope global
/// IPv4 routes (all tables):
///   throw default table 200 proto static
///   unreachable 100.96.0.1 table 200 proto static
///   default via 100.96.0.3 dev lzup0 table main proto static onlink
///   unreachable 10.0.0.0/8 table main proto static
///   local 100.96.0.1 dev lzs0 table local proto kernel scope host src 100.96.0.1
/// IPv6 routes (all tables):
///   unreachable default dev lo table main proto static metric 1024
/// IPv4 rules:
///   500: from all iif lzs0 ipproto tcp lookup 200
///   1000: from all lookup local
///   32766: from all lookup main proto kernel
/// IPv6 rules:
///   0: from all lookup local proto kernel
/// ```
pub fn debug_view(ns: &Netns) -> Result<String, TopologyError> {
    ns.netlink(async |handle| render(&handle).await)
}

async fn render(handle: &Handle) -> Result<String, TopologyError> {
    let links: Vec<LinkMessage> = handle.link().get().execute().try_collect().await.map_err(netlink_error("list links"))?;
    let addresses: Vec<AddressMessage> = handle.address().get().execute().try_collect().await.map_err(netlink_error("list addresses"))?;
    let names = NetView { links: links.iter().filter_map(|l| Some((l.header.index, link_name(l)?))).collect(), ..NetView::default() };
    let mut out = String::from("links:\n");
    for link in &links {
        out.push_str(&format!("  {}\n", render_link(link, &names)));
        for address in addresses.iter().filter(|a| a.header.index == link.header.index) {
            if let Some(line) = render_address(address) {
                out.push_str(&format!("      {line}\n"));
            }
        }
    }
    for v4 in [true, false] {
        let family = if v4 { "IPv4" } else { "IPv6" };
        let query = if v4 { RouteMessageBuilder::<Ipv4Addr>::new().build() } else { RouteMessageBuilder::<Ipv6Addr>::new().build() };
        let mut routes: Vec<RouteMessage> =
            handle.route().get(query).execute().try_collect().await.map_err(netlink_error(format!("list {family} routes")))?;
        routes.retain(|r| r.header.address_family == if v4 { AddressFamily::Inet } else { AddressFamily::Inet6 });
        // Grouped by table, in the kernel's order within each.
        routes.sort_by_key(route_table);
        out.push_str(&format!("{family} routes (all tables):\n"));
        for route in &routes {
            out.push_str(&format!("  {}\n", render_route(route, &names)));
        }
    }
    for v4 in [true, false] {
        out.push_str(&format!("{} rules:\n", if v4 { "IPv4" } else { "IPv6" }));
        for rule in dump_rules(handle, v4).await? {
            out.push_str(&format!("  {}\n", render_rule(&rule)));
        }
    }
    Ok(out)
}

fn link_name(link: &LinkMessage) -> Option<String> {
    link.attributes.iter().find_map(|a| if let LinkAttribute::IfName(n) = a { Some(n.clone()) } else { None })
}

/// The flags `ip link` shows, in its order.
const LINK_FLAGS: [(LinkFlags, &str); 17] = [
    (LinkFlags::Loopback, "LOOPBACK"),
    (LinkFlags::Broadcast, "BROADCAST"),
    (LinkFlags::Pointopoint, "POINTOPOINT"),
    (LinkFlags::Multicast, "MULTICAST"),
    (LinkFlags::Noarp, "NOARP"),
    (LinkFlags::Allmulti, "ALLMULTI"),
    (LinkFlags::Promisc, "PROMISC"),
    (LinkFlags::Controller, "MASTER"),
    (LinkFlags::Port, "SLAVE"),
    (LinkFlags::Debug, "DEBUG"),
    (LinkFlags::Dynamic, "DYNAMIC"),
    (LinkFlags::Automedia, "AUTOMEDIA"),
    (LinkFlags::Portsel, "PORTSEL"),
    (LinkFlags::Notrailers, "NOTRAILERS"),
    (LinkFlags::Up, "UP"),
    (LinkFlags::LowerUp, "LOWER_UP"),
    (LinkFlags::Dormant, "DORMANT"),
];

/// `INDEX: NAME[@PEER]: <FLAGS> mtu N state STATE [master M]`, then on the
/// next line the link layer address, the kind and its peer namespace.
fn render_link(link: &LinkMessage, names: &NetView) -> String {
    let flags = link.header.flags;
    let mut shown: Vec<&str> = Vec::new();
    if flags.contains(LinkFlags::Up) && !flags.contains(LinkFlags::LowerUp) {
        shown.push("NO-CARRIER");
    }
    shown.extend(LINK_FLAGS.iter().filter(|(flag, _)| flags.contains(*flag)).map(|(_, name)| *name));
    let netns_id = link.attributes.iter().find_map(|a| if let LinkAttribute::LinkNetNsId(id) = a { Some(*id) } else { None });
    let mut line = format!("{}: {}", link.header.index, link_name(link).unwrap_or_else(|| "?".into()));
    for attribute in &link.attributes {
        if let LinkAttribute::Link(peer) = attribute {
            // A peer in another namespace is only known by its index there.
            let _ = if netns_id.is_some() { write!(line, "@if{peer}") } else { write!(line, "@{}", names.link_name(*peer)) };
        }
    }
    let _ = write!(line, ": <{}>", shown.join(","));
    for attribute in &link.attributes {
        match attribute {
            LinkAttribute::Mtu(mtu) => {
                let _ = write!(line, " mtu {mtu}");
            }
            LinkAttribute::Controller(index) => {
                let _ = write!(line, " master {}", names.link_name(*index));
            }
            _ => {}
        }
    }
    for attribute in &link.attributes {
        if let LinkAttribute::OperState(state) = attribute {
            let _ = write!(line, " state {state}");
        }
    }
    let _ = write!(line, "\n      link/{}", link.header.link_layer_type.to_string().to_lowercase());
    for attribute in &link.attributes {
        if let LinkAttribute::Address(mac) = attribute {
            let _ = write!(line, " {}", mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"));
        }
    }
    for attribute in &link.attributes {
        if let LinkAttribute::LinkInfo(infos) = attribute {
            for info in infos {
                if let LinkInfo::Kind(kind) = info {
                    let _ = write!(line, " {kind}");
                }
            }
        }
    }
    if let Some(id) = netns_id {
        let _ = write!(line, " link-netnsid {id}");
    }
    line
}

/// `inet[6] ADDRESS/LEN [peer PEER/LEN] scope SCOPE [FLAGS]`.
fn render_address(address: &AddressMessage) -> Option<String> {
    let family = match address.header.family {
        AddressFamily::Inet => "inet",
        AddressFamily::Inet6 => "inet6",
        _ => return None,
    };
    let local = address.attributes.iter().find_map(|a| if let AddressAttribute::Local(ip) = a { Some(*ip) } else { None });
    let peer = address.attributes.iter().find_map(|a| if let AddressAttribute::Address(ip) = a { Some(*ip) } else { None });
    let len = address.header.prefix_len;
    let mut line = match (local, peer) {
        (Some(local), Some(peer)) if local != peer => format!("{family} {local} peer {peer}/{len}"),
        (Some(ip), _) | (None, Some(ip)) => format!("{family} {ip}/{len}"),
        (None, None) => return None,
    };
    let scope = match address.header.scope {
        AddressScope::Universe => "global".to_string(),
        other => other.to_string(),
    };
    let _ = write!(line, " scope {scope}");
    // The 32-bit flags attribute supersedes the header's 8 bits when present.
    let flags = address
        .attributes
        .iter()
        .find_map(|a| if let AddressAttribute::Flags(f) = a { Some(*f) } else { None })
        .unwrap_or_else(|| AddressFlags::from_bits_retain(u32::from(address.header.flags.bits())));
    for (flag, name) in [
        (AddressFlags::Secondary, "secondary"),
        (AddressFlags::Tentative, "tentative"),
        (AddressFlags::Dadfailed, "dadfailed"),
        (AddressFlags::Deprecated, "deprecated"),
        (AddressFlags::Nodad, "nodad"),
        (AddressFlags::Optimistic, "optimistic"),
        (AddressFlags::Noprefixroute, "noprefixroute"),
    ] {
        if flags.contains(flag) {
            let _ = write!(line, " {name}");
        }
    }
    Some(line)
}

fn route_table(route: &RouteMessage) -> u32 {
    route
        .attributes
        .iter()
        .find_map(|a| if let RouteAttribute::Table(t) = a { Some(*t) } else { None })
        .unwrap_or(u32::from(route.header.table))
}

fn table_name(table: u32) -> String {
    match table {
        LOCAL_TABLE => "local".into(),
        MAIN_TABLE => "main".into(),
        DEFAULT_TABLE => "default".into(),
        other => other.to_string(),
    }
}

/// A destination or source as `ip` shows it: `default` for a zero-length
/// prefix (destinations only), the bare address for a host, else `NET/LEN`.
fn show_prefix(address: Option<IpAddr>, len: u8, v4: bool) -> String {
    let address = address.unwrap_or(if v4 { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) });
    let full = if address.is_ipv4() { 32 } else { 128 };
    if len == full { address.to_string() } else { format!("{address}/{len}") }
}

fn route_kind(kind: RouteType) -> Option<String> {
    Some(match kind {
        RouteType::Unicast => return None,
        RouteType::Local => "local".into(),
        RouteType::Broadcast => "broadcast".into(),
        RouteType::Anycast => "anycast".into(),
        RouteType::Multicast => "multicast".into(),
        RouteType::BlackHole => "blackhole".into(),
        RouteType::Unreachable => "unreachable".into(),
        RouteType::Prohibit => "prohibit".into(),
        RouteType::Throw => "throw".into(),
        RouteType::Nat => "nat".into(),
        RouteType::ExternalResolve => "xresolve".into(),
        other => format!("type {}", u8::from(other)),
    })
}

fn protocol_name(protocol: RouteProtocol) -> String {
    match protocol {
        RouteProtocol::Dhcp => "dhcp".into(),
        other => other.to_string(),
    }
}

/// `[TYPE] DEST [from SRC] [via GW] [dev DEV] table T [proto P] [scope S]
/// [src PREFSRC] [metric N] [onlink] [linkdown]`, then one `nexthop` per
/// path of a multipath route.
fn render_route(route: &RouteMessage, names: &NetView) -> String {
    let header = &route.header;
    let v4 = header.address_family == AddressFamily::Inet;
    let attribute = |pick: fn(&RouteAttribute) -> Option<IpAddr>| route.attributes.iter().find_map(pick);
    let destination = attribute(|a| if let RouteAttribute::Destination(d) = a { route_address(d) } else { None });
    let mut line = String::new();
    if let Some(kind) = route_kind(header.kind) {
        let _ = write!(line, "{kind} ");
    }
    if header.destination_prefix_length == 0 {
        line.push_str("default");
    } else {
        line.push_str(&show_prefix(destination, header.destination_prefix_length, v4));
    }
    if header.source_prefix_length > 0 {
        let source = attribute(|a| if let RouteAttribute::Source(s) = a { route_address(s) } else { None });
        let _ = write!(line, " from {}", show_prefix(source, header.source_prefix_length, v4));
    }
    if let Some(gateway) = attribute(|a| if let RouteAttribute::Gateway(g) = a { route_address(g) } else { None }) {
        let _ = write!(line, " via {gateway}");
    }
    for a in &route.attributes {
        if let RouteAttribute::Oif(index) = a {
            let _ = write!(line, " dev {}", names.link_name(*index));
        }
    }
    let _ = write!(line, " table {}", table_name(route_table(route)));
    let _ = write!(line, " proto {}", protocol_name(header.protocol));
    if header.scope != RouteScope::Universe {
        let scope = match header.scope {
            RouteScope::NoWhere => "nowhere".to_string(),
            other => other.to_string(),
        };
        let _ = write!(line, " scope {scope}");
    }
    if let Some(source) = attribute(|a| if let RouteAttribute::PrefSource(s) = a { route_address(s) } else { None }) {
        let _ = write!(line, " src {source}");
    }
    for a in &route.attributes {
        if let RouteAttribute::Priority(metric) = a {
            let _ = write!(line, " metric {metric}");
        }
    }
    for (flag, name) in [(RouteFlags::Onlink, "onlink"), (RouteFlags::Linkdown, "linkdown"), (RouteFlags::Dead, "dead")] {
        if header.flags.contains(flag) {
            let _ = write!(line, " {name}");
        }
    }
    for a in &route.attributes {
        if let RouteAttribute::MultiPath(hops) = a {
            for hop in hops {
                line.push_str("\n      nexthop");
                for h in &hop.attributes {
                    if let RouteAttribute::Gateway(g) = h {
                        if let Some(gateway) = route_address(g) {
                            let _ = write!(line, " via {gateway}");
                        }
                    }
                }
                let _ = write!(line, " dev {} weight {}", names.link_name(hop.interface_index), u32::from(hop.hops) + 1);
            }
        }
    }
    line
}

fn protocol_selector(protocol: IpProtocol) -> String {
    match protocol {
        IpProtocol::Other(number) => number.to_string(),
        named => format!("{named:?}").to_lowercase(),
    }
}

/// `PRIO: [not] from SRC [to DST] [tos T] [fwmark M/MASK] [iif I] [oif O]
/// [ipproto P] [sport A-B] [dport A-B] [uidrange A-B] [suppress_prefixlength
/// N] ACTION [proto P]`, where ACTION is `lookup TABLE`, `goto PRIO`,
/// `blackhole`, `unreachable`, `prohibit` or `nop`.
fn render_rule(message: &RuleMessage) -> String {
    // The selectors Lazaret itself installs are parsed as for verification.
    let rule = SidecarRule::parse(message);
    let header = &message.header;
    let v4 = header.family == AddressFamily::Inet;
    let mut line = format!("{}:", rule.priority);
    if rule.inverted {
        line.push_str(" not");
    }
    match rule.source {
        Some(source) if source.prefix_len() > 0 => {
            let _ = write!(line, " from {}", show_prefix(Some(source.network()), source.prefix_len(), v4));
        }
        _ => line.push_str(" from all"),
    }
    if let Some(destination) = rule.destination {
        let _ = write!(line, " to {}", show_prefix(Some(destination.network()), destination.prefix_len(), v4));
    }
    if header.tos != 0 {
        let _ = write!(line, " tos {:#04x}", header.tos);
    }
    let mark = message.attributes.iter().find_map(|a| if let RuleAttribute::FwMark(m) = a { Some(*m) } else { None });
    let mask = message.attributes.iter().find_map(|a| if let RuleAttribute::FwMask(m) = a { Some(*m) } else { None });
    match (mark, mask) {
        (Some(mark), Some(mask)) if mask != u32::MAX => {
            let _ = write!(line, " fwmark {mark:#x}/{mask:#x}");
        }
        (Some(mark), _) if mark != 0 || mask.is_some_and(|m| m != 0) => {
            let _ = write!(line, " fwmark {mark:#x}");
        }
        _ => {}
    }
    if let Some(iif) = &rule.iif {
        let _ = write!(line, " iif {iif}");
    }
    for attribute in &message.attributes {
        match attribute {
            RuleAttribute::Oifname(oif) => {
                let _ = write!(line, " oif {oif}");
            }
            RuleAttribute::L3MDev(true) => line.push_str(" l3mdev"),
            _ => {}
        }
    }
    if let Some(protocol) = rule.protocol {
        let _ = write!(line, " ipproto {}", protocol_selector(protocol));
    }
    for attribute in &message.attributes {
        match attribute {
            RuleAttribute::SourcePortRange(range) => {
                let _ = write!(line, " sport {}-{}", range.start, range.end);
            }
            RuleAttribute::DestinationPortRange(range) => {
                let _ = write!(line, " dport {}-{}", range.start, range.end);
            }
            RuleAttribute::UidRange(range) => {
                let _ = write!(line, " uidrange {}-{}", range.start, range.end);
            }
            RuleAttribute::SuppressPrefixLen(len) if *len != u32::MAX => {
                let _ = write!(line, " suppress_prefixlength {len}");
            }
            RuleAttribute::SuppressIfGroup(group) if *group != u32::MAX => {
                let _ = write!(line, " suppress_ifgroup {group}");
            }
            _ => {}
        }
    }
    match (rule.action, rule.goto) {
        (RuleAction::ToTable, _) => {
            let _ = write!(line, " lookup {}", table_name(rule.table));
        }
        (RuleAction::Goto, Some(target)) => {
            let _ = write!(line, " goto {target}");
        }
        (RuleAction::Goto, None) => line.push_str(" goto"),
        (RuleAction::Nop, _) => line.push_str(" nop"),
        (RuleAction::Blackhole, _) => line.push_str(" blackhole"),
        (RuleAction::Unreachable, _) => line.push_str(" unreachable"),
        (RuleAction::Prohibit, _) => line.push_str(" prohibit"),
        (other, _) => {
            let _ = write!(line, " action {}", u8::from(other));
        }
    }
    for attribute in &message.attributes {
        if let RuleAttribute::Protocol(protocol) = attribute {
            if *protocol != RouteProtocol::Unspec {
                let _ = write!(line, " proto {}", protocol_name(*protocol));
            }
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_route::route::RouteAddress;
    use rtnetlink::packet_route::rule::RulePortRange;

    fn names() -> NetView {
        NetView { links: vec![(1, "lo".into()), (2, "eth0".into())], ..NetView::default() }
    }

    fn route(v4: bool, kind: RouteType, table: u32, attributes: Vec<RouteAttribute>, len: u8) -> RouteMessage {
        let mut message = if v4 { RouteMessageBuilder::<Ipv4Addr>::new().build() } else { RouteMessageBuilder::<Ipv6Addr>::new().build() };
        message.header.kind = kind;
        message.header.destination_prefix_length = len;
        message.header.table = u8::try_from(table).unwrap_or(0);
        message.attributes = attributes;
        message.attributes.push(RouteAttribute::Table(table));
        message
    }

    #[test]
    fn routes_read_like_ip_route_show_table_all() {
        let unreachable = route(
            true,
            RouteType::Unreachable,
            MAIN_TABLE,
            vec![RouteAttribute::Destination(RouteAddress::Inet(Ipv4Addr::new(10, 0, 0, 0))), RouteAttribute::Priority(1024)],
            8,
        );
        assert_eq!(render_route(&unreachable, &names()), "unreachable 10.0.0.0/8 table main proto static metric 1024");
        let mut default = route(
            true,
            RouteType::Unicast,
            MAIN_TABLE,
            vec![RouteAttribute::Gateway(RouteAddress::Inet(Ipv4Addr::new(100, 96, 0, 1))), RouteAttribute::Oif(2)],
            0,
        );
        default.header.flags |= RouteFlags::Onlink;
        assert_eq!(render_route(&default, &names()), "default via 100.96.0.1 dev eth0 table main proto static onlink");
        let blackhole = route(
            false,
            RouteType::BlackHole,
            200,
            vec![RouteAttribute::Destination(RouteAddress::Inet6("2001:db8::1".parse().expect("valid test input")))],
            128,
        );
        assert_eq!(render_route(&blackhole, &names()), "blackhole 2001:db8::1 table 200 proto static");
        let mut local = route(
            true,
            RouteType::Local,
            LOCAL_TABLE,
            vec![
                RouteAttribute::Destination(RouteAddress::Inet(Ipv4Addr::LOCALHOST)),
                RouteAttribute::Oif(1),
                RouteAttribute::PrefSource(RouteAddress::Inet(Ipv4Addr::LOCALHOST)),
            ],
            32,
        );
        local.header.protocol = RouteProtocol::Kernel;
        local.header.scope = RouteScope::Host;
        assert_eq!(render_route(&local, &names()), "local 127.0.0.1 dev lo table local proto kernel scope host src 127.0.0.1");
        // An interface that is gone is shown by its index.
        let gone = route(true, RouteType::Unicast, 7, vec![RouteAttribute::Oif(9)], 0);
        assert_eq!(render_route(&gone, &names()), "default dev #9 table 7 proto static");
    }

    #[test]
    fn rules_read_like_ip_rule_show() {
        let mut lookup = RuleMessage::default();
        lookup.header.family = AddressFamily::Inet;
        lookup.header.action = RuleAction::ToTable;
        lookup.header.src_len = 24;
        lookup.attributes = vec![
            RuleAttribute::Priority(1234),
            RuleAttribute::Source(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 0))),
            RuleAttribute::Table(100),
            RuleAttribute::Iifname("lzs0".into()),
            RuleAttribute::IpProtocol(IpProtocol::Tcp),
            RuleAttribute::DestinationPortRange(RulePortRange { start: 53, end: 53 }),
            RuleAttribute::SuppressPrefixLen(u32::MAX),
            RuleAttribute::Protocol(RouteProtocol::Unspec),
        ];
        assert_eq!(render_rule(&lookup), "1234: from 198.51.100.0/24 iif lzs0 ipproto tcp dport 53-53 lookup 100");
        let mut kernel = RuleMessage::default();
        kernel.header.family = AddressFamily::Inet6;
        kernel.header.action = RuleAction::ToTable;
        kernel.header.table = 254;
        kernel.attributes = vec![RuleAttribute::Priority(32766), RuleAttribute::Table(254), RuleAttribute::Protocol(RouteProtocol::Kernel)];
        assert_eq!(render_rule(&kernel), "32766: from all lookup main proto kernel");
        let mut guard = RuleMessage::default();
        guard.header.family = AddressFamily::Inet6;
        guard.header.action = RuleAction::Unreachable;
        guard.header.dst_len = 10;
        guard.attributes = vec![
            RuleAttribute::Priority(450),
            RuleAttribute::Destination(IpAddr::V6("fe80::".parse().expect("valid test input"))),
            RuleAttribute::FwMark(0x10),
            RuleAttribute::FwMask(0xff),
        ];
        assert_eq!(render_rule(&guard), "450: from all to fe80::/10 fwmark 0x10/0xff unreachable");
        let mut goto = RuleMessage::default();
        goto.header.family = AddressFamily::Inet6;
        goto.header.action = RuleAction::Goto;
        goto.header.flags |= rtnetlink::packet_route::rule::RuleFlags::Invert;
        goto.attributes = vec![RuleAttribute::Priority(401), RuleAttribute::Goto(450), RuleAttribute::Oifname("eth0".into())];
        assert_eq!(render_rule(&goto), "401: not from all oif eth0 goto 450");
    }
}
