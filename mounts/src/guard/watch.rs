//! The event loop: one fanotify group (`FAN_CLASS_NOTIF |
//! FAN_REPORT_DFID_NAME`) with a filesystem mark per watched filesystem,
//! for `FAN_CREATE | FAN_MOVED_TO | FAN_ATTRIB | FAN_CLOSE_WRITE |
//! FAN_MODIFY | FAN_ONDIR`. Each event names the writer's pid, the parent
//! directory (a file handle) and the entry's name. Events of other pids are
//! dropped before anything is resolved; for the others the directory handle
//! is opened (`open_by_handle_at` on a root fd of that filesystem), its
//! current path read from `/proc/self/fd` only as a hint, and the hint
//! verified by opening that path beneath the root (no symlinks) and
//! comparing device and inode: a directory outside every root, or moved
//! meanwhile, is not touched. The entry is then handled relative to the
//! verified directory fd. A directory renamed into a root is walked whole.
//! `FAN_Q_OVERFLOW` runs a full sweep, once the queue is drained.
//!
//! Events are handled in batches (what one read returns, after a short
//! [`BATCH_WINDOW`]): the events of one entry in a batch (a file's create,
//! attribute changes and close) are merged and the entry handled once, and
//! each directory handle is resolved once per batch. This is exact, not an
//! approximation: the guard acts on an entry's state as it is when it is
//! handled, never on what an event says, and every event of a batch was
//! queued before the batch was read; whatever happens after that queues
//! events of its own for the next batch. Only a create, a rename in or an
//! attribute change can give an entry privilege bits, capabilities or
//! another owner (a write never adds them), so entries with nothing but
//! writes get the git checks only.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::gate::{Gate, GateShared};
use super::neutralise::{Cause, Engine, Out};
use super::sweep::{sweep_engine, walk};
use super::{EventSink, GuardConfig, GuardError, GuardEvent, PidFilter, SweepReport};
use crate::error::MountError;
use crate::safe_path::{self, FileKind};

/// How the guard observes a root's filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// fanotify with a filesystem mark and directory-handle + name events
    /// (`FAN_REPORT_DFID_NAME`): pids known.
    Fanotify,
    /// Not watchable by events (the filesystem has no file-handle support
    /// for fanotify): only sweeps protect it. The coordinator should sweep
    /// it more often and say so.
    SweepOnly,
}

/// The events watched.
const EVENT_MASK: u64 =
    libc::FAN_CREATE | libc::FAN_MOVED_TO | libc::FAN_ATTRIB | libc::FAN_CLOSE_WRITE | libc::FAN_MODIFY | libc::FAN_ONDIR;

/// Watched too with a gate, which alone needs to know what left a name
/// (a rename queues twice the events with it: the queue overflows sooner).
const GATE_EVENTS: u64 = libc::FAN_MOVED_FROM;

/// `fanotify_init` flags.
const INIT_FLAGS: libc::c_uint = libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK | libc::FAN_REPORT_DFID_NAME;

/// `FANOTIFY_METADATA_VERSION`.
const METADATA_VERSION: u8 = 3;

/// Names whose in-place modification (an fd kept open, no close) matters:
/// `FAN_MODIFY` events of other names are dropped unread.
const MODIFY_NAMES: [&[u8]; 6] = [b"config", b"config.worktree", b"commondir", b"gitdir", b"attributes", b"alternates"];

/// Size of one read of the event queue (one batch at most): about 15,000
/// events of a workspace path.
const READ_BUFFER: usize = 1 << 20;

/// How long the guard lets events gather after the queue becomes readable
/// before it reads them: a file's create, attribute changes and close then
/// come in one batch and are handled once. Adds at most this much to the
/// time a neutralisation takes.
const BATCH_WINDOW: Duration = Duration::from_millis(2);

/// Most directories kept open while one batch is handled (then the cache
/// starts over, so a batch spread over many directories cannot exhaust
/// the fds).
const DIR_CACHE: usize = 256;

/// The events that can change an entry's privileges or owner.
const METADATA_EVENTS: u64 = libc::FAN_CREATE | libc::FAN_MOVED_TO | libc::FAN_ATTRIB;

fn new_group() -> Result<OwnedFd, GuardError> {
    crate::sys::fanotify_init(INIT_FLAGS, (libc::O_RDONLY | libc::O_LARGEFILE) as libc::c_uint).map_err(|errno| GuardError::Unsupported {
        path: PathBuf::from("/"),
        reason: format!("fanotify_init(FAN_REPORT_DFID_NAME): {errno} (needs CAP_SYS_ADMIN and Linux >= 5.9)"),
    })
}

/// Marks the filesystem of `dir`; `Ok(false)` if that filesystem cannot be
/// watched this way.
fn mark_filesystem(group: &OwnedFd, dir: &OwnedFd, path: &Path, mask: u64) -> Result<bool, GuardError> {
    match crate::sys::fanotify_mark(group.as_fd(), libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM, mask, dir.as_fd(), Some(c".")) {
        Ok(()) => Ok(true),
        Err(Errno::EXDEV | Errno::ENODEV | Errno::EOPNOTSUPP | Errno::EINVAL) => Ok(false),
        Err(errno) => {
            Err(GuardError::Unsupported { path: path.to_owned(), reason: format!("fanotify_mark(FAN_MARK_FILESYSTEM): {errno}") })
        }
    }
}

/// Which backend the filesystem of `path` supports (tries a fanotify
/// filesystem mark; needs CAP_SYS_ADMIN).
pub fn probe_backend(path: &Path) -> Result<Backend, GuardError> {
    let group = new_group()?;
    let dir = safe_path::open_root_dir(path)?;
    Ok(if mark_filesystem(&group, &dir, path, EVENT_MASK)? { Backend::Fanotify } else { Backend::SweepOnly })
}

/// Requests to the guard thread.
enum Command {
    Settle(mpsc::Sender<()>),
    /// The gate waits for the queue to be handled: drain now.
    GateDrain,
    /// Fail as a bug would ([`Guard::fail_for_test`]).
    Fail,
    /// Handle nothing for this long ([`Guard::stall_for_test`]).
    Stall(std::time::Duration),
    Stop,
}

/// A running guard: one thread reading fanotify events for every root.
/// Dropping it stops the thread (as [`Guard::stop`] does, without the
/// final sweep).
pub struct Guard {
    thread: Option<JoinHandle<()>>,
    commands: mpsc::Sender<Command>,
    wake: OwnedFd,
    backends: Vec<Backend>,
    config: GuardConfig,
    /// Dropped after the final sweep: the kernel lets every open through
    /// once it is gone.
    gate: Option<Gate>,
    /// What the guard sealed (with a gate), given back at the stop.
    seals: Option<std::sync::Arc<super::neutralise::Seals>>,
}

impl Guard {
    /// Opens the roots and the quarantine, marks the roots' filesystems and
    /// starts the guard thread. Only events whose pid `is_sandbox` accepts
    /// are acted on; everything done is sent to `sink` (from the guard
    /// thread). Does not sweep: call [`super::sweep`] first when restarting
    /// a guard over a Domain that ran without one.
    pub fn start(config: GuardConfig, is_sandbox: PidFilter, sink: EventSink) -> Result<Guard, GuardError> {
        let mut engine = Engine::open(config.clone())?;
        let seals = config.gate.as_ref().map(|_| std::sync::Arc::new(super::neutralise::Seals::default()));
        engine.seals = seals.clone();
        let group = new_group()?;
        let mut backends = Vec::new();
        let mut fsids = Vec::new();
        let mut mount_fds = Vec::new();
        for root in &engine.roots {
            // open_by_handle_at refuses O_PATH fds as its mount fd.
            mount_fds.push(safe_path::open_beneath(root.fd.as_fd(), Path::new(""), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?);
            let mask = if config.gate.is_some() { EVENT_MASK | GATE_EVENTS } else { EVENT_MASK };
            let watched = mark_filesystem(&group, &root.fd, &root.path, mask)?;
            backends.push(if watched { Backend::Fanotify } else { Backend::SweepOnly });
            fsids.push(crate::sys::fsid(root.fd.as_fd()).map_err(|e| MountError::sys("fstatfs", &root.path, e))?);
        }
        let (wake_read, wake_write) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(|e| MountError::sys("pipe2", "guard", e))?;
        let (commands, receiver) = mpsc::channel();
        let gate_shared = match &config.gate {
            None => None,
            Some(_) => {
                let queue = group.try_clone().map_err(|e| MountError::io("dup", "fanotify group", e))?;
                let (sender, wake) = (commands.clone(), wake_write.try_clone().map_err(|e| MountError::io("dup", "guard wake pipe", e))?);
                let sender = std::sync::Mutex::new(sender);
                let request: Box<dyn Fn() + Send + Sync> = Box::new(move || {
                    if sender.lock().unwrap_or_else(std::sync::PoisonError::into_inner).send(Command::GateDrain).is_ok() {
                        let _ = nix::unistd::write(&wake, &[1]);
                    }
                });
                Some(std::sync::Arc::new(GateShared::new(queue, request, seals.clone().unwrap_or_default())?))
            }
        };
        let mut state = LoopState {
            engine,
            group,
            wake: wake_read,
            receiver,
            is_sandbox,
            sink,
            fsids,
            mount_fds,
            sweep_pending: false,
            resweep_pending: false,
            gate: gate_shared.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("workspace-guard".into())
            .spawn(move || {
                let _stopped = LoopStopped(state.gate.clone());
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| state.run()));
                if let Err(payload) = run {
                    // The gate first: what waits is refused at once.
                    if let Some(gate) = &state.gate {
                        gate.loop_stopped();
                    }
                    let message = payload
                        .downcast_ref::<&str>()
                        .map(|m| (*m).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".to_owned());
                    (state.sink)(GuardEvent::Failed(message));
                }
            })
            .map_err(|e| MountError::io("spawn", "workspace-guard", e))?;
        let mut guard = Guard { thread: Some(thread), commands, wake: wake_write, backends, config, gate: None, seals };
        if let (Some(gate), Some(shared)) = (&guard.config.gate, gate_shared) {
            let host_root = match &gate.host_root {
                Some(fd) => fd.try_clone().map_err(|e| MountError::io("dup", "/", e))?,
                None => OwnedFd::from(std::fs::File::open("/").map_err(|e| MountError::io("open", "/", e))?),
            };
            let own_root = match (gate.this_namespace_too, &gate.host_root) {
                (true, Some(_)) => Some(OwnedFd::from(std::fs::File::open("/").map_err(|e| MountError::io("open", "/", e))?)),
                _ => None,
            };
            // On failure `guard` is dropped: the loop stops.
            guard.gate = Some(Gate::start(&guard.config, &host_root, own_root.as_ref(), shared)?);
        }
        Ok(guard)
    }

    /// The backend used for each root, in [`GuardConfig::roots`] order.
    pub fn backends(&self) -> Vec<Backend> {
        self.backends.clone()
    }

    /// Waits until every event queued so far by the kernel has been handled
    /// (for tests and for the coordinator before a session-end sweep). The
    /// kernel queues an event before the writer's system call returns, so
    /// after settle every write the sandbox has finished has been seen.
    pub fn settle(&self) -> Result<(), GuardError> {
        let (reply, done) = mpsc::channel();
        self.send(Command::Settle(reply))?;
        done.recv().map_err(|_| GuardError::Config("the guard thread has stopped".into()))
    }

    /// Handles every event queued so far ([`Guard::settle`]), then sweeps
    /// every root in the caller's thread (the session-end sweep; the guard
    /// goes on handling events meanwhile). Unlike [`super::sweep`] it shares
    /// the running guard's seals: it knows the guard's sealed copies and the
    /// developer's own writes during the run, and leaves them as they are.
    pub fn sweep_now(&self) -> Result<SweepReport, GuardError> {
        self.settle()?;
        super::sweep::sweep_sharing(&self.config, self.seals.clone())
    }

    /// Makes the guard's thread panic, as a bug in it would: for the tests
    /// that show what a failed guard means for the gate and the Domain.
    #[doc(hidden)]
    pub fn fail_for_test(&self) -> Result<(), GuardError> {
        self.send(Command::Fail)
    }

    /// Makes the guard's thread handle nothing for `how_long`, as a guard
    /// starved of CPU would: for the tests of the gate's deadline and of a
    /// queue overflow.
    #[doc(hidden)]
    pub fn stall_for_test(&self, how_long: std::time::Duration) -> Result<(), GuardError> {
        self.send(Command::Stall(how_long))
    }

    /// Stops the thread, then runs a final sweep (with the guard's seals
    /// and what it knew of the developer's writes) and returns it.
    pub fn stop(mut self) -> Result<SweepReport, GuardError> {
        self.halt();
        let mut report = super::sweep::sweep_sharing(&self.config, self.seals.clone());
        let unsealed = self.unseal();
        if let Ok(report) = &mut report {
            report.errors.extend(unsealed);
        }
        if let (Some(gate), true) = (&self.gate, report.is_ok()) {
            gate.final_sweep_done();
        }
        self.gate = None;
        report
    }

    /// Gives the sealed control files back to the developer.
    fn unseal(&mut self) -> Vec<String> {
        self.seals.take().map(|s| s.unseal_all(&self.config)).unwrap_or_default()
    }

    /// Whether host opens are gated (see [`super::gate`]).
    pub fn gated(&self) -> bool {
        self.gate.is_some()
    }

    fn send(&self, command: Command) -> Result<(), GuardError> {
        self.commands.send(command).map_err(|_| GuardError::Config("the guard thread has stopped".into()))?;
        let _ = nix::unistd::write(&self.wake, &[1]);
        Ok(())
    }

    fn halt(&mut self) {
        let _ = self.send(Command::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.halt();
        let _ = self.unseal();
    }
}

/// What the guard thread owns.
struct LoopState {
    engine: Engine,
    group: OwnedFd,
    wake: OwnedFd,
    receiver: mpsc::Receiver<Command>,
    is_sandbox: PidFilter,
    sink: EventSink,
    /// `f_fsid` of each root, as events report it.
    fsids: Vec<[u8; 8]>,
    /// A readable (not `O_PATH`) fd of each root, for `open_by_handle_at`.
    mount_fds: Vec<OwnedFd>,
    /// The queue overflowed: sweep once it is drained.
    sweep_pending: bool,
    /// Something appeared where a kept git value leads through: sweep once
    /// the queue is drained.
    resweep_pending: bool,
    /// Shared with the gate, when there is one.
    gate: Option<std::sync::Arc<GateShared>>,
}

/// Tells the gate when the loop ends by a panic that was not caught (one
/// in the sink that reports the failure): what waits for it is then
/// refused at once. (A stop is followed by the final sweep, which decides
/// what waits: [`Guard::stop`].)
struct LoopStopped(Option<std::sync::Arc<GateShared>>);

impl Drop for LoopStopped {
    fn drop(&mut self) {
        if let (Some(gate), true) = (&self.0, std::thread::panicking()) {
            gate.loop_stopped();
        }
    }
}

/// One parsed event (in a batch: every event of one entry, merged).
#[derive(Clone, Copy)]
struct RawEvent<'a> {
    mask: u64,
    pid: u32,
    fsid: [u8; 8],
    handle_type: i32,
    handle: &'a [u8],
    name: &'a [u8],
}

impl LoopState {
    fn run(&mut self) {
        let mut buffer = vec![0u8; READ_BUFFER];
        loop {
            let (group_ready, wake_ready) = {
                let mut fds = [PollFd::new(self.group.as_fd(), PollFlags::POLLIN), PollFd::new(self.wake.as_fd(), PollFlags::POLLIN)];
                match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) => {}
                    Err(Errno::EINTR) => continue,
                    Err(errno) => {
                        (self.sink)(GuardEvent::Error(format!("workspace guard stopped: poll: {errno}")));
                        return;
                    }
                }
                let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
                (ready(&fds[0]), ready(&fds[1]))
            };
            if group_ready {
                std::thread::sleep(BATCH_WINDOW);
                self.drain(&mut buffer);
            }
            if wake_ready {
                let mut sink = [0u8; 64];
                while matches!(nix::unistd::read(&self.wake, &mut sink), Ok(n) if n > 0) {}
                while let Ok(command) = self.receiver.try_recv() {
                    match command {
                        Command::Settle(reply) => {
                            self.drain(&mut buffer);
                            self.engine.reload_restored();
                            let _ = reply.send(());
                        }
                        Command::GateDrain => self.drain(&mut buffer),
                        Command::Fail => panic!("the guard failed on purpose (test hook)"),
                        Command::Stall(how_long) => std::thread::sleep(how_long),
                        Command::Stop => return,
                    }
                }
            }
        }
    }

    /// Reads and handles events until the queue is empty, then runs the
    /// sweep an overflow asked for.
    fn drain(&mut self, buffer: &mut [u8]) {
        // Events read but not yet counted as handled for the gate: held
        // back while a sweep is due, which is their handling.
        let mut unpublished = 0u64;
        loop {
            if let Some(gate) = &self.gate {
                gate.reading();
            }
            let read = nix::unistd::read(&self.group, buffer);
            let events = read.as_ref().map_or(0, |&n| event_count(&buffer[..n]));
            if let Some(gate) = &self.gate {
                gate.read_done(events);
            }
            let length = match read {
                Ok(0) | Err(Errno::EAGAIN) => break,
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(errno) => {
                    (self.sink)(GuardEvent::Error(format!("workspace guard: reading events: {errno}")));
                    break;
                }
            };
            let mut out = Out::default();
            let mut overflow = false;
            let mut batch = Batch::default();
            let mut pids = PidMemo::default();
            let mut developer = Batch::default();
            let mut moved_away = Batch::default();
            for_each_event(&buffer[..length], |event| match event {
                Parsed::Overflow => overflow = true,
                // Only the gate needs to know what left a name.
                Parsed::Event(event) if event.mask & libc::FAN_MOVED_FROM != 0 => {
                    if self.gate.is_some() && pids.accepts(event.pid, &*self.is_sandbox) {
                        moved_away.add(event);
                    }
                }
                Parsed::Event(event) => {
                    if self.wanted(&event, &mut pids) {
                        batch.add(event);
                    } else if self.gate.is_some() && developer_control_write(&event) {
                        developer.add(event);
                    }
                }
            });
            self.handle_batch(&batch, &mut out);
            self.note_developer_writes(&developer, &batch);
            self.note_moved_away(&moved_away);
            self.sweep_pending |= overflow;
            self.resweep_pending |= out.sweep;
            self.emit(out);
            unpublished += events;
            if !(self.sweep_pending || self.resweep_pending) {
                self.publish(std::mem::take(&mut unpublished));
            }
        }
        let overflowed = std::mem::take(&mut self.sweep_pending);
        if overflowed | std::mem::take(&mut self.resweep_pending) {
            // Events were lost, or something appeared where a kept git
            // value leads through: everything is looked at (after the queue
            // was drained, so one sweep covers a burst).
            let report = sweep_engine(&self.engine);
            let sweep_time = report.duration;
            self.emit(Out { neutralised: report.neutralised, errors: report.errors, sweep: false });
            if overflowed {
                (self.sink)(GuardEvent::Overflow { sweep_time });
            }
        }
        self.publish(unpublished);
    }

    /// Tells the gate that `events` more of the queue are handled (a
    /// symlink taken away in them first), and reports what the gate
    /// refused.
    fn publish(&mut self, events: u64) {
        let Some(gate) = self.gate.clone() else { return };
        if let Some(cause) = self.engine.take_taint() {
            gate.taint(cause);
        }
        gate.handled(events);
        for refusal in gate.take_refusals() {
            (self.sink)(GuardEvent::Refused(refusal));
        }
    }

    fn emit(&mut self, out: Out) {
        for n in out.neutralised {
            (self.sink)(GuardEvent::Neutralised(n));
        }
        for e in out.errors {
            (self.sink)(GuardEvent::Error(e));
        }
    }

    /// Whether an event is to be handled: the sandbox's, and not a bare
    /// write to a name whose in-place changes cannot matter.
    fn wanted(&self, event: &RawEvent<'_>, pids: &mut PidMemo) -> bool {
        let modify_only = event.mask & !libc::FAN_ONDIR == libc::FAN_MODIFY;
        if modify_only && !MODIFY_NAMES.contains(&event.name) {
            return false;
        }
        let sandbox = pids.accepts(event.pid, &*self.is_sandbox);
        let dir_moved = event.mask & (libc::FAN_MOVED_TO | libc::FAN_ONDIR) == libc::FAN_MOVED_TO | libc::FAN_ONDIR;
        if !sandbox && dir_moved && event.pid != std::process::id() {
            // Perhaps from outside into a root, with the gate's ignore mark.
            if let Some(gate) = &self.gate {
                gate.directory_moved();
            }
        }
        sandbox
    }

    /// Tells the gate which control files the developer (not the sandbox)
    /// wrote last, as they are now; an entry the sandbox also touched in
    /// this batch is the guard's to judge.
    fn note_developer_writes(&self, developer: &Batch<'_>, sandbox: &Batch<'_>) {
        let Some(gate) = &self.gate else { return };
        for event in &developer.entries {
            let key = ((event.fsid, event.handle_type, event.handle), event.name, false);
            if sandbox.index.contains_key(&key) {
                continue;
            }
            let Some((_, _, dir)) = self.resolve_dir(event) else { continue };
            if let Ok(st) = nix::sys::stat::fstatat(&dir, OsStr::from_bytes(event.name), AtFlags::AT_SYMLINK_NOFOLLOW) {
                if safe_path::kind_of(&st) == FileKind::Regular {
                    gate.developer_wrote(&st);
                }
            }
        }
    }

    /// Tells the gate whether the sandbox moved a git control entry away
    /// (a control file, or a `hooks` or `info` directory of a git dir): a
    /// host open of the file that was there finds it under another name.
    fn note_moved_away(&self, moved: &Batch<'_>) {
        let Some(gate) = &self.gate else { return };
        self.each_resolved(moved, |event, root, dir_rel, _| {
            if !self.engine.roots[root].kind.has_git_control() {
                return ControlFlow::Continue(());
            }
            let in_git_dir = || gate.is_or_was_git_dir(self.engine.roots[root].fd.as_fd(), dir_rel);
            let matters = if event.mask & libc::FAN_ONDIR != 0 {
                matches!(event.name, b"hooks" | b"info") && in_git_dir()
            } else {
                let rel = dir_rel.join(OsStr::from_bytes(event.name));
                let by_name = matches!(event.name, b"alternates" | b"http-alternates") || dir_rel.file_name() == Some(OsStr::new("hooks"));
                super::gate::is_control_name(&rel) && (by_name || in_git_dir() || self.engine.in_git_dir(root, &rel))
            };
            if matters {
                gate.control_moved_away();
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        });
    }

    /// Handles the entries of one batch.
    fn handle_batch(&self, batch: &Batch<'_>, out: &mut Out) {
        self.each_resolved(batch, |event, root, dir_rel, dir| {
            self.handle(event, root, dir_rel, dir, out);
            ControlFlow::Continue(())
        });
    }

    /// Calls `each` with every entry of `batch` whose directory is
    /// (verifiably) in a root, each directory resolved once, until it
    /// breaks.
    fn each_resolved<'a>(&self, batch: &Batch<'a>, mut each: impl FnMut(&RawEvent<'a>, usize, &Path, BorrowedFd<'_>) -> ControlFlow<()>) {
        let mut dirs: HashMap<DirKey<'_>, Option<(usize, PathBuf, OwnedFd)>> = HashMap::new();
        for event in &batch.entries {
            if dirs.len() >= DIR_CACHE {
                dirs.clear();
            }
            let resolved = dirs.entry((event.fsid, event.handle_type, event.handle)).or_insert_with(|| self.resolve_dir(event));
            if let Some((root, dir_rel, dir)) = resolved {
                if each(event, *root, dir_rel, dir.as_fd()).is_break() {
                    return;
                }
            }
        }
    }

    /// Handles one entry of the sandbox (its events merged; see the module
    /// documentation) in the verified directory `dir` (`dir_rel` in `root`).
    fn handle(&self, event: &RawEvent<'_>, root: usize, dir_rel: &Path, dir: BorrowedFd<'_>, out: &mut Out) {
        let mut cause = Cause { pid: Some(event.pid), every_file: false, still_open: None };
        let written = event.mask & (libc::FAN_CREATE | libc::FAN_MODIFY) != 0 && event.mask & libc::FAN_ONDIR == 0;
        // Only a gate's guard seals.
        if self.gate.is_some() && written && event.mask & (libc::FAN_CLOSE_WRITE | libc::FAN_MOVED_TO) == 0 && !event.name.is_empty() {
            // Its writer may still be writing (`echo x > alternates`: the
            // create's event can come before the write).
            cause.still_open = nix::sys::stat::fstatat(dir, OsStr::from_bytes(event.name), AtFlags::AT_SYMLINK_NOFOLLOW)
                .ok()
                .map(|st| (st.st_dev, st.st_ino));
        }
        if event.name.is_empty() || event.name == b"." {
            // An event on the directory itself.
            let Some(name) = dir_rel.file_name().map(OsStr::to_os_string) else { return };
            let parent_rel = dir_rel.parent().unwrap_or(Path::new(""));
            let Ok(parent) = safe_path::open_beneath(self.engine.roots[root].fd.as_fd(), parent_rel, OFlag::O_PATH | OFlag::O_DIRECTORY)
            else {
                return;
            };
            self.handle_entry(root, dir_rel, parent.as_fd(), &name, event.mask, cause, out);
        } else {
            let name = OsStr::from_bytes(event.name);
            self.handle_entry(root, &dir_rel.join(name), dir, name, event.mask, cause, out);
        }
    }

    #[allow(clippy::too_many_arguments)] // verified fds and names, passed explicitly
    fn handle_entry(&self, root: usize, rel: &Path, parent: BorrowedFd<'_>, name: &OsStr, mask: u64, cause: Cause, out: &mut Out) {
        let git_control = self.engine.roots[root].kind.has_git_control();
        if let (Some(gate), true) = (&self.gate, git_control && super::git_model::GitDirMarks::is_mark(name.as_bytes())) {
            if let Ok(dir) = nix::sys::stat::fstat(parent) {
                gate.note_git_dir(&dir);
            }
        }
        if self.engine.protected(root, rel) {
            return;
        }
        if mask & METADATA_EVENTS == 0 {
            // Only written: its content may matter to git, nothing else.
            if git_control {
                self.engine.check_git_event(root, rel, cause, out);
            }
            return;
        }
        // Made or moved in where a kept value leads through: the values
        // are judged again (a symlink there would redirect git).
        if mask & (libc::FAN_CREATE | libc::FAN_MOVED_TO) != 0 && self.engine.is_depended_on(root, rel) {
            out.sweep = true;
        }
        let st = match nix::sys::stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(_) => {
                // Gone already: if it was a symlink at a name git reads in
                // a git dir, a host open meanwhile may have gone through
                // it (a directory there cannot have been one).
                let made = mask & (libc::FAN_CREATE | libc::FAN_MOVED_TO) != 0 && mask & libc::FAN_ONDIR == 0;
                if git_control && made && super::gate::is_redirecting_name(rel) && self.engine.in_git_dir(root, rel) {
                    self.engine.note_taint(root, rel);
                }
                return;
            }
        };
        if let Some(gate) = &self.gate {
            gate.sandbox_touched(&st);
        }
        self.engine.fix_entry(root, rel, parent, name, &st, cause, out);
        if git_control {
            self.engine.check_git_event(root, rel, cause, out);
            if safe_path::kind_of(&st) == FileKind::Symlink {
                self.engine.check_symlink_in_git_dir(root, rel, cause, out);
            }
        }
        if safe_path::kind_of(&st) == FileKind::Directory && mask & libc::FAN_MOVED_TO != 0 {
            walk(&self.engine, root, rel, true, out);
        }
    }

    /// The root, root-relative path and fd of the event's directory, if it
    /// is (verifiably) inside a root.
    fn resolve_dir(&self, event: &RawEvent<'_>) -> Option<(usize, PathBuf, OwnedFd)> {
        let roots = &self.engine.roots;
        let mount = (0..roots.len()).find(|&i| self.fsids[i] == event.fsid)?;
        let dir = crate::sys::open_by_handle_at(
            self.mount_fds[mount].as_fd(),
            event.handle_type,
            event.handle,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
        .ok()?;
        let hint = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())).ok()?;
        let st = nix::sys::stat::fstat(&dir).ok()?;
        // The deepest root whose path the hint is under (roots may nest).
        let mut best: Option<(usize, PathBuf)> = None;
        for (index, root) in roots.iter().enumerate() {
            if self.fsids[index] != event.fsid {
                continue;
            }
            if let Ok(rel) = hint.strip_prefix(&root.path) {
                if best.as_ref().is_none_or(|(b, _)| roots[*b].path.as_os_str().len() < root.path.as_os_str().len()) {
                    best = Some((index, rel.to_owned()));
                }
            }
        }
        let (root, rel) = best?;
        let verified = safe_path::open_beneath(roots[root].fd.as_fd(), &rel, OFlag::O_PATH | OFlag::O_DIRECTORY).ok()?;
        let check = nix::sys::stat::fstat(&verified).ok()?;
        (check.st_dev == st.st_dev && check.st_ino == st.st_ino).then_some((root, rel, verified))
    }
}

/// Whether an event of a process outside the sandbox may have changed a
/// git control file (by name: resolving every developer event would cost
/// their builds).
fn developer_control_write(event: &RawEvent<'_>) -> bool {
    event.mask & libc::FAN_ONDIR == 0
        && event.pid != std::process::id()
        && (super::gate::is_control_name(Path::new(OsStr::from_bytes(event.name)))
            || super::git_model::HOOK_NAMES.iter().any(|h| h.as_bytes() == event.name))
}

/// A directory as events name it: filesystem, handle type and handle.
type DirKey<'a> = ([u8; 8], i32, &'a [u8]);

/// The entries of one batch, in the order of their first event, each with
/// the union of its events' masks.
#[derive(Default)]
struct Batch<'a> {
    entries: Vec<RawEvent<'a>>,
    /// By directory, name, and whether the event was on a directory (a
    /// name that was a file and then a directory in one batch is two
    /// entries: what it was first must not hide under `FAN_ONDIR`).
    index: HashMap<(DirKey<'a>, &'a [u8], bool), usize>,
}

impl<'a> Batch<'a> {
    fn add(&mut self, event: RawEvent<'a>) {
        let key = ((event.fsid, event.handle_type, event.handle), event.name, event.mask & libc::FAN_ONDIR != 0);
        match self.index.get(&key) {
            Some(&at) => self.entries[at].mask |= event.mask,
            None => {
                self.index.insert(key, self.entries.len());
                self.entries.push(event);
            }
        }
    }
}

/// The pid filter's answers within one batch (a batch holds a handful of
/// writers; the filter may read /proc for a pid it has not seen).
#[derive(Default)]
struct PidMemo {
    answers: Vec<(u32, bool)>,
}

impl PidMemo {
    fn accepts(&mut self, pid: u32, filter: &(dyn Fn(u32) -> bool + Send + Sync)) -> bool {
        if let Some(&(_, answer)) = self.answers.iter().find(|(p, _)| *p == pid) {
            return answer;
        }
        let answer = filter(pid);
        if self.answers.len() < 64 {
            self.answers.push((pid, answer));
        }
        answer
    }
}

/// What the buffer holds.
enum Parsed<'a> {
    Event(RawEvent<'a>),
    Overflow,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// How many events a buffer read from the queue holds (the unit of the
/// gate's count: see [`super::gate`]).
fn event_count(buffer: &[u8]) -> u64 {
    let (mut offset, mut count) = (0, 0);
    while let Some(len) = u32_at(buffer, offset).map(|l| l as usize) {
        if len < 24 || offset + len > buffer.len() {
            break;
        }
        offset += len;
        count += 1;
    }
    count
}

/// Parses a buffer of fanotify events (`struct fanotify_event_metadata`
/// followed by info records; see fanotify(7)) without unsafe code.
fn for_each_event<'a>(buffer: &'a [u8], mut each: impl FnMut(Parsed<'a>)) {
    let mut offset = 0;
    while offset + 24 <= buffer.len() {
        let Some(event_len) = u32_at(buffer, offset).map(|l| l as usize) else { return };
        if event_len < 24 || offset + event_len > buffer.len() {
            return;
        }
        let event = &buffer[offset..offset + event_len];
        offset += event_len;
        let version = event[4];
        let (Some(metadata_len), Some(mask), Some(fd), Some(pid)) =
            (u16_at(event, 6), u64_at(event, 8), u32_at(event, 16), u32_at(event, 20))
        else {
            continue;
        };
        crate::sys::close_raw_fd(fd as i32);
        if version != METADATA_VERSION {
            continue;
        }
        if mask & libc::FAN_Q_OVERFLOW != 0 {
            each(Parsed::Overflow);
            continue;
        }
        let mut info = metadata_len as usize;
        while info + 4 <= event.len() {
            let info_type = event[info];
            let Some(len) = u16_at(event, info + 2).map(usize::from) else { break };
            if len < 4 || info + len > event.len() {
                break;
            }
            let record = &event[info..info + len];
            info += len;
            if info_type != libc::FAN_EVENT_INFO_TYPE_DFID_NAME && info_type != libc::FAN_EVENT_INFO_TYPE_DFID {
                continue;
            }
            let (Some(fsid), Some(handle_bytes), Some(handle_type)) = (record.get(4..12), u32_at(record, 12), u32_at(record, 16)) else {
                continue;
            };
            let handle_end = 20 + handle_bytes as usize;
            let Some(handle) = record.get(20..handle_end) else { continue };
            let name = if info_type == libc::FAN_EVENT_INFO_TYPE_DFID_NAME {
                let rest = record.get(handle_end..).unwrap_or_default();
                &rest[..rest.iter().position(|b| *b == 0).unwrap_or(rest.len())]
            } else {
                &b""[..]
            };
            let mut fsid_bytes = [0u8; 8];
            fsid_bytes.copy_from_slice(fsid);
            each(Parsed::Event(RawEvent { mask, pid, fsid: fsid_bytes, handle_type: handle_type as i32, handle, name }));
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(event_len: usize, mask: u64, pid: u32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(event_len as u32).to_ne_bytes());
        b.push(METADATA_VERSION);
        b.push(0);
        b.extend_from_slice(&24u16.to_ne_bytes());
        b.extend_from_slice(&mask.to_ne_bytes());
        b.extend_from_slice(&(-1i32).to_ne_bytes());
        b.extend_from_slice(&pid.to_ne_bytes());
        b
    }

    #[test]
    fn parses_dfid_name_events_and_overflow_and_stops_at_garbage() {
        let mut record = vec![libc::FAN_EVENT_INFO_TYPE_DFID_NAME, 0, 0, 0];
        record.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]); // fsid
        record.extend_from_slice(&8u32.to_ne_bytes());
        record.extend_from_slice(&1i32.to_ne_bytes());
        record.extend_from_slice(&[9; 8]); // handle
        record.extend_from_slice(b"config\0\0");
        let len = record.len() as u16;
        record[2..4].copy_from_slice(&len.to_ne_bytes());
        let mut buffer = metadata(24, libc::FAN_Q_OVERFLOW, 0);
        buffer.extend(metadata(24 + record.len(), libc::FAN_CREATE, 77));
        buffer.extend(&record);
        buffer.extend(metadata(4000, libc::FAN_CREATE, 78)); // claims more than the buffer holds
        let mut seen = Vec::new();
        for_each_event(&buffer, |parsed| match parsed {
            Parsed::Overflow => seen.push("overflow".to_owned()),
            Parsed::Event(e) => {
                assert_eq!(e.fsid, [1, 2, 3, 4, 5, 6, 7, 8]);
                assert_eq!((e.handle_type, e.handle), (1, &[9u8; 8][..]));
                seen.push(format!("{:x} {} {}", e.mask, e.pid, String::from_utf8_lossy(e.name)));
            }
        });
        assert_eq!(seen, vec!["overflow".to_owned(), format!("{:x} 77 config", libc::FAN_CREATE)]);
    }
}
