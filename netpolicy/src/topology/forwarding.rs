//! Host-side forwarding, switched on per interface and restored after the
//! last Domain: IPv4's `conf/<if>/forwarding`, and IPv6's
//! `conf/<if>/force_forwarding` (Linux 6.17+). IPv6's older global switch
//! (`conf/all/forwarding`) is never touched: it would also turn the whole host
//! into a router that ignores router advertisements on every interface.
//! The original values live in a small JSON file (under an exclusive lock)
//! so that the last Domain's coordinator, or the next start after a crash,
//! can restore them even if another process changed them.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use super::TopologyError;

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct ForwardingRecord {
    /// Interface name -> IPv4 forwarding value before Lazaret touched it.
    originals: BTreeMap<String, String>,
    /// Interface name -> IPv6 force_forwarding value before Lazaret touched it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    ipv6_originals: BTreeMap<String, String>,
}

impl ForwardingRecord {
    fn originals(&mut self, switch: Switch) -> &mut BTreeMap<String, String> {
        match switch {
            Switch::Ipv4 => &mut self.originals,
            Switch::Ipv6 => &mut self.ipv6_originals,
        }
    }
}

/// A per-interface forwarding switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Switch {
    /// `/proc/sys/net/ipv4/conf/<if>/forwarding`.
    Ipv4,
    /// `/proc/sys/net/ipv6/conf/<if>/force_forwarding`.
    Ipv6,
}

/// Where IPv6's per-interface switch is, to tell whether the kernel has it.
pub(crate) const IPV6_FORCE_FORWARDING_ALL: &str = "/proc/sys/net/ipv6/conf/all/force_forwarding";
/// IPv6's global forwarding switch.
pub(crate) const IPV6_GLOBAL_FORWARDING: &str = "/proc/sys/net/ipv6/conf/all/forwarding";

fn io_error(action: String) -> impl FnOnce(std::io::Error) -> TopologyError {
    move |source| TopologyError::Io { action, source }
}

/// The switch's sysctl for `interface`, refusing names that are not plain.
fn sysctl_path(switch: Switch, interface: &str) -> Result<PathBuf, TopologyError> {
    if interface.is_empty() || interface.len() > 15 || interface.contains('/') || interface == "." || interface == ".." {
        return Err(TopologyError::BadInterfaceName(interface.to_string()));
    }
    Ok(PathBuf::from(match switch {
        Switch::Ipv4 => format!("/proc/sys/net/ipv4/conf/{interface}/forwarding"),
        Switch::Ipv6 => format!("/proc/sys/net/ipv6/conf/{interface}/force_forwarding"),
    }))
}

/// Reads a sysctl of the calling thread's network namespace.
pub(crate) fn read_sysctl(path: &Path) -> Result<String, TopologyError> {
    std::fs::read_to_string(path).map(|v| v.trim().to_string()).map_err(io_error(format!("read {}", path.display())))
}

/// Writes a sysctl of the calling thread's network namespace.
pub(crate) fn write_sysctl(path: &Path, value: &str) -> Result<(), TopologyError> {
    std::fs::write(path, value).map_err(io_error(format!("write {} to {}", value, path.display())))
}

fn locked<R>(state_file: &Path, work: impl FnOnce(&mut ForwardingRecord) -> Result<(R, bool), TopologyError>) -> Result<R, TopologyError> {
    if let Some(parent) = state_file.parent() {
        std::fs::create_dir_all(parent).map_err(io_error(format!("create {}", parent.display())))?;
    }
    let lock_path = state_file.with_extension("lock");
    let lock_file: File = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_error(format!("open {}", lock_path.display())))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| TopologyError::Namespace { action: "flock forwarding state", errno })?;
    let mut record: ForwardingRecord = match std::fs::read(state_file) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|error| TopologyError::StateFile { path: state_file.to_path_buf(), reason: error.to_string() })?,
        Err(error) if error.kind() == ErrorKind::NotFound => ForwardingRecord::default(),
        Err(source) => return Err(TopologyError::Io { action: format!("read {}", state_file.display()), source }),
    };
    let (result, keep) = work(&mut record)?;
    if keep && !(record.originals.is_empty() && record.ipv6_originals.is_empty()) {
        let text = serde_json::to_vec_pretty(&record)
            .map_err(|error| TopologyError::StateFile { path: state_file.to_path_buf(), reason: error.to_string() })?;
        let temporary = state_file.with_extension("tmp");
        std::fs::write(&temporary, text).map_err(io_error(format!("write {}", temporary.display())))?;
        std::fs::rename(&temporary, state_file).map_err(io_error(format!("rename to {}", state_file.display())))?;
    } else {
        match std::fs::remove_file(state_file) {
            Ok(()) => {}
            Err(error) if error.kind() == ErrorKind::NotFound => {}
            Err(source) => return Err(TopologyError::Io { action: format!("remove {}", state_file.display()), source }),
        }
    }
    Ok(result)
}

/// Turns `switch` on for `interfaces`, recording each original value once
/// (before changing it). Must run on a thread inside the host namespace.
pub(crate) fn enable(state_file: &Path, switch: Switch, interfaces: &[String]) -> Result<(), TopologyError> {
    locked(state_file, |record| {
        for interface in interfaces {
            let path = sysctl_path(switch, interface)?;
            if !record.originals(switch).contains_key(interface) {
                let original = read_sysctl(&path)?;
                record.originals(switch).insert(interface.clone(), original);
            }
        }
        Ok(((), true))
    })?;
    // Written only after the originals are safely on disk; a concurrent
    // `restore_unless` sees our uplink and leaves the values alone.
    for interface in interfaces {
        write_sysctl(&sysctl_path(switch, interface)?, "1")?;
    }
    Ok(())
}

/// Unless `still_needed()` (evaluated under the lock) says otherwise, restores
/// every recorded original value and forgets them. Interfaces that no longer
/// exist are skipped. Must run on a thread inside the host namespace.
pub(crate) fn restore_unless(state_file: &Path, still_needed: impl FnOnce() -> Result<bool, TopologyError>) -> Result<(), TopologyError> {
    locked(state_file, |record| {
        if still_needed()? {
            return Ok(((), true));
        }
        for switch in [Switch::Ipv4, Switch::Ipv6] {
            for (interface, original) in record.originals(switch).iter() {
                let path = sysctl_path(switch, interface)?;
                if path.exists() {
                    write_sysctl(&path, original)?;
                }
            }
            record.originals(switch).clear();
        }
        Ok(((), false))
    })
}

/// Turns `switch` on for one Lazaret-owned interface (dies with the interface).
pub(crate) fn enable_owned(switch: Switch, interface: &str) -> Result<(), TopologyError> {
    write_sysctl(&sysctl_path(switch, interface)?, "1")
}
