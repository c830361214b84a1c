//! nftables sets whose elements time out (the table's sets, and the
//! addresses the resolver opens in them), as `nftcodec` messages; the
//! kernel's acknowledgement of each is checked.
//!
//! Every function talks to the calling thread's namespace.

use std::net::IpAddr;
use std::time::Duration;

use super::nftcodec::{
    self as codec, Batch, NFPROTO_INET, NFT_MSG_DELSETELEM, NFT_MSG_GETSET, NFT_MSG_GETSETELEM, NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM,
    NFT_MSG_NEWTABLE, NFT_SET_CONSTANT, NFT_SET_INTERVAL, NFT_SET_MAP, NFT_SET_TIMEOUT, NLM_F_CREATE, SetDesc, attributes, be32_value,
    be64_value, find, string,
};
use super::{TopologyError, refused};

/// nft's datatype numbers for `ipv4_addr` and `ipv6_addr`.
const TYPE_IPADDR: u32 = 7;
const TYPE_IP6ADDR: u32 = 8;

/// One named set of addresses whose elements time out (`type
/// ipv4_addr|ipv6_addr; flags timeout;`), filled at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SetSpec {
    pub name: String,
    pub v4: bool,
}

fn set_payload(table: &str, set: &SetSpec, id: u32) -> Vec<u8> {
    let (key_type, key_len) = if set.v4 { (TYPE_IPADDR, 4) } else { (TYPE_IP6ADDR, 16) };
    codec::set(&SetDesc {
        table,
        name: &set.name,
        flags: NFT_SET_TIMEOUT,
        key_type,
        key_len,
        id,
        size: None,
        timeout_ms: None,
        counter: false,
    })
}

/// Creates table `inet NAME` (if missing) and its `sets`, with
/// `counting` also its counting sets (`refused`), in one transaction.
pub(crate) fn create_table_and_sets(table: &str, sets: &[SetSpec], counting: bool) -> Result<(), TopologyError> {
    let mut batch = Batch::new();
    batch.add(NFT_MSG_NEWTABLE, NLM_F_CREATE, NFPROTO_INET, &codec::table(table, None));
    for (index, set) in sets.iter().enumerate() {
        batch.add(NFT_MSG_NEWSET, NLM_F_CREATE, NFPROTO_INET, &set_payload(table, set, index as u32 + 1));
    }
    if counting {
        for (index, v4) in [true, false].into_iter().enumerate() {
            batch.add(NFT_MSG_NEWSET, NLM_F_CREATE, NFPROTO_INET, &refused::set_payload(table, v4, (sets.len() + index) as u32 + 1));
        }
    }
    codec::transact(&batch.finish())
        .map_err(|source| TopologyError::Io { action: format!("nftables: create the sets of table inet {table}"), source })
}

fn key(address: IpAddr) -> Vec<u8> {
    match address {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn element_list(table: &str, set: &str, address: IpAddr, timeout: Option<Duration>) -> Vec<u8> {
    let millis = timeout.map(|timeout| u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).max(1));
    codec::set_element(table, set, Some(&key(address)), millis)
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
    let mut batch = Batch::new();
    for element in elements {
        let timed = element_list(table, &element.set, element.address, Some(element.timeout));
        batch.add(NFT_MSG_NEWSETELEM, NLM_F_CREATE, NFPROTO_INET, &timed);
        batch.add(NFT_MSG_DELSETELEM, 0, NFPROTO_INET, &element_list(table, &element.set, element.address, None));
        batch.add(NFT_MSG_NEWSETELEM, NLM_F_CREATE, NFPROTO_INET, &timed);
    }
    codec::transact(&batch.finish())
        .map_err(|source| TopologyError::Io { action: format!("nftables: add set elements in table inet {table}"), source })
}

fn be32(value: Option<&[u8]>) -> Option<u32> {
    be32_value(value?)
}

/// What is wrong with table `inet TABLE`'s sets: a set missing, or not of
/// the expected key type, length and `timeout` flag.
pub(crate) fn set_differences(table: &str, sets: &[SetSpec], counting: bool) -> Result<Vec<String>, TopologyError> {
    let found = codec::dump(NFT_MSG_GETSET, NFPROTO_INET, &codec::table(table, None))
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

/// None may be set on a counting set.
const NFT_SET_INTERVAL_MAP_CONSTANT: u32 = NFT_SET_CONSTANT | NFT_SET_INTERVAL | NFT_SET_MAP;

/// The addresses in set `set` of table `inet TABLE` now, with the time each
/// has left (for `lazaret policy show` and the tests).
pub fn set_addresses(table: &str, set: &str) -> Result<Vec<(IpAddr, Option<Duration>)>, TopologyError> {
    let payload = codec::set_element(table, set, None, None);
    let messages = codec::dump(NFT_MSG_GETSETELEM, NFPROTO_INET, &payload)
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
            let expiration = find(element, 5).and_then(be64_value).map(Duration::from_millis);
            found.push((address, expiration));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::nftcodec::fixtures;
    use crate::topology::nftcodec::testing::{assert_same, hex};

    /// The same bytes as the raw encoder that came before `nftcodec`.
    #[test]
    fn messages_match_the_raw_encoder() {
        let sets = [SetSpec { name: "names4".into(), v4: true }, SetSpec { name: "names6_p22".into(), v4: false }];
        let mut batch = Batch::new();
        batch.add(NFT_MSG_NEWTABLE, NLM_F_CREATE, NFPROTO_INET, &codec::table("lazaret-locked", None));
        for (index, set) in sets.iter().enumerate() {
            batch.add(NFT_MSG_NEWSET, NLM_F_CREATE, NFPROTO_INET, &set_payload("lazaret-locked", set, index as u32 + 1));
        }
        for (index, v4) in [true, false].into_iter().enumerate() {
            batch.add(NFT_MSG_NEWSET, NLM_F_CREATE, NFPROTO_INET, &refused::set_payload("lazaret-locked", v4, index as u32 + 3));
        }
        assert_same(&batch.finish().bytes, &hex(fixtures::TABLE_AND_SETS), "create_table_and_sets");
        let mut batch = Batch::new();
        for (set, address) in [("names4", "192.0.2.1"), ("names6_p22", "2001:db8::7")] {
            let address: IpAddr = address.parse().expect("ip");
            let timed = element_list("lazaret-locked", set, address, Some(Duration::from_millis(90_500)));
            batch.add(NFT_MSG_NEWSETELEM, NLM_F_CREATE, NFPROTO_INET, &timed);
            batch.add(NFT_MSG_DELSETELEM, 0, NFPROTO_INET, &element_list("lazaret-locked", set, address, None));
            batch.add(NFT_MSG_NEWSETELEM, NLM_F_CREATE, NFPROTO_INET, &timed);
        }
        assert_same(&batch.finish().bytes, &hex(fixtures::PUT_ELEMENTS), "put_elements");
    }

    #[test]
    fn messages_are_well_formed() {
        let payload = set_payload("lazaret-locked", &SetSpec { name: "names4".into(), v4: true }, 1);
        let list = attributes(&payload).expect("attributes");
        assert_eq!(list.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 10]);
        assert_eq!(string(list[1].1), "names4");
        let element = element_list("t", "s", "192.0.2.1".parse().expect("ip"), Some(Duration::from_secs(2)));
        let elements = find(&element, 3).and_then(|e| find(e, 1)).expect("element");
        assert_eq!(find(elements, 1).and_then(|k| find(k, 1)), Some(&[192, 0, 2, 1][..]));
        assert_eq!(find(elements, 4), Some(&2000u64.to_be_bytes()[..]));
    }
}
