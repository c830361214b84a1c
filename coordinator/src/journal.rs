//! A Domain's journal (OR-4's evidence): `<Domain Root>/journal.jsonl`, one
//! fsynced JSON line per transition, every one of them first accepted by the
//! protocol model ([`lazaret_protocol::Machine`]), which is the only place
//! transitions are decided.
//!
//! A journal covers whole coordinator runs from an absent Domain. A run that
//! crashed leaves a journal that ends with the Domain not absent; the next
//! coordinator (holding the lock, so the old one is dead) moves it aside as
//! `journal-<ms>.crashed.jsonl` (still a conformant prefix, and checked as
//! such by `lazaret journal --check`) and starts a new one.
//!
//! # When a line is durable
//!
//! [`DomainJournal::record`] writes a line and fsyncs it before it returns:
//! the line is on the disk before the caller does the real thing.
//! [`DomainJournal::record_unsynced`] writes it (in the same order as every
//! other line, under the same `&mut self`) and returns a [`JournalSync`]
//! instead; the line becomes durable when that is synced, or with the next
//! fsync of the journal, whichever comes first (an fsync covers every line
//! written before it). Two uses:
//!
//! - Group commit: apply and write under the caller's lock, fsync after
//!   letting go of it ([`JournalSync::sync`]), then act. Another thread's
//!   lines are not held up behind this fsync, and one fsync may carry the
//!   lines of several.
//! - Lines that only record what has already happened or been decided, with
//!   no real action that must wait for them, are not synced on their own:
//!   they reach the disk with the next line that must. Which lines those
//!   are is the caller's argument (see the escalation request lifecycle in
//!   `daemon::escalation`). A written line survives a crash of the
//!   coordinator (it is in the kernel's page cache); only a crash of the
//!   machine before the next fsync can lose it, and the journal left is
//!   still a conformant prefix, as after any crash.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lazaret_protocol::journal::{ConformanceError, Event, JournalEntry, Machine, TransitionError};
use lazaret_protocol::model::DomainPhase;

/// File name of the current journal in the Domain Root.
pub const JOURNAL_FILE: &str = "journal.jsonl";

/// Why a transition could not be journalled.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The model does not allow it: the coordinator must not act.
    #[error("the protocol model refuses {0}")]
    Refused(#[from] TransitionError),
    /// The journal could not be read, moved or written.
    #[error("journal {path}: {source}")]
    Io {
        /// The journal file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A journal does not replay against the model.
    #[error("journal {path} does not conform to the protocol model: {source}")]
    Nonconformant {
        /// The journal file.
        path: PathBuf,
        /// The first refused line.
        source: ConformanceError,
    },
}

/// The open journal of one Domain and the model state it implies.
pub struct DomainJournal {
    domain: String,
    path: PathBuf,
    file: File,
    /// The same open file, for fsyncs made outside the caller's lock.
    sync_file: Arc<File>,
    machine: Machine,
    /// Why a line could not be written: from then on the journal takes no
    /// more lines (its model has moved past its file).
    broken: Option<String>,
}

/// Makes the lines a journal has written so far durable (see the module
/// docs): an fsync that needs no access to the [`DomainJournal`].
#[derive(Clone)]
pub struct JournalSync {
    path: PathBuf,
    file: Arc<File>,
}

impl JournalSync {
    /// fsyncs the journal: every line written before this call is on the
    /// disk when it returns `Ok`.
    pub fn sync(&self) -> Result<(), JournalError> {
        self.file.sync_data().map_err(|source| JournalError::Io { path: self.path.clone(), source })
    }
}

impl DomainJournal {
    /// Opens `<domain_root>/journal.jsonl` for a new coordinator run of
    /// `domain`. The caller holds the Domain lock. A journal that does not
    /// end with the Domain absent (a crashed run) or does not replay is moved
    /// aside first; the returned notes say what was done, for the log.
    pub fn open_for_run(domain_root: &Path, domain: &str) -> Result<(DomainJournal, Vec<String>), JournalError> {
        let path = domain_root.join(JOURNAL_FILE);
        let io = |source| JournalError::Io { path: path.clone(), source };
        let mut notes = Vec::new();
        let mut machine = Machine::new();
        match File::open(&path) {
            Ok(f) => match lazaret_protocol::replay_reader(BufReader::new(f)) {
                Ok(m) if domain_absent(&m, domain) => machine = m,
                outcome => {
                    let why = match outcome {
                        Ok(_) => "its run did not end (crash)".to_string(),
                        Err(e) => format!("it does not replay: {e}"),
                    };
                    let aside = domain_root.join(format!("journal-{}.crashed.jsonl", now_ms()));
                    std::fs::rename(&path, &aside).map_err(io)?;
                    notes.push(format!("moved the journal aside as {} ({why})", aside.display()));
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io)?;
        let sync_file = Arc::new(file.try_clone().map_err(io)?);
        Ok((DomainJournal { domain: domain.to_string(), path, file, sync_file, machine, broken: None }, notes))
    }

    /// Applies `event` to the model and, if it is allowed, appends and
    /// fsyncs its line. Call it *before* doing the real thing; on error,
    /// do not do it. (A failed fsync leaves the line written and applied:
    /// an intention that was not carried out, as a crash right after it.)
    pub fn record(&mut self, event: Event) -> Result<(), JournalError> {
        self.record_unsynced(event)?.sync()
    }

    /// Applies `event` to the model and, if it is allowed, appends its line
    /// without waiting for the disk; the returned handle makes it durable
    /// (see the module docs for when that may come later). On error, the
    /// model and the file are unchanged and the caller must not act.
    ///
    /// A line that cannot be written (a full disk) breaks the journal: the
    /// model has already taken the step (applying it is all or nothing, and
    /// keeping a copy to roll back would cost a clone of the whole model per
    /// line), so this and every later call fails and the coordinator acts
    /// on nothing more. A partly written line would have made the file
    /// unreadable past it anyway.
    pub fn record_unsynced(&mut self, event: Event) -> Result<JournalSync, JournalError> {
        let io = |source| JournalError::Io { path: self.path.clone(), source };
        if let Some(why) = &self.broken {
            return Err(io(std::io::Error::other(format!("a line could not be written earlier ({why}); the journal takes no more"))));
        }
        let entry = JournalEntry::now(&self.domain, event);
        let mut line = entry.to_json_line().map_err(|e| io(e.into()))?;
        line.push('\n');
        self.machine.apply(&entry)?;
        if let Err(e) = self.file.write_all(line.as_bytes()) {
            self.broken = Some(e.to_string());
            return Err(io(e));
        }
        Ok(self.syncer())
    }

    /// A handle that fsyncs what this journal has written, usable without
    /// holding it.
    pub fn syncer(&self) -> JournalSync {
        JournalSync { path: self.path.clone(), file: self.sync_file.clone() }
    }

    /// Why the journal takes no more lines, once a write failed.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Whether the model would allow `event` now.
    pub fn allows(&self, event: &Event) -> bool {
        self.machine.check(&JournalEntry::now(&self.domain, event.clone())).is_ok()
    }

    /// The Domain's protocol phase, as the journal implies it.
    pub fn phase(&self) -> String {
        self.machine.domain_state(&self.domain).map(|d| format!("{:?}", d.phase)).unwrap_or_else(|| "Absent".into())
    }

    /// The model state so far.
    pub fn machine(&self) -> &Machine {
        &self.machine
    }
}

fn domain_absent(machine: &Machine, domain: &str) -> bool {
    machine.domain_state(domain).is_none_or(|d| d.phase == DomainPhase::Absent)
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

/// The outcome of checking one journal file.
#[derive(Debug)]
pub struct CheckedJournal {
    /// The file.
    pub path: PathBuf,
    /// Number of transitions replayed.
    pub entries: usize,
    /// Whether the run it records ended (the Domain is absent at the end).
    pub complete: bool,
}

/// Replays the current journal and every journal a crashed run left in
/// `domain_root` against the model. Each must conform; a crashed run's may
/// stop anywhere.
pub fn check_all(domain_root: &Path) -> Result<Vec<CheckedJournal>, JournalError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(domain_root)
        .map_err(|source| JournalError::Io { path: domain_root.to_path_buf(), source })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n == JOURNAL_FILE || (n.starts_with("journal-") && n.ends_with(".crashed.jsonl")))
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let f = File::open(&path).map_err(|source| JournalError::Io { path: path.clone(), source })?;
        let entries = BufReader::new(File::open(&path).map_err(|source| JournalError::Io { path: path.clone(), source })?)
            .lines()
            .map_while(Result::ok)
            .filter(|l| !l.trim().is_empty())
            .count();
        let machine = lazaret_protocol::replay_reader(BufReader::new(f))
            .map_err(|source| JournalError::Nonconformant { path: path.clone(), source })?;
        let complete = machine.state().domains.iter().all(|d| d.phase == DomainPhase::Absent);
        out.push(CheckedJournal { path, entries, complete });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(j: &mut DomainJournal, session: &str) {
        j.record(Event::AcquireDomainLock { session: session.into(), fingerprint: "fp".into() }).expect("lock");
        for e in [Event::MountStateAnchor, Event::CreateTrustAnchor, Event::StartSidecar, Event::StartSandbox, Event::PublishDomain] {
            j.record(e).expect("start-up");
        }
    }

    fn stop(j: &mut DomainJournal) {
        for e in [
            Event::BeginTeardown,
            Event::StopSandbox,
            Event::StopSidecar,
            Event::DestroyTrustAnchor,
            Event::UnmountStateAnchor,
            Event::ReleaseDomainLock,
        ] {
            j.record(e).expect("teardown");
        }
    }

    #[test]
    fn a_refused_transition_writes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut j, _) = DomainJournal::open_for_run(dir.path(), "d1").expect("open");
        j.record(Event::AcquireDomainLock { session: "s1".into(), fingerprint: "fp".into() }).expect("lock");
        assert!(matches!(j.record(Event::StartSandbox), Err(JournalError::Refused(_))));
        let text = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).expect("read");
        assert_eq!(text.lines().count(), 1);
    }

    #[test]
    fn runs_append_and_a_crashed_run_is_moved_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (mut j, notes) = DomainJournal::open_for_run(dir.path(), "d1").expect("open");
            assert!(notes.is_empty());
            start(&mut j, "s1");
            j.record(Event::ConnectSession { session: "s1".into() }).expect("connect");
            j.record(Event::RegisterSession { session: "s1".into(), fingerprint: "fp".into() }).expect("register");
            j.record(Event::DisconnectSession { session: "s1".into() }).expect("disconnect");
            stop(&mut j);
        }
        {
            // A clean run: the next one appends.
            let (mut j, notes) = DomainJournal::open_for_run(dir.path(), "d1").expect("open");
            assert!(notes.is_empty(), "{notes:?}");
            start(&mut j, "s2");
            // ... and crashes here.
        }
        let checked = check_all(dir.path()).expect("conformant");
        assert_eq!(checked.len(), 1);
        assert!(!checked[0].complete);
        let (_j, notes) = DomainJournal::open_for_run(dir.path(), "d1").expect("open");
        assert_eq!(notes.len(), 1, "{notes:?}");
        let checked = check_all(dir.path()).expect("conformant");
        assert_eq!(checked.len(), 2, "{checked:?}");
    }

    #[test]
    fn unsynced_lines_are_written_in_order_and_a_refused_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut j, _) = DomainJournal::open_for_run(dir.path(), "d1").expect("open");
        let sync = j.record_unsynced(Event::AcquireDomainLock { session: "s1".into(), fingerprint: "fp".into() }).expect("lock");
        assert!(matches!(j.record_unsynced(Event::StartSandbox), Err(JournalError::Refused(_))));
        j.record_unsynced(Event::MountStateAnchor).expect("anchor");
        // Synced from another handle, after the fact: both lines.
        sync.sync().expect("sync");
        j.syncer().sync().expect("sync");
        let text = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).expect("read");
        let actions: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["action"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(actions, ["AcquireDomainLock", "MountStateAnchor"]);
        assert_eq!(check_all(dir.path()).expect("conformant")[0].entries, 2);
    }

    #[test]
    fn a_forged_line_fails_the_check() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(JOURNAL_FILE), "{\"timestamp_ms\":1,\"domain\":\"d\",\"action\":\"StartSandbox\"}\n")
            .expect("write");
        assert!(matches!(check_all(dir.path()), Err(JournalError::Nonconformant { .. })));
    }
}
