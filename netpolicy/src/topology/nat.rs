//! Source NAT on the host, over nftables netlink (nftnl + mnl; no `nft` command).
//!
//! Each Domain gets its own table, `inet lazaret-<SidecarId>`, holding one
//! `nat`/`postrouting` base chain that masquerades the sandbox's IPv4 address
//! and, for an IPv6-enabled Domain, its IPv6 address, and the Domain's
//! forward guard (see `nft::host_table`). Deleting that table
//! removes exactly this Domain's rules and nothing else; when the last Domain
//! is gone no Lazaret table is left. Stale tables of crashed runs are found
//! by the Sidecar ID in their name.

use std::ffi::{CStr, CString};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

use nftnl::{Batch, FinalizedBatch, MsgType, ProtoFamily, Table};

use super::{SidecarId, TopologyError};

/// Table names start with this; the Sidecar ID follows.
pub const NAT_TABLE_PREFIX: &str = "lazaret-";
/// `NFPROTO_*` numbers of the families a Lazaret table can have: `inet` now,
/// `ip` for tables left by builds before IPv6 support.
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

fn nft_error(action: String) -> impl FnOnce(io::Error) -> TopologyError {
    move |source| TopologyError::Io { action: format!("nftables: {action}"), source }
}

/// The name of a Domain's NAT table.
pub fn table_name(id: SidecarId) -> String {
    format!("{NAT_TABLE_PREFIX}{id}")
}

/// Sends one batch and waits for the kernel's acknowledgements.
///
/// Once acknowledged the batch is committed, but closing an nftables socket
/// after a deletion waits for the kernel to free the deleted objects (an RCU
/// grace period, 5-35 ms here) that nothing needs to wait for. So the socket
/// lives on a helper thread (created on the calling thread, hence in its
/// network namespace) that reports the result first and closes afterwards.
pub(crate) fn send(batch: &FinalizedBatch) -> io::Result<()> {
    let messages: Vec<Vec<u8>> = batch.iter().map(<[u8]>::to_vec).collect();
    let sequences = batch.sequence_numbers();
    let (report, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let exchange = || -> io::Result<mnl::Socket> {
            let socket = mnl::Socket::new(mnl::Bus::Netfilter)?;
            let portid = socket.portid();
            socket.send_all(messages.iter().map(Vec::as_slice))?;
            let mut buffer = vec![0; nftnl::nft_nlmsg_maxsize() as usize];
            let mut expected = sequences;
            while !expected.is_empty() {
                for message in socket.recv(&mut buffer[..])? {
                    let message = message?;
                    let Some(sequence) = expected.next() else {
                        return Err(io::Error::other("unexpected nftables acknowledgement"));
                    };
                    mnl::cb_run(message, sequence, portid)?;
                }
            }
            Ok(socket)
        };
        match exchange() {
            Ok(socket) => {
                let _ = report.send(Ok(()));
                drop(socket);
            }
            Err(error) => {
                let _ = report.send(Err(error));
            }
        }
    });
    result.recv().map_err(|_| io::Error::other("nftables worker thread panicked"))?
}

/// Installs the Domain's host table `inet lazaret-<id>`
/// (`nft::host_table`): `ip saddr <sandbox> masquerade` (and, given
/// an IPv6 address, `ip6 saddr <sandbox6> masquerade`) and the forward guard
/// that lets only replies into the Domain and only the sandbox's addresses
/// out of it. Must run on a thread inside the host namespace
/// ([`super::Netns::run`]); [`super::DomainNetwork`] calls it itself.
pub fn install(id: SidecarId, sandbox: Ipv4Addr, sandbox6: Option<Ipv6Addr>) -> Result<(), TopologyError> {
    super::nft::host_table(id, sandbox, sandbox6).install()
}

/// One nftables table: its `NFPROTO_*` family and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableRef {
    pub(crate) family: u8,
    pub(crate) name: String,
}

/// Every nftables table (all families) in the calling thread's namespace.
pub(crate) fn list_tables() -> Result<Vec<TableRef>, TopologyError> {
    let list = || -> io::Result<Vec<TableRef>> {
        let socket = mnl::Socket::new(mnl::Bus::Netfilter)?;
        let portid = socket.portid();
        let sequence = 0;
        socket.send(&nftnl::table::get_tables_nlmsg(sequence))?;
        receive_dump(&socket, sequence, portid, parse_table_messages)
    };
    list().map_err(nft_error("list tables".into()))
}

/// Receives the answers to a dump request sent on `socket` until the
/// kernel says it is done, parsing each batch with `parse`. mnl checks
/// sequence, port and NLMSG_ERROR and tells when the dump is done.
pub(crate) fn receive_dump<T>(socket: &mnl::Socket, sequence: u32, portid: u32, parse: impl Fn(&[u8]) -> Vec<T>) -> io::Result<Vec<T>> {
    let mut found = Vec::new();
    let mut buffer = vec![0; nftnl::nft_nlmsg_maxsize() as usize];
    loop {
        let length = socket.recv_raw(&mut buffer[..])?;
        if length == 0 {
            break;
        }
        let received = &buffer[..length];
        found.extend(parse(received));
        match mnl::cb_run(received, sequence, portid)? {
            mnl::CbResult::Stop => break,
            mnl::CbResult::Ok => {}
        }
    }
    Ok(found)
}

/// The tables in a buffer of netlink messages from an nftables table dump
/// (`NFT_MSG_NEWTABLE` messages: nlmsghdr, nfgenmsg, then attributes).
/// Anything malformed is skipped; the kernel is the only sender.
fn parse_table_messages(mut bytes: &[u8]) -> Vec<TableRef> {
    const NLMSG_HEADER: usize = 16;
    const NFGENMSG: usize = 4;
    const NFT_MSG_NEWTABLE: u16 = 0;
    const NFNL_SUBSYS_NFTABLES: u16 = 10;
    const NFTA_TABLE_NAME: u16 = 1;
    let mut tables = Vec::new();
    while bytes.len() >= NLMSG_HEADER {
        let length = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        let kind = u16::from_ne_bytes([bytes[4], bytes[5]]);
        if length < NLMSG_HEADER || length > bytes.len() {
            break;
        }
        let message = &bytes[..length];
        if kind == (NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWTABLE) && message.len() >= NLMSG_HEADER + NFGENMSG {
            let family = message[NLMSG_HEADER];
            let mut attributes = &message[NLMSG_HEADER + NFGENMSG..];
            while attributes.len() >= 4 {
                let attribute_length = u16::from_ne_bytes([attributes[0], attributes[1]]) as usize;
                let attribute_kind = u16::from_ne_bytes([attributes[2], attributes[3]]) & 0x3fff;
                if attribute_length < 4 || attribute_length > attributes.len() {
                    break;
                }
                if attribute_kind == NFTA_TABLE_NAME {
                    let value = &attributes[4..attribute_length];
                    let value = value.split(|b| *b == 0).next().unwrap_or_default();
                    if let Ok(name) = std::str::from_utf8(value) {
                        tables.push(TableRef { family, name: name.to_string() });
                    }
                }
                let padded = (attribute_length + 3) & !3;
                attributes = attributes.get(padded..).unwrap_or_default();
            }
        }
        let padded = (length + 3) & !3;
        bytes = bytes.get(padded..).unwrap_or_default();
    }
    tables
}

fn sidecar_of(table: &TableRef) -> Option<SidecarId> {
    table.name.strip_prefix(NAT_TABLE_PREFIX)?.parse().ok()
}

/// Sidecar IDs that own a NAT table in the calling thread's namespace.
pub(crate) fn owned_tables() -> Result<Vec<SidecarId>, TopologyError> {
    let mut ids: Vec<SidecarId> = list_tables()?.iter().filter_map(sidecar_of).collect();
    ids.sort();
    ids.dedup();
    Ok(ids)
}

/// Deletes, in one batch, the NAT tables (whatever their family) of every
/// Sidecar ID that `remove` accepts, and returns those IDs. Runs in the host
/// namespace.
pub(crate) fn remove_where(remove: impl Fn(SidecarId) -> bool) -> Result<Vec<SidecarId>, TopologyError> {
    let doomed: Vec<(SidecarId, ProtoFamily, CString)> = list_tables()?
        .iter()
        .filter_map(|table| {
            let id = sidecar_of(table).filter(|id| remove(*id))?;
            let family = match table.family {
                NFPROTO_INET => ProtoFamily::Inet,
                NFPROTO_IPV4 => ProtoFamily::Ipv4,
                NFPROTO_IPV6 => ProtoFamily::Ipv6,
                _ => return None,
            };
            Some((id, family, CString::new(table.name.as_str()).ok()?))
        })
        .collect();
    if doomed.is_empty() {
        return Ok(Vec::new());
    }
    let tables: Vec<Table> = doomed.iter().map(|(_, family, name)| Table::new(name as &CStr, *family)).collect();
    let mut batch = Batch::new();
    for table in &tables {
        batch.add(table, MsgType::Del);
    }
    let mut ids: Vec<SidecarId> = doomed.iter().map(|(id, _, _)| *id).collect();
    ids.sort();
    ids.dedup();
    let names: Vec<String> = ids.iter().map(|id| table_name(*id)).collect();
    send(&batch.finalize()).map_err(nft_error(format!("delete table(s) {}", names.join(", "))))?;
    Ok(ids)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One netlink attribute (length, kind, value, padding), for tests.
    pub(crate) fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut bytes = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        bytes.extend(kind.to_ne_bytes());
        bytes.extend(value);
        while bytes.len() % 4 != 0 {
            bytes.push(0);
        }
        bytes
    }

    fn table_message(kind: u16, family: u8, attributes: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = attributes.concat();
        let length = 16 + 4 + body.len();
        let mut bytes = (length as u32).to_ne_bytes().to_vec();
        bytes.extend(kind.to_ne_bytes());
        bytes.extend([0u8; 10]);
        bytes.extend([family, 0, 0, 0]);
        bytes.extend(body);
        bytes
    }

    #[test]
    fn table_dump_parsing_keeps_family_and_name_and_skips_the_rest() {
        let newtable = 10 << 8;
        let mut buffer = table_message(newtable, NFPROTO_INET, &[attribute(1, b"lazaret-abcdef0123\0"), attribute(2, &[0, 0, 0, 1])]);
        buffer.extend(table_message(newtable, NFPROTO_IPV4, &[attribute(2, &[0; 4]), attribute(1, b"filter\0")]));
        buffer.extend(table_message(3, 0, &[]));
        buffer.extend([1, 2, 3]);
        let tables = parse_table_messages(&buffer);
        assert_eq!(
            tables,
            vec![
                TableRef { family: NFPROTO_INET, name: "lazaret-abcdef0123".into() },
                TableRef { family: NFPROTO_IPV4, name: "filter".into() },
            ]
        );
        assert_eq!(sidecar_of(&tables[0]).map(|id| id.to_string()).as_deref(), Some("abcdef0123"));
        assert_eq!(sidecar_of(&tables[1]), None);
        // A length running past the buffer stops parsing instead of panicking.
        let mut truncated = table_message(newtable, NFPROTO_INET, &[attribute(1, b"x\0")]);
        truncated[0] = 200;
        assert!(parse_table_messages(&truncated).is_empty());
    }
}
