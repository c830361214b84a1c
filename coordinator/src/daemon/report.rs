//! What the coordinator tells about its Domain: `lazaret ls` status, the
//! `lazaret debug` report, and the refusals that explain themselves
//! (protocol version, changed configuration).

use std::fmt::Write as _;

use lazaret_protocol::wire::{CoordinatorMessage, DomainStatus, WIRE_VERSION};

use super::domain::Domain;

/// Why a client of another protocol version cannot talk to this Domain.
pub(super) fn version_mismatch(version: u32) -> String {
    format!(
        "this Domain's coordinator speaks protocol version {WIRE_VERSION}, the client {version}: use the same lazaret binary, or stop the Domain (`lazaret stop`) and start it again"
    )
}

/// [`version_mismatch`] as the answer to a one-shot request.
pub(super) fn version_refusal(version: u32) -> CoordinatorMessage {
    CoordinatorMessage::Refused { reason: version_mismatch(version), retry: false }
}

/// `lazaret ls`'s line for this Domain.
pub(super) fn status_of(d: &Domain) -> DomainStatus {
    let live = d.live();
    DomainStatus {
        domain: d.ctx.domain_id.to_string(),
        profile: d.ctx.profile.name.clone(),
        workspace: d.ctx.workspace.root().display().to_string(),
        state: live.journal.phase(),
        sessions: live.sessions.keys().cloned().collect(),
        uptime_secs: d.started.elapsed().as_secs(),
        sandbox: d.container.clone(),
        sidecar: d.network.sidecar.clone(),
        coordinator_pid: std::process::id(),
        pending: live.sessions.values().flat_map(|s| s.link.pending()).collect(),
    }
}

/// The destinations the Domain's sidecar refused recently, read from its
/// counting sets (`lazaret policy log`).
pub(super) fn refused_destinations(d: &Domain) -> Result<Vec<lazaret_protocol::wire::RefusedDestination>, String> {
    let Some(sidecar) = &d.network.sidecar_ns else {
        return Err("the Domain has no sidecar network namespace".into());
    };
    let found = lazaret_netpolicy::topology::refused_destinations(sidecar)
        .map_err(|e| format!("reading the sidecar's refused destinations: {e}"))?;
    Ok(found
        .into_iter()
        .map(|r| lazaret_protocol::wire::RefusedDestination {
            address: r.address.to_string(),
            protocol: r.protocol_name(),
            port: r.port,
            packets: r.packets,
            last_secs: r.last_ago.as_secs(),
        })
        .collect())
}

/// The fine-grained namespace view: namespace inodes of the sandbox process
/// and the sidecar, the sidecar's addresses, routes and rules (read over
/// netlink), and the mounts this coordinator made (its private mount
/// namespace).
pub(super) fn debug_report(d: &Domain) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "domain {} (profile {}, workspace {})", d.ctx.domain_id, d.ctx.profile.name, d.ctx.workspace.root().display());
    let _ = writeln!(out, "sandbox container {}", d.container);
    match lazaret_runtime::runsc::read_pid_file(&d.run.sandbox_pid()) {
        Ok(pid) => {
            let _ = writeln!(out, "sandbox process: PID {pid} (in the coordinator's PID namespace)");
            for ns in ["pid", "net", "mnt", "ipc", "uts", "cgroup", "user"] {
                let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|e| format!("? ({e})"));
                let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).map(|p| p.display().to_string()).unwrap_or_default();
                let _ = writeln!(out, "  {ns:<7} {theirs:<24} coordinator: {ours}");
            }
        }
        Err(e) => {
            let _ = writeln!(out, "sandbox process: unknown ({e})");
        }
    }
    let _ = writeln!(out, "sidecar {}", d.network.sidecar);
    for (label, ns) in [("sandbox netns", &d.network.sandbox_ns), ("sidecar netns", &d.network.sidecar_ns)] {
        match ns {
            Some(ns) => {
                let inode = ns.inode().map(|i| i.to_string()).unwrap_or_else(|e| format!("? ({e})"));
                let _ = writeln!(out, "{label}: net:[{inode}]");
                match lazaret_netpolicy::topology::debug_view(ns) {
                    Ok(view) => {
                        for l in view.lines() {
                            let _ = writeln!(out, "  {l}");
                        }
                    }
                    Err(e) => {
                        let _ = writeln!(out, "  cannot read it: {e}");
                    }
                }
            }
            None => {
                let _ = writeln!(out, "{label}: none");
            }
        }
    }
    let _ = writeln!(out, "mounts made by the coordinator (its private mount namespace):");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let run = d.run.path().display().to_string();
    let root = d.ctx.paths.domain_root(&d.ctx.domain_id).display().to_string();
    for l in mountinfo.lines().filter(|l| l.contains(&run) || l.contains(&root)) {
        let _ = writeln!(out, "  {l}");
    }
    out
}

/// Names the settings that differ between two rendered configurations, for
/// `profile`: the global keys and that profile's keys.
pub fn config_differences(ours: &str, theirs: &str, profile: &str) -> Vec<String> {
    use serde_json::Value;
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
    let (a, b) = (parse(ours), parse(theirs));
    let mut diffs = Vec::new();
    let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
    let mut top: Vec<String> = keys(&a).into_iter().chain(keys(&b)).collect();
    top.sort();
    top.dedup();
    for k in top {
        if k == "profiles" {
            let pa = a.get("profiles").and_then(|p| p.get(profile)).cloned().unwrap_or(Value::Null);
            let pb = b.get("profiles").and_then(|p| p.get(profile)).cloned().unwrap_or(Value::Null);
            diff_values(&format!("profiles.{profile}"), &pa, &pb, &mut diffs);
        } else {
            diff_values(&k, a.get(&k).unwrap_or(&Value::Null), b.get(&k).unwrap_or(&Value::Null), &mut diffs);
        }
    }
    diffs
}

fn diff_values(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    match (a.as_object(), b.as_object()) {
        (Some(oa), Some(ob)) => {
            let mut keys: Vec<&String> = oa.keys().chain(ob.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let null = serde_json::Value::Null;
                diff_values(&format!("{path}.{k}"), oa.get(k).unwrap_or(&null), ob.get(k).unwrap_or(&null), out);
            }
        }
        _ if a != b => out.push(path.to_string()),
        _ => {}
    }
}

/// Why a session whose configuration changed cannot join, naming what
/// changed and the fix.
pub(super) fn refusal_for_fingerprint(d: &Domain, theirs_fingerprint: &str, theirs: &str) -> String {
    let diffs = config_differences(&d.config_json, theirs, &d.ctx.profile.name);
    let what = if diffs.is_empty() { "settings outside the rendered configuration".to_string() } else { diffs.join(", ") };
    format!(
        "the configuration of profile {p:?} changed since its Domain started, so this session cannot join it (Configuration Fingerprint {theirs_fingerprint} instead of the running Domain's {old}; settings that differ: {what})\n  hint: stop the running Domain with `lazaret stop {p}` (its sessions end) and run again, or run with the configuration the Domain was started with",
        p = d.ctx.profile.name,
        old = d.fingerprint,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_global_and_profile_settings_only() {
        let ours = r#"{"dns":["1.1.1.1"],"profiles":{"a":{"command":["sh"],"env":{"X":"1"}},"b":{"command":["sh"]}}}"#;
        let theirs = r#"{"dns":["9.9.9.9"],"profiles":{"a":{"command":["sh"],"env":{"X":"2"},"hostname":"h"},"b":{"command":["bash"]}}}"#;
        assert_eq!(config_differences(ours, theirs, "a"), vec!["dns", "profiles.a.env.X", "profiles.a.hostname"]);
        assert!(config_differences(ours, ours, "a").is_empty());
    }

    #[test]
    fn a_version_refusal_names_both_versions_and_the_fix() {
        let text = version_mismatch(WIRE_VERSION + 1);
        assert!(text.contains(&format!("version {WIRE_VERSION}")), "{text}");
        assert!(text.contains(&format!("the client {}", WIRE_VERSION + 1)), "{text}");
        assert!(text.contains("lazaret stop"), "{text}");
    }
}
