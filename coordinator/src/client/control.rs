//! The one-shot client commands: `lazaret ls`, `stop`, `stop --all`,
//! `debug`, and where a Domain's journal lives.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lazaret_protocol::wire::{ClientMessage, CoordinatorMessage, DomainStatus, WIRE_VERSION};

use crate::context::{Context, ContextError, load_config, require_root};
use crate::identity::Developer;
use crate::layout::DomainDir;
use crate::transport;

use super::ClientError;

/// How long a stopped Domain may take to go down beyond twice its grace.
const DOWN_LIMIT: Duration = Duration::from_secs(60);

/// Waits until nobody holds the Domain lock (its coordinator's processes
/// have all exited), up to `limit`. Returns whether it is free.
pub fn wait_unlocked(lock: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let free = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(lock) {
            Err(_) => true,
            // A shared, non-blocking probe, released when dropped.
            Ok(f) => nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock).is_ok(),
        };
        if free {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A one-shot request to the coordinator of the Domain in `dir`.
fn request(dir: &DomainDir, msg: &ClientMessage) -> Result<CoordinatorMessage, ClientError> {
    transport::request(&dir.socket(), msg).map_err(ClientError::from)
}

/// The runtime directory of the developer, from the configuration.
fn runtime_dir(config: Option<&Path>) -> Result<PathBuf, ClientError> {
    let developer = Developer::from_process().map_err(ContextError::from)?;
    let cfg = load_config(config, &developer).map_err(ContextError::from)?;
    Ok(cfg.runtime_dir(&developer))
}

/// Domains of this developer that have a published socket.
fn running_domains(runtime: &Path) -> Vec<DomainDir> {
    let mut dirs: Vec<DomainDir> = std::fs::read_dir(runtime)
        .map(|rd| rd.flatten().map(|e| DomainDir::new(e.path())).filter(|d| d.socket().exists()).collect())
        .unwrap_or_default();
    dirs.sort_by(|a, b| a.path().cmp(b.path()));
    dirs
}

/// The running Domain of `profile` on the workspace at `dir`.
fn running(config: Option<&Path>, profile: Option<&str>, dir: &Path) -> Result<(Context, DomainDir), ClientError> {
    require_root()?;
    let ctx = Context::resolve(config, profile, dir)?;
    let domain = DomainDir::new(ctx.domain_runtime_dir()?);
    if !domain.socket().exists() {
        return Err(ClientError::NotRunning { profile: ctx.profile.name.clone(), workspace: ctx.workspace.root().to_path_buf() });
    }
    Ok((ctx, domain))
}

/// `lazaret ls`: every running Domain of this developer.
pub fn list(config: Option<&Path>) -> Result<Vec<DomainStatus>, ClientError> {
    require_root()?;
    let mut out = Vec::new();
    for dir in running_domains(&runtime_dir(config)?) {
        if let Ok(CoordinatorMessage::Status(s)) = request(&dir, &ClientMessage::Status { version: WIRE_VERSION }) {
            out.push(s);
        }
    }
    Ok(out)
}

/// `lazaret stop PROFILE`: ends the Domain of `profile` on the workspace at
/// `dir` gracefully and waits until it is down. Returns its Domain ID.
pub fn stop(config: Option<&Path>, profile: Option<&str>, dir: &Path, grace: Duration) -> Result<String, ClientError> {
    let (ctx, domain) = running(config, profile, dir)?;
    stop_domain(&domain, grace)?;
    Ok(ctx.domain_id.to_string())
}

fn stop_domain(dir: &DomainDir, grace: Duration) -> Result<(), ClientError> {
    let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
    match request(dir, &ClientMessage::Stop { version: WIRE_VERSION, grace_ms })? {
        CoordinatorMessage::Stopping => {}
        CoordinatorMessage::Refused { reason, .. } => return Err(ClientError::Refused(reason)),
        other => return Err(ClientError::Unexpected { request: "stop", answer: format!("{other:?}") }),
    }
    if wait_unlocked(&dir.lock(), grace * 2 + DOWN_LIMIT) {
        Ok(())
    } else {
        Err(ClientError::StopTimeout { dir: dir.path().to_path_buf(), log: dir.log() })
    }
}

/// `lazaret stop --all`: stops every running Domain of this developer;
/// returns the Domain directories stopped.
pub fn stop_all(config: Option<&Path>, grace: Duration) -> Result<Vec<PathBuf>, ClientError> {
    require_root()?;
    let mut stopped = Vec::new();
    let mut failures = Vec::new();
    for dir in running_domains(&runtime_dir(config)?) {
        match stop_domain(&dir, grace) {
            Ok(()) => stopped.push(dir.path().to_path_buf()),
            Err(e) => failures.push((dir.path().to_path_buf(), e)),
        }
    }
    if failures.is_empty() { Ok(stopped) } else { Err(ClientError::StopAll(failures)) }
}

/// `lazaret debug PROFILE`: the coordinator's view of namespaces, routes
/// and mounts.
pub fn debug(config: Option<&Path>, profile: Option<&str>, dir: &Path) -> Result<String, ClientError> {
    let (_, domain) = running(config, profile, dir)?;
    match request(&domain, &ClientMessage::Debug { version: WIRE_VERSION })? {
        CoordinatorMessage::Debug { text } => Ok(text),
        CoordinatorMessage::Refused { reason, .. } => Err(ClientError::Refused(reason)),
        other => Err(ClientError::Unexpected { request: "debug", answer: format!("{other:?}") }),
    }
}

/// `lazaret policy log`: the names the running locked Domain of `profile`
/// on the workspace at `dir` refused, most frequent first; `None` when the
/// Domain's egress is open (it has no resolver of its own).
pub fn refused_names(
    config: Option<&Path>,
    profile: Option<&str>,
    dir: &Path,
) -> Result<Option<Vec<lazaret_netpolicy::topology::RefusedName>>, ClientError> {
    let (ctx, domain) = running(config, profile, dir)?;
    if ctx.profile.egress != crate::config::EgressMode::Locked {
        return Ok(None);
    }
    let path = domain.refused_names();
    match lazaret_netpolicy::topology::read_refused_log(&path) {
        Ok(names) => Ok(Some(names)),
        // Nothing refused yet.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some(Vec::new())),
        Err(source) => Err(ClientError::Io { context: format!("reading {}", path.display()), source }),
    }
}

/// `lazaret policy log`: the destinations the sidecar of the running Domain
/// of `profile` on the workspace at `dir` refused recently (open and locked
/// egress alike), most refused first.
pub fn refused_destinations(
    config: Option<&Path>,
    profile: Option<&str>,
    dir: &Path,
) -> Result<Vec<lazaret_protocol::wire::RefusedDestination>, ClientError> {
    let (_, domain) = running(config, profile, dir)?;
    match request(&domain, &ClientMessage::RefusedDestinations { version: WIRE_VERSION })? {
        CoordinatorMessage::RefusedDestinations { destinations } => Ok(destinations),
        CoordinatorMessage::Refused { reason, .. } => Err(ClientError::Refused(reason)),
        other => Err(ClientError::Unexpected { request: "refused destinations", answer: format!("{other:?}") }),
    }
}

/// The Domain Root (holding the journal) of `profile`'s Domain on the
/// workspace at `dir`.
pub fn journal_location(config: Option<&Path>, profile: Option<&str>, dir: &Path) -> Result<PathBuf, ClientError> {
    let ctx = Context::resolve(config, profile, dir)?;
    Ok(ctx.paths.domain_root(&ctx.domain_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_domains_with_a_published_socket_are_running() {
        let runtime = tempfile::tempdir().expect("tempdir");
        for (name, published) in [("b", true), ("a", true), ("c", false)] {
            let d = DomainDir::new(runtime.path().join(name));
            std::fs::create_dir(d.path()).expect("dir");
            if published {
                std::fs::write(d.socket(), "").expect("socket stand-in");
            }
        }
        let found: Vec<PathBuf> = running_domains(runtime.path()).iter().map(|d| d.path().to_path_buf()).collect();
        assert_eq!(found, [runtime.path().join("a"), runtime.path().join("b")]);
    }

    #[test]
    fn an_unheld_lock_is_free_and_a_held_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lock = dir.path().join("lock");
        assert!(wait_unlocked(&lock, Duration::ZERO), "a missing lock file is free");
        let held = crate::lock::DomainLock::acquire(&lock, "d").expect("lock");
        assert!(!wait_unlocked(&lock, Duration::from_millis(20)));
        drop(held);
        assert!(wait_unlocked(&lock, Duration::from_millis(20)));
    }
}
