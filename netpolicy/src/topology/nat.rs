//! Source NAT on the host, over nftables netlink (nftnl + mnl; no `nft` command).
//!
//! Each Domain gets its own table, `ip lazaret-<SidecarId>`, holding one
//! `nat`/`postrouting` base chain that masquerades the sandbox's address.
//! Deleting that table removes exactly this Domain's rules and nothing else;
//! when the last Domain is gone no Lazaret table is left. Stale tables of
//! crashed runs are found by the Sidecar ID in their name.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::io;
use std::net::Ipv4Addr;

use nftnl::{Batch, Chain, ChainType, FinalizedBatch, Hook, MsgType, Policy, ProtoFamily, Rule, Table, nft_expr};

use super::{SidecarId, TopologyError};

/// Table names start with this; the Sidecar ID follows.
pub const NAT_TABLE_PREFIX: &str = "lazaret-";
/// Standard `srcnat` priority.
const SRCNAT_PRIORITY: i32 = 100;

fn nft_error(action: String) -> impl FnOnce(io::Error) -> TopologyError {
    move |source| TopologyError::Io { action: format!("nftables: {action}"), source }
}

/// The name of a Domain's NAT table.
pub fn table_name(id: SidecarId) -> String {
    format!("{NAT_TABLE_PREFIX}{id}")
}

fn c_name(text: String) -> Result<CString, TopologyError> {
    CString::new(text).map_err(|_| TopologyError::BadInterfaceName("nft name with NUL".into()))
}

/// Sends one batch and waits for the kernel's acknowledgements.
///
/// Once acknowledged the batch is committed, but closing an nftables socket
/// after a deletion waits for the kernel to free the deleted objects (an RCU
/// grace period, 5-35 ms here) that nothing needs to wait for. So the socket
/// lives on a helper thread (created on the calling thread, hence in its
/// network namespace) that reports the result first and closes afterwards.
fn send(batch: &FinalizedBatch) -> io::Result<()> {
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

/// Installs `ip saddr <sandbox> masquerade` for one Domain in table
/// `lazaret-<id>`. Must run on a thread inside the host namespace
/// ([`super::Netns::run`]); [`super::DomainNetwork`] calls it itself.
pub fn install(id: SidecarId, sandbox: Ipv4Addr) -> Result<(), TopologyError> {
    let name = c_name(table_name(id))?;
    let table = Table::new(&name, ProtoFamily::Ipv4);
    let mut chain = Chain::new(c"snat", &table);
    chain.set_hook(Hook::PostRouting, SRCNAT_PRIORITY);
    chain.set_type(ChainType::Nat);
    chain.set_policy(Policy::Accept);
    let mut rule = Rule::new(&chain);
    rule.add_expr(&nft_expr!(payload ipv4 saddr));
    rule.add_expr(&nft_expr!(cmp == sandbox));
    rule.add_expr(&nft_expr!(masquerade));
    let comment = c_name(format!("Lazaret sidecar {id}"))?;
    rule.set_comment(&comment).map_err(|reason| TopologyError::RouteBuild {
        prefix: crate::Prefix::host(sandbox.into()),
        reason: reason.to_string(),
    })?;
    let mut batch = Batch::new();
    batch.add(&table, MsgType::Add);
    batch.add(&chain, MsgType::Add);
    batch.add(&rule, MsgType::Add);
    send(&batch.finalize()).map_err(nft_error(format!("install masquerade for {sandbox} in table {}", table_name(id))))
}

/// Names of all nftables tables (every family) in the calling thread's namespace.
pub(crate) fn list_tables() -> Result<HashSet<CString>, TopologyError> {
    let list = || -> io::Result<HashSet<CString>> {
        let socket = mnl::Socket::new(mnl::Bus::Netfilter)?;
        let portid = socket.portid();
        let sequence = 0;
        socket.send(&nftnl::table::get_tables_nlmsg(sequence))?;
        let mut tables = HashSet::new();
        let mut buffer = vec![0; nftnl::nft_nlmsg_maxsize() as usize];
        loop {
            let length = socket.recv_raw(&mut buffer[..])?;
            if length == 0 {
                break;
            }
            match mnl::cb_run2(&buffer[..length], sequence, portid, nftnl::table::get_tables_cb, &mut tables)? {
                mnl::CbResult::Stop => break,
                mnl::CbResult::Ok => {}
            }
        }
        Ok(tables)
    };
    list().map_err(nft_error("list tables".into()))
}

/// Sidecar IDs that own a NAT table in the calling thread's namespace.
pub(crate) fn owned_tables() -> Result<Vec<SidecarId>, TopologyError> {
    Ok(list_tables()?
        .iter()
        .filter_map(|name| name.to_str().ok()?.strip_prefix(NAT_TABLE_PREFIX)?.parse().ok())
        .collect())
}

/// Deletes one Domain's NAT table, if present. Runs in the host namespace.
pub(crate) fn remove(id: SidecarId) -> Result<(), TopologyError> {
    if !owned_tables()?.contains(&id) {
        return Ok(());
    }
    let name = c_name(table_name(id))?;
    let table = Table::new(&name as &CStr, ProtoFamily::Ipv4);
    let mut batch = Batch::new();
    batch.add(&table, MsgType::Del);
    send(&batch.finalize()).map_err(nft_error(format!("delete table {}", table_name(id))))
}
