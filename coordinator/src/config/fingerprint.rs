//! Configuration Fingerprint and display renderings.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use lazaret_netpolicy::Prefix;

use super::{Config, ConfigError, EscalationSettings, Located, Profile, RunscSettings};

/// Version tag hashed into every fingerprint; bump it when the canonical form
/// changes meaning.
const FINGERPRINT_FORMAT: &str = "lazaret-config-fingerprint-v2";

/// The Configuration Fingerprint: lowercase hex SHA-256 of the canonical
/// validated configuration of one Domain. Sessions whose fingerprint differs
/// from the running Domain's must not join it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The 64 lowercase hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a Domain's behaviour depends on. Sets are sorted; spans, the file
/// name, `default_profile` and other profiles are left out.
#[derive(Serialize)]
struct Canonical<'a> {
    format: &'static str,
    storage_root: &'a Path,
    runtime_dir: Option<&'a Path>,
    runsc: &'a RunscSettings,
    /// The profile's effective escalation settings (global rules, then its
    /// own; rule order is meaningful).
    escalation: &'a EscalationSettings,
    /// Only when configured, so a default `[network]` keeps older fingerprints.
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<&'a super::NetworkSettings>,
    profile_name: &'a str,
    image: &'a str,
    command: &'a [String],
    isolate_gitignored: bool,
    persistent_dirs: Vec<&'a PathBuf>,
    allow_egress: Vec<&'a Located<Prefix>>,
    deny_egress: Vec<&'a Located<Prefix>>,
    /// Only when locked or naming names, so open profiles keep older fingerprints.
    #[serde(skip_serializing_if = "super::EgressMode::is_open")]
    egress: super::EgressMode,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    allow_names: Vec<&'a Located<super::AllowName>>,
    ipv6: Option<bool>,
    /// Effective resolvers: the profile's, else the top-level list.
    dns: &'a [IpAddr],
    env: &'a std::collections::BTreeMap<String, super::EnvValue>,
    volumes: &'a [Located<super::Volume>],
    /// Only when set, so profiles without it keep older fingerprints.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    profile_state: Vec<&'a Located<super::StateEntry>>,
    user: super::UserChoice,
    hostname: Option<&'a str>,
    memory_limit: Option<u64>,
    pids_limit: Option<u64>,
    /// Only when set, so profiles without setup keep older fingerprints.
    #[serde(skip_serializing_if = "<[Vec<String>]>::is_empty")]
    setup: &'a [Vec<String>],
}

fn sorted<T: Ord>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut items: Vec<T> = items.into_iter().collect();
    items.sort();
    items
}

pub(crate) fn fingerprint(config: &Config, profile: &Profile) -> Result<Fingerprint, ConfigError> {
    let canonical = Canonical {
        format: FINGERPRINT_FORMAT,
        storage_root: &config.storage_root,
        runtime_dir: config.runtime_dir.as_deref(),
        runsc: &config.runsc,
        escalation: &profile.escalation,
        network: (config.network != super::NetworkSettings::default()).then_some(&config.network),
        profile_name: &profile.name,
        image: &profile.image,
        command: &profile.command,
        isolate_gitignored: profile.isolate_gitignored,
        persistent_dirs: sorted(&profile.persistent_dirs),
        allow_egress: sorted(&profile.allow_egress),
        deny_egress: sorted(&profile.deny_egress),
        egress: profile.egress,
        allow_names: sorted(&profile.allow_names),
        ipv6: profile.ipv6,
        dns: profile.effective_dns(config),
        env: &profile.env,
        volumes: &profile.volumes,
        profile_state: sorted(&profile.profile_state),
        user: profile.user,
        hostname: profile.hostname.as_deref(),
        memory_limit: profile.memory_limit,
        pids_limit: profile.pids_limit,
        setup: &profile.setup,
    };
    let bytes = serde_json::to_vec(&canonical).map_err(|error| ConfigError::Render { message: error.to_string() })?;
    Ok(Fingerprint(hex::encode(Sha256::digest(&bytes))))
}

pub(crate) fn render_toml(config: &Config) -> Result<String, ConfigError> {
    let render_error = |message: String| ConfigError::Render { message };
    let mut table = toml::Table::try_from(config).map_err(|error| render_error(error.to_string()))?;
    // `allow_egress` is one list in the file, prefixes and names mixed; the
    // model keeps the names apart. Written back as one, the output parses.
    if let Some(toml::Value::Table(profiles)) = table.get_mut("profiles") {
        for (_, profile) in profiles.iter_mut() {
            let toml::Value::Table(profile) = profile else { continue };
            let Some(toml::Value::Array(names)) = profile.remove("allow_egress_names") else { continue };
            match profile.entry("allow_egress").or_insert_with(|| toml::Value::Array(Vec::new())) {
                toml::Value::Array(entries) => entries.extend(names),
                _ => return Err(render_error("allow_egress is not a list".to_string())),
            }
        }
    }
    let body = toml::to_string_pretty(&table).map_err(|error| render_error(error.to_string()))?;
    Ok(format!("# Validated configuration from {} (defaults filled in)\n{body}", config.file.display()))
}

pub(crate) fn render_json(config: &Config) -> Result<String, ConfigError> {
    let render_error = |error: serde_json::Error| ConfigError::Render { message: error.to_string() };
    let mut value = serde_json::to_value(config).map_err(render_error)?;
    if let serde_json::Value::Object(map) = &mut value {
        map.insert("file".to_string(), serde_json::Value::String(config.file.display().to_string()));
    }
    serde_json::to_string_pretty(&value).map_err(render_error)
}
