//! The gate: no host process opens a git control file the sandbox wrote
//! before the guard has decided on it (issue 30; the design and its
//! failure modes are in docs/workspace-guard.md, "The gate").
//!
//! A `FAN_CLASS_CONTENT` fanotify group with a *mount* mark for
//! `FAN_OPEN_PERM` on each host mount holding a root: every open through
//! those mounts waits for the gate thread's answer, so a repository is
//! covered the moment it exists, however it was made. The sandbox's opens
//! go through the gofer's own bind mounts (other mount objects), and the
//! guard's through the coordinator's private mount namespace, so neither
//! ever reaches the gate (an open by this process is allowed at once all
//! the same, so the gate cannot wait on itself).
//!
//! An open is decided in two steps:
//!
//! 1. **Order.** The guard must first have handled every write the
//!    sandbox finished before the open. The kernel queues a write's event
//!    before the write returns, so those events are the ones queued in the
//!    guard's notification group when the gate reads the open (`FIONREAD`,
//!    which counts 24 bytes an event whatever its size). The gate waits
//!    (the opener blocks) until the guard has handled that many more
//!    events of its queue ([`GateShared`]); it asks the guard to drain at
//!    once rather than after its batching window.
//! 2. **Decision.** A file the guard took away or replaced meanwhile is
//!    refused, whatever its name. A file with a control name
//!    ([`is_control_name`]) in a git directory (one now, or one the sandbox
//!    ever made marks in) is allowed only if it is still the file at its
//!    path, unchanged (same device, inode and ctime), now that the guard
//!    has acted, and it is the guard's sealed copy, the developer's own
//!    write, or older than the run: whatever the guard filtered or
//!    quarantined is no longer there, so the opener gets `EPERM` and its
//!    next open reads the guard's version. Any other file is allowed,
//!    unless the guard has just taken away a symlink at a name git reads
//!    in a git dir (a `config` or `hooks` symlink makes git read a file of
//!    another name): for [`TAINT_WINDOW`] after that, opens of files the
//!    developer did not write last are refused.
//!
//! Opens outside every root are allowed, and their directory gets an
//! ignore mark so its other files no longer wake the gate; a directory
//! the developer moves later (into a root, perhaps) drops every ignore
//! mark. An open that cannot be decided within [`DEADLINE`] (the guard
//! stalled, died or is flooded) is refused: the gate fails closed for what
//! the agent may have written, and no opener waits longer than that.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::classify::{self, ControlFile};
use super::neutralise::{Seals, is_git_dir_at};
use super::{GuardConfig, GuardError, RootKind};
use crate::error::MountError;
use crate::safe_path;

/// The permission events gated. An `execve` raises `FAN_OPEN_PERM` too
/// (besides `FAN_OPEN_EXEC_PERM`), so hooks are covered by it alone.
const PERM_EVENTS: u64 = libc::FAN_OPEN_PERM;

/// The longest an opener waits for a decision; then it is refused.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// How long after the guard takes away a symlink in a git dir waiting
/// opens of non-control files are refused (the open may have gone through
/// it).
pub const TAINT_WINDOW: Duration = Duration::from_secs(2);

/// How long an open the gate would refuse waits for events still to be
/// queued before it is decided once more ([`GateLoop::park_again`]).
const SECOND_LOOK: Duration = Duration::from_millis(5);

/// Most opens waiting at once (each blocks a host thread); past it, new
/// ones are refused.
const MAX_PARKED: usize = 4096;

/// Most ignore marks (each pins an inode in the kernel); past it, opens
/// outside the roots keep waking the gate.
const MAX_IGNORE_MARKS: usize = 65_536;

/// Most directories remembered as ones the sandbox made git dir marks in.
const MAX_GIT_DIRS: usize = 65_536;

/// `struct fanotify_event_metadata`.
const METADATA_LEN: usize = 24;

/// A file's ctime at most this far before the run's start counts as
/// changed (the coarse clock, as in the sweep rule).
const COARSE_CLOCK_SLACK: Duration = Duration::from_millis(10);

/// The names git reads as control files wherever the directory is (a git
/// directory, a `modules/` or `worktrees/` entry, an `objects` reached
/// through a symlink): the gate decides on every file so named, and on
/// every file in a directory named `hooks`.
pub fn is_control_name(rel: &Path) -> bool {
    let name = rel.file_name().map(OsStr::as_bytes).unwrap_or_default();
    let in_hooks = rel.parent().and_then(Path::file_name) == Some(OsStr::new("hooks"));
    in_hooks
        || matches!(name, b"config" | b"config.worktree" | b"commondir" | b"gitdir" | b"attributes" | b"alternates" | b"http-alternates")
}

/// Whether an entry the sandbox made at `rel` redirects git when it is a
/// symlink: a control name, or a `hooks` or `info` directory (git reads
/// `hooks/*` and `info/attributes` through it under other names).
pub fn is_redirecting_name(rel: &Path) -> bool {
    is_control_name(rel) || matches!(rel.file_name().map(OsStr::as_bytes), Some(b"hooks" | b"info"))
}

/// What the guard's event loop and the gate share.
pub(crate) struct GateShared {
    /// Odd while the loop is inside a `read` of its queue (a seqlock for
    /// [`GateShared::handled_target`]).
    read_gen: AtomicU64,
    /// Events the loop has read from its queue.
    read_events: AtomicU64,
    /// Events the loop has read *and handled* (sweeps an overflow or a
    /// changed kept path asked for included).
    handled_events: AtomicU64,
    /// Until when waiting non-control opens are refused (ms since `epoch`).
    taint_until_ms: AtomicU64,
    /// Where the last taint came from (for the refusal's reason).
    taint_cause: Mutex<String>,
    /// `read_events` after the read that held the latest move of a git
    /// control entry by the sandbox (0: none): an open of the file that was
    /// there finds it under another name ([`GateLoop::decide`]).
    moved_away_at: AtomicU64,
    /// Directories (device, inode) the sandbox made git dir marks in
    /// (`HEAD`, `objects`, `refs`, `commondir`): their control files stay
    /// control files even when the marks are gone at the moment the gate
    /// looks (the host's git may have seen them a moment before).
    git_dirs: Mutex<std::collections::HashSet<(u64, u64)>>,
    /// Whether the loop still runs.
    loop_alive: AtomicBool,
    /// The developer moved a directory: every ignore mark goes.
    flush_ignores: AtomicBool,
    epoch: Instant,
    /// The loop's notification group, for `FIONREAD`.
    queue: OwnedFd,
    /// Written (one byte) after each handled batch; the gate polls it.
    progress_write: OwnedFd,
    progress_read: OwnedFd,
    /// Asks the loop to drain now.
    drain_request: Box<dyn Fn() + Send + Sync>,
    /// Opens the gate refused, for the loop to report.
    refused: Mutex<Vec<Refusal>>,
    /// What the guard sealed, and which control files the developer wrote
    /// last.
    seals: Arc<Seals>,
}

/// One refused open, reported as [`super::GuardEvent::Refused`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The [`super::GuardRoot::label`].
    pub root: String,
    /// Path relative to that root.
    pub path: PathBuf,
    /// The opener's pid, as the guard's PID namespace sees it (0 when it
    /// cannot: the coordinator runs in a PID namespace of its own).
    pub pid: u32,
    /// Why, in words.
    pub reason: String,
}

impl Refusal {
    /// One line for a session terminal (no newline; the path escaped).
    pub fn summary(&self) -> String {
        let path = lazaret_protocol::display::escaped(&self.path);
        // A process outside the reader's PID namespace is reported as 0.
        let who = if self.pid == 0 { "a host process's".to_owned() } else { format!("pid {}'s", self.pid) };
        format!("workspace guard: refused {who} open of {}:{path}: {}", self.root, self.reason)
    }
}

impl GateShared {
    /// `queue` is a duplicate of the loop's notification group fd;
    /// `drain_request` wakes the loop with a request to drain.
    pub(crate) fn new(queue: OwnedFd, drain_request: Box<dyn Fn() + Send + Sync>, seals: Arc<Seals>) -> Result<GateShared, GuardError> {
        let (progress_read, progress_write) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(|e| MountError::sys("pipe2", "gate", e))?;
        Ok(GateShared {
            read_gen: AtomicU64::new(0),
            read_events: AtomicU64::new(0),
            handled_events: AtomicU64::new(0),
            taint_until_ms: AtomicU64::new(0),
            taint_cause: Mutex::new(String::new()),
            moved_away_at: AtomicU64::new(0),
            git_dirs: Mutex::new(std::collections::HashSet::new()),
            loop_alive: AtomicBool::new(true),
            flush_ignores: AtomicBool::new(false),
            epoch: Instant::now(),
            queue,
            progress_write,
            progress_read,
            drain_request,
            refused: Mutex::new(Vec::new()),
            seals,
        })
    }

    /// The loop: about to read its queue.
    pub(crate) fn reading(&self) {
        self.read_gen.fetch_add(1, Ordering::SeqCst);
    }

    /// The loop: a read returned `n` events.
    pub(crate) fn read_done(&self, n: u64) {
        self.read_events.fetch_add(n, Ordering::SeqCst);
        self.read_gen.fetch_add(1, Ordering::SeqCst);
    }

    /// The loop: `n` more events read are handled.
    pub(crate) fn handled(&self, n: u64) {
        if n > 0 {
            self.handled_events.fetch_add(n, Ordering::SeqCst);
            self.poke();
        }
    }

    /// The loop: it took away a symlink at a name git reads in a git dir
    /// (or saw such a name vanish before it could look), at `cause`.
    /// Called before [`Self::handled`].
    pub(crate) fn taint(&self, cause: String) {
        *self.taint_cause.lock().unwrap_or_else(PoisonError::into_inner) = cause;
        let until = self.now_ms() + TAINT_WINDOW.as_millis() as u64;
        self.taint_until_ms.fetch_max(until, Ordering::SeqCst);
    }

    /// The loop: in the events it read last, the sandbox moved a git
    /// control entry away (renamed it, or the directory holding it).
    /// Called before [`Self::handled`].
    pub(crate) fn control_moved_away(&self) {
        self.moved_away_at.fetch_max(self.read_events.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    /// Whether the sandbox moved a git control entry away in an event
    /// queued after the first `floor` events.
    fn moved_away_after(&self, floor: u64) -> bool {
        self.moved_away_at.load(Ordering::SeqCst) > floor
    }

    /// The loop: the sandbox made (or moved in) a git dir mark in the
    /// directory `st`.
    pub(crate) fn note_git_dir(&self, st: &nix::sys::stat::FileStat) {
        let mut dirs = self.git_dirs.lock().unwrap_or_else(PoisonError::into_inner);
        if dirs.len() >= MAX_GIT_DIRS {
            dirs.clear(); // then only the marks there now count
        }
        dirs.insert((st.st_dev, st.st_ino));
    }

    /// Whether `rel` beneath `root` is, or may just have been, a git
    /// directory for the host's git: marks there now, a `.git` above it, or
    /// marks the sandbox made there at some point (it may have taken them
    /// away since the host's git looked).
    pub(crate) fn is_or_was_git_dir(&self, root: BorrowedFd<'_>, rel: &Path) -> bool {
        if is_git_dir_at(root, rel) || rel.ancestors().any(classify::is_dot_git) {
            return true;
        }
        let dir = safe_path::open_beneath(root, rel, OFlag::O_PATH | OFlag::O_DIRECTORY).ok();
        let st = dir.and_then(|fd| nix::sys::stat::fstat(&fd).ok());
        st.is_some_and(|st| self.git_dirs.lock().unwrap_or_else(PoisonError::into_inner).contains(&(st.st_dev, st.st_ino)))
    }

    /// The loop: the sandbox touched the file `st`: it is no longer the
    /// developer's write.
    pub(crate) fn sandbox_touched(&self, st: &nix::sys::stat::FileStat) {
        self.seals.sandbox_touched(st);
    }

    /// The loop: a directory moved (not by the sandbox).
    pub(crate) fn directory_moved(&self) {
        self.flush_ignores.store(true, Ordering::SeqCst);
    }

    /// The loop: it has failed (panicked): what waits for it is refused.
    /// A loop stopped for the Domain's stop is followed by the final sweep
    /// instead ([`Gate::final_sweep_done`]).
    pub(crate) fn loop_stopped(&self) {
        self.loop_alive.store(false, Ordering::SeqCst);
        self.poke();
    }

    /// The loop: the developer wrote the control file `st` (as it is now).
    pub(crate) fn developer_wrote(&self, st: &nix::sys::stat::FileStat) {
        self.seals.developer_wrote(st);
    }

    fn developer_wrote_last(&self, st: &nix::sys::stat::FileStat) -> bool {
        self.seals.developer_wrote_last(st)
    }

    fn developer_wrote_identity(&self, file: Identity) -> bool {
        self.seals.developer_wrote_version(file.dev, file.ino, file.ctime)
    }

    /// The loop: what the gate refused since the last call.
    pub(crate) fn take_refusals(&self) -> Vec<Refusal> {
        std::mem::take(&mut *self.refused.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn poke(&self) {
        let _ = nix::unistd::write(&self.progress_write, &[1]);
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn tainted(&self) -> bool {
        self.now_ms() < self.taint_until_ms.load(Ordering::SeqCst)
    }

    /// How many handled events mean that every event queued now has been
    /// handled; `None` while the loop is inside a read (retry).
    fn handled_target(&self) -> Option<u64> {
        let generation = self.read_gen.load(Ordering::SeqCst);
        if generation % 2 == 1 {
            return None;
        }
        let read = self.read_events.load(Ordering::SeqCst);
        // fanotify's FIONREAD is FAN_EVENT_METADATA_LEN per queued event,
        // not the bytes a read returns (those carry info records too).
        let queued = crate::sys::queued_bytes(self.queue.as_fd()).ok()?.div_ceil(METADATA_LEN as u64);
        (self.read_gen.load(Ordering::SeqCst) == generation).then_some(read + queued)
    }

    fn handled_through(&self, target: u64) -> bool {
        self.handled_events.load(Ordering::SeqCst) >= target
    }
}

/// One root as the gate sees it.
struct GateRoot {
    label: String,
    path: PathBuf,
    kind: RootKind,
    /// In the guard's own mount namespace (never gated).
    fd: OwnedFd,
}

/// An open waiting for its decision.
struct Parked {
    event_fd: OwnedFd,
    pid: u32,
    target: u64,
    /// At most this many events of the guard's queue were queued before
    /// the open was ([`GateLoop::floor`]).
    floor: u64,
    deadline: Instant,
    root: usize,
    rel: PathBuf,
    control: bool,
    /// Its ctime is not before the run's start.
    changed: bool,
    /// Decided once already and parked again ([`GateLoop::park_again`]).
    second_look: bool,
    /// When to take the queue's count again (parked again).
    recheck_at: Option<Instant>,
    identity: Identity,
}

/// What "unchanged" compares.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
}

impl Identity {
    fn of(st: &nix::sys::stat::FileStat) -> Identity {
        Identity { dev: st.st_dev, ino: st.st_ino, ctime: (st.st_ctime, st.st_ctime_nsec) }
    }
}

/// A running gate. Dropping it stops the thread; the kernel then lets every
/// open through, so it is dropped only after the guard's final sweep.
pub(crate) struct Gate {
    thread: Option<JoinHandle<()>>,
    stop: OwnedFd,
    shared: Arc<GateShared>,
}

impl Gate {
    /// Marks the mounts holding `config`'s roots (as `host_root`, an fd of
    /// `/` in the developer's mount namespace, reaches them, and as
    /// `own_root`, this process's `/`, does when given) and starts the
    /// gate thread.
    pub(crate) fn start(
        config: &GuardConfig,
        host_root: &OwnedFd,
        own_root: Option<&OwnedFd>,
        shared: Arc<GateShared>,
    ) -> Result<Gate, GuardError> {
        let group = crate::sys::fanotify_init(
            libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK | libc::FAN_UNLIMITED_MARKS,
            (libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC) as libc::c_uint,
        )
        .map_err(|errno| GuardError::Unsupported {
            path: PathBuf::from("/"),
            reason: format!(
                "fanotify_init(FAN_CLASS_CONTENT): {errno} (the gate needs CAP_SYS_ADMIN and a kernel with CONFIG_FANOTIFY_ACCESS_PERMISSIONS)"
            ),
        })?;
        let mut roots = Vec::new();
        for root in &config.roots {
            let rel = host_relative(&root.path)?;
            for namespace_root in std::iter::once(host_root).chain(own_root) {
                crate::sys::fanotify_mark(
                    group.as_fd(),
                    libc::FAN_MARK_ADD | libc::FAN_MARK_MOUNT,
                    PERM_EVENTS,
                    namespace_root.as_fd(),
                    Some(&rel),
                )
                .map_err(|errno| GuardError::Unsupported {
                    path: root.path.clone(),
                    reason: format!("fanotify_mark(FAN_MARK_MOUNT, FAN_OPEN_PERM): {errno}"),
                })?;
            }
            roots.push(GateRoot {
                label: root.label.clone(),
                path: root.path.clone(),
                kind: root.kind,
                fd: safe_path::open_root_dir(&root.path)?,
            });
        }
        let host_root = host_root.try_clone().map_err(|e| MountError::io("dup", "/", e))?;
        let (stop_read, stop) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(|e| MountError::sys("pipe2", "gate", e))?;
        let since = config.changed_since.map(|t| t.checked_sub(COARSE_CLOCK_SLACK).unwrap_or(UNIX_EPOCH));
        let shared_for_stop = shared.clone();
        let mut state = GateLoop {
            group,
            roots,
            since,
            host_root,
            shared,
            stop: stop_read,
            parked: Vec::new(),
            floor: 0,
            ignore_marks: 0,
            ignore_supported: true,
            reported: HashMap::new(),
            own_pid: std::process::id(),
            quarantine_dir: config.quarantine_dir.canonicalize().unwrap_or_else(|_| config.quarantine_dir.clone()),
        };
        let thread = std::thread::Builder::new()
            .name("workspace-gate".into())
            .spawn(move || state.run())
            .map_err(|e| MountError::io("spawn", "workspace-gate", e))?;
        Ok(Gate { thread: Some(thread), stop, shared: shared_for_stop })
    }

    /// The guard's final sweep has run (the sandbox is gone): every write
    /// of the sandbox is handled, and what waits is decided now.
    pub(crate) fn final_sweep_done(&self) {
        self.shared.handled_events.store(u64::MAX, Ordering::SeqCst);
        self.shared.poke();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let _ = nix::unistd::write(&self.stop, &[1]);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `path` without its leading `/`, for a lookup relative to the host's `/`.
fn host_relative(path: &Path) -> Result<CString, GuardError> {
    let bytes = path.as_os_str().as_bytes();
    let rel = bytes.strip_prefix(b"/").ok_or_else(|| GuardError::Config(format!("{} is not absolute", path.display())))?;
    CString::new(if rel.is_empty() { &b"."[..] } else { rel })
        .map_err(|_| GuardError::Config(format!("{} holds a NUL byte", path.display())))
}

/// Where an opened file is.
enum Place {
    /// Outside every root (its directory may get an ignore mark).
    Outside(PathBuf),
    /// In a root whose files the host's git does not read.
    Unguarded,
    /// In root `root` at `rel`.
    Guarded { root: usize, rel: PathBuf },
}

/// The deepest root holding `path` (roots may nest).
fn place(roots: &[(&Path, RootKind)], path: &Path) -> Place {
    let best = roots.iter().enumerate().filter(|(_, (root, _))| path.starts_with(root)).max_by_key(|(_, (root, _))| root.as_os_str().len());
    match best {
        None => Place::Outside(path.parent().unwrap_or(Path::new("/")).to_owned()),
        Some((_, (_, kind))) if !kind.has_git_control() => Place::Unguarded,
        Some((i, (root, _))) => Place::Guarded { root: i, rel: path.strip_prefix(root).unwrap_or(path).to_owned() },
    }
}

struct GateLoop {
    group: OwnedFd,
    roots: Vec<GateRoot>,
    /// Files whose ctime is before this did not change during the run.
    since: Option<SystemTime>,
    host_root: OwnedFd,
    shared: Arc<GateShared>,
    stop: OwnedFd,
    parked: Vec<Parked>,
    /// The guard's queue count (read plus queued) taken before the last
    /// read of the gate's queue that emptied it: every open read after
    /// that was queued after it.
    floor: u64,
    ignore_marks: usize,
    ignore_supported: bool,
    /// When each path was last reported refused (one line a second at most).
    reported: HashMap<(usize, PathBuf), Instant>,
    own_pid: u32,
    /// Where the guard moves what it takes away.
    quarantine_dir: PathBuf,
}

impl GateLoop {
    fn run(&mut self) {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let timeout = self
                .parked
                .iter()
                .map(|p| p.recheck_at.unwrap_or(p.deadline).saturating_duration_since(Instant::now()))
                .min()
                .map_or(PollTimeout::NONE, |d| PollTimeout::try_from(d.as_millis().min(60_000) as u64 + 1).unwrap_or(PollTimeout::MAX));
            let (events, progress, stop) = {
                let mut fds = [
                    PollFd::new(self.group.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.shared.progress_read.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.stop.as_fd(), PollFlags::POLLIN),
                ];
                match nix::poll::poll(&mut fds, timeout) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(_) => {
                        // Cannot wait any more: refuse what waits, and stop
                        // (the kernel then allows new opens: the Domain's
                        // log says so).
                        self.refuse_all("the gate failed");
                        return;
                    }
                }
                let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
                (ready(&fds[0]), ready(&fds[1]), ready(&fds[2]))
            };
            if stop {
                self.decide_parked();
                self.refuse_all("the Domain is stopping");
                return;
            }
            if progress {
                let mut sink = [0u8; 256];
                while matches!(nix::unistd::read(&self.shared.progress_read, &mut sink), Ok(n) if n > 0) {}
            }
            if self.shared.flush_ignores.swap(false, Ordering::SeqCst) && self.ignore_marks > 0 {
                // Inode marks of this group are ignore marks only.
                let _ = crate::sys::fanotify_mark(self.group.as_fd(), libc::FAN_MARK_FLUSH, 0, self.host_root.as_fd(), None);
                self.ignore_marks = 0;
            }
            if events {
                self.read_events(&mut buffer);
            }
            self.decide_parked();
        }
    }

    /// One read of the queue (poll comes back at once if more wait: one
    /// system call less per open than reading until `EAGAIN`).
    fn read_events(&mut self, buffer: &mut [u8]) {
        {
            let before = self.guard_queue_count();
            let n = match nix::unistd::read(&self.group, buffer) {
                Ok(n) if n > 0 => n,
                _ => return,
            };
            // Permission events carry no info records: room for one more
            // means the read took every event queued.
            let emptied = n + METADATA_LEN <= buffer.len();
            let mut at = 0;
            while at + METADATA_LEN <= n {
                let field = |o: usize| u32::from_ne_bytes([buffer[at + o], buffer[at + o + 1], buffer[at + o + 2], buffer[at + o + 3]]);
                let event_len = field(0) as usize;
                let (fd, pid) = (field(16) as i32, field(20));
                if event_len < METADATA_LEN {
                    break;
                }
                at += event_len;
                if fd < 0 {
                    continue; // FAN_NOFD (an overflow: never for permission events)
                }
                // Held until answered: the opener waits on it.
                let event_fd = crate::sys::own_raw_fd(fd);
                self.on_open(event_fd, pid);
            }
            if emptied {
                self.floor = before;
            }
        }
    }

    /// Events of the guard's queue read or queued now.
    fn guard_queue_count(&self) -> u64 {
        loop {
            if let Some(count) = self.shared.handled_target() {
                return count;
            }
            std::hint::spin_loop();
        }
    }

    /// Decides now, or parks.
    fn on_open(&mut self, event_fd: OwnedFd, pid: u32) {
        if pid == self.own_pid {
            return self.answer(event_fd, true);
        }
        let Ok(st) = nix::sys::stat::fstat(&event_fd) else { return self.answer(event_fd, false) };
        if safe_path::kind_of(&st) != safe_path::FileKind::Regular {
            return self.answer(event_fd, true);
        }
        let Ok(mut path) = std::fs::read_link(format!("/proc/self/fd/{}", event_fd.as_raw_fd())) else {
            return self.answer(event_fd, false);
        };
        // A file unlinked since it was opened: judged by where it was.
        let deleted = path.as_os_str().as_bytes().ends_with(b" (deleted)");
        if let Some(kept) = path.as_os_str().as_bytes().strip_suffix(b" (deleted)") {
            path = PathBuf::from(OsStr::from_bytes(kept));
        }
        // Taken away before the gate got to the open (in the quarantine
        // now, or unlinked: where it was cannot be told). Inode numbers are
        // reused, so a file of that number that is still linked elsewhere
        // is another file.
        if self.shared.seals.was_taken(st.st_dev, st.st_ino) && (deleted || path.starts_with(&self.quarantine_dir)) {
            return self.refuse_unplaced(event_fd, pid, path, "a file the sandbox wrote that the Workspace Guard took away");
        }
        let roots: Vec<(&Path, RootKind)> = self.roots.iter().map(|r| (r.path.as_path(), r.kind)).collect();
        let (root, rel) = match place(&roots, &path) {
            Place::Outside(dir) => {
                self.ignore(&dir);
                return self.answer(event_fd, true);
            }
            Place::Unguarded => return self.answer(event_fd, true),
            Place::Guarded { root, rel } => (root, rel),
        };
        let control = is_control_name(&rel);
        let changed = self.since.is_none_or(|since| {
            let since = since.duration_since(UNIX_EPOCH).unwrap_or_default();
            (st.st_ctime, st.st_ctime_nsec) >= (since.as_secs() as i64, i64::from(since.subsec_nanos()))
        });
        // Even a control file older than the run waits: a directory the
        // sandbox prepared in an earlier run and renamed in keeps its
        // files' ctimes, and the guard's walk of it must come first.
        if rel.file_name().is_some_and(|n| n.as_bytes().starts_with(super::neutralise::TEMP_PREFIX.as_bytes())) {
            // The guard's own temporary file: a file it is replacing was
            // opened just as the guard exchanged it out of place.
            let parked = self.parked_now(event_fd, pid, root, rel, control, changed, Identity::of(&st));
            return self.refuse(parked, "a file the Workspace Guard was replacing");
        }
        if changed && !(control && self.is_git_control_path(root, &rel)) {
            // A control file the sandbox renamed away (or whose directory
            // it renamed) just after the host opened it is found here
            // under its new name: the rename's event must be in the count.
            self.pass_rename_locks(root, &rel);
        }
        let mut parked = self.parked_now(event_fd, pid, root, rel, control, changed, Identity::of(&st));
        parked.target = self.guard_queue_count();
        if self.shared.handled_through(parked.target) {
            return self.decide(parked);
        }
        if self.parked.len() >= MAX_PARKED {
            return self.refuse(parked, "too many opens waiting for the Workspace Guard");
        }
        if self.parked.is_empty() {
            (self.shared.drain_request)();
        }
        self.parked.push(parked);
    }

    /// An open as it waits: its target is still to be taken.
    #[allow(clippy::too_many_arguments)] // the open's facts, each named
    fn parked_now(
        &self,
        event_fd: OwnedFd,
        pid: u32,
        root: usize,
        rel: PathBuf,
        control: bool,
        changed: bool,
        identity: Identity,
    ) -> Parked {
        Parked {
            event_fd,
            pid,
            target: 0,
            floor: self.floor,
            deadline: Instant::now() + DEADLINE,
            root,
            rel,
            control,
            changed,
            second_look: false,
            recheck_at: None,
            identity,
        }
    }

    /// Waits for every rename that holds a directory on the way to `rel`
    /// (from the root down to its parent) to finish: a rename takes both
    /// directories' inode locks and queues its events before it lets them
    /// go, so once each is passed, a rename that moved the file (or a
    /// directory above it) to where the gate found it is in the guard's
    /// queue. A directory that cannot be opened (a symlink now) ends it:
    /// the file is no longer there.
    fn pass_rename_locks(&self, root: usize, rel: &Path) {
        let Ok(mut dir) = self.roots[root].fd.try_clone() else { return };
        let mut components = rel.parent().into_iter().flat_map(Path::components);
        loop {
            let _ = crate::sys::pass_directory_lock(dir.as_fd());
            let Some(std::path::Component::Normal(name)) = components.next() else { return };
            match nix::fcntl::openat(
                &dir,
                name,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            ) {
                Ok(next) => dir = next,
                Err(_) => return,
            }
        }
    }

    fn decide_parked(&mut self) {
        let now = Instant::now();
        let alive = self.shared.loop_alive.load(Ordering::SeqCst);
        let mut waiting = Vec::new();
        for mut parked in std::mem::take(&mut self.parked) {
            if let Some(at) = parked.recheck_at {
                match self.shared.handled_target() {
                    Some(target) if now >= at => {
                        parked.target = target;
                        parked.recheck_at = None;
                    }
                    _ => {
                        waiting.push(parked);
                        continue;
                    }
                }
            }
            if self.shared.handled_through(parked.target) {
                self.decide(parked);
            } else if !alive {
                self.refuse(parked, "the Workspace Guard has stopped");
            } else if now >= parked.deadline {
                self.refuse(parked, "the Workspace Guard did not get to it in time");
            } else {
                waiting.push(parked);
            }
        }
        // Those decided here may have been parked again meanwhile.
        waiting.append(&mut self.parked);
        if !waiting.is_empty() {
            (self.shared.drain_request)();
        }
        self.parked = waiting;
    }

    /// The guard has handled every write before the open: decide.
    fn decide(&mut self, parked: Parked) {
        if self.shared.seals.was_taken(parked.identity.dev, parked.identity.ino) && !self.still_there(&parked) {
            return self.refuse(parked, "a file the sandbox wrote that the Workspace Guard took away or replaced");
        }
        if parked.control && self.is_git_control(&parked) {
            match self.at_path(&parked) {
                Some(st) if Identity::of(&st) == parked.identity => {
                    // The guard's sealed copy, the developer's own write, or
                    // a file from before the run (which the guard has
                    // walked if the sandbox renamed it in); anything else
                    // the sandbox could still write in place.
                    if !parked.changed || self.shared.seals.holds(&st, parked.root, &parked.rel) || self.shared.developer_wrote_last(&st) {
                        self.answer(parked.event_fd, true)
                    } else if !parked.second_look {
                        // A rename is visible a moment before its event is
                        // queued: the developer's own `config.lock` rename,
                        // seen by another of their processes, is recorded by
                        // the next batch. One more wait, then the verdict.
                        self.park_again(parked)
                    } else {
                        self.refuse(parked, "a git control file the sandbox wrote that the Workspace Guard has not sealed")
                    }
                }
                // Replaced since the open, not by the guard (that was
                // refused above): what the opener holds is from before the
                // run or the developer's own (their `config.lock` renames).
                _ if !parked.changed || self.shared.developer_wrote_identity(parked.identity) => self.answer(parked.event_fd, true),
                _ => self.refuse(parked, "a git control file the sandbox wrote, taken away or rewritten by the Workspace Guard"),
            }
        } else if parked.changed && self.shared.moved_away_after(parked.floor) && !self.developer_file(&parked) {
            // Perhaps opened at a control name and renamed away since (the
            // gate sees only where the file is now).
            self.refuse(parked, "opened as the sandbox moved a git control file away: it may be the one opened")
        } else if self.shared.tainted() && !self.developer_file(&parked) {
            let cause = self.shared.taint_cause.lock().unwrap_or_else(PoisonError::into_inner).clone();
            let reason = format!("opened just as the Workspace Guard took away a symlink at {cause} that the open may have gone through");
            self.refuse(parked, &reason)
        } else {
            self.answer(parked.event_fd, true)
        }
    }

    /// Parks `parked` again: after [`SECOND_LOOK`], until the guard has
    /// handled what is queued then.
    fn park_again(&mut self, mut parked: Parked) {
        if self.parked.len() >= MAX_PARKED {
            return self.refuse(parked, "too many opens waiting for the Workspace Guard");
        }
        parked.second_look = true;
        parked.recheck_at = Some(Instant::now() + SECOND_LOOK);
        self.parked.push(parked);
    }

    /// Whether the file is a control file of a git directory now (a file
    /// named `config` elsewhere is a project's: the guard leaves it, and so
    /// does the gate). The guard has handled every write before the open,
    /// so a directory made a git dir before it has been judged as one.
    fn is_git_control(&self, parked: &Parked) -> bool {
        self.is_git_control_path(parked.root, &parked.rel)
    }

    /// [`Self::is_git_control`] of `rel` in root `root`.
    fn is_git_control_path(&self, root: usize, rel: &Path) -> bool {
        let root = self.roots[root].fd.as_fd();
        let by_name = rel.parent().and_then(Path::file_name) == Some(OsStr::new("info"))
            && matches!(rel.file_name().map(OsStr::as_bytes), Some(b"alternates" | b"http-alternates"));
        by_name
            || classify::control_candidates(rel).iter().any(|c| {
                matches!(
                    c.kind,
                    ControlFile::Config
                        | ControlFile::ConfigWorktree
                        | ControlFile::Commondir
                        | ControlFile::Gitdir
                        | ControlFile::Hook
                        | ControlFile::InfoAttributes
                        | ControlFile::Alternates
                        | ControlFile::HttpAlternates
                ) && self.shared.is_or_was_git_dir(root, &c.git_dir)
            })
    }

    /// Whether the parked file is still the one at its path (an inode
    /// number the guard took away may be reused by a new file).
    fn still_there(&self, parked: &Parked) -> bool {
        self.at_path(parked).is_some_and(|st| (st.st_dev, st.st_ino) == (parked.identity.dev, parked.identity.ino))
    }

    /// Whether the parked file is one the developer wrote last (as it is).
    fn developer_file(&self, parked: &Parked) -> bool {
        self.at_path(parked).is_some_and(|st| Identity::of(&st) == parked.identity && self.shared.developer_wrote_last(&st))
    }

    /// What is at the parked open's path now (no symlink followed).
    fn at_path(&self, parked: &Parked) -> Option<nix::sys::stat::FileStat> {
        let root = &self.roots[parked.root];
        safe_path::open_path_beneath(root.fd.as_fd(), &parked.rel).ok().flatten().and_then(|fd| nix::sys::stat::fstat(&fd).ok())
    }

    fn refuse(&mut self, parked: Parked, reason: &str) {
        let key = (parked.root, parked.rel.clone());
        let now = Instant::now();
        let due = self.reported.get(&key).is_none_or(|at| now.duration_since(*at) >= Duration::from_secs(1));
        if due {
            if self.reported.len() > 4096 {
                self.reported.clear();
            }
            self.reported.insert(key, now);
            let refusal = Refusal {
                root: self.roots[parked.root].label.clone(),
                path: parked.rel.clone(),
                pid: parked.pid,
                reason: reason.to_owned(),
            };
            self.shared.refused.lock().unwrap_or_else(PoisonError::into_inner).push(refusal);
            (self.shared.drain_request)();
        }
        self.answer(parked.event_fd, false);
    }

    /// Refuses an open of a file no longer in a root (always reported).
    fn refuse_unplaced(&mut self, event_fd: OwnedFd, pid: u32, path: PathBuf, reason: &str) {
        let refusal = Refusal { root: "host".to_owned(), path, pid, reason: reason.to_owned() };
        self.shared.refused.lock().unwrap_or_else(PoisonError::into_inner).push(refusal);
        (self.shared.drain_request)();
        self.answer(event_fd, false);
    }

    fn refuse_all(&mut self, reason: &str) {
        for parked in std::mem::take(&mut self.parked) {
            self.refuse(parked, reason);
        }
    }

    fn answer(&self, event_fd: OwnedFd, allow: bool) {
        respond(self.group.as_fd(), event_fd.as_fd(), allow);
    }

    /// An ignore mark on `dir` (outside every root) for opens of its files.
    fn ignore(&mut self, dir: &Path) {
        if !self.ignore_supported || self.ignore_marks >= MAX_IGNORE_MARKS {
            return;
        }
        let Ok(rel) = host_relative(dir) else { return };
        let flags = libc::FAN_MARK_ADD | libc::FAN_MARK_IGNORE_SURV;
        match crate::sys::fanotify_mark(
            self.group.as_fd(),
            flags,
            PERM_EVENTS | libc::FAN_EVENT_ON_CHILD,
            self.host_root.as_fd(),
            Some(&rel),
        ) {
            Ok(()) => self.ignore_marks += 1,
            // FAN_MARK_IGNORE needs Linux 6.0: opens outside keep waking
            // the gate (slower, not less safe).
            Err(Errno::EINVAL) => self.ignore_supported = false,
            Err(_) => {}
        }
    }
}

/// Writes the `struct fanotify_response` for an event.
fn respond(group: BorrowedFd<'_>, event_fd: BorrowedFd<'_>, allow: bool) {
    let mut response = [0u8; 8];
    response[..4].copy_from_slice(&event_fd.as_raw_fd().to_ne_bytes());
    response[4..].copy_from_slice(&(if allow { libc::FAN_ALLOW } else { libc::FAN_DENY }).to_ne_bytes());
    let _ = nix::unistd::write(group, &response);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_names_are_what_git_reads_to_run_or_redirect() {
        for p in [
            ".git/config",
            "tools/.git/config.worktree",
            "a/b/commondir",
            ".git/worktrees/w/gitdir",
            ".git/info/attributes",
            "x/objects/info/alternates",
            "x/objects/info/http-alternates",
            ".git/hooks/pre-commit",
            "weird/hooks/anything",
            ".git/modules/m/config",
            "bare.git/config",
        ] {
            assert!(is_control_name(Path::new(p)), "{p}");
        }
        for p in ["src/main.rs", ".git/HEAD", ".git/index", "config.toml", "hooks", ".git/info/exclude", "configs/x"] {
            assert!(!is_control_name(Path::new(p)), "{p}");
        }
        assert!(is_redirecting_name(Path::new(".git/hooks")) && is_redirecting_name(Path::new(".git/info")));
        assert!(!is_redirecting_name(Path::new(".git/refs")));
    }

    #[test]
    fn the_deepest_root_places_a_file() {
        let roots =
            [(Path::new("/w"), RootKind::Workspace), (Path::new("/w/sub"), RootKind::IgnoredState), (Path::new("/v"), RootKind::Volume)];
        assert!(matches!(place(&roots, Path::new("/w/sub/x/config")), Place::Unguarded));
        match place(&roots, Path::new("/w/a/.git/config")) {
            Place::Guarded { root: 0, rel } => assert_eq!(rel, Path::new("a/.git/config")),
            _ => panic!("not placed in the workspace"),
        }
        assert!(matches!(place(&roots, Path::new("/v/config")), Place::Guarded { root: 2, .. }));
        // Components, not string prefixes.
        match place(&roots, Path::new("/wx/config")) {
            Place::Outside(dir) => assert_eq!(dir, Path::new("/wx")),
            _ => panic!("/wx is not in /w"),
        }
    }

    #[test]
    fn host_relative_paths_have_no_leading_slash() {
        assert_eq!(host_relative(Path::new("/home/dev")).expect("rel").as_bytes(), b"home/dev");
        assert_eq!(host_relative(Path::new("/")).expect("rel").as_bytes(), b".");
        assert!(host_relative(Path::new("rel")).is_err());
    }
}
