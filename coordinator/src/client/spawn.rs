//! Starting a Domain's coordinator (`lazaret __coordinator`, detached),
//! relaying what it says on its status pipe while it starts, and showing
//! the start-up's progress ([`StartupDisplay`]): on a terminal, one status
//! line that rewrites itself and is erased before the session's output
//! begins; with `--verbose`, the stage timeline.
//!
//! The stages come from the Domain's journal, which the coordinator writes
//! before each stage acts: the client only reads it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lazaret_protocol::journal::{Event, JournalEntry};

use crate::context::Context;
use crate::layout::DomainDir;
use crate::startup::{Progress, SetupMode, Stage};

use super::{ClientError, RunRequest};

/// How much Lazaret says of its own on stderr; errors are always shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verbosity {
    /// Errors only (`--quiet`): no warnings, notes or status line.
    Quiet,
    /// Warnings and notes, and on a terminal the start-up status line.
    #[default]
    Normal,
    /// Also the start-up stage timeline and the coordinator's log path
    /// (`--verbose`), whether stderr is a terminal or not.
    Verbose,
}

/// What a starting coordinator said on its status pipe: warnings are
/// relayed as they arrive; errors are kept for the final message.
#[derive(Debug, Default)]
pub(super) struct StatusLines {
    pending: Vec<u8>,
    errors: Vec<String>,
}

/// The prefix of an error line on the status pipe.
const ERROR_PREFIX: &str = "lazaret: error: ";

impl StatusLines {
    /// Takes `bytes`, returning the complete non-error lines (to print);
    /// with `all`, an unterminated last line counts too.
    pub fn feed(&mut self, bytes: &[u8], all: bool) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut shown = Vec::new();
        while let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=i).collect();
            self.line(String::from_utf8_lossy(&line).trim_end().to_string(), &mut shown);
        }
        if all && !self.pending.is_empty() {
            let line = String::from_utf8_lossy(&self.pending).trim_end().to_string();
            self.pending.clear();
            self.line(line, &mut shown);
        }
        shown
    }

    fn line(&mut self, line: String, shown: &mut Vec<String>) {
        match line.strip_prefix(ERROR_PREFIX) {
            Some(e) => self.errors.push(e.to_string()),
            None => shown.push(line),
        }
    }

    /// The errors the coordinator reported, one per line.
    pub fn errors(&self) -> Option<String> {
        (!self.errors.is_empty()).then(|| self.errors.join("\n"))
    }
}

/// A coordinator this client started, and its status pipe.
pub(super) struct Launched {
    pub child: Child,
    pipe: File,
    pub status: StatusLines,
    display: StartupDisplay,
}

impl Launched {
    /// Copies start-up messages to stderr (none with `--quiet`) and
    /// updates the start-up display. With `all`, also an unterminated last
    /// line.
    pub fn relay(&mut self, all: bool) {
        let mut buf = [0u8; 4096];
        let mut got = Vec::new();
        loop {
            match self.pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        for line in self.status.feed(&got, all) {
            if self.display.verbosity == Verbosity::Quiet {
                continue;
            }
            match Progress::parse(&line) {
                Some(progress) => self.display.progress(progress),
                None => self.display.line(&line),
            }
        }
        self.display.tick();
    }

    /// The session is in: relays what is left and erases the status line,
    /// so that nothing of it mixes with the agent's output.
    pub fn finish(&mut self) {
        self.relay(false);
        self.display.done();
    }
}

/// Starts the Domain's coordinator with its stdout a non-blocking status
/// pipe and its stderr the Domain's log.
pub(super) fn spawn_coordinator(req: &RunRequest, ctx: &Context, dir: &DomainDir, session: &str) -> Result<Launched, ClientError> {
    let exe = std::env::current_exe().map_err(ClientError::io("finding the lazaret binary"))?;
    let log_path = dir.log();
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&log_path)
        .map_err(ClientError::io(format!("opening {}", log_path.display())))?;
    let mut cmd = Command::new(exe);
    if let Some(c) = &req.config {
        cmd.arg("--config").arg(c);
    }
    cmd.arg("__coordinator")
        .arg("--domain-dir")
        .arg(dir.path())
        .arg("--session")
        .arg(session)
        .arg("--profile")
        .arg(&ctx.profile.name)
        .arg("-C")
        .arg(&req.dir);
    if req.reset_anchor {
        cmd.arg("--reset-anchor");
    }
    match req.setup {
        SetupMode::Normal => {}
        SetupMode::Skip => {
            cmd.arg("--no-setup");
        }
        SetupMode::Rerun => {
            cmd.arg("--reprovision");
        }
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::from(log));
    let mut child = cmd.spawn().map_err(ClientError::io("starting the Domain's coordinator"))?;
    let pipe = child.stdout.take().map(|p| File::from(OwnedFd::from(p))).ok_or_else(|| ClientError::Io {
        context: "the coordinator's status pipe".into(),
        source: std::io::ErrorKind::BrokenPipe.into(),
    })?;
    nix::fcntl::fcntl(&pipe, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).map_err(ClientError::errno("status pipe"))?;
    let journal = ctx.paths.domain_root(&ctx.domain_id).join(crate::journal::JOURNAL_FILE);
    let mut display = StartupDisplay::new(&ctx.profile.name, JournalTail::from_end(journal), req.verbosity);
    if req.verbosity == Verbosity::Verbose {
        display.line(&format!(
            "lazaret: starting the coordinator of Domain {} (its log: {})",
            ctx.domain_id.short(),
            lazaret_protocol::display::escaped(&log_path)
        ));
    }
    Ok(Launched { child, pipe, status: StatusLines::default(), display })
}

/// The stage a journal event starts (the coordinator journals it before
/// the stage acts); `None` for events that start no stage.
fn stage_started_by(event: &Event) -> Option<Stage> {
    match event {
        Event::AcquireDomainLock { .. } => Some(Stage::Lock),
        Event::MountStateAnchor => Some(Stage::StateAnchor),
        Event::CreateTrustAnchor => Some(Stage::TrustAnchor),
        Event::StartSidecar => Some(Stage::Sidecar),
        Event::StartSandbox => Some(Stage::SandboxCreated),
        Event::PublishDomain => Some(Stage::Published),
        _ => None,
    }
}

/// Reads the lines a coordinator appends to a Domain's journal: from its
/// end when the client starts the coordinator, from the start of a new file
/// (a crashed run's journal is moved aside and a new one begun).
struct JournalTail {
    path: PathBuf,
    /// Device and inode of the file read so far.
    file: Option<(u64, u64)>,
    offset: u64,
    partial: Vec<u8>,
}

/// The most of the journal read at once (start-up writes a few lines).
const JOURNAL_READ_LIMIT: u64 = 1 << 20;

impl JournalTail {
    fn from_end(path: PathBuf) -> JournalTail {
        let meta = std::fs::metadata(&path).ok();
        JournalTail { path, file: meta.as_ref().map(|m| (m.dev(), m.ino())), offset: meta.map_or(0, |m| m.len()), partial: Vec::new() }
    }

    /// The entries appended since the last call (unreadable or unparsable
    /// lines are skipped: this is a display, not a check).
    fn new_entries(&mut self) -> Vec<JournalEntry> {
        let Ok(meta) = std::fs::metadata(&self.path) else { return Vec::new() };
        let identity = (meta.dev(), meta.ino());
        if self.file != Some(identity) || meta.len() < self.offset {
            *self = JournalTail { path: std::mem::take(&mut self.path), file: Some(identity), offset: 0, partial: Vec::new() };
        }
        if meta.len() == self.offset {
            return Vec::new();
        }
        let mut bytes = Vec::new();
        let read = File::open(&self.path).and_then(|mut f| {
            f.seek(std::io::SeekFrom::Start(self.offset))?;
            f.take(JOURNAL_READ_LIMIT).read_to_end(&mut bytes)
        });
        if read.is_err() {
            return Vec::new();
        }
        self.offset += bytes.len() as u64;
        self.partial.extend_from_slice(&bytes);
        let mut events = Vec::new();
        while let Some(i) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            if let Ok(entry) = serde_json::from_slice::<JournalEntry>(&line) {
                events.push(entry);
            }
        }
        events
    }
}

/// Erases the terminal's current line and returns to its first column.
const ERASE_LINE: &str = "\r\x1b[2K";
/// How often the journal is looked at while a Domain starts.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// How often the status line's elapsed time is redrawn.
const REDRAW_EVERY: Duration = Duration::from_millis(100);

/// What the developer sees while a Domain starts: the status line on a
/// terminal (stderr; never drawn into a redirected stream), the stage
/// timeline with `--verbose`.
struct StartupDisplay {
    profile: String,
    started: Instant,
    /// `started` in the journal's clock (milliseconds since the epoch).
    started_ms: u64,
    verbosity: Verbosity,
    /// Whether the status line may be drawn: stderr is a terminal that
    /// understands erasing, and not `--quiet`.
    status_line: bool,
    journal: JournalTail,
    stage: Option<Stage>,
    /// The setup step running now (`N/M: ARGV`), shown instead of the stage.
    setup_step: Option<String>,
    /// The status line is on the screen.
    shown: bool,
    last_poll: Option<Instant>,
    last_draw: Option<Instant>,
    finished: bool,
}

impl StartupDisplay {
    fn new(profile: &str, journal: JournalTail, verbosity: Verbosity) -> StartupDisplay {
        let stderr = std::io::stderr();
        let dumb = std::env::var("TERM").map_or(true, |t| t.is_empty() || t == "dumb");
        let status_line = verbosity != Verbosity::Quiet && lazaret_runtime::terminal::is_terminal(stderr.as_fd()) && !dumb;
        StartupDisplay {
            profile: lazaret_protocol::display::inert(profile, 64),
            started: Instant::now(),
            started_ms: u64::try_from(crate::journal::now_ms()).unwrap_or(u64::MAX),
            verbosity,
            status_line,
            journal,
            stage: None,
            setup_step: None,
            shown: false,
            last_poll: None,
            last_draw: None,
            finished: false,
        }
    }

    /// A line of its own on stderr (above the status line, which the next
    /// tick redraws).
    fn line(&mut self, text: &str) {
        self.erase();
        eprintln!("{text}");
    }

    /// Setup progress: on a terminal the status line names the step; the
    /// step headers and their output are printed with `--verbose` or when
    /// stderr is not a terminal (a log then shows what was installed).
    fn progress(&mut self, progress: Progress) {
        let print = self.verbosity == Verbosity::Verbose || !self.status_line;
        match progress {
            Progress::Step(step) => {
                if print {
                    self.line(&Progress::Step(step.clone()).line());
                }
                self.setup_step = Some(step);
                self.last_draw = None;
            }
            Progress::Output(text) => {
                if print {
                    self.line(&format!("  {text}"));
                }
            }
            Progress::Done(text) => {
                if print {
                    self.line(&text);
                }
                self.setup_step = None;
                self.last_draw = None;
            }
        }
        self.tick();
    }

    /// Follows the journal and redraws the status line when due.
    fn tick(&mut self) {
        if self.finished {
            return;
        }
        let now = Instant::now();
        if self.last_poll.is_none_or(|t| now.duration_since(t) >= POLL_EVERY) {
            self.last_poll = Some(now);
            self.follow_journal();
        }
        if self.status_line && self.last_draw.is_none_or(|t| now.duration_since(t) >= REDRAW_EVERY) {
            self.last_draw = Some(now);
            self.draw();
        }
    }

    /// Takes the stages journalled since the last look.
    fn follow_journal(&mut self) {
        for entry in self.journal.new_entries() {
            let Some(stage) = stage_started_by(&entry.event) else { continue };
            self.stage = Some(stage);
            self.last_draw = None;
            if self.verbosity == Verbosity::Verbose {
                // When the coordinator journalled it, not when it was seen.
                let at = Duration::from_millis(entry.timestamp_ms.saturating_sub(self.started_ms)).as_secs_f64();
                self.line(&format!("lazaret: {at:>6.2}s stage {stage}"));
            }
        }
    }

    fn draw(&mut self) {
        // A terminal that does not know its size (0 columns) counts as 80.
        let columns = lazaret_runtime::terminal::window_size(std::io::stderr().as_fd()).map_or(0, |w| usize::from(w.cols));
        let columns = if columns == 0 { 80 } else { columns };
        let label = match &self.setup_step {
            Some(step) => Some(format!("setup {step}")),
            None => self.stage.map(|s| s.to_string()),
        };
        let text = status_text_of(&self.profile, label.as_deref(), self.started.elapsed(), columns);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "{ERASE_LINE}{text}");
        let _ = err.flush();
        self.shown = true;
    }

    fn erase(&mut self) {
        if self.shown {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(ERASE_LINE.as_bytes());
            let _ = err.flush();
            self.shown = false;
        }
    }

    /// The Domain is up (or start-up is over): erase the status line for
    /// good; `--verbose` says how long it took.
    fn done(&mut self) {
        if self.finished {
            return;
        }
        self.erase();
        self.finished = true;
        if self.verbosity == Verbosity::Verbose {
            self.follow_journal();
            eprintln!("lazaret: {:>6.2}s Domain {} started", self.started.elapsed().as_secs_f64(), self.profile);
        }
    }
}

impl Drop for StartupDisplay {
    fn drop(&mut self) {
        // Before any error message the caller prints.
        self.erase();
    }
}

/// The status line: `lazaret: starting Domain PROFILE (STAGE) 1.2s`, cut to
/// fit in `columns - 1` (a line that wraps could not be erased).
#[cfg(test)]
fn status_text(profile: &str, stage: Option<Stage>, elapsed: Duration, columns: usize) -> String {
    status_text_of(profile, stage.map(|s| s.to_string()).as_deref(), elapsed, columns)
}

/// [`status_text`] with any label in the parentheses (a stage, or the
/// setup step running).
/// A label too long for the line is cut (marked `…`) before the elapsed
/// time is.
fn status_text_of(profile: &str, label: Option<&str>, elapsed: Duration, columns: usize) -> String {
    let width = columns.saturating_sub(1).max(1);
    let time = format!(" {:.1}s", elapsed.as_secs_f64());
    let base = format!("lazaret: starting Domain {profile}");
    let stage = match label {
        None => String::new(),
        Some(l) => {
            let room = width.saturating_sub(base.chars().count() + time.chars().count() + 3);
            if l.chars().count() <= room {
                format!(" ({l})")
            } else {
                format!(" ({}…)", l.chars().take(room.saturating_sub(1)).collect::<String>())
            }
        }
    };
    format!("{base}{stage}{time}").chars().take(width).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_names_profile_stage_and_time_and_never_wraps() {
        let t = status_text("shell", Some(Stage::SandboxStarted), Duration::from_millis(1230), 80);
        assert_eq!(t, "lazaret: starting Domain shell (sandbox) 1.2s");
        assert_eq!(status_text("shell", None, Duration::ZERO, 80), "lazaret: starting Domain shell 0.0s");
        assert_eq!(status_text("shell", None, Duration::ZERO, 11).chars().count(), 10);
        assert_eq!(status_text("shell", None, Duration::ZERO, 0).chars().count(), 1);
        let long = status_text_of(
            "claude",
            Some("setup 3/3: npm install -g @anthropic-ai/claude-code --some --more --arguments"),
            Duration::from_millis(41_200),
            80,
        );
        assert_eq!(long.chars().count(), 79, "{long}");
        assert!(
            long.starts_with("lazaret: starting Domain claude (setup 3/3: npm install") && long.ends_with("…) 41.2s"),
            "the time stays: {long}"
        );
    }

    #[test]
    fn journalled_events_name_the_stage_they_start_in_start_up_order() {
        let events = [
            Event::AcquireDomainLock { session: "s".into(), fingerprint: "f".into() },
            Event::MountStateAnchor,
            Event::CreateTrustAnchor,
            Event::StartSidecar,
            Event::StartSandbox,
            Event::PublishDomain,
        ];
        let stages: Vec<Stage> = events.iter().filter_map(stage_started_by).collect();
        assert_eq!(stages.len(), events.len());
        let order = |s: &Stage| Stage::ALL.iter().position(|x| x == s);
        assert!(stages.windows(2).all(|w| order(&w[0]) < order(&w[1])), "{stages:?}");
        assert_eq!(stage_started_by(&Event::BeginTeardown), None);
    }

    #[test]
    fn the_journal_is_followed_from_its_end_and_from_the_start_of_a_new_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal.jsonl");
        let line = |e: Event| format!("{}\n", JournalEntry::now("d", e).to_json_line().expect("json"));
        std::fs::write(&path, line(Event::PublishDomain)).expect("old run");
        let mut tail = JournalTail::from_end(path.clone());
        assert!(tail.new_entries().is_empty(), "what was there before is not this start-up's");
        let lock = line(Event::AcquireDomainLock { session: "s".into(), fingerprint: "f".into() });
        let (first, rest) = lock.split_at(10);
        std::fs::OpenOptions::new().append(true).open(&path).and_then(|mut f| f.write_all(first.as_bytes())).expect("append");
        assert!(tail.new_entries().is_empty(), "half a line is not an event");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{rest}not json\n").as_bytes()))
            .expect("append");
        assert_eq!(tail.new_entries().iter().map(|e| &e.event).filter_map(stage_started_by).collect::<Vec<_>>(), [Stage::Lock]);
        // A crashed run's journal is moved aside and a new one begun.
        std::fs::rename(&path, dir.path().join("aside.jsonl")).expect("move aside");
        std::fs::write(&path, line(Event::MountStateAnchor)).expect("new journal");
        assert_eq!(tail.new_entries().iter().map(|e| &e.event).filter_map(stage_started_by).collect::<Vec<_>>(), [Stage::StateAnchor]);
    }

    #[test]
    fn warnings_are_shown_and_errors_kept_across_partial_reads() {
        let mut s = StatusLines::default();
        assert_eq!(s.feed(b"lazaret: warning: a\nlazaret: err", false), ["lazaret: warning: a"]);
        assert_eq!(s.feed(b"or: it broke\nhalf", false), Vec::<String>::new());
        assert_eq!(s.errors().as_deref(), Some("it broke"));
        assert_eq!(s.feed(b"", true), ["half"]);
        assert_eq!(s.feed(b"lazaret: error: and this\n", true), Vec::<String>::new());
        assert_eq!(s.errors().as_deref(), Some("it broke\nand this"));
    }
}
