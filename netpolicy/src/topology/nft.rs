//! Lazaret's nftables tables as data: one description of each table
//! ([`TableSpec`]) is what gets installed (netlink messages of `nftcodec`)
//! and what a dump of the kernel's chains and rules is compared with.
//!
//! The comparison is on the netlink form: the rules Lazaret would send are
//! serialized by `nftcodec`, the kernel's are dumped, and both are reduced to
//! their expressions (name and attributes, attribute order and nesting
//! flags ignored). Only `accept`-policy base chains are used, and a chain
//! of one Lazaret table can only drop or reject: another table's verdicts
//! (the host's own firewall) still apply on top.
//!
//! Two tables:
//! * in the sidecar, `inet lazaret-filter` ([`sidecar_filter`]): traffic
//!   from the sandbox to a resolver that only its DNS route opens gets UDP
//!   and TCP port 53 and nothing else (routes cannot match ports);
//! * on the host, the Domain's `inet lazaret-<ID>` ([`host_table`]): the
//!   source NAT and a forward guard, so that the host forwards into the
//!   Domain only replies, and out of it only the sandbox's own addresses.
//!
//! (and `lazaret-locked` in locked mode, [`locked_table`]). A sidecar
//! table counts what it refuses: its rejecting rules `goto refuse`, a chain
//! that, with the counting sets and `lazaret-filter`'s `refused-routes`, is
//! described by `refused` and read back here with the rest.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::nftcodec::{
    self as codec, BaseChain, Batch, Expr, Message, NFPROTO_INET, NFPROTO_IPV4, NFPROTO_IPV6, NFT_CMP_EQ, NFT_CMP_NEQ, NFT_CT_STATE,
    NFT_META_IIFNAME, NFT_META_L4PROTO, NFT_META_NFPROTO, NFT_META_OIFNAME, NFT_MSG_DELCHAIN, NFT_MSG_DELTABLE, NFT_MSG_GETCHAIN,
    NFT_MSG_GETRULE, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE, NFT_MSG_NEWTABLE, NFT_PAYLOAD_NETWORK_HEADER, NFT_PAYLOAD_TRANSPORT_HEADER,
    NFT_REG_1, NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, Transaction, Verdict, attributes, be32_value, find, parse_messages, string,
};
use super::nftset::{self, SetSpec};
use super::refused::{self, Counting, REFUSED_SET_SIZE, REFUSED_TIMEOUT, refused_set_name};
use super::{SIDECAR_INNER_LINK, SidecarId, TopologyError};
use crate::prefix::Prefix;

/// Host table names start with this; the Sidecar ID follows.
pub const NAT_TABLE_PREFIX: &str = "lazaret-";

/// The name of a Domain's host (NAT) table.
pub fn table_name(id: SidecarId) -> String {
    format!("{NAT_TABLE_PREFIX}{id}")
}

/// How [`TableSpec::batch`] treats what is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replacing {
    Nothing,
    /// Delete the whole table first.
    Table,
    /// Delete each of the spec's base chains first (and with them their rules).
    Chains,
}

/// The sidecar's filter table (family inet).
pub const SIDECAR_FILTER_TABLE: &str = "lazaret-filter";
/// Standard `srcnat` and `filter` priorities.
const SRCNAT_PRIORITY: i32 = 100;
const FILTER_PRIORITY: i32 = 0;
/// `ct state` bits (host byte order).
const CT_ESTABLISHED: u32 = 2;
const CT_RELATED: u32 = 4;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const DNS_PORT: u16 = 53;
const IFNAMSIZ: usize = 16;

/// One match of a rule, in nft's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Match {
    /// `iifname "NAME"`.
    IifName(String),
    /// `oifname "NAME"`.
    OifName(String),
    /// `meta nfproto ipv4|ipv6` (true for IPv4); needed before any address match in an inet table.
    Family(bool),
    /// `ip|ip6 daddr ADDRESS`.
    Daddr(IpAddr),
    /// `ip|ip6 saddr ADDRESS`.
    Saddr(IpAddr),
    /// `ip|ip6 saddr != ADDRESS`.
    SaddrNot(IpAddr),
    /// `meta l4proto tcp|udp th dport PORT`.
    Dport(u8, u16),
    /// `ct state != established ct state != related`: a packet that starts
    /// something (new, invalid, untracked).
    NotEstablishedOrRelated,
    /// `ct state established,related`: a packet of a flow already let through.
    EstablishedOrRelated,
    /// `ip|ip6 daddr @SET` (true for IPv4).
    DaddrInSet(bool, String),
    /// `ip|ip6 daddr PREFIX`.
    DaddrInPrefix(Prefix),
}

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Accept,
    Drop,
    /// `goto refuse`: count the destination, then `reject with icmpx
    /// host-unreachable` (fails at once, like an unreachable route; see `refused`).
    Refuse,
    Masquerade,
}

/// One rule: its matches in order and its action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuleSpec {
    pub matches: Vec<Match>,
    pub action: Action,
}

/// What kind of base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChainKind {
    /// `type nat hook postrouting priority srcnat`.
    SourceNat,
    /// `type filter hook forward priority filter`.
    Forward,
}

/// One base chain (policy accept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChainSpec {
    pub name: &'static str,
    pub kind: ChainKind,
    pub rules: Vec<RuleSpec>,
}

/// One `inet` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableSpec {
    pub name: String,
    /// Sets, created before the chains (their rules look them up).
    pub sets: Vec<SetSpec>,
    pub chains: Vec<ChainSpec>,
    /// The comment on every rule.
    pub comment: String,
    /// What the table counts of what it refuses (its `refuse` chain and
    /// counting sets, see `refused`).
    pub counting: Counting,
}

fn family_word(address: &IpAddr) -> &'static str {
    if address.is_ipv4() { "ip" } else { "ip6" }
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Match::IifName(name) => write!(f, "iifname \"{name}\""),
            Match::OifName(name) => write!(f, "oifname \"{name}\""),
            Match::Family(v4) => write!(f, "meta nfproto {}", if *v4 { "ipv4" } else { "ipv6" }),
            Match::Daddr(address) => write!(f, "{} daddr {address}", family_word(address)),
            Match::Saddr(address) => write!(f, "{} saddr {address}", family_word(address)),
            Match::SaddrNot(address) => write!(f, "{} saddr != {address}", family_word(address)),
            Match::Dport(protocol, port) => {
                write!(f, "meta l4proto {} th dport {port}", if *protocol == IPPROTO_TCP { "tcp" } else { "udp" })
            }
            Match::NotEstablishedOrRelated => f.write_str("ct state != established ct state != related"),
            Match::EstablishedOrRelated => f.write_str("ct state established,related"),
            Match::DaddrInSet(v4, set) => write!(f, "{} daddr @{set}", if *v4 { "ip" } else { "ip6" }),
            Match::DaddrInPrefix(prefix) => write!(f, "{} daddr {prefix}", if prefix.is_v4() { "ip" } else { "ip6" }),
        }
    }
}

impl fmt::Display for RuleSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for item in &self.matches {
            write!(f, "{item} ")?;
        }
        f.write_str(match self.action {
            Action::Accept => "accept",
            Action::Drop => "drop",
            Action::Refuse => "goto refuse",
            Action::Masquerade => "masquerade",
        })
    }
}

impl fmt::Display for ChainSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, hook, priority) = match self.kind {
            ChainKind::SourceNat => ("nat", "postrouting", "srcnat"),
            ChainKind::Forward => ("filter", "forward", "filter"),
        };
        writeln!(f, "  chain {} {{ type {kind} hook {hook} priority {priority}; policy accept;", self.name)?;
        for rule in &self.rules {
            writeln!(f, "    {rule}")?;
        }
        f.write_str("  }")
    }
}

impl fmt::Display for TableSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "table inet {} {{", self.name)?;
        for set in &self.sets {
            writeln!(f, "  set {} {{ type {}; flags timeout; }}", set.name, if set.v4 { "ipv4_addr" } else { "ipv6_addr" })?;
        }
        for v4 in [true, false].into_iter().filter(|_| self.counting != Counting::Off) {
            writeln!(
                f,
                "  set {} {{ type {} . inet_proto . inet_service; size {REFUSED_SET_SIZE}; flags dynamic,timeout; timeout {}s; counter; }}",
                refused_set_name(v4),
                if v4 { "ipv4_addr" } else { "ipv6_addr" },
                REFUSED_TIMEOUT.as_secs()
            )?;
        }
        for chain in &self.chains {
            writeln!(f, "{chain}")?;
        }
        for chain in refused::chains(self.counting) {
            if chain.prerouting {
                writeln!(f, "  chain {} {{ type filter hook prerouting priority filter; policy accept;", chain.name)?;
            } else {
                writeln!(f, "  chain {} {{", chain.name)?;
            }
            for rule in &chain.rules {
                writeln!(f, "    {}", rule.text)?;
            }
            writeln!(f, "  }}")?;
        }
        f.write_str("}")
    }
}

fn interface_name(name: &str) -> Result<[u8; IFNAMSIZ], TopologyError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= IFNAMSIZ || bytes.contains(&0) {
        return Err(TopologyError::BadInterfaceName(name.to_string()));
    }
    // Padded to IFNAMSIZ like nft does: an exact match, and `meta iifname` loads 16 bytes.
    let mut padded = [0u8; IFNAMSIZ];
    padded[..bytes.len()].copy_from_slice(bytes);
    Ok(padded)
}

/// The mask of `prefix` as an address of its family.
fn netmask(prefix: &Prefix) -> IpAddr {
    let len = u32::from(prefix.prefix_len());
    if prefix.is_v4() {
        IpAddr::V4(Ipv4Addr::from(u32::MAX.checked_shl(32 - len).unwrap_or(0)))
    } else {
        IpAddr::V6(Ipv6Addr::from(u128::MAX.checked_shl(128 - len).unwrap_or(0)))
    }
}

fn c_name(text: &str) -> Result<&str, TopologyError> {
    if text.contains('\0') {
        return Err(TopologyError::BadInterfaceName("nft name with NUL".into()));
    }
    Ok(text)
}

/// `payload ip|ip6 saddr|daddr` into register 1.
fn address_payload(v4: bool, source: bool) -> Expr {
    let (offset, len) = match (v4, source) {
        (true, true) => (12, 4),
        (true, false) => (16, 4),
        (false, true) => (8, 16),
        (false, false) => (24, 16),
    };
    Expr::Payload { base: NFT_PAYLOAD_NETWORK_HEADER, offset, len, dreg: NFT_REG_1 }
}

fn octets(address: IpAddr) -> Vec<u8> {
    match address {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn add_address(rule: &mut Vec<Expr>, address: IpAddr, source: bool, equal: bool) {
    rule.push(address_payload(address.is_ipv4(), source));
    rule.push(Expr::Cmp { op: if equal { NFT_CMP_EQ } else { NFT_CMP_NEQ }, value: octets(address) });
}

fn meta(key: u32) -> Expr {
    Expr::Meta { key, dreg: NFT_REG_1 }
}

fn cmp(op: u32, value: &[u8]) -> Expr {
    Expr::Cmp { op, value: value.to_vec() }
}

impl RuleSpec {
    /// The rule's expressions.
    fn expressions(&self) -> Result<Vec<Expr>, TopologyError> {
        let mut rule = Vec::new();
        for item in &self.matches {
            match item {
                Match::IifName(name) => {
                    rule.push(meta(NFT_META_IIFNAME));
                    rule.push(cmp(NFT_CMP_EQ, &interface_name(name)?));
                }
                Match::OifName(name) => {
                    rule.push(meta(NFT_META_OIFNAME));
                    rule.push(cmp(NFT_CMP_EQ, &interface_name(name)?));
                }
                Match::Family(v4) => {
                    rule.push(meta(NFT_META_NFPROTO));
                    rule.push(cmp(NFT_CMP_EQ, &[if *v4 { NFPROTO_IPV4 } else { NFPROTO_IPV6 }]));
                }
                Match::Daddr(address) => add_address(&mut rule, *address, false, true),
                Match::Saddr(address) => add_address(&mut rule, *address, true, true),
                Match::SaddrNot(address) => add_address(&mut rule, *address, true, false),
                Match::Dport(protocol, port) => {
                    rule.push(meta(NFT_META_L4PROTO));
                    rule.push(cmp(NFT_CMP_EQ, &[*protocol]));
                    // The same header offset for TCP and UDP (`th dport`).
                    rule.push(Expr::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset: 2, len: 2, dreg: NFT_REG_1 });
                    rule.push(cmp(NFT_CMP_EQ, &port.to_be_bytes()));
                }
                Match::NotEstablishedOrRelated => {
                    rule.push(Expr::Ct { key: NFT_CT_STATE });
                    rule.push(cmp(NFT_CMP_NEQ, &CT_ESTABLISHED.to_ne_bytes()));
                    rule.push(cmp(NFT_CMP_NEQ, &CT_RELATED.to_ne_bytes()));
                }
                Match::EstablishedOrRelated => {
                    rule.push(Expr::Ct { key: NFT_CT_STATE });
                    rule.push(Expr::Bitwise { mask: (CT_ESTABLISHED | CT_RELATED).to_ne_bytes().to_vec(), xor: vec![0; 4] });
                    rule.push(cmp(NFT_CMP_NEQ, &0u32.to_ne_bytes()));
                }
                Match::DaddrInSet(v4, name) => {
                    // The set itself is created by `nftset::create_table_and_sets`.
                    rule.push(address_payload(*v4, false));
                    rule.push(Expr::Lookup { set: c_name(name)?.to_string() });
                }
                Match::DaddrInPrefix(prefix) => {
                    let (network, mask) = (prefix.network(), netmask(prefix));
                    if network.is_ipv4() != mask.is_ipv4() {
                        return Err(TopologyError::Nftables { action: format!("build rule {self}"), reason: "mixed families".into() });
                    }
                    rule.push(address_payload(network.is_ipv4(), false));
                    let mask = octets(mask);
                    rule.push(Expr::Bitwise { xor: vec![0; mask.len()], mask });
                    rule.push(cmp(NFT_CMP_EQ, &octets(network)));
                }
            }
        }
        rule.push(match self.action {
            Action::Accept => Expr::Verdict(Verdict::Accept),
            Action::Drop => Expr::Verdict(Verdict::Drop),
            Action::Refuse => Expr::Verdict(Verdict::Goto(refused::REFUSE_CHAIN.to_string())),
            Action::Masquerade => Expr::Masquerade,
        });
        Ok(rule)
    }
}

impl TableSpec {
    /// The whole table as one batch: the table, its chains and their rules;
    /// with `replacing`, an existing table of the name is deleted first in
    /// the same transaction (so no packet ever sees it half built or gone).
    fn batch(&self, replacing: Replacing) -> Result<Transaction, TopologyError> {
        let name = c_name(&self.name)?;
        let comment = c_name(&self.comment)?;
        // Flags as libnftnl set them: a table is added without NLM_F_CREATE
        // (adding an existing one is no error either way), rules exclusively.
        let table = codec::table(name, Some(0));
        let mut batch = Batch::new();
        if replacing == Replacing::Table {
            // Adding an existing table is no error; deleting a missing one would be.
            batch.add(NFT_MSG_NEWTABLE, 0, NFPROTO_INET, &table);
            batch.add(NFT_MSG_DELTABLE, 0, NFPROTO_INET, &table);
        }
        batch.add(NFT_MSG_NEWTABLE, 0, NFPROTO_INET, &table);
        for spec in &self.chains {
            let base = match spec.kind {
                ChainKind::SourceNat => BaseChain { hook: codec::NF_INET_POST_ROUTING, priority: SRCNAT_PRIORITY, kind: "nat" },
                ChainKind::Forward => BaseChain { hook: codec::NF_INET_FORWARD, priority: FILTER_PRIORITY, kind: "filter" },
            };
            let chain = codec::chain(name, c_name(spec.name)?, Some(base));
            if replacing == Replacing::Chains {
                // The same for each base chain: its rules go with it.
                batch.add(NFT_MSG_NEWCHAIN, NLM_F_CREATE, NFPROTO_INET, &chain);
                batch.add(NFT_MSG_DELCHAIN, 0, NFPROTO_INET, &chain);
            }
            batch.add(NFT_MSG_NEWCHAIN, NLM_F_CREATE, NFPROTO_INET, &chain);
        }
        for spec in &self.chains {
            for rule in &spec.rules {
                let payload = codec::commented_rule(name, spec.name, comment, &rule.expressions()?)
                    .map_err(|reason| TopologyError::Nftables { action: format!("build rule {rule}"), reason })?;
                batch.add(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND | NLM_F_EXCL, NFPROTO_INET, &payload);
            }
        }
        Ok(batch.finish())
    }

    /// Installs the table in the calling thread's namespace: first the
    /// table and its sets (one transaction), then its counting chains (one
    /// transaction), then the chains and rules (one transaction). Only used
    /// before the sandbox starts.
    pub fn install(&self) -> Result<(), TopologyError> {
        let counting = self.counting != Counting::Off;
        if !self.sets.is_empty() || counting {
            nftset::create_table_and_sets(&self.name, &self.sets, counting)?;
        }
        if counting {
            let mut batch = Batch::new();
            for chain in refused::chains(self.counting) {
                batch.add(NFT_MSG_NEWCHAIN, NLM_F_CREATE, NFPROTO_INET, &refused::chain_payload(&self.name, &chain));
                for rule in &chain.rules {
                    batch.add(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, NFPROTO_INET, &refused::rule_payload(&self.name, rule));
                }
            }
            codec::transact(&batch.finish()).map_err(|source| TopologyError::Io {
                action: format!("nftables: install the counting chains of inet {}", self.name),
                source,
            })?;
        }
        let batch = self.batch(Replacing::Nothing)?;
        codec::transact_detached(batch)
            .map_err(|source| TopologyError::Io { action: format!("nftables: install table inet {}", self.name), source })
    }

    /// Replaces the table of this name in the calling thread's namespace
    /// with this one, atomically (one nftables transaction). A counting
    /// table keeps its sets (and their counts) and its counting chains: only
    /// its own base chains are replaced, each deleted and added again with
    /// its rules in the same transaction.
    pub fn replace(&self) -> Result<(), TopologyError> {
        let batch = self.batch(if self.counting == Counting::Off { Replacing::Table } else { Replacing::Chains })?;
        codec::transact_detached(batch)
            .map_err(|source| TopologyError::Io { action: format!("nftables: replace table inet {}", self.name), source })
    }

    /// What the kernel should hold for this table, in netlink form.
    fn expected(&self) -> Result<(Vec<DumpedChain>, Vec<DumpedRule>), TopologyError> {
        let batch = self.batch(Replacing::Nothing)?;
        let mut messages: Vec<Message> = parse_messages(&batch.bytes);
        for chain in refused::chains(self.counting) {
            messages.push(Message { kind: NFT_MSG_NEWCHAIN, family: NFPROTO_INET, attributes: refused::chain_payload(&self.name, &chain) });
            for rule in &chain.rules {
                messages.push(Message { kind: NFT_MSG_NEWRULE, family: NFPROTO_INET, attributes: refused::rule_payload(&self.name, rule) });
            }
        }
        let chains = messages.iter().filter(|m| m.kind == NFT_MSG_NEWCHAIN).filter_map(DumpedChain::parse).collect();
        let rules = messages.iter().filter(|m| m.kind == NFT_MSG_NEWRULE).filter_map(DumpedRule::parse).collect();
        Ok((chains, rules))
    }

    /// Differences between this table and what the calling thread's
    /// namespace holds under its name (family inet).
    pub fn differences(&self) -> Result<Vec<String>, TopologyError> {
        let (expected_chains, expected_rules) = self.expected()?;
        let belongs = |table: &str, family: u8| table == self.name && family == NFPROTO_INET;
        let tables = codec::list_tables().map_err(|source| TopologyError::Io { action: "nftables: list tables".into(), source })?;
        let table = format!("nftables table inet {}", self.name);
        if !tables.iter().any(|t| belongs(&t.name, t.family)) {
            return Ok(vec![format!("{table} is missing")]);
        }
        let chains: Vec<DumpedChain> =
            dump(NFT_MSG_GETCHAIN, None)?.iter().filter_map(DumpedChain::parse).filter(|c| belongs(&c.table, c.family)).collect();
        let rules: Vec<DumpedRule> =
            dump(NFT_MSG_GETRULE, Some(&self.name))?.iter().filter_map(DumpedRule::parse).filter(|r| belongs(&r.table, r.family)).collect();
        let mut differences = Vec::new();
        if !self.sets.is_empty() || self.counting != Counting::Off {
            differences.extend(
                nftset::set_differences(&self.name, &self.sets, self.counting != Counting::Off)?
                    .into_iter()
                    .map(|d| format!("{table}: {d}")),
            );
        }
        for chain in &expected_chains {
            match chains.iter().find(|c| c.name == chain.name) {
                None => differences.push(format!("{table}: chain {} is missing", chain.name)),
                Some(found) if found != chain => {
                    differences.push(format!("{table}: chain {} is {found:?}, expected {chain:?}", chain.name))
                }
                Some(_) => {}
            }
        }
        for chain in chains.iter().filter(|c| !expected_chains.iter().any(|e| e.name == c.name)) {
            differences.push(format!("{table}: unexpected chain {}", chain.name));
        }
        let described: Vec<(&DumpedRule, String)> =
            expected_rules
                .iter()
                .zip(self.chains.iter().flat_map(|c| c.rules.iter().map(move |r| format!("chain {}: {r}", c.name))).chain(
                    refused::chains(self.counting).iter().flat_map(|c| c.rules.iter().map(|r| format!("chain {}: {}", c.name, r.text))),
                ))
                .collect();
        for (rule, description) in &described {
            if !rules.iter().any(|found| found.same_as(rule)) {
                differences.push(format!("{table}: rule missing: {description}"));
            }
        }
        for found in &rules {
            if !expected_rules.iter().any(|rule| found.same_as(rule)) {
                let names: Vec<&str> = found.expressions.iter().map(|(name, _)| name.as_str()).collect();
                differences.push(format!("{table}: unexpected rule in chain {} ({})", found.chain, names.join(" ")));
            }
        }
        if differences.is_empty() {
            for chain in &expected_chains {
                let order = |list: &[DumpedRule]| -> Vec<Vec<(String, Value)>> {
                    list.iter().filter(|r| r.chain == chain.name).map(|r| r.expressions.clone()).collect()
                };
                if order(&rules) != order(&expected_rules) {
                    differences.push(format!("{table}: the rules of chain {} are out of order", chain.name));
                }
            }
        }
        Ok(differences)
    }
}

/// The sidecar's filter: for each resolver the policy opens only because
/// it is a resolver, `iifname "lzs0" <family> daddr R` gets UDP and TCP
/// port 53 accepted and everything else rejected. The table exists (with
/// an empty chain) when there is no such resolver, so the read-back is the
/// same either way.
pub(crate) fn sidecar_filter(port53_only: &[IpAddr]) -> TableSpec {
    let mut rules = Vec::new();
    for resolver in port53_only {
        let base = vec![Match::IifName(SIDECAR_INNER_LINK.to_string()), Match::Family(resolver.is_ipv4()), Match::Daddr(*resolver)];
        for protocol in [IPPROTO_UDP, IPPROTO_TCP] {
            let mut matches = base.clone();
            matches.push(Match::Dport(protocol, DNS_PORT));
            rules.push(RuleSpec { matches, action: Action::Accept });
        }
        rules.push(RuleSpec { matches: base, action: Action::Refuse });
    }
    TableSpec {
        name: SIDECAR_FILTER_TABLE.to_string(),
        sets: Vec::new(),
        chains: vec![ChainSpec { name: "forward", kind: ChainKind::Forward, rules }],
        comment: "Lazaret: DNS resolvers get port 53 only".to_string(),
        counting: Counting::RejectsAndRoutes,
    }
}

/// The sidecar's table of a locked Domain (`egress = "locked"`).
pub const LOCKED_TABLE: &str = "lazaret-locked";

/// The set of the addresses allowed names resolved to: `names4`/`names6`
/// for every port, `names4_p22` for a rule with port 22.
pub fn locked_set_name(v4: bool, port: Option<u16>) -> String {
    let family = if v4 { 4 } else { 6 };
    match port {
        Some(port) => format!("names{family}_p{port}"),
        None => format!("names{family}"),
    }
}

/// The locked Domain's filter, `inet lazaret-locked`: from the sandbox
/// (`iifname "lzs0"`) only flows already let through, addresses in the
/// name sets (per port where the rule has one) and the `allow_egress`
/// prefixes are forwarded; everything else is rejected (host-unreachable,
/// so a client fails at once instead of timing out). The sets' elements
/// time out; the resolver adds them before it answers the sandbox. The
/// routes and `lazaret-filter` still apply on top (a name resolving to a
/// private address stays denied).
pub(crate) fn locked_table(ports: &std::collections::BTreeSet<u16>, prefixes: &[Prefix]) -> TableSpec {
    let from_sandbox = || Match::IifName(SIDECAR_INNER_LINK.to_string());
    let mut sets = Vec::new();
    let mut rules = vec![RuleSpec { matches: vec![from_sandbox(), Match::EstablishedOrRelated], action: Action::Accept }];
    for v4 in [true, false] {
        let set = locked_set_name(v4, None);
        rules.push(RuleSpec {
            matches: vec![from_sandbox(), Match::Family(v4), Match::DaddrInSet(v4, set.clone())],
            action: Action::Accept,
        });
        sets.push(SetSpec { name: set, v4 });
    }
    for port in ports {
        for v4 in [true, false] {
            let set = locked_set_name(v4, Some(*port));
            for protocol in [IPPROTO_TCP, IPPROTO_UDP] {
                let matches = vec![from_sandbox(), Match::Family(v4), Match::Dport(protocol, *port), Match::DaddrInSet(v4, set.clone())];
                rules.push(RuleSpec { matches, action: Action::Accept });
            }
            sets.push(SetSpec { name: set, v4 });
        }
    }
    for prefix in prefixes {
        rules.push(RuleSpec {
            matches: vec![from_sandbox(), Match::Family(prefix.is_v4()), Match::DaddrInPrefix(*prefix)],
            action: Action::Accept,
        });
    }
    rules.push(RuleSpec { matches: vec![from_sandbox()], action: Action::Refuse });
    TableSpec {
        name: LOCKED_TABLE.to_string(),
        sets,
        chains: vec![ChainSpec { name: "forward", kind: ChainKind::Forward, rules }],
        comment: "Lazaret: locked egress, only allowed names and prefixes".to_string(),
        counting: Counting::Rejects,
    }
}

/// The host's table of one Domain: masquerade of the sandbox's addresses
/// (`snat`), and the forward guard (`forward`):
/// * `oifname "lzh<ID>" ct state != established ct state != related drop`:
///   nothing that starts a connection is forwarded into the Domain (a LAN
///   peer routing the pool via the host, another Domain); replies and their
///   ICMP errors pass;
/// * `iifname "lzh<ID>" meta nfproto ipv4 ip saddr != S drop` (and the same
///   for IPv6, or every IPv6 packet when IPv6 is disabled): only the
///   sandbox's own address is forwarded out of the Domain.
///
/// Both only drop: packets of other interfaces are not matched at all, so
/// the host's other forwarding is untouched.
pub(crate) fn host_table(id: SidecarId, sandbox: Ipv4Addr, sandbox6: Option<Ipv6Addr>) -> TableSpec {
    let link = id.host_link_name();
    let sources = [Some(IpAddr::V4(sandbox)), sandbox6.map(IpAddr::V6)];
    let masquerade = sources
        .iter()
        .flatten()
        .map(|source| RuleSpec { matches: vec![Match::Family(source.is_ipv4()), Match::Saddr(*source)], action: Action::Masquerade })
        .collect();
    let mut forward = vec![RuleSpec { matches: vec![Match::OifName(link.clone()), Match::NotEstablishedOrRelated], action: Action::Drop }];
    for (v4, source) in [(true, sources[0]), (false, sources[1])] {
        let mut matches = vec![Match::IifName(link.clone()), Match::Family(v4)];
        matches.extend(source.map(Match::SaddrNot));
        forward.push(RuleSpec { matches, action: Action::Drop });
    }
    TableSpec {
        name: table_name(id),
        sets: Vec::new(),
        chains: vec![
            ChainSpec { name: "snat", kind: ChainKind::SourceNat, rules: masquerade },
            ChainSpec { name: "forward", kind: ChainKind::Forward, rules: forward },
        ],
        comment: format!("Lazaret sidecar {id}"),
        counting: Counting::Off,
    }
}

// ---- the kernel's chains and rules, reduced for comparison ----

fn attribute(bytes: &[u8], kind: u16) -> Option<&[u8]> {
    find(bytes, kind)
}

/// An attribute value reduced for comparison: nested attributes (in any
/// order, with or without the nested flag) or plain bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Value {
    Bytes(Vec<u8>),
    Nested(Vec<(u16, Value)>),
}

fn normalize(bytes: &[u8]) -> Value {
    match attributes(bytes) {
        Some(list) if !list.is_empty() => {
            let mut nested: Vec<(u16, Value)> = list.into_iter().map(|(kind, value)| (kind, normalize(value))).collect();
            nested.sort();
            Value::Nested(nested)
        }
        _ => Value::Bytes(bytes.to_vec()),
    }
}

/// The attributes of an expression that say what it does: the kernel dumps
/// a lookup with its flags but not the set ID `nftcodec` sends (keep only
/// NFTA_LOOKUP_SET and _SREG), and a bitwise with the operation `nftcodec`
/// leaves out, as libnftnl did (drop NFTA_BITWISE_OP, 0 = mask-and-xor
/// either way).
fn comparable(name: &str, data: Value) -> Value {
    let keep: fn(u16) -> bool = match name {
        "lookup" => |kind| kind == 1 || kind == 2,
        "bitwise" => |kind| kind != 6,
        // The kernel dumps a timeout (0) and the set's counter it copied
        // into the expression; what matters is set, operation and key.
        "dynset" => |kind| kind == 1 || kind == 3 || kind == 4,
        _ => return data,
    };
    match data {
        Value::Nested(list) => Value::Nested(list.into_iter().filter(|(kind, _)| keep(*kind)).collect()),
        other => other,
    }
}

/// A base chain as dumped (or as `nftcodec` serializes it).
#[derive(Debug, Clone, PartialEq, Eq)]
struct DumpedChain {
    family: u8,
    table: String,
    name: String,
    hook: Option<u32>,
    priority: Option<i32>,
    policy: Option<u32>,
    kind: Option<String>,
}

impl DumpedChain {
    fn parse(message: &Message) -> Option<DumpedChain> {
        const TABLE: u16 = 1;
        const NAME: u16 = 3;
        const HOOK: u16 = 4;
        const POLICY: u16 = 5;
        const TYPE: u16 = 7;
        let bytes = &message.attributes;
        let hook = attribute(bytes, HOOK);
        Some(DumpedChain {
            family: message.family,
            table: string(attribute(bytes, TABLE)?),
            name: string(attribute(bytes, NAME)?),
            hook: hook.and_then(|h| attribute(h, 1)).and_then(be32_value),
            priority: hook.and_then(|h| attribute(h, 2)).and_then(be32_value).map(|p| p as i32),
            policy: attribute(bytes, POLICY).and_then(be32_value),
            kind: attribute(bytes, TYPE).map(string),
        })
    }
}

/// A rule as dumped (or as `nftcodec` serializes it): its chain and expressions.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DumpedRule {
    family: u8,
    table: String,
    chain: String,
    expressions: Vec<(String, Value)>,
}

impl DumpedRule {
    fn parse(message: &Message) -> Option<DumpedRule> {
        const TABLE: u16 = 1;
        const CHAIN: u16 = 2;
        const EXPRESSIONS: u16 = 4;
        let bytes = &message.attributes;
        let mut expressions = Vec::new();
        for (_, element) in attributes(attribute(bytes, EXPRESSIONS).unwrap_or_default())? {
            let name = string(attribute(element, 1)?);
            let data = attribute(element, 2).map(normalize).unwrap_or(Value::Bytes(Vec::new()));
            let data = comparable(&name, data);
            expressions.push((name, data));
        }
        Some(DumpedRule {
            family: message.family,
            table: string(attribute(bytes, TABLE)?),
            chain: string(attribute(bytes, CHAIN)?),
            expressions,
        })
    }

    fn same_as(&self, other: &DumpedRule) -> bool {
        self.chain == other.chain && self.expressions == other.expressions
    }
}

/// Dumps every object of one kind (`NFT_MSG_GET*`) of the inet family in
/// the calling thread's namespace; given a table, only that table's (the
/// kernel filters rule dumps by table; callers filter again).
fn dump(request: u16, table: Option<&str>) -> Result<Vec<Message>, TopologyError> {
    // NFTA_RULE_TABLE / NFTA_CHAIN_TABLE (both 1).
    let filter = table.map(|name| codec::table(name, None)).unwrap_or_default();
    codec::dump(request, NFPROTO_INET, &filter)
        .map_err(|source| TopologyError::Io { action: "nftables: dump chains and rules".into(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("valid test input")
    }

    #[test]
    fn sidecar_filter_reads_like_nft() {
        let table = sidecar_filter(&[ip("192.168.1.1"), ip("fd00::53")]);
        let rules: Vec<String> = table.chains[0].rules.iter().map(ToString::to_string).collect();
        assert_eq!(
            rules,
            [
                "iifname \"lzs0\" meta nfproto ipv4 ip daddr 192.168.1.1 meta l4proto udp th dport 53 accept",
                "iifname \"lzs0\" meta nfproto ipv4 ip daddr 192.168.1.1 meta l4proto tcp th dport 53 accept",
                "iifname \"lzs0\" meta nfproto ipv4 ip daddr 192.168.1.1 goto refuse",
                "iifname \"lzs0\" meta nfproto ipv6 ip6 daddr fd00::53 meta l4proto udp th dport 53 accept",
                "iifname \"lzs0\" meta nfproto ipv6 ip6 daddr fd00::53 meta l4proto tcp th dport 53 accept",
                "iifname \"lzs0\" meta nfproto ipv6 ip6 daddr fd00::53 goto refuse",
            ]
        );
        assert!(sidecar_filter(&[]).chains[0].rules.is_empty());
        let text = table.to_string();
        assert!(text.starts_with("table inet lazaret-filter {\n  set refused4 { type ipv4_addr . inet_proto . inet_service; size 1024; flags dynamic,timeout; timeout 3600s; counter; }"), "{text}");
        for line in [
            "  chain forward { type filter hook forward priority filter; policy accept;",
            "  chain refuse {\n    meta nfproto ipv4 meta l4proto tcp update @refused4 { ip daddr . meta l4proto . th dport }",
            "    reject with icmpx host-unreachable\n  }",
            "  chain refused-routes { type filter hook prerouting priority filter; policy accept;",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn host_table_reads_like_nft() {
        let id: SidecarId = "abcdef0123".parse().expect("valid test input");
        let v4_only = host_table(id, Ipv4Addr::new(100, 96, 0, 4), None);
        assert_eq!(v4_only.name, "lazaret-abcdef0123");
        let text = v4_only.to_string();
        for line in [
            "chain snat { type nat hook postrouting priority srcnat; policy accept;",
            "meta nfproto ipv4 ip saddr 100.96.0.4 masquerade",
            "chain forward { type filter hook forward priority filter; policy accept;",
            "oifname \"lzhabcdef0123\" ct state != established ct state != related drop",
            "iifname \"lzhabcdef0123\" meta nfproto ipv4 ip saddr != 100.96.0.4 drop",
            // IPv6 disabled: nothing of it leaves the Domain.
            "iifname \"lzhabcdef0123\" meta nfproto ipv6 drop",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        let dual = host_table(id, Ipv4Addr::new(100, 96, 0, 4), Some("fd6c:617a:6172::6460:4".parse().expect("valid test input")));
        let text = dual.to_string();
        assert!(text.contains("iifname \"lzhabcdef0123\" meta nfproto ipv6 ip6 saddr != fd6c:617a:6172::6460:4 drop"), "{text}");
        assert!(text.contains("meta nfproto ipv6 ip6 saddr fd6c:617a:6172::6460:4 masquerade"), "{text}");
    }

    #[test]
    fn serialized_rules_parse_back_into_their_expressions() {
        let (chains, rules) = sidecar_filter(&[ip("192.168.1.1")]).expected().expect("serialize");
        // forward, then the counting chains: refuse (regular) and refused-routes (prerouting).
        assert_eq!(chains.len(), 3);
        assert_eq!((chains[0].hook, chains[0].priority, chains[0].policy), (Some(2), Some(0), Some(1)));
        assert_eq!(chains[0].kind.as_deref(), Some("filter"));
        assert_eq!((chains[1].name.as_str(), chains[1].hook, chains[1].kind.as_deref()), ("refuse", None, None));
        assert_eq!(
            (chains[2].name.as_str(), chains[2].hook, chains[2].priority, chains[2].policy),
            ("refused-routes", Some(0), Some(0), Some(1))
        );
        assert_eq!(rules.len(), 3 + 7 + 6);
        assert_eq!(rules[9].expressions.last().map(|(name, _)| name.as_str()), Some("reject"));
        assert_eq!(rules[10].expressions.iter().filter(|(name, _)| name == "fib").count(), 2);
        let names: Vec<&str> = rules[0].expressions.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["meta", "cmp", "meta", "cmp", "payload", "cmp", "meta", "cmp", "payload", "cmp", "immediate"]);
        // `goto refuse` is an immediate verdict.
        assert_eq!(rules[2].expressions.last().map(|(name, _)| name.as_str()), Some("immediate"));
        assert!(!rules[0].same_as(&rules[1]), "UDP and TCP differ");
        // Interface names longer than IFNAMSIZ - 1 are refused, not truncated.
        assert!(interface_name("abcdefghijklmnop").is_err());
    }

    #[test]
    fn normalization_ignores_attribute_order_and_flags() {
        use crate::topology::nftcodec::attr as attribute;
        let a = [attribute(1, &[0, 0, 0, 1]), attribute(0x8000 | 2, &attribute(1, &[9, 9]))].concat();
        let b = [attribute(2, &attribute(1, &[9, 9])), attribute(1, &[0, 0, 0, 1])].concat();
        assert_eq!(normalize(&a), normalize(&b));
        assert_ne!(normalize(&a), normalize(&[attribute(1, &[0, 0, 0, 2]), attribute(2, &attribute(1, &[9, 9]))].concat()));
        // Malformed lengths are plain bytes, never a panic.
        assert_eq!(normalize(&[200, 0, 1, 0]), Value::Bytes(vec![200, 0, 1, 0]));
        assert_eq!(attributes(&[8, 0, 1, 0, 1]), None);
    }

    /// The same bytes as libnftnl (through the `nftnl` crate) sent for
    /// these tables, up to what `testing::normalized` says may differ.
    #[test]
    fn batches_match_libnftnl() {
        use crate::topology::nftcodec::fixtures;
        use crate::topology::nftcodec::testing::{assert_same, hex};
        let id: SidecarId = "abcdef0123".parse().expect("valid test input");
        let host = host_table(id, Ipv4Addr::new(100, 96, 0, 4), Some("fd6c:617a:6172::6460:4".parse().expect("ip")));
        let host4 = host_table(id, Ipv4Addr::new(100, 96, 0, 4), None);
        let filter = sidecar_filter(&[ip("192.168.1.1"), ip("fd00::53")]);
        let locked = locked_table(&[22].into(), &["198.51.100.0/24".parse().expect("prefix"), "2001:db8::/32".parse().expect("prefix")]);
        for (spec, replacing, fixture, what) in [
            (&host, Replacing::Table, fixtures::HOST_REPLACE, "host table, replace"),
            (&host4, Replacing::Nothing, fixtures::HOST4_INSTALL, "IPv4-only host table, install"),
            (&filter, Replacing::Chains, fixtures::FILTER_REPLACE, "sidecar filter, replace"),
            (&locked, Replacing::Nothing, fixtures::LOCKED_INSTALL, "locked table, install"),
        ] {
            let batch = spec.batch(replacing).expect("serialize");
            assert_same(&batch.bytes, &hex(fixture), what);
        }
    }

    /// What `install` compares with the kernel's dump parses back from the
    /// very bytes it sends: one chain message per chain, one rule message
    /// per rule, in order.
    #[test]
    fn expected_is_what_is_sent() {
        let table = locked_table(&[22].into(), &["198.51.100.0/24".parse().expect("prefix")]);
        let sent = parse_messages(&table.batch(Replacing::Nothing).expect("batch").bytes);
        let (chains, rules) = table.expected().expect("expected");
        let sent_rules: Vec<DumpedRule> = sent.iter().filter(|m| m.kind == NFT_MSG_NEWRULE).filter_map(DumpedRule::parse).collect();
        assert_eq!(sent_rules.len(), table.chains[0].rules.len());
        assert_eq!(&rules[..sent_rules.len()], &sent_rules[..]);
        assert_eq!(chains[0], sent.iter().filter(|m| m.kind == NFT_MSG_NEWCHAIN).find_map(DumpedChain::parse).expect("chain"));
        assert!(rules[sent_rules.len()..].iter().all(|r| r.chain == refused::REFUSE_CHAIN));
    }

    #[test]
    fn locked_table_reads_like_nft() {
        let table = locked_table(&[22].into(), &["198.51.100.0/24".parse().expect("prefix")]);
        let text = table.to_string();
        for line in [
            "set names4 { type ipv4_addr; flags timeout; }",
            "set names6_p22 { type ipv6_addr; flags timeout; }",
            "iifname \"lzs0\" ct state established,related accept",
            "iifname \"lzs0\" meta nfproto ipv4 ip daddr @names4 accept",
            "iifname \"lzs0\" meta nfproto ipv6 meta l4proto udp th dport 22 ip6 daddr @names6_p22 accept",
            "iifname \"lzs0\" meta nfproto ipv4 ip daddr 198.51.100.0/24 accept",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert_eq!(table.chains[0].rules.last().map(ToString::to_string).as_deref(), Some("iifname \"lzs0\" goto refuse"));
        assert_eq!(table.sets.len(), 4);
        // It serializes, and the lookups name their sets.
        let (_, rules) = table.expected().expect("serialize");
        assert_eq!(rules.len(), table.chains[0].rules.len() + 7, "its rules and the refuse chain's");
        assert!(rules[1].expressions.iter().any(|(name, _)| name == "lookup"));
        assert_eq!(netmask(&"10.0.0.0/8".parse().expect("prefix")), IpAddr::V4(Ipv4Addr::new(255, 0, 0, 0)));
        assert_eq!(netmask(&"::/0".parse().expect("prefix")), IpAddr::V6(Ipv6Addr::UNSPECIFIED));
    }
}
