//! The Domain's network: from the profile's egress settings to a compiled
//! policy, and the sidecar topology that enforces it (`lazaret_netpolicy`).
//!
//! A crashed run's sidecar is found again by the Sidecar ID it recorded in
//! the Domain's runtime directory, and only its resources are removed.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lazaret_netpolicy::topology::{
    self, DomainNetwork, HostWatcher, LockedResolver, Netns, ResolverSettings, SidecarId, TopologyConfig, TopologyError,
};
use lazaret_netpolicy::{CompiledPolicy, NameRule, PolicyError, PolicyInput};

use crate::config::{Config, EgressMode, Profile};

/// Errors from the network layer, with the fix where there is one.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The profile's policy does not compile.
    #[error("egress policy of profile {profile:?}:\n{source}")]
    Policy {
        /// The profile.
        profile: String,
        /// What is wrong (every problem, with config locations).
        source: PolicyError,
    },
    /// No usable DNS resolver.
    #[error(
        "DNS for profile {profile:?}: {source}\n  hint: set `dns = [\"ADDRESS\", ...]` in the profile or at the top of the configuration"
    )]
    Dns {
        /// The profile.
        profile: String,
        /// Why.
        source: lazaret_netpolicy::DnsError,
    },
    /// The profile asks for IPv6 on a host that has it switched off.
    #[error(
        "profile {profile:?} sets `ipv6 = true`, but {why}\n  hint: set `ipv6 = false` in the profile (or leave it out: the default follows the host), or enable IPv6 on the host"
    )]
    Ipv6Unavailable {
        /// The profile.
        profile: String,
        /// What is off.
        why: String,
    },
    /// Building, verifying or removing the topology failed.
    #[error("sidecar network: {0}")]
    Topology(#[from] TopologyError),
    /// The Sidecar ID record could not be read or written.
    #[error("{path}: {source}")]
    Record {
        /// The record file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// A topology error, with policy problems attributed to `profile`.
fn for_profile(profile: &Profile, e: TopologyError) -> NetworkError {
    match e {
        TopologyError::Policy(source) => NetworkError::Policy { profile: profile.name.clone(), source },
        other => NetworkError::Topology(other),
    }
}

/// Whether IPv6 is on for a profile that does not say: only where the host
/// has a global IPv6 route and can forward IPv6 for one interface (or is an
/// IPv6 router already), so the default never fails to start.
fn ipv6_default() -> Result<bool, NetworkError> {
    let host = Netns::of_current_thread()?;
    Ok(topology::host_has_global_ipv6_route(&host)? && topology::host_can_forward_ipv6(&host)?)
}

/// Why the host (the network namespace the coordinator runs in) cannot give
/// a Domain IPv6, if it cannot: `conf` is its `/proc/sys/net/ipv6/conf`.
/// Without this the sidecar's first IPv6 address on its host-side veth is
/// refused with a bare EACCES. `/proc/sys/net` shows the namespace of the
/// process that opens it, which is the coordinator's.
fn host_ipv6_off(conf: &Path) -> Option<String> {
    let knob = conf.join("default/disable_ipv6");
    match std::fs::read_to_string(&knob) {
        Ok(v) if v.trim() == "1" => {
            Some("IPv6 is disabled on this host for new interfaces (net.ipv6.conf.default.disable_ipv6 = 1)".to_string())
        }
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some("this host's kernel has IPv6 off (no /proc/sys/net/ipv6; booted with ipv6.disable=1?)".to_string())
        }
        // Unreadable: let the topology say what fails.
        Err(_) => None,
    }
}

/// The policy input of a profile: its allow/deny prefixes, its resolvers
/// (configured, else the host's resolv.conf) and its IPv6 choice (`ipv6`,
/// else [`ipv6_default`]).
pub fn policy_input(config: &Config, profile: &Profile) -> Result<PolicyInput, NetworkError> {
    let ipv6 = match profile.ipv6 {
        Some(true) => match host_ipv6_off(Path::new("/proc/sys/net/ipv6/conf")) {
            Some(why) => return Err(NetworkError::Ipv6Unavailable { profile: profile.name.clone(), why }),
            None => true,
        },
        Some(false) => false,
        None => ipv6_default()?,
    };
    let configured = profile.effective_dns(config);
    let dns: Vec<IpAddr> = if configured.is_empty() {
        lazaret_netpolicy::dns::host_resolvers()
            .map_err(|source| NetworkError::Dns { profile: profile.name.clone(), source })?
            .into_iter()
            // With IPv6 disabled for the Domain an IPv6 resolver is unusable.
            .filter(|resolver| ipv6 || resolver.is_ipv4())
            .collect()
    } else {
        configured.to_vec()
    };
    Ok(PolicyInput {
        allow: profile.allow_egress.iter().map(|p| (p.value, p.origin.clone())).collect(),
        deny: profile.deny_egress.iter().map(|p| (p.value, p.origin.clone())).collect(),
        dns,
        ipv6,
        locked: profile.egress == EgressMode::Locked,
        names: profile
            .allow_names
            .iter()
            .map(|name| NameRule { pattern: name.pattern.clone(), port: name.port, origin: name.origin.clone() })
            .collect(),
        ..PolicyInput::default()
    })
}

/// Topology settings: the configured pools, and forwarding state recorded
/// per host network namespace under the Storage Root.
pub fn topology_config(config: &Config, host: &Netns) -> Result<TopologyConfig, NetworkError> {
    let dir = config.storage_root.join("net");
    std::fs::create_dir_all(&dir).map_err(|source| NetworkError::Record { path: dir.clone(), source })?;
    let mut topology = TopologyConfig::new(dir.join(format!("forwarding-{}.json", host.inode()?)));
    if let Some(pool) = &config.network.pool {
        topology.pool = pool.value;
    }
    if let Some(pool6) = &config.network.pool6 {
        topology.pool6 = pool6.value;
    }
    Ok(topology)
}

/// The compiled policy a Domain of this profile would get on this host now
/// (for `lazaret policy show` and `explain`).
pub fn preview(config: &Config, profile: &Profile) -> Result<CompiledPolicy, NetworkError> {
    let input = policy_input(config, profile)?;
    let host = Netns::of_current_thread()?;
    let topo = topology_config(config, &host)?;
    topology::host_policy(&host, &topo, &input).map_err(|e| for_profile(profile, e))
}

/// Brings up the Domain's sidecar network after removing what a crashed
/// earlier run of the same Domain left (found through `record`, a file in
/// the Domain's runtime directory, which holds the Sidecar ID while the
/// Domain runs). The caller holds the Domain lock.
pub fn bring_up(config: &Config, profile: &Profile, record: &Path) -> Result<DomainNetwork, NetworkError> {
    let input = policy_input(config, profile)?;
    let host = Netns::of_current_thread()?;
    let topo = topology_config(config, &host)?;
    match std::fs::read_to_string(record) {
        Ok(text) => {
            if let Ok(stale) = text.trim().parse::<SidecarId>() {
                let removed = topology::remove_sidecars(&host, &[stale], &topo.forwarding_state_file)?;
                if !removed.is_empty() {
                    eprintln!("lazaret: removed the network of a crashed earlier run (sidecar {stale})");
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(NetworkError::Record { path: record.to_path_buf(), source }),
    }
    let network = DomainNetwork::create(&host, &topo, &input).map_err(|e| for_profile(profile, e))?;
    std::fs::write(record, format!("{}\n", network.sidecar_id()))
        .map_err(|source| NetworkError::Record { path: record.to_path_buf(), source })?;
    Ok(network)
}

/// Keeps the running Domain's policy in step with the host's addresses and
/// on-link networks (a VPN coming up, a new IPv6 temporary address): a
/// thread applies each change to the sidecar as it happens and writes what
/// changed, or why it could not, to `log`. The protocol journal has no event
/// for it (the model knows nothing of host addresses), so the coordinator's
/// log is the record. Dropping the watcher stops and joins the thread; it
/// holds the topology only as a `Weak`, so once dropped the start-up stack's
/// handle is the last one again.
pub fn watch_host(topology: &Arc<DomainNetwork>, log: impl Fn(&str) + Send + 'static) -> Result<HostWatcher, NetworkError> {
    Ok(HostWatcher::start(topology, move |result| match result {
        Ok(update) => log(&format!("host addresses changed; sidecar policy updated and verified: {update}")),
        Err(e) => log(&format!("host addresses changed, but updating the sidecar policy failed (retried at the next change): {e}")),
    })?)
}

/// The environment variable that lowers the resolver's TTL clamp (seconds,
/// at least 1; default 30): for the end-to-end tests, which need an answer
/// to expire within seconds. It can only make the Domain stricter (an
/// address closes sooner), so honouring it is safe.
pub const DNS_MIN_TTL_ENV: &str = "LAZARET_TEST_DNS_MIN_TTL";

/// Starts a locked Domain's resolver with its upstream resolvers.
pub fn start_resolver(topology: &DomainNetwork, log_file: PathBuf) -> Result<LockedResolver, NetworkError> {
    let mut settings = ResolverSettings::new(topology.policy().resolvers().to_vec());
    settings.log_file = Some(log_file);
    if let Some(seconds) = std::env::var(DNS_MIN_TTL_ENV).ok().and_then(|v| v.parse::<u64>().ok()).filter(|s| *s >= 1) {
        settings.clamp.min = settings.clamp.min.min(std::time::Duration::from_secs(seconds));
    }
    Ok(topology.start_resolver(settings)?)
}

/// Takes the Domain's network down and forgets its Sidecar ID.
pub fn tear_down(network: DomainNetwork, record: &Path) -> Result<(), NetworkError> {
    network.teardown()?;
    match std::fs::remove_file(record) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NetworkError::Record { path: record.to_path_buf(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::host_ipv6_off;

    #[test]
    fn ipv6_is_off_when_new_interfaces_get_it_disabled_or_the_kernel_has_none() {
        let conf = tempfile::tempdir().expect("tempdir");
        assert!(host_ipv6_off(&conf.path().join("absent")).is_some_and(|why| why.contains("ipv6.disable=1")));
        std::fs::create_dir(conf.path().join("default")).expect("mkdir");
        let knob = conf.path().join("default/disable_ipv6");
        std::fs::write(&knob, "1\n").expect("write");
        assert!(host_ipv6_off(conf.path()).is_some_and(|why| why.contains("disable_ipv6 = 1")));
        std::fs::write(&knob, "0\n").expect("write");
        assert_eq!(host_ipv6_off(conf.path()), None);
    }
}
