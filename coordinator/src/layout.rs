//! Where a running Domain keeps its files: the one place that knows every
//! name in a Domain runtime directory (`<runtime_dir>/<domain-id>/`, 0700)
//! and in the run directory of one sandbox inside it.
//!
//! ```text
//! <domain dir>/lock               the Domain lock (flock, owner's PID)
//! <domain dir>/coordinator.sock   the published socket (0600, developer's)
//! <domain dir>/coordinator.log    the coordinator's log
//! <domain dir>/ca.pem             the Trust Anchor's certificate
//! <domain dir>/sidecar-id         the running sidecar's ID (crash recovery)
//! <domain dir>/setup.running      present while the profile's setup runs (waiting clients)
//! <domain dir>/runsc/             runsc's state root
//! <domain dir>/run-<container>/   one sandbox's run directory (see RunDir)
//! ```
//!
//! In the Domain Root (`<storage root>/domains/<domain-id>/`, root's), beside
//! the journal, State Anchor layers and Ignored Workspace State:
//!
//! ```text
//! <Domain Root>/quarantine/       the Workspace Guard's quarantine
//! <Domain Root>/ignored/          Ignored Workspace State storage
//! ```

use std::path::{Path, PathBuf};

const LOCK: &str = "lock";
const SOCKET: &str = "coordinator.sock";
const LOG: &str = "coordinator.log";
const CA_CERT: &str = "ca.pem";
const SIDECAR_RECORD: &str = "sidecar-id";
const RUNSC_STATE: &str = "runsc";
const RUN_PREFIX: &str = "run-";
const SETUP_MARKER: &str = "setup.running";
const QUARANTINE: &str = "quarantine";
const IGNORED_STATE: &str = "ignored";

/// A Domain's runtime directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainDir(PathBuf);

impl DomainDir {
    /// The layout rooted at `path` (which [`crate::context::Context::domain_runtime_dir`] creates).
    pub fn new(path: PathBuf) -> DomainDir {
        DomainDir(path)
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The Domain lock file.
    pub fn lock(&self) -> PathBuf {
        self.0.join(LOCK)
    }

    /// The coordinator's published socket.
    pub fn socket(&self) -> PathBuf {
        self.0.join(SOCKET)
    }

    /// The coordinator's log.
    pub fn log(&self) -> PathBuf {
        self.0.join(LOG)
    }

    /// The Trust Anchor's CA certificate.
    pub fn ca_cert(&self) -> PathBuf {
        self.0.join(CA_CERT)
    }

    /// The locked resolver's refused names (`lazaret policy log`).
    pub fn refused_names(&self) -> PathBuf {
        self.0.join("refused-names.json")
    }

    /// The record of the running sidecar's ID.
    pub fn sidecar_record(&self) -> PathBuf {
        self.0.join(SIDECAR_RECORD)
    }

    /// runsc's state root.
    pub fn runsc_state(&self) -> PathBuf {
        self.0.join(RUNSC_STATE)
    }

    /// The run directory of sandbox `container`.
    pub fn run_dir(&self, container: &str) -> RunDir {
        RunDir(self.0.join(format!("{RUN_PREFIX}{container}")))
    }

    /// Run directories present now, as (container ID, run directory).
    pub fn run_dirs(&self) -> Vec<(String, RunDir)> {
        let Ok(entries) = std::fs::read_dir(&self.0) else { return Vec::new() };
        let mut found: Vec<(String, RunDir)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_string();
                let container = name.strip_prefix(RUN_PREFIX)?.to_string();
                Some((container, RunDir(e.path())))
            })
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found
    }

    /// Present while the profile's setup steps run (it holds the current
    /// step): a client waiting for the socket waits longer meanwhile.
    pub fn setup_marker(&self) -> PathBuf {
        self.0.join(SETUP_MARKER)
    }

    /// Files that only a live coordinator may have: removed by recovery.
    pub fn published_files(&self) -> [PathBuf; 3] {
        [self.socket(), self.ca_cert(), self.setup_marker()]
    }
}

/// The run directory of one sandbox (`run-<container>`, 0700): the bundle,
/// the rootfs overlay and everything staged for the sandbox's mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir(PathBuf);

impl RunDir {
    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The rootfs handed to runsc (an overlay over the image).
    pub fn rootfs(&self) -> PathBuf {
        self.0.join("rootfs")
    }

    /// The rootfs overlay's upper layer.
    pub fn upper(&self) -> PathBuf {
        self.0.join("upper")
    }

    /// The rootfs overlay's work directory.
    pub fn work(&self) -> PathBuf {
        self.0.join("work")
    }

    /// Mountpoints of the State Anchor overlays.
    pub fn anchor(&self) -> PathBuf {
        self.0.join("anchor")
    }

    /// Mountpoints of staged workspace binds (Ignored Workspace State, Git Sentry).
    pub fn staging(&self) -> PathBuf {
        self.0.join("staging")
    }

    /// The OCI bundle directory.
    pub fn bundle(&self) -> PathBuf {
        self.0.join("bundle")
    }

    /// The sandbox's `/etc/resolv.conf`.
    pub fn resolv_conf(&self) -> PathBuf {
        self.0.join("resolv.conf")
    }

    /// The OCI bundle of the setup sandbox (the profile's `setup` steps).
    pub fn setup_bundle(&self) -> PathBuf {
        self.0.join("setup-bundle")
    }

    /// runsc's PID file of the setup sandbox process.
    pub fn setup_sandbox_pid(&self) -> PathBuf {
        self.0.join("setup-sandbox.pid")
    }

    /// The PID file (PID inside the setup sandbox) of the running setup step.
    pub fn setup_step_pid(&self) -> PathBuf {
        self.0.join("setup-step.pid")
    }

    /// runsc's PID file of the sandbox process.
    pub fn sandbox_pid(&self) -> PathBuf {
        self.0.join("sandbox.pid")
    }

    /// The PID file (PID inside the sandbox) of session `session`'s agent.
    pub fn session_pid(&self, session: &str) -> PathBuf {
        self.0.join(format!("session-{session}.pid"))
    }
}

/// The Workspace Guard's quarantine in a Domain Root
/// (`<Domain Root>/quarantine/<id>/{record.json,content}`): what the guard
/// moved out of the workspace, until `lazaret audit PROFILE --restore ID`.
pub fn quarantine_dir(domain_root: &Path) -> PathBuf {
    domain_root.join(QUARANTINE)
}

/// The Ignored Workspace State storage in a Domain Root (the directory
/// `lazaret_mounts::ignored_state::plan_ignored` puts every isolated path's
/// storage in).
pub fn ignored_state_dir(domain_root: &Path) -> PathBuf {
    domain_root.join(IGNORED_STATE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_dirs_are_found_by_their_prefix_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = DomainDir::new(dir.path().to_path_buf());
        std::fs::create_dir(layout.run_dir("lzr-b").path()).expect("run b");
        std::fs::create_dir(layout.run_dir("lzr-a").path()).expect("run a");
        std::fs::create_dir(layout.runsc_state()).expect("runsc");
        std::fs::write(layout.lock(), "1\n").expect("lock");
        let found: Vec<String> = layout.run_dirs().into_iter().map(|(c, _)| c).collect();
        assert_eq!(found, ["lzr-a", "lzr-b"]);
        assert_eq!(layout.run_dir("lzr-a").rootfs(), dir.path().join("run-lzr-a/rootfs"));
    }
}
