//! nftables sets whose elements time out, over raw nf_tables netlink
//! messages: nftnl 0.9 can create a set but neither give it the `timeout`
//! flag nor give an element a timeout, and this crate has no `unsafe` to
//! reach libnftnl's setters. The messages are few and simple (a table, a
//! set, set elements), built here attribute by attribute; the kernel's
//! acknowledgement of each is checked.
//!
//! Every function talks to the calling thread's namespace.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use super::nft::{Message, NFNL_SUBSYS_NFTABLES, NFPROTO_INET, SetSpec, attributes, parse_messages};
use super::{TopologyError, refused};

const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
pub(super) const NFT_MSG_NEWTABLE: u16 = NFNL_SUBSYS_NFTABLES << 8;
pub(super) const NFT_MSG_NEWSET: u16 = NFNL_SUBSYS_NFTABLES << 8 | 9;
const NFT_MSG_GETSET: u16 = NFNL_SUBSYS_NFTABLES << 8 | 10;
pub(super) const NFT_MSG_NEWSETELEM: u16 = NFNL_SUBSYS_NFTABLES << 8 | 12;
pub(super) const NFT_MSG_GETSETELEM: u16 = NFNL_SUBSYS_NFTABLES << 8 | 13;
const NFT_MSG_DELSETELEM: u16 = NFNL_SUBSYS_NFTABLES << 8 | 14;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
pub(super) const NLM_F_CREATE: u16 = 0x400;
const NLM_F_DUMP: u16 = 0x300;
const NLA_F_NESTED: u16 = 0x8000;
const NFT_SET_TIMEOUT: u32 = 0x10;
/// nft's datatype numbers for `ipv4_addr` and `ipv6_addr`.
const TYPE_IPADDR: u32 = 7;
const TYPE_IP6ADDR: u32 = 8;

pub(super) fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + value.len() + 3);
    out.extend(((4 + value.len()) as u16).to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(value);
    out.resize((out.len() + 3) & !3, 0);
    out
}

pub(super) fn nested(kind: u16, inner: &[u8]) -> Vec<u8> {
    attr(kind | NLA_F_NESTED, inner)
}

pub(super) fn strz(text: &str) -> Vec<u8> {
    [text.as_bytes(), &[0]].concat()
}

/// One netlink message of the nf_tables subsystem.
fn message(kind: u16, flags: u16, sequence: u32, family: u8, payload: &[u8]) -> Vec<u8> {
    let length = 16 + 4 + payload.len();
    let mut out = Vec::with_capacity(length);
    out.extend((length as u32).to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(flags.to_ne_bytes());
    out.extend(sequence.to_ne_bytes());
    out.extend(0u32.to_ne_bytes());
    // nfgenmsg: family, NFNETLINK_V0, res_id (big endian; the subsystem for batches).
    let res_id: u16 = if kind == NFNL_MSG_BATCH_BEGIN || kind == NFNL_MSG_BATCH_END { NFNL_SUBSYS_NFTABLES } else { 0 };
    out.push(family);
    out.push(0);
    out.extend(res_id.to_be_bytes());
    out.extend(payload);
    out
}

/// Sends `messages` (each with `NLM_F_ACK`, numbered from 2) as one
/// transaction and checks every acknowledgement.
pub(super) fn transact(bodies: Vec<(u16, u16, Vec<u8>)>) -> io::Result<()> {
    let mut messages = vec![message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 1, 0, &[])];
    let mut sequences = Vec::new();
    for (index, (kind, flags, payload)) in bodies.into_iter().enumerate() {
        let sequence = 2 + index as u32;
        messages.push(message(kind, NLM_F_REQUEST | NLM_F_ACK | flags, sequence, NFPROTO_INET, &payload));
        sequences.push(sequence);
    }
    let end = 2 + sequences.len() as u32;
    messages.push(message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, 0, &[]));
    let socket = mnl::Socket::new(mnl::Bus::Netfilter)?;
    let portid = socket.portid();
    // One datagram: the kernel reads a batch from a single message.
    socket.send(&messages.concat())?;
    let mut buffer = vec![0; nftnl::nft_nlmsg_maxsize() as usize];
    let mut expected = sequences.into_iter();
    let mut next = expected.next();
    while let Some(sequence) = next {
        for received in socket.recv(&mut buffer[..])? {
            let received = received?;
            mnl::cb_run(received, sequence, portid)?;
            next = expected.next();
            if next.is_none() {
                break;
            }
        }
    }
    Ok(())
}

fn set_payload(table: &str, set: &SetSpec, id: u32) -> Vec<u8> {
    let (key_type, key_len) = if set.v4 { (TYPE_IPADDR, 4u32) } else { (TYPE_IP6ADDR, 16u32) };
    [
        attr(1, &strz(table)),
        attr(2, &strz(&set.name)),
        attr(3, &NFT_SET_TIMEOUT.to_be_bytes()),
        attr(4, &key_type.to_be_bytes()),
        attr(5, &key_len.to_be_bytes()),
        attr(10, &id.to_be_bytes()),
    ]
    .concat()
}

/// Creates table `inet NAME` (if missing) and its `sets`, with
/// `counting` also its counting sets (`refused`), in one transaction.
pub(crate) fn create_table_and_sets(table: &str, sets: &[SetSpec], counting: bool) -> Result<(), TopologyError> {
    let mut bodies = vec![(NFT_MSG_NEWTABLE, NLM_F_CREATE, attr(1, &strz(table)))];
    for (index, set) in sets.iter().enumerate() {
        bodies.push((NFT_MSG_NEWSET, NLM_F_CREATE, set_payload(table, set, index as u32 + 1)));
    }
    if counting {
        for (index, v4) in [true, false].into_iter().enumerate() {
            bodies.push((NFT_MSG_NEWSET, NLM_F_CREATE, refused::set_payload(table, v4, (sets.len() + index) as u32 + 1)));
        }
    }
    transact(bodies).map_err(|source| TopologyError::Io { action: format!("nftables: create the sets of table inet {table}"), source })
}

fn key(address: IpAddr) -> Vec<u8> {
    match address {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn element_list(table: &str, set: &str, address: IpAddr, timeout: Option<Duration>) -> Vec<u8> {
    let mut element = nested(1, &attr(1, &key(address)));
    if let Some(timeout) = timeout {
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).max(1);
        element.extend(attr(4, &millis.to_be_bytes()));
    }
    [attr(1, &strz(table)), attr(2, &strz(set)), nested(3, &nested(1, &element))].concat()
}

/// One element to (re)open: `address` in set `set` for `timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetElement {
    /// The set's name.
    pub set: String,
    /// The address.
    pub address: IpAddr,
    /// Its lifetime from now.
    pub timeout: Duration,
}

/// Puts every element into its set of table `inet TABLE` with its timeout
/// from now, in one transaction: added (a no-op if present), deleted and
/// added again, so an element already there gets the new timeout on every
/// kernel, and no packet ever sees it missing.
pub fn put_elements(table: &str, elements: &[SetElement]) -> Result<(), TopologyError> {
    if elements.is_empty() {
        return Ok(());
    }
    let mut bodies = Vec::new();
    for element in elements {
        let timed = element_list(table, &element.set, element.address, Some(element.timeout));
        bodies.push((NFT_MSG_NEWSETELEM, NLM_F_CREATE, timed.clone()));
        bodies.push((NFT_MSG_DELSETELEM, 0, element_list(table, &element.set, element.address, None)));
        bodies.push((NFT_MSG_NEWSETELEM, NLM_F_CREATE, timed));
    }
    transact(bodies).map_err(|source| TopologyError::Io { action: format!("nftables: add set elements in table inet {table}"), source })
}

pub(super) fn dump(request: u16, payload: &[u8]) -> io::Result<Vec<Message>> {
    let socket = mnl::Socket::new(mnl::Bus::Netfilter)?;
    let portid = socket.portid();
    let sequence = 1;
    socket.send(&message(request, NLM_F_REQUEST | NLM_F_DUMP, sequence, NFPROTO_INET, payload))?;
    super::nat::receive_dump(&socket, sequence, portid, parse_messages)
}

pub(super) fn find(bytes: &[u8], kind: u16) -> Option<&[u8]> {
    attributes(bytes)?.into_iter().find(|(k, _)| *k == kind).map(|(_, v)| v)
}

fn string(value: &[u8]) -> String {
    String::from_utf8_lossy(value.split(|b| *b == 0).next().unwrap_or_default()).to_string()
}

fn be32(value: Option<&[u8]>) -> Option<u32> {
    Some(u32::from_be_bytes(value?.get(..4)?.try_into().ok()?))
}

/// What is wrong with table `inet TABLE`'s sets: a set missing, or not of
/// the expected key type, length and `timeout` flag.
pub(crate) fn set_differences(table: &str, sets: &[SetSpec], counting: bool) -> Result<Vec<String>, TopologyError> {
    let found = dump(NFT_MSG_GETSET, &attr(1, &strz(table)))
        .map_err(|source| TopologyError::Io { action: format!("nftables: dump the sets of inet {table}"), source })?;
    let mut differences = Vec::new();
    for set in sets {
        let dumped = found.iter().filter(|m| m.family == NFPROTO_INET).find(|m| {
            find(&m.attributes, 1).map(string).as_deref() == Some(table) && find(&m.attributes, 2).map(string).as_deref() == Some(&set.name)
        });
        let (key_type, key_len) = if set.v4 { (TYPE_IPADDR, 4) } else { (TYPE_IP6ADDR, 16) };
        match dumped {
            None => differences.push(format!("set {} is missing", set.name)),
            Some(m) => {
                let flags = be32(find(&m.attributes, 3)).unwrap_or(0);
                let actual = (be32(find(&m.attributes, 4)), be32(find(&m.attributes, 5)), flags & NFT_SET_TIMEOUT != 0);
                if actual != (Some(key_type), Some(key_len), true) {
                    differences.push(format!(
                        "set {} is {actual:?} (key type, length, timeout), expected ({key_type}, {key_len}, true)",
                        set.name
                    ));
                }
            }
        }
    }
    for v4 in [true, false].into_iter().filter(|_| counting) {
        let name = refused::refused_set_name(v4);
        let dumped = found.iter().filter(|m| m.family == NFPROTO_INET).find(|m| {
            find(&m.attributes, 1).map(string).as_deref() == Some(table) && find(&m.attributes, 2).map(string).as_deref() == Some(name)
        });
        let key_type = if v4 { refused::KEY_TYPE_V4 } else { refused::KEY_TYPE_V6 };
        let expected = (Some(refused::NFT_SET_TIMEOUT | refused::NFT_SET_EVAL), Some(key_type), Some(refused::key_len(v4)));
        match dumped {
            None => differences.push(format!("set {name} is missing")),
            Some(m) => {
                let flags = be32(find(&m.attributes, 3))
                    .map(|f| f & (refused::NFT_SET_TIMEOUT | refused::NFT_SET_EVAL | NFT_SET_INTERVAL_MAP_CONSTANT));
                let actual = (flags, be32(find(&m.attributes, 4)), be32(find(&m.attributes, 5)));
                if actual != expected {
                    differences.push(format!("set {name} is {actual:?} (flags, key type, length), expected {expected:?}"));
                }
            }
        }
    }
    Ok(differences)
}

/// `NFT_SET_CONSTANT | NFT_SET_INTERVAL | NFT_SET_MAP`: none may be set on a counting set.
const NFT_SET_INTERVAL_MAP_CONSTANT: u32 = 0x2 | 0x4 | 0x8;

/// The addresses in set `set` of table `inet TABLE` now, with the time each
/// has left (for `lazaret policy show` and the tests).
pub fn set_addresses(table: &str, set: &str) -> Result<Vec<(IpAddr, Option<Duration>)>, TopologyError> {
    let payload = [attr(1, &strz(table)), attr(2, &strz(set))].concat();
    let messages = dump(NFT_MSG_GETSETELEM, &payload)
        .map_err(|source| TopologyError::Io { action: format!("nftables: dump set {set} of inet {table}"), source })?;
    let mut found = Vec::new();
    for m in messages.iter().filter(|m| m.kind == NFT_MSG_NEWSETELEM) {
        let Some(list) = find(&m.attributes, 3) else { continue };
        for (_, element) in attributes(list).unwrap_or_default() {
            let Some(value) = find(element, 1).and_then(|k| find(k, 1)) else { continue };
            let address = match value.len() {
                4 => IpAddr::from(<[u8; 4]>::try_from(value).unwrap_or_default()),
                16 => IpAddr::from(<[u8; 16]>::try_from(value).unwrap_or_default()),
                _ => continue,
            };
            let expiration =
                find(element, 5).and_then(|v| Some(u64::from_be_bytes(v.get(..8)?.try_into().ok()?))).map(Duration::from_millis);
            found.push((address, expiration));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_well_formed() {
        let payload = set_payload("lazaret-locked", &SetSpec { name: "names4".into(), v4: true }, 1);
        let list = attributes(&payload).expect("attributes");
        assert_eq!(list.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 10]);
        assert_eq!(string(list[1].1), "names4");
        let bytes = message(NFT_MSG_NEWSET, NLM_F_REQUEST, 7, NFPROTO_INET, &payload);
        let parsed = parse_messages(&bytes);
        assert_eq!(parsed.len(), 1);
        assert_eq!((parsed[0].kind, parsed[0].family), (NFT_MSG_NEWSET, NFPROTO_INET));
        let element = element_list("t", "s", "192.0.2.1".parse().expect("ip"), Some(Duration::from_secs(2)));
        let elements = find(&element, 3).and_then(|e| find(e, 1)).expect("element");
        assert_eq!(find(elements, 1).and_then(|k| find(k, 1)), Some(&[192, 0, 2, 1][..]));
        assert_eq!(find(elements, 4), Some(&2000u64.to_be_bytes()[..]));
    }
}
