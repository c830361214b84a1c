//! The Domain's health watch (issue 17, fault injection): what the host or
//! another root process can break underneath a running Domain, checked by
//! the supervisor every [`INTERVAL`].
//!
//! - The sandbox (runsc's sandbox process, or its gofer, without which
//!   the sandbox exits) gone: nothing inside runs any more. Sessions are
//!   told and the Domain stops (no grace: there is nothing to send SIGTERM
//!   to).
//! - The Domain's network changed underneath it: a veth of the sidecar
//!   (`lzup0` towards the host, `lzs0` towards the sandbox) or the host's
//!   nftables table (`inet lazaret-<SidecarId>`: NAT and the forward guard)
//!   removed. The policy the Domain was started with no longer holds, so it
//!   is not repaired in place: sessions are told and the Domain stops.
//! - The Domain Root's filesystem full, or the journal broken by a write
//!   that failed: a Domain that cannot journal its steps must not take
//!   more. Sessions are told and the Domain stops while the journal can
//!   still record its teardown.
//! - The socket (`coordinator.sock`) removed or replaced: nothing is
//!   wrong with the Domain, only new sessions cannot reach it. It is
//!   published again and sessions are told.
//!
//! Each finding is one line to every session (the client prints it as
//! `lazaret: LINE`) and one in the coordinator's log.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::Duration;

use lazaret_protocol::wire::CoordinatorMessage;

use super::domain::{Domain, Live, Phase, StopRequest};
use super::log;

/// How often the supervisor checks.
pub(super) const INTERVAL: Duration = Duration::from_millis(500);

/// Below this much free space on the Domain Root's filesystem the Domain
/// stops: enough for its teardown's journal lines (a few hundred bytes
/// each, fsynced), far less than anything a Domain needs to run.
const MIN_FREE_BYTES: u64 = 1 << 20;

/// Grace for a Domain stopped by a fault it survives inside (network, disk):
/// agents get SIGTERM, then SIGKILL.
const FAULT_GRACE: Duration = Duration::from_secs(2);

/// What a check found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Finding {
    /// The Domain cannot go on: stop it, after telling sessions this line.
    Fatal { notice: String, grace: Duration },
    /// The socket is gone or is not ours: publish it again.
    SocketGone(String),
}

/// Runs every check (without the Domain's lock: they talk to the kernel).
pub(super) fn check(d: &Domain) -> Vec<Finding> {
    let mut findings = Vec::new();
    if let Some(f) = gofer(d).or_else(|| sandbox(d)) {
        findings.push(f);
    }
    findings.extend(network(d));
    if let Some(f) = disk(d) {
        findings.push(f);
    }
    if let Some(f) = socket(d) {
        findings.push(f);
    }
    findings
}

/// Acts on what [`check`] found, with the state locked.
pub(super) fn act(d: &Arc<Domain>, live: &mut Live, findings: Vec<Finding>) {
    if live.phase != Phase::Ready {
        return;
    }
    for finding in findings {
        match finding {
            Finding::Fatal { notice, grace } => {
                // The first fault decides; a stop already under way (a
                // `lazaret stop`, an earlier fault) has told sessions.
                if live.stop.is_none() {
                    log(&format!("fault: {notice}"));
                    live.stop = Some(StopRequest::because(grace, notice));
                    d.changed.notify_all();
                }
            }
            Finding::SocketGone(why) => {
                let notice = match republish(d, live) {
                    Ok(()) => format!("{why}; published it again"),
                    Err(e) => format!("{why}, and publishing it again failed ({e}): new sessions cannot join this Domain"),
                };
                log(&format!("fault: {notice}"));
                tell_sessions(live, &notice);
                if live.socket_ino.is_none() {
                    // Not published: stop asking every round.
                    live.socket_ino = Some(0);
                }
            }
        }
    }
}

fn tell_sessions(live: &Live, notice: &str) {
    // Not marked as told: this is no stop, a stop's notice still comes.
    for s in live.sessions.values() {
        s.link.send(&CoordinatorMessage::Notice { text: notice.to_string() });
    }
}

/// A session whose agent ended: if the sandbox died under it, it hears so
/// before its exit status (the supervisor may not have looked yet), and the
/// Domain stops.
pub(super) fn session_ended(d: &Domain, session: &str) {
    let Some(Finding::Fatal { notice, grace }) = gofer(d).or_else(|| sandbox(d)) else { return };
    let mut live = d.live();
    if live.stop.is_none() && live.phase == Phase::Ready {
        log(&format!("fault: {notice}"));
        live.stop = Some(StopRequest::because(grace, notice.clone()));
        d.changed.notify_all();
    }
    let notice = live.stop.as_ref().map(|s| s.notice.clone()).unwrap_or(notice);
    if live.notified.insert(session.to_string()) {
        if let Some(s) = live.sessions.get(session) {
            s.link.send(&CoordinatorMessage::Notice { text: notice });
        }
    }
}

/// runsc's gofer (the sandbox's file server), by the PID in runsc's state
/// file: without it the sandbox cannot open files, and it exits soon after.
fn gofer(d: &Domain) -> Option<Finding> {
    let state = d.dir.runsc_state().join(format!("{c}_sandbox:{c}.state", c = d.container));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(state).ok()?).ok()?;
    let pid = json.get("goferPid")?.as_i64().filter(|p| *p > 1)?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    if !is_gone(&stat) && !sigkill_pending(&status) {
        return None;
    }
    Some(Finding::Fatal {
        notice: format!("the sandbox {} died (its runsc gofer, PID {pid}, is gone); stopping the Domain", d.container),
        grace: Duration::ZERO,
    })
}

/// The sandbox process, by the PID runsc recorded (a PID of this PID
/// namespace): gone, or a zombie PID 1 has not reaped yet.
fn sandbox(d: &Domain) -> Option<Finding> {
    let pid = lazaret_runtime::runsc::read_pid_file(&d.run.sandbox_pid()).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw())).unwrap_or_default();
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.as_raw())).unwrap_or_default();
    // A sandbox SIGKILLed a moment ago may still be exiting when its
    // sessions' `runsc exec` already saw their connections close.
    if !is_gone(&stat) && !sigkill_pending(&status) {
        return None;
    }
    Some(Finding::Fatal {
        notice: format!("the sandbox {} died (its runsc sandbox process, PID {}, is gone); stopping the Domain", d.container, pid.as_raw()),
        grace: Duration::ZERO,
    })
}

/// Whether a process whose `/proc/PID/stat` reads `stat` (empty: no such
/// process) is gone: absent, or dead and not yet reaped.
fn is_gone(stat: &str) -> bool {
    // The command name is in parentheses and may hold anything.
    let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).unwrap_or("");
    matches!(state, "" | "Z" | "X" | "x")
}

/// Whether `/proc/PID/status` shows a SIGKILL pending (the process is
/// being killed; it may take a moment to exit).
fn sigkill_pending(status: &str) -> bool {
    let kill_bit = 1u64 << (libc::SIGKILL - 1);
    status
        .lines()
        .filter_map(|l| l.strip_prefix("SigPnd:").or_else(|| l.strip_prefix("ShdPnd:")))
        .filter_map(|v| u64::from_str_radix(v.trim(), 16).ok())
        .any(|mask| mask & kill_bit != 0)
}

/// The sidecar's two veths (in its namespace) and the host's table.
fn network(d: &Domain) -> Vec<Finding> {
    let mut missing = Vec::new();
    if let (Some(sidecar), Some(_)) = (&d.network.sidecar_ns, &d.network.sandbox_ns) {
        for link in [lazaret_netpolicy::topology::SIDECAR_UPLINK, lazaret_netpolicy::topology::SIDECAR_INNER_LINK] {
            let found = sidecar.run(|| Ok(nix::net::if_::if_nametoindex(link).is_ok()));
            if matches!(found, Ok(false)) {
                missing.push(format!("the sidecar's veth {link}"));
            }
        }
    }
    if let (Some(host), Some(id)) = (&d.network.host_ns, d.network.sidecar_id) {
        if let Ok(tables) = lazaret_netpolicy::topology::nat_tables(host) {
            if !tables.contains(&id) {
                missing.push(format!("the host's nftables table inet {}", lazaret_netpolicy::topology::nat::table_name(id)));
            }
        }
    }
    if missing.is_empty() {
        return Vec::new();
    }
    vec![Finding::Fatal {
        notice: format!("the Domain's network was changed underneath it ({} removed); stopping the Domain", missing.join(", ")),
        grace: FAULT_GRACE,
    }]
}

/// Free space on the Domain Root's filesystem, and the journal.
fn disk(d: &Domain) -> Option<Finding> {
    let root = d.ctx.paths.domain_root(&d.ctx.domain_id);
    if let Some(why) = d.live().journal.broken() {
        return Some(Finding::Fatal {
            notice: format!("the Domain's journal cannot be written ({why}); stopping the Domain"),
            grace: FAULT_GRACE,
        });
    }
    let vfs = nix::sys::statvfs::statvfs(&root).ok()?;
    let free = (vfs.blocks_available() as u64).saturating_mul(vfs.fragment_size() as u64);
    if free >= MIN_FREE_BYTES {
        return None;
    }
    Some(Finding::Fatal {
        notice: format!(
            "the Domain Root's filesystem is full ({} KiB left at {}); stopping the Domain while its journal can still record that",
            free / 1024,
            root.display()
        ),
        grace: FAULT_GRACE,
    })
}

/// The socket path still names the socket this coordinator listens on.
fn socket(d: &Domain) -> Option<Finding> {
    let ino = d.live().socket_ino?;
    if ino == 0 {
        return None;
    }
    let path = d.dir.socket();
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.ino() == ino => None,
        Ok(_) => Some(Finding::SocketGone(format!("the Domain's socket {} was replaced by another file", path.display()))),
        Err(_) => Some(Finding::SocketGone(format!("the Domain's socket {} was removed", path.display()))),
    }
}

/// Binds the socket again (as the publish stage does: mode 0600, owned by
/// the developer; the runtime directory is the developer's, 0700, and no
/// sandbox sees it) and serves it from an accept thread of its own. The
/// old listener stays open until teardown, unreachable.
fn republish(d: &Arc<Domain>, live: &mut Live) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let path = d.dir.socket();
    live.socket_ino = None;
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    nix::unistd::chown(&path, Some(d.ctx.developer.uid.into()), None)?;
    live.socket_ino = Some(std::fs::symlink_metadata(&path)?.ino());
    live.listener_fds.push(listener.as_raw_fd());
    let d2 = d.clone();
    let acceptor =
        std::thread::Builder::new().name("session accept".into()).spawn(move || super::domain::accept_sessions(&d2, listener))?;
    live.acceptors.push(acceptor);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_gone;

    #[test]
    fn a_process_is_gone_when_absent_or_a_zombie() {
        assert!(is_gone(""));
        assert!(is_gone("12 (runsc-sandbox) Z 1 12 12 0"));
        assert!(is_gone("12 (a) b) X 1"));
        assert!(!is_gone("12 (runsc-sandbox) S 1 12 12 0"));
        assert!(!is_gone("12 (x) Z) R 1"), "the state follows the last parenthesis");
    }

    #[test]
    fn a_pending_sigkill_is_seen_in_either_pending_set() {
        assert!(super::sigkill_pending("Name:\tx\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n"));
        assert!(super::sigkill_pending("SigPnd:\t0000000000000100\n"));
        assert!(!super::sigkill_pending("SigPnd:\t0000000000000002\nShdPnd:\t0000000000004000\n"));
        assert!(!super::sigkill_pending(""));
    }
}
