//! Source NAT on the host, over nftables netlink (`nftcodec`; no `nft` command).
//!
//! Each Domain gets its own table, `inet lazaret-<SidecarId>`, holding one
//! `nat`/`postrouting` base chain that masquerades the sandbox's IPv4 address
//! and, for an IPv6-enabled Domain, its IPv6 address, and the Domain's
//! forward guard (see `nft::host_table`). Deleting that table
//! removes exactly this Domain's rules and nothing else; when the last Domain
//! is gone no Lazaret table is left. Stale tables of crashed runs are found
//! by the Sidecar ID in their name.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

pub use super::nft::{NAT_TABLE_PREFIX, table_name};
use super::nftcodec::{self as codec, Batch, NFPROTO_INET, NFPROTO_IPV4, NFPROTO_IPV6, NFT_MSG_DELTABLE, TableRef, Transaction};
use super::{SidecarId, TopologyError};

fn nft_error(action: String) -> impl FnOnce(io::Error) -> TopologyError {
    move |source| TopologyError::Io { action: format!("nftables: {action}"), source }
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

/// Every nftables table (all families) in the calling thread's namespace.
pub(crate) fn list_tables() -> Result<Vec<TableRef>, TopologyError> {
    codec::list_tables().map_err(nft_error("list tables".into()))
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

/// One transaction deleting `tables`.
fn delete(tables: &[TableRef]) -> Transaction {
    let mut batch = Batch::new();
    for table in tables {
        // Name and flags 0, as libnftnl sent a table to delete.
        batch.add(NFT_MSG_DELTABLE, 0, table.family, &codec::table(&table.name, Some(0)));
    }
    batch.finish()
}

/// Deletes, in one batch, the NAT tables (whatever their family) of every
/// Sidecar ID that `remove` accepts, and returns those IDs. Runs in the host
/// namespace.
pub(crate) fn remove_where(remove: impl Fn(SidecarId) -> bool) -> Result<Vec<SidecarId>, TopologyError> {
    let doomed: Vec<(SidecarId, TableRef)> = list_tables()?
        .into_iter()
        .filter_map(|table| {
            let id = sidecar_of(&table).filter(|id| remove(*id))?;
            // The families a Lazaret table can have: `inet` now, `ip` for
            // tables left by builds before IPv6 support.
            [NFPROTO_INET, NFPROTO_IPV4, NFPROTO_IPV6].contains(&table.family).then_some((id, table))
        })
        .collect();
    if doomed.is_empty() {
        return Ok(Vec::new());
    }
    let tables: Vec<TableRef> = doomed.iter().map(|(_, table)| table.clone()).collect();
    let mut ids: Vec<SidecarId> = doomed.iter().map(|(id, _)| *id).collect();
    ids.sort();
    ids.dedup();
    let names: Vec<String> = ids.iter().map(|id| table_name(*id)).collect();
    codec::transact_detached(delete(&tables)).map_err(nft_error(format!("delete table(s) {}", names.join(", "))))?;
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::nftcodec::fixtures;
    use crate::topology::nftcodec::testing::{assert_same, hex};

    #[test]
    fn stale_tables_are_found_by_their_sidecar_id() {
        let table = |family, name: &str| TableRef { family, name: name.into() };
        assert_eq!(sidecar_of(&table(NFPROTO_INET, "lazaret-abcdef0123")).map(|id| id.to_string()).as_deref(), Some("abcdef0123"));
        assert_eq!(sidecar_of(&table(NFPROTO_IPV4, "filter")), None);
        assert_eq!(sidecar_of(&table(NFPROTO_INET, "lazaret-filter")), None);
    }

    /// `remove_where`'s batch, the same bytes as libnftnl's.
    #[test]
    fn deleting_tables_matches_libnftnl() {
        let tables = [(NFPROTO_INET, "lazaret-abcdef0123"), (NFPROTO_IPV4, "lazaret-0123456789"), (NFPROTO_IPV6, "lazaret-fedcba9876")]
            .map(|(family, name)| TableRef { family, name: name.into() });
        assert_same(&delete(&tables).bytes, &hex(fixtures::DELETE_TABLES), "delete tables");
    }
}
