//! The live state machine a coordinator drives, and the journal it writes.
//!
//! A coordinator keeps one [`Machine`] and calls [`Machine::apply`] with a
//! [`JournalEntry`] *before* doing the real thing the entry describes; if the
//! model refuses, the coordinator must not do it. Every applied entry is one
//! JSON line of the Domain's journal. [`replay`] feeds a journal through a
//! fresh [`Machine`], so the check of a journal and the coordinator's own
//! checks are the same code.
//!
//! Obligations of a coordinator that follow from the model: a Session ID is
//! used for one connection only (a Closed session never returns); a session
//! has at most one accepted request at a time, so a second concurrent request
//! must be refused before `VerifyRequest` (like one with a bad certificate,
//! it is not journalled); closing a session kills its running host command;
//! an event that lost a race (a host command exiting after its cancellation)
//! is refused by [`Machine::apply`] and must then not be acted on. A journal
//! covers whole coordinator runs from an absent Domain: after a crash, the
//! next run starts a new journal (a crashed run's journal is a conformant
//! prefix).
//!
//! Real identifiers (Domain IDs, Session IDs, Escalation Request IDs, command
//! lines) are strings; the machine maps each to a model index the first time
//! it appears and records the model constants the entry implies. Once a
//! session has ended or a request reached a terminal phase, the machine
//! retires it (its index is reused, its ID kept only as a digest and refused
//! if it comes again), so that its size and the cost of an entry stay flat
//! over a long Domain life; see [`Machine`].
//!
//! # Escalation requests: what to journal, in which order
//!
//! Before `VerifyRequest`, and not journalled (the client gets an error
//! frame): a bad or foreign certificate, a Session ID that is not registered
//! and connected, a malformed or oversized frame, a second request of a
//! session whose previous request has not had its result delivered
//! (`activeRequest[s] = NoRequest`), and a request ID seen before (check with
//! [`Machine::check`]: the model refuses a second `VerifyRequest` of one
//! ID). Every accepted request then starts with
//!
//! `VerifyRequest { session, request, command, auto_approved, argv, cwd,
//! justification }`, built with [`Event::verify_request`] (`command` is
//! [`quote_argv`]`(&argv)`; `auto_approved` is true when a rule matches or
//! [`Machine::is_domain_approved`] holds for argv and cwd),
//!
//! followed by exactly one of these (each step applied before the real thing
//! it stands for; "…" is the prefix of the line above):
//!
//! | outcome | events after `VerifyRequest` |
//! |---|---|
//! | rule approves, command exits | `AutoApprove { rule: NAME }`, `StartHostExecution`, `CompleteHostExecution { exit_status }`, `DeliverResult` |
//! | approved for the Domain earlier | `AutoApprove { rule: "domain-approval" }` ([`DOMAIN_APPROVAL_RULE`]), then as above |
//! | developer approves once | `PromptDeveloper`, `DeveloperApprove { for_domain: false }`, `StartHostExecution`, `CompleteHostExecution`, `DeliverResult` |
//! | developer approves for the Domain | `PromptDeveloper`, `DeveloperApprove { for_domain: true }`, then as above |
//! | developer edits, then approves | `PromptDeveloper`, `DeveloperEditApprove { command, argv }` ([`Event::developer_edit_approve`]; an edit that changes nothing is journalled as `DeveloperApprove`), `StartHostExecution`, `CompleteHostExecution`, `DeliverResult` |
//! | developer denies | `PromptDeveloper`, `DeveloperDeny { reason: "" }`, `DeliverResult` |
//! | session without a terminal, no rule | `PromptDeveloper`, `DeveloperDeny { reason: "the session has no terminal" }`, `DeliverResult` |
//! | prompt unanswered | `PromptDeveloper`, `TimeoutRequest`, `DeliverResult` |
//! | command runs too long | … `StartHostExecution`, `TimeoutRequest` (then kill its cgroup), `DeliverResult` |
//! | client cancels (any open phase) | … `CancelRequest` (then withdraw the prompt or kill the command), `DeliverResult` |
//! | command cannot start or is lost | … `StartHostExecution`, `FailHostExecution { reason }`, `DeliverResult` |
//! | session disconnects (any phase before `DeliverResult`) | … `DisconnectSession` only: the model closes the session and cancels its request without a result; kill the command |
//! | Domain fails | … `FailDomain`, then `EvictSession` per connected session (as a disconnect) |
//!
//! `DeliverResult` needs the session connected and `Attached` (its terminal
//! routed back to the Sandbox), which every resolving step above establishes:
//! `PromptDeveloper` routes the terminal to the Prompt, `DeveloperApprove`,
//! `DeveloperEditApprove` and `DeveloperDeny` back to the Sandbox,
//! `StartHostExecution` to the HostProcess, and `CompleteHostExecution`,
//! `TimeoutRequest`, `CancelRequest` and `FailHostExecution` back to the
//! Sandbox. `StartHostExecution` needs the route at the Sandbox too, so a
//! spawn failure is `StartHostExecution` then `FailHostExecution`, never a
//! bare failure. Races resolve by whichever entry is applied first: once a
//! `TimeoutRequest` or `CancelRequest` is applied, a late
//! `CompleteHostExecution` is refused (report Timed out / Cancelled, not the
//! exit status); once `CompleteHostExecution` is applied, a late cancel is
//! refused; after `DisconnectSession`, every step of that request is refused.
//!
//! # Observations
//!
//! A few events record what the coordinator *saw and undid* rather than a
//! protocol step: [`Event::NeutraliseSandboxWrite`] (the Workspace Guard).
//! They map to no TLA+ action. The rule: an observation is accepted while
//! the Domain is not Absent (its coordinator runs: Starting, Ready,
//! Stopping or Failed), refused otherwise, and changes no model state, so
//! a journal with observations is a behaviour of the model once they are
//! left out, and `Lazaret.tla` needs no change for them.
//!
//! ```
//! use lazaret_protocol::journal::{Event, JournalEntry, Machine};
//!
//! let mut machine = Machine::new();
//! let domain = "3f9c2a";
//! let lock = JournalEntry::now(domain, Event::AcquireDomainLock {
//!     session: "s-1".into(),
//!     fingerprint: "sha256:ab".into(),
//! });
//! machine.apply(&lock)?; // then take the lock for real; write `lock.to_json_line()`
//! machine.apply(&JournalEntry::now(domain, Event::MountStateAnchor))?;
//! // The sandbox may not start before the sidecar: the model refuses.
//! let early = JournalEntry::now(domain, Event::StartSandbox);
//! assert!(machine.apply(&early).is_err());
//! # Ok::<(), lazaret_protocol::journal::TransitionError>(())
//! ```

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::digest_set::IdDigestSet;
use crate::model::{
    Action, CommandId, CommandSpec, Config, DomainId, DomainPhase, DomainState, Invariant, Refused, RequestId, RequestSpec, RequestState,
    SessionId, SessionPhase, SessionSpec, SessionState, State, Subject, check_invariants, step,
};
use crate::shell::quote_argv;

/// One protocol transition, with the real identifiers it concerns. The
/// variant names are the TLA+ action names (the `action` field of a line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action")]
pub enum Event {
    /// A launcher found the Domain absent, took its lock and became its
    /// coordinator; `fingerprint` is the Configuration Fingerprint it runs with.
    AcquireDomainLock {
        /// The launching session.
        session: String,
        /// The Domain's Configuration Fingerprint for this run.
        fingerprint: String,
    },
    /// The State Anchor overlay is mounted.
    MountStateAnchor,
    /// The Domain's Trust Anchor (CA) exists.
    CreateTrustAnchor,
    /// The Network Sidecar is up and its policy installed.
    StartSidecar,
    /// The Agent Sandbox is started (its specification was checked to join no
    /// host namespace).
    StartSandbox,
    /// Start-up refused: the sandbox specification would join a host namespace.
    AbortUnsafeStart,
    /// The Domain's socket is published; sessions may connect.
    PublishDomain,
    /// Something failed; the socket is withdrawn and teardown follows.
    FailDomain {
        /// What failed, for the developer.
        #[serde(default)]
        reason: String,
    },
    /// The last session left; teardown starts.
    BeginTeardown,
    /// The sandbox is stopped and deleted.
    StopSandbox,
    /// The sidecar is stopped and its namespace removed.
    StopSidecar,
    /// The Trust Anchor is destroyed.
    DestroyTrustAnchor,
    /// The State Anchor is unmounted.
    UnmountStateAnchor,
    /// The coordinator releases the Domain lock and exits.
    ReleaseDomainLock,
    /// A session connected over mutual TLS.
    ConnectSession {
        /// The session.
        session: String,
    },
    /// A connected session registered with a matching fingerprint.
    RegisterSession {
        /// The session.
        session: String,
        /// The fingerprint it presented.
        fingerprint: String,
    },
    /// A connected session presented a different fingerprint and was closed.
    RejectSession {
        /// The session.
        session: String,
        /// The fingerprint it presented.
        fingerprint: String,
    },
    /// A session's connection ended.
    DisconnectSession {
        /// The session.
        session: String,
    },
    /// The coordinator closed a session of a failed Domain.
    EvictSession {
        /// The session.
        session: String,
    },
    /// A launcher gave up before connecting.
    AbandonLaunch {
        /// The session.
        session: String,
    },
    /// An escalation request with a valid client certificate for `session`
    /// was accepted.
    VerifyRequest {
        /// The registered session the certificate names.
        session: String,
        /// The Escalation Request ID.
        request: String,
        /// The requested command: [`quote_argv`]`(&argv)` (checked when
        /// `argv` is present). It names the model's command constant.
        command: String,
        /// Whether the command is approved without asking: an escalation
        /// rule matches it, or the developer approved this argv and working
        /// directory for the Domain's life before.
        auto_approved: bool,
        /// The requested argument vector (agent-controlled). Empty only in
        /// journals written before it was recorded.
        #[serde(default)]
        argv: Vec<String>,
        /// The requested working directory inside the sandbox.
        #[serde(default)]
        cwd: String,
        /// The agent's justification (agent-controlled).
        #[serde(default)]
        justification: String,
    },
    /// A rule approved the request.
    AutoApprove {
        /// The request.
        request: String,
        /// The name of the rule that matched, or [`DOMAIN_APPROVAL_RULE`]
        /// when an earlier approve-for-the-Domain decision did (checked).
        #[serde(default)]
        rule: String,
    },
    /// The request is shown to the developer on its session's terminal.
    PromptDeveloper {
        /// The request.
        request: String,
    },
    /// The developer approved the command as requested.
    DeveloperApprove {
        /// The request.
        request: String,
        /// The developer approved this exact argv and working directory for
        /// the rest of the Domain's life: later identical requests are
        /// verified as auto-approved and approved by [`DOMAIN_APPROVAL_RULE`].
        #[serde(default)]
        for_domain: bool,
    },
    /// The developer edited the command, then approved the edited one.
    DeveloperEditApprove {
        /// The request.
        request: String,
        /// The edited command, [`quote_argv`]`(&argv)` (checked when `argv`
        /// is present); must differ from the requested one.
        command: String,
        /// The edited argument vector. Empty only in journals written before
        /// it was recorded.
        #[serde(default)]
        argv: Vec<String>,
    },
    /// The developer denied the request (or the coordinator did on the
    /// developer's behalf: a session without a terminal cannot be asked).
    DeveloperDeny {
        /// The request.
        request: String,
        /// Why, when it was not the developer's keypress (for example
        /// "the session has no terminal"); empty otherwise.
        #[serde(default)]
        reason: String,
    },
    /// The approved command starts on the host.
    StartHostExecution {
        /// The request.
        request: String,
    },
    /// The host command exited.
    CompleteHostExecution {
        /// The request.
        request: String,
        /// Its exit status, if it exited normally.
        #[serde(default)]
        exit_status: Option<i32>,
    },
    /// The request timed out (a running host command is killed).
    TimeoutRequest {
        /// The request.
        request: String,
    },
    /// The client cancelled the request (a running host command is killed).
    CancelRequest {
        /// The request.
        request: String,
    },
    /// The host command could not run or was lost.
    FailHostExecution {
        /// The request.
        request: String,
        /// What failed.
        #[serde(default)]
        reason: String,
    },
    /// The Escalation Result was delivered to the client.
    DeliverResult {
        /// The request.
        request: String,
    },
    /// The Workspace Guard neutralised something the sandbox wrote in the
    /// workspace, its Ignored Workspace State or a volume (issue 13): a git
    /// control file quarantined, a new repository's configuration reduced,
    /// privilege bits or file capabilities removed, ownership given back to
    /// the developer.
    ///
    /// An *observation*, not a TLA+ action: it maps to no model action and
    /// changes no model state. [`Machine::apply`] accepts it while the
    /// Domain is not Absent (its coordinator holds the lock: Starting,
    /// Ready, Stopping or Failed) and refuses it otherwise, so a journal
    /// still replays as a behaviour of the model with these lines left out.
    /// Every text field may carry agent-chosen names: make them inert
    /// before showing them.
    NeutraliseSandboxWrite {
        /// The guarded root the path is in: its label (`workspace`,
        /// `ignored`, `volume …`).
        root: String,
        /// The path, relative to that root.
        path: String,
        /// What was done: the guard's action kind (`quarantined`,
        /// `filtered_git_config`, `cleared_privilege_bits`,
        /// `removed_file_capabilities`, `changed_owner`).
        kind: String,
        /// The one-line account the developer's terminals showed.
        summary: String,
        /// Why it was neutralised.
        #[serde(default)]
        reason: String,
        /// The quarantine entry holding the original (`lazaret audit
        /// PROFILE --restore ID` puts it back), when the file was moved aside.
        #[serde(default)]
        quarantine_id: Option<String>,
        /// How it was found: `event` (the guard saw the write) or `sweep`
        /// (a full sweep: session end, Domain stop, guard start, overflow).
        #[serde(default)]
        found_by: String,
    },
}

/// The [`Event::AutoApprove`] rule name of a request approved because the
/// developer approved the same argv and working directory for the Domain.
pub const DOMAIN_APPROVAL_RULE: &str = "domain-approval";

impl Event {
    /// A [`Event::VerifyRequest`] whose `command` is derived from `argv`, as
    /// [`Machine::apply`] checks.
    pub fn verify_request(session: &str, request: &str, argv: &[String], cwd: &str, justification: &str, auto_approved: bool) -> Self {
        Self::VerifyRequest {
            session: session.to_owned(),
            request: request.to_owned(),
            command: quote_argv(argv),
            auto_approved,
            argv: argv.to_vec(),
            cwd: cwd.to_owned(),
            justification: justification.to_owned(),
        }
    }

    /// A [`Event::DeveloperEditApprove`] whose `command` is derived from
    /// the edited `argv`.
    pub fn developer_edit_approve(request: &str, argv: &[String]) -> Self {
        Self::DeveloperEditApprove { request: request.to_owned(), command: quote_argv(argv), argv: argv.to_vec() }
    }

    /// Whether the event is an observation: journalled while its Domain's
    /// coordinator runs, mapped to no model action, changing no model state
    /// (see [`Event::NeutraliseSandboxWrite`]).
    pub fn is_observation(&self) -> bool {
        matches!(self, Self::NeutraliseSandboxWrite { .. })
    }

    /// The TLA+ action name of the event (for an observation, its own name;
    /// no TLA+ action has it).
    pub fn name(&self) -> &'static str {
        match self {
            Self::AcquireDomainLock { .. } => "AcquireDomainLock",
            Self::MountStateAnchor => "MountStateAnchor",
            Self::CreateTrustAnchor => "CreateTrustAnchor",
            Self::StartSidecar => "StartSidecar",
            Self::StartSandbox => "StartSandbox",
            Self::AbortUnsafeStart => "AbortUnsafeStart",
            Self::PublishDomain => "PublishDomain",
            Self::FailDomain { .. } => "FailDomain",
            Self::BeginTeardown => "BeginTeardown",
            Self::StopSandbox => "StopSandbox",
            Self::StopSidecar => "StopSidecar",
            Self::DestroyTrustAnchor => "DestroyTrustAnchor",
            Self::UnmountStateAnchor => "UnmountStateAnchor",
            Self::ReleaseDomainLock => "ReleaseDomainLock",
            Self::ConnectSession { .. } => "ConnectSession",
            Self::RegisterSession { .. } => "RegisterSession",
            Self::RejectSession { .. } => "RejectSession",
            Self::DisconnectSession { .. } => "DisconnectSession",
            Self::EvictSession { .. } => "EvictSession",
            Self::AbandonLaunch { .. } => "AbandonLaunch",
            Self::VerifyRequest { .. } => "VerifyRequest",
            Self::AutoApprove { .. } => "AutoApprove",
            Self::PromptDeveloper { .. } => "PromptDeveloper",
            Self::DeveloperApprove { .. } => "DeveloperApprove",
            Self::DeveloperEditApprove { .. } => "DeveloperEditApprove",
            Self::DeveloperDeny { .. } => "DeveloperDeny",
            Self::StartHostExecution { .. } => "StartHostExecution",
            Self::CompleteHostExecution { .. } => "CompleteHostExecution",
            Self::TimeoutRequest { .. } => "TimeoutRequest",
            Self::CancelRequest { .. } => "CancelRequest",
            Self::FailHostExecution { .. } => "FailHostExecution",
            Self::DeliverResult { .. } => "DeliverResult",
            Self::NeutraliseSandboxWrite { .. } => "NeutraliseSandboxWrite",
        }
    }
}

/// One line of a Domain's journal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Milliseconds since the Unix epoch when the transition was applied.
    pub timestamp_ms: u64,
    /// The real Domain ID.
    pub domain: String,
    /// The transition.
    #[serde(flatten)]
    pub event: Event,
}

impl JournalEntry {
    /// An entry for `event` of `domain`, stamped with the current time.
    pub fn now(domain: &str, event: Event) -> Self {
        let timestamp_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self { timestamp_ms, domain: domain.to_owned(), event }
    }

    /// The entry as one JSON line, without the trailing newline.
    pub fn to_json_line(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

/// Why the machine refused a journal entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The model does not allow the action in the current state.
    #[error("the model forbids {event}: {refused}")]
    Refused {
        /// The event's action name.
        event: &'static str,
        /// The failed enabling conjunct.
        refused: Refused,
    },
    /// The entry names a session or request the journal has not introduced.
    #[error("{event} names unknown {kind} {id:?}")]
    Unknown {
        /// The event's action name.
        event: &'static str,
        /// "session" or "request".
        kind: &'static str,
        /// The real identifier.
        id: String,
    },
    /// The entry names a session that has ended or a request that reached
    /// a terminal phase, which a retiring [`Machine`] no longer holds: each
    /// ID is used once (SR-9), and nothing can happen to it any more.
    #[error("{event} names {kind} {id:?}, which has ended (an ID is used once)")]
    Retired {
        /// The event's action name.
        event: &'static str,
        /// "session" or "request".
        kind: &'static str,
        /// The real identifier.
        id: String,
    },
    /// The entry contradicts a constant an earlier entry established (a
    /// session's fingerprint, a request's session, a session's Domain), names
    /// a command that is not its argv quoted, or claims a Domain approval
    /// that was never given.
    #[error("{event} contradicts the journal: {detail}")]
    Inconsistent {
        /// The event's action name.
        event: &'static str,
        /// What it contradicts.
        detail: String,
    },
    /// An observation ([`Event::is_observation`]) of a Domain whose
    /// coordinator does not run (the Domain is Absent or never appeared).
    #[error("{event} needs a running coordinator of Domain {domain:?}, but the Domain is absent")]
    NotRunning {
        /// The event's name.
        event: &'static str,
        /// The real Domain ID.
        domain: String,
    },
    /// The transition was allowed but led to a state breaking an invariant
    /// (a bug in the model itself; never expected).
    #[error("{event} leads to a state violating {invariant:?}")]
    Invariant {
        /// The event's action name.
        event: &'static str,
        /// The violated invariant.
        invariant: Invariant,
    },
}

/// A journal line the model does not accept.
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    /// The line is not a journal entry.
    #[error("journal line {line}: not a journal entry: {source}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// The line could not be read.
    #[error("journal line {line}: cannot read: {source}")]
    Read {
        /// 1-based line number.
        line: usize,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The transition is not one the model allows.
    #[error("journal line {line}: {source}")]
    Transition {
        /// 1-based line number.
        line: usize,
        /// Why it is not allowed.
        source: TransitionError,
    },
}

/// The protocol state of one or more Domains, driven by journal entries.
///
/// # What it remembers
///
/// A session that has ended (Closed) and a request in a terminal phase
/// (Completed, Denied, TimedOut, Cancelled, Failed) can take no further
/// step in the model: every action of a session needs it New or Connected,
/// and a Closed session is neither; every action of a request needs it
/// Unused, open or pending a result. A machine made with [`Machine::new`]
/// therefore *retires* them after the step that ends them: their model
/// slots go on a free list for the next new session or request, their
/// name maps and details are dropped, and a command constant no live
/// request names is freed too. So a long-lived Domain's machine holds only
/// what is live, and an apply costs the same after a million requests as
/// after ten.
///
/// Replay protection stays (SR-9): the real ID of each retired session
/// and request is kept as a 128-bit digest ([`IdDigestSet`]: 16 MiB per
/// million IDs), and an entry that names one again is refused with
/// [`TransitionError::Retired`], where a machine keeping everything would
/// refuse it with [`TransitionError::Refused`] or
/// [`TransitionError::Inconsistent`]: the same entries are accepted (a
/// differential test checks it), only the reason differs.
///
/// [`Machine::keeping_history`] makes a machine that retires nothing, for
/// a consumer that wants to look at ended sessions and requests after a
/// replay (tests, forensics); it grows with the journal.
///
/// The [`State`] and [`Config`] a retiring machine exposes keep the slots
/// of retired entities (a Closed session, a terminal request, which satisfy
/// every invariant) until they are reused under another name: look
/// entities up by their real IDs ([`Machine::session_state`] and friends),
/// not by slot.
#[derive(Clone, Debug, Default)]
pub struct Machine {
    /// What an entry may change; each apply works on a copy of it.
    live: Live,
    /// Digests of retired Session IDs and request IDs: only ever added to,
    /// after an entry was accepted, so an apply never copies it.
    retired: IdDigestSet,
    retention: Retention,
}

/// Whether a [`Machine`] retires ended sessions and terminal requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Retention {
    #[default]
    Retire,
    KeepHistory,
}

/// [`IdDigestSet`] kinds of retired IDs.
const SESSION: &str = "session";
const REQUEST: &str = "request";

/// The live part of a [`Machine`].
#[derive(Clone, Debug, Default)]
struct Live {
    config: Config,
    state: State,
    domains: HashMap<String, DomainId>,
    sessions: HashMap<String, SessionId>,
    requests: HashMap<String, RequestId>,
    /// Model command constants by (command, auto-approved): see
    /// [`Live::command`] for why one real command may be two constants.
    commands: HashMap<(String, bool), CommandId>,
    /// Each verified request's command and working directory.
    request_details: HashMap<RequestId, RequestDetails>,
    /// (Domain, command, working directory) the developer approved for the
    /// rest of the Domain's life.
    domain_approvals: HashSet<(DomainId, String, String)>,
    /// Slots of retired entities, reused before the tables grow.
    free: FreeSlots,
}

/// Model slots whose entity was retired.
#[derive(Clone, Debug, Default)]
struct FreeSlots {
    sessions: Vec<SessionId>,
    requests: Vec<RequestId>,
    commands: Vec<CommandId>,
}

/// What the machine remembers of a verified request besides its model
/// constants.
#[derive(Clone, Debug, Default)]
struct RequestDetails {
    command: String,
    cwd: String,
}

impl Machine {
    /// A machine with no Domain, session or request yet, which retires
    /// ended sessions and terminal requests (see [`Machine`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// A machine that keeps every session and request it has seen, ended
    /// or not, so that their final states can be inspected; it grows with
    /// the journal (an apply costs time in proportion too).
    pub fn keeping_history() -> Self {
        Self { retention: Retention::KeepHistory, ..Self::default() }
    }

    /// Whether this machine keeps ended sessions and terminal requests.
    pub fn keeps_history(&self) -> bool {
        self.retention == Retention::KeepHistory
    }

    /// How many Session IDs and request IDs have been retired.
    pub fn retired_ids(&self) -> usize {
        self.retired.len()
    }

    /// The current model state (with retired entities' slots: see
    /// [`Machine`]).
    pub fn state(&self) -> &State {
        &self.live.state
    }

    /// The model constants established so far (with retired entities'
    /// slots: see [`Machine`]).
    pub fn config(&self) -> &Config {
        &self.live.config
    }

    /// The model index of a real Domain ID, if it has appeared.
    pub fn domain_index(&self, domain: &str) -> Option<DomainId> {
        self.live.domains.get(domain).copied()
    }

    /// The model index of a real Session ID, if it has appeared and has
    /// not been retired.
    pub fn session_index(&self, session: &str) -> Option<SessionId> {
        self.live.sessions.get(session).copied()
    }

    /// The model index of a real Escalation Request ID, if it has appeared
    /// and has not been retired.
    pub fn request_index(&self, request: &str) -> Option<RequestId> {
        self.live.requests.get(request).copied()
    }

    /// Whether a Session ID was retired: it ended, and any entry naming it
    /// is refused.
    pub fn is_retired_session(&self, session: &str) -> bool {
        self.retired.contains(SESSION, session)
    }

    /// Whether a request ID was retired: it reached a terminal phase, and
    /// any entry naming it is refused.
    pub fn is_retired_request(&self, request: &str) -> bool {
        self.retired.contains(REQUEST, request)
    }

    /// The model variables of a real Domain, if it has appeared.
    pub fn domain_state(&self, domain: &str) -> Option<&DomainState> {
        self.domain_index(domain).map(|d| &self.live.state.domains[d.0])
    }

    /// The model variables of a real session, if it has appeared and has
    /// not been retired.
    pub fn session_state(&self, session: &str) -> Option<&SessionState> {
        self.session_index(session).map(|s| &self.live.state.sessions[s.0])
    }

    /// The model variables of a real request, if it has appeared and has
    /// not been retired.
    pub fn request_state(&self, request: &str) -> Option<&RequestState> {
        self.request_index(request).map(|r| &self.live.state.requests[r.0])
    }

    /// Whether the developer approved `argv` in `cwd` for the rest of the
    /// life of `domain` (so a new identical request is auto-approved by
    /// [`DOMAIN_APPROVAL_RULE`]).
    pub fn is_domain_approved(&self, domain: &str, argv: &[String], cwd: &str) -> bool {
        self.domain_index(domain).is_some_and(|d| self.live.domain_approvals.contains(&(d, quote_argv(argv), cwd.to_owned())))
    }

    /// Whether the model would accept `entry` now, without applying it.
    pub fn check(&self, entry: &JournalEntry) -> Result<(), TransitionError> {
        if entry.event.is_observation() {
            return self.observe(entry);
        }
        self.successor(entry).map(|_| ())
    }

    /// Applies `entry` if the model allows it and returns the model action
    /// (`None` for an observation, which changes no model state); on
    /// refusal nothing changes. A retiring machine then retires what the
    /// step ended.
    pub fn apply(&mut self, entry: &JournalEntry) -> Result<Option<Action>, TransitionError> {
        if entry.event.is_observation() {
            return self.observe(entry).map(|()| None);
        }
        let (next, action) = self.successor(entry)?;
        self.live = next;
        if self.retention == Retention::Retire {
            self.live.retire_ended_by(action, &mut self.retired);
        }
        Ok(Some(action))
    }

    /// The live part after `entry`, and its action; `self` unchanged. The
    /// copy is what makes a refusal change nothing; it is as large as
    /// what is live (everything, when keeping history).
    fn successor(&self, entry: &JournalEntry) -> Result<(Live, Action), TransitionError> {
        let mut next = self.live.clone();
        let action = next.action_for(entry, &self.retired)?;
        let event = entry.event.name();
        next.state = step(&next.config, &next.state, &action).map_err(|refused| TransitionError::Refused { event, refused })?;
        check_invariants(&next.config, &next.state).map_err(|invariant| TransitionError::Invariant { event, invariant })?;
        Ok((next, action))
    }

    /// Accepts an observation of a Domain whose coordinator runs (any
    /// phase but Absent); changes nothing.
    fn observe(&self, entry: &JournalEntry) -> Result<(), TransitionError> {
        match self.domain_state(&entry.domain) {
            Some(d) if d.phase != DomainPhase::Absent => Ok(()),
            _ => Err(TransitionError::NotRunning { event: entry.event.name(), domain: entry.domain.clone() }),
        }
    }

    /// Sessions that are neither New nor Closed.
    pub fn live_sessions(&self) -> usize {
        self.live.state.sessions.iter().filter(|s| !matches!(s.phase, SessionPhase::New | SessionPhase::Closed)).count()
    }
}

impl Live {
    /// Maps an entry to its model action, adding the Domain, session, request
    /// or command it introduces and the constants it implies. An ID in
    /// `retired` is refused.
    fn action_for(&mut self, entry: &JournalEntry, retired: &IdDigestSet) -> Result<Action, TransitionError> {
        let event = entry.event.name();
        let d = self.domain(&entry.domain);
        let action = match &entry.event {
            Event::AcquireDomainLock { session, fingerprint } => {
                let s = self.session(event, d, session, retired)?;
                // A new run of an absent Domain may use an edited configuration:
                // the fingerprint is a constant of the run. The launcher validated
                // the configuration, so it is confined (ConfigSafe).
                if self.state.domains[d.0].phase == DomainPhase::Absent {
                    let spec = &mut self.config.domains[d.0];
                    spec.fingerprint = fingerprint.clone();
                    spec.config_safe = true;
                    // Approvals for a Domain's life end with it.
                    self.domain_approvals.retain(|(domain, _, _)| *domain != d);
                }
                Action::AcquireDomainLock(s)
            }
            Event::MountStateAnchor => Action::MountStateAnchor(d),
            Event::CreateTrustAnchor => Action::CreateTrustAnchor(d),
            Event::StartSidecar => Action::StartSidecar(d),
            Event::StartSandbox => {
                self.set_isolation(d, true);
                Action::StartSandbox(d)
            }
            Event::AbortUnsafeStart => {
                self.set_isolation(d, false);
                Action::AbortUnsafeStart(d)
            }
            Event::PublishDomain => Action::PublishDomain(d),
            Event::FailDomain { .. } => Action::FailDomain(d),
            Event::BeginTeardown => Action::BeginTeardown(d),
            Event::StopSandbox => Action::StopSandbox(d),
            Event::StopSidecar => Action::StopSidecar(d),
            Event::DestroyTrustAnchor => Action::DestroyTrustAnchor(d),
            Event::UnmountStateAnchor => Action::UnmountStateAnchor(d),
            Event::ReleaseDomainLock => Action::ReleaseDomainLock(d),
            Event::ConnectSession { session } => Action::ConnectSession(self.session(event, d, session, retired)?),
            Event::RegisterSession { session, fingerprint } => {
                let s = self.session(event, d, session, retired)?;
                self.set_fingerprint(event, s, fingerprint)?;
                Action::RegisterSession(s)
            }
            Event::RejectSession { session, fingerprint } => {
                let s = self.session(event, d, session, retired)?;
                self.set_fingerprint(event, s, fingerprint)?;
                Action::RejectSession(s)
            }
            Event::DisconnectSession { session } => Action::DisconnectSession(self.known_session(event, session, retired)?),
            Event::EvictSession { session } => Action::EvictSession(self.known_session(event, session, retired)?),
            Event::AbandonLaunch { session } => Action::AbandonLaunch(self.session(event, d, session, retired)?),
            Event::VerifyRequest { session, request, command, auto_approved, argv, cwd, .. } => {
                let s = self.known_session(event, session, retired)?;
                check_rendering(event, command, argv)?;
                let c = self.command(command, *auto_approved);
                let r = match self.requests.get(request) {
                    Some(&r) => {
                        if self.config.requests[r.0].session != s {
                            return Err(TransitionError::Inconsistent {
                                event,
                                detail: format!("request {request:?} belongs to another session"),
                            });
                        }
                        r
                    }
                    None if retired.contains(REQUEST, request) => {
                        return Err(TransitionError::Retired { event, kind: REQUEST, id: request.clone() });
                    }
                    None => {
                        // Only requests with a valid client certificate are journalled.
                        let r = self.new_request(RequestSpec { name: request.clone(), session: s, command: c, certificate_valid: true });
                        let details = RequestDetails { command: command.clone(), cwd: cwd.clone() };
                        self.request_details.insert(r, details);
                        r
                    }
                };
                Action::VerifyRequest(r)
            }
            Event::AutoApprove { request, rule } => {
                let r = self.request(event, request, retired)?;
                if rule == DOMAIN_APPROVAL_RULE && !self.domain_approved(d, r) {
                    return Err(TransitionError::Inconsistent {
                        event,
                        detail: format!("request {request:?} was not approved for the Domain before"),
                    });
                }
                Action::AutoApprove(r)
            }
            Event::PromptDeveloper { request } => Action::PromptDeveloper(self.request(event, request, retired)?),
            Event::DeveloperApprove { request, for_domain } => {
                let r = self.request(event, request, retired)?;
                if *for_domain {
                    // Applied to a copy: forgotten again if the model refuses.
                    let details = self.request_details.get(&r).cloned().unwrap_or_default();
                    self.domain_approvals.insert((d, details.command, details.cwd));
                }
                Action::DeveloperApprove(r)
            }
            Event::DeveloperEditApprove { request, command, argv } => {
                let r = self.request(event, request, retired)?;
                check_rendering(event, command, argv)?;
                // The rules were never asked about the edited command: it is
                // the developer's own decision, not auto-approved.
                let c = self.command(command, false);
                Action::DeveloperEditApprove(r, c)
            }
            Event::DeveloperDeny { request, .. } => Action::DeveloperDeny(self.request(event, request, retired)?),
            Event::StartHostExecution { request } => Action::StartHostExecution(self.request(event, request, retired)?),
            Event::CompleteHostExecution { request, .. } => Action::CompleteHostExecution(self.request(event, request, retired)?),
            Event::TimeoutRequest { request } => Action::TimeoutRequest(self.request(event, request, retired)?),
            Event::CancelRequest { request } => Action::CancelRequest(self.request(event, request, retired)?),
            Event::FailHostExecution { request, .. } => Action::FailHostExecution(self.request(event, request, retired)?),
            Event::DeliverResult { request } => Action::DeliverResult(self.request(event, request, retired)?),
            // Observations never reach here (apply handles them first); a
            // refusal keeps this total without a panic.
            Event::NeutraliseSandboxWrite { .. } => {
                return Err(TransitionError::NotRunning { event, domain: entry.domain.clone() });
            }
        };
        // Every action concerns the entry's Domain.
        let concerned = self.config.action_domain(&action);
        if concerned != d {
            return Err(TransitionError::Inconsistent { event, detail: format!("it concerns another Domain than {:?}", entry.domain) });
        }
        Ok(action)
    }

    fn domain(&mut self, domain: &str) -> DomainId {
        if let Some(&d) = self.domains.get(domain) {
            return d;
        }
        // Fingerprint and safety are set by the entries that establish them.
        // Domains are never retired: a journal has one, or a few.
        let d = self.config.add_domain(domain, "");
        self.state.domains.push(DomainState::initial());
        self.domains.insert(domain.to_owned(), d);
        d
    }

    /// The session `id` of Domain `d`, added (as New) if it has not appeared.
    fn session(&mut self, event: &'static str, d: DomainId, id: &str, retired: &IdDigestSet) -> Result<SessionId, TransitionError> {
        if let Some(&s) = self.sessions.get(id) {
            if self.config.sessions[s.0].domain != d {
                return Err(TransitionError::Inconsistent { event, detail: format!("session {id:?} belongs to another Domain") });
            }
            return Ok(s);
        }
        if retired.contains(SESSION, id) {
            return Err(TransitionError::Retired { event, kind: SESSION, id: id.to_owned() });
        }
        let spec = SessionSpec { name: id.to_owned(), domain: d, fingerprint: String::new() };
        let s = SessionId(reuse_or_push(
            self.free.sessions.pop().map(|s| s.0),
            (&mut self.config.sessions, spec),
            (&mut self.state.sessions, SessionState::initial()),
        ));
        self.sessions.insert(id.to_owned(), s);
        Ok(s)
    }

    fn known_session(&self, event: &'static str, id: &str, retired: &IdDigestSet) -> Result<SessionId, TransitionError> {
        match self.sessions.get(id) {
            Some(&s) => Ok(s),
            None => Err(unknown_or_retired(event, SESSION, id, retired)),
        }
    }

    fn request(&self, event: &'static str, id: &str, retired: &IdDigestSet) -> Result<RequestId, TransitionError> {
        match self.requests.get(id) {
            Some(&r) => Ok(r),
            None => Err(unknown_or_retired(event, REQUEST, id, retired)),
        }
    }

    /// A new request (Unused) in a free slot or a new one.
    fn new_request(&mut self, spec: RequestSpec) -> RequestId {
        let name = spec.name.clone();
        let r = RequestId(reuse_or_push(
            self.free.requests.pop().map(|r| r.0),
            (&mut self.config.requests, spec),
            (&mut self.state.requests, RequestState::initial()),
        ));
        self.requests.insert(name, r);
        r
    }

    /// The model constant of `command` verified with `auto_approved`.
    ///
    /// The model's `AutoApprovedCommands` is a constant set, but a real
    /// Domain's grows: once the developer approves an argv for the Domain's
    /// life, the same command is approved without asking. The machine
    /// therefore maps each (command, auto-approved) pair to its own model
    /// command, which is sound because commands are opaque constants in the
    /// model: its guards and invariants look only at a command's identity
    /// and at its membership in `AutoApprovedCommands`. A request's command
    /// (`RequestCommand[r]`) is bound once, at `VerifyRequest`, when the
    /// coordinator evaluates the rules and Domain approvals, and nothing
    /// (neither a rule nor a later Domain approval) changes that request's
    /// auto-approval afterwards; so every real run maps to a run of the model
    /// with these constants, each with a fixed membership. The one guard that
    /// compares commands, `c # RequestCommand[r]` of `DeveloperEditApprove`,
    /// concerns a prompted (not auto-approved) request and an edited command
    /// that is never auto-approved, so both are "not auto-approved"
    /// constants, equal exactly when the real commands are equal.
    ///
    /// A retiring machine frees a constant once no live request names it
    /// (as its command or its approved command); the same pair gets a
    /// constant again when it comes back. Sound for the same reason: only
    /// live requests' commands are ever compared.
    fn command(&mut self, command: &str, auto_approved: bool) -> CommandId {
        let key = (command.to_owned(), auto_approved);
        if let Some(&c) = self.commands.get(&key) {
            return c;
        }
        let spec = CommandSpec { name: command.to_owned(), auto_approved };
        let c = match self.free.commands.pop() {
            Some(c) => {
                self.config.commands[c.0] = spec;
                c
            }
            None => {
                self.config.commands.push(spec);
                CommandId(self.config.commands.len() - 1)
            }
        };
        self.commands.insert(key, c);
        c
    }

    /// Whether request `r`'s command and working directory were approved
    /// for the life of Domain `d`.
    fn domain_approved(&self, d: DomainId, r: RequestId) -> bool {
        self.request_details
            .get(&r)
            .is_some_and(|details| self.domain_approvals.contains(&(d, details.command.clone(), details.cwd.clone())))
    }

    /// A session's fingerprint is a constant: learned once, then checked.
    fn set_fingerprint(&mut self, event: &'static str, s: SessionId, fingerprint: &str) -> Result<(), TransitionError> {
        let spec = &mut self.config.sessions[s.0];
        if spec.fingerprint.is_empty() {
            spec.fingerprint = fingerprint.to_owned();
            Ok(())
        } else if spec.fingerprint == fingerprint {
            Ok(())
        } else {
            Err(TransitionError::Inconsistent { event, detail: format!("session {:?} presented another fingerprint before", spec.name) })
        }
    }

    fn set_isolation(&mut self, d: DomainId, safe: bool) {
        // The runtime checks the generated sandbox specification before it
        // starts anything; the entry records the outcome of that check.
        if self.state.domains[d.0].phase == DomainPhase::Starting {
            self.config.domains[d.0].sandbox_isolation_safe = safe;
        }
    }

    /// Retires what the accepted `action` ended: a request it moved to a
    /// terminal phase, a session it closed (with its requests, which closing
    /// made terminal).
    fn retire_ended_by(&mut self, action: Action, retired: &mut IdDigestSet) {
        match action.subject() {
            Subject::Session(s) => {
                // Only these end a session; retire_session also checks the phase.
                if matches!(
                    action,
                    Action::RejectSession(_) | Action::DisconnectSession(_) | Action::EvictSession(_) | Action::AbandonLaunch(_)
                ) {
                    self.retire_session(s, retired);
                }
            }
            Subject::Request(r) => {
                // In practice only DeliverResult ends a request; asking the
                // phase keeps this right if the model changes.
                if self.state.requests[r.0].phase.is_terminal() {
                    self.retire_request(r, retired);
                }
            }
            Subject::Domain(_) => {}
        }
    }

    /// Retires a Closed session and its requests. Closing cancels the
    /// active request and a session's other requests are terminal already
    /// (`ActiveRequestConsistent`); should one not be, the session is kept,
    /// since its slot must not be reused under a live request.
    fn retire_session(&mut self, s: SessionId, retired: &mut IdDigestSet) {
        if self.state.sessions[s.0].phase != SessionPhase::Closed {
            return;
        }
        let own: Vec<RequestId> = self.requests.values().copied().filter(|r| self.config.requests[r.0].session == s).collect();
        if own.iter().any(|r| !self.state.requests[r.0].phase.is_terminal()) {
            return;
        }
        for r in own {
            self.retire_request(r, retired);
        }
        // The name stays in the slot until it is reused, so that the action
        // that ended it still displays with it.
        let name = self.config.sessions[s.0].name.clone();
        retired.insert(SESSION, &name);
        self.sessions.remove(&name);
        self.free.sessions.push(s);
    }

    /// Retires a terminal request, and the command constants no other live
    /// request names.
    fn retire_request(&mut self, r: RequestId, retired: &mut IdDigestSet) {
        let name = self.config.requests[r.0].name.clone();
        retired.insert(REQUEST, &name);
        self.requests.remove(&name);
        self.request_details.remove(&r);
        self.free.requests.push(r);
        let named = [Some(self.config.requests[r.0].command), self.state.requests[r.0].approved_command];
        for c in named.into_iter().flatten() {
            self.free_command_if_unnamed(c);
        }
    }

    fn free_command_if_unnamed(&mut self, c: CommandId) {
        let named =
            self.requests.values().any(|r| self.config.requests[r.0].command == c || self.state.requests[r.0].approved_command == Some(c));
        if named {
            return;
        }
        let spec = &self.config.commands[c.0];
        let key = (spec.name.clone(), spec.auto_approved);
        // Absent or another constant: freed already (a request's command
        // and approved command are often the same).
        if self.commands.get(&key) == Some(&c) {
            self.commands.remove(&key);
            self.free.commands.push(c);
        }
    }
}

/// [`TransitionError::Retired`] for an ID retired before, otherwise
/// [`TransitionError::Unknown`].
fn unknown_or_retired(event: &'static str, kind: &'static str, id: &str, retired: &IdDigestSet) -> TransitionError {
    if retired.contains(kind, id) {
        TransitionError::Retired { event, kind, id: id.to_owned() }
    } else {
        TransitionError::Unknown { event, kind, id: id.to_owned() }
    }
}

/// Refuses an entry whose `command` is not the rendering of its `argv`, so
/// that distinct argument vectors are distinct model commands (`a b` as one
/// argument and as two would otherwise be the same command). An empty `argv`
/// is a journal written before argument vectors were recorded.
fn check_rendering(event: &'static str, command: &str, argv: &[String]) -> Result<(), TransitionError> {
    if argv.is_empty() || quote_argv(argv) == command {
        return Ok(());
    }
    Err(TransitionError::Inconsistent { event, detail: format!("command {command:?} is not the quoted argv {:?}", quote_argv(argv)) })
}

/// Replays journal entries from `Init` through a retiring [`Machine`];
/// fails at the first entry the model does not allow, naming its (1-based)
/// position.
pub fn replay<'a>(entries: impl IntoIterator<Item = &'a JournalEntry>) -> Result<Machine, ConformanceError> {
    replay_into(Machine::new(), entries)
}

/// [`replay`] through `machine` (for example [`Machine::keeping_history`]);
/// the machine is expected fresh, but need not be.
pub fn replay_into<'a>(mut machine: Machine, entries: impl IntoIterator<Item = &'a JournalEntry>) -> Result<Machine, ConformanceError> {
    for (i, entry) in entries.into_iter().enumerate() {
        machine.apply(entry).map_err(|source| ConformanceError::Transition { line: i + 1, source })?;
    }
    Ok(machine)
}

/// Replays a JSON-lines journal (blank lines are skipped) through a
/// retiring [`Machine`].
pub fn replay_reader(reader: impl BufRead) -> Result<Machine, ConformanceError> {
    replay_reader_into(Machine::new(), reader)
}

/// [`replay_reader`] through `machine`.
pub fn replay_reader_into(mut machine: Machine, reader: impl BufRead) -> Result<Machine, ConformanceError> {
    for (i, line) in reader.lines().enumerate() {
        let line_number = i + 1;
        let line = line.map_err(|source| ConformanceError::Read { line: line_number, source })?;
        if line.trim().is_empty() {
            continue;
        }
        let entry: JournalEntry = serde_json::from_str(&line).map_err(|source| ConformanceError::Parse { line: line_number, source })?;
        machine.apply(&entry).map_err(|source| ConformanceError::Transition { line: line_number, source })?;
    }
    Ok(machine)
}

/// A model slot for a new session or request: a retired slot from the free
/// list is overwritten, else the spec and state vectors grow by one.
/// Returns the slot's index.
fn reuse_or_push<Spec, St>(free: Option<usize>, (specs, spec): (&mut Vec<Spec>, Spec), (states, state): (&mut Vec<St>, St)) -> usize {
    match free {
        Some(i) => {
            specs[i] = spec;
            states[i] = state;
            i
        }
        None => {
            specs.push(spec);
            states.push(state);
            specs.len() - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn neutralised() -> Event {
        Event::NeutraliseSandboxWrite {
            root: "workspace".into(),
            path: "sub/.git/hooks/pre-commit".into(),
            kind: "quarantined".into(),
            summary: "quarantined sub/.git/hooks/pre-commit".into(),
            reason: "a hook of a repository created in the sandbox".into(),
            quarantine_id: Some("q1".into()),
            found_by: "event".into(),
        }
    }

    fn apply(m: &mut Machine, event: Event) -> Result<Option<Action>, TransitionError> {
        m.apply(&JournalEntry::now("d1", event))
    }

    #[test]
    fn an_observation_is_accepted_only_while_the_coordinator_runs_and_changes_nothing() {
        let mut m = Machine::new();
        assert!(matches!(apply(&mut m, neutralised()), Err(TransitionError::NotRunning { .. })), "unknown Domain");
        let lock = Event::AcquireDomainLock { session: "s1".into(), fingerprint: "fp".into() };
        assert!(apply(&mut m, lock).expect("lock").is_some());
        // Starting, then Ready, then Stopping: each accepts it unchanged.
        let mut phases = Vec::new();
        for step in [
            None,
            Some(Event::MountStateAnchor),
            Some(Event::CreateTrustAnchor),
            Some(Event::StartSidecar),
            Some(Event::StartSandbox),
            Some(Event::PublishDomain),
            Some(Event::BeginTeardown),
            Some(Event::StopSandbox),
        ] {
            if let Some(e) = step {
                apply(&mut m, e).expect("a start-up or teardown step");
            }
            let before = m.state().clone();
            assert_eq!(apply(&mut m, neutralised()).expect("observed"), None);
            assert_eq!(m.state(), &before, "an observation changes no model state");
            phases.push(m.domain_state("d1").map(|d| d.phase));
        }
        assert!(
            phases.contains(&Some(DomainPhase::Starting))
                && phases.contains(&Some(DomainPhase::Ready))
                && phases.contains(&Some(DomainPhase::Stopping)),
            "{phases:?}"
        );
        for e in [Event::StopSidecar, Event::DestroyTrustAnchor, Event::UnmountStateAnchor, Event::ReleaseDomainLock] {
            apply(&mut m, e).expect("teardown");
        }
        assert!(matches!(apply(&mut m, neutralised()), Err(TransitionError::NotRunning { .. })), "absent again");
    }

    #[test]
    fn an_observation_round_trips_as_a_journal_line_and_replays() {
        let lines: Vec<JournalEntry> =
            [Event::AcquireDomainLock { session: "s1".into(), fingerprint: "fp".into() }, neutralised(), Event::MountStateAnchor]
                .into_iter()
                .map(|e| JournalEntry::now("d1", e))
                .collect();
        let text: String = lines.iter().map(|e| e.to_json_line().expect("json") + "\n").collect();
        assert!(text.contains("\"action\":\"NeutraliseSandboxWrite\""), "{text}");
        let m = replay_reader(std::io::Cursor::new(text)).expect("replays");
        assert_eq!(m.domain_state("d1").map(|d| d.phase), Some(DomainPhase::Starting));
        // Older readers' defaults: only the required fields.
        let minimal = r#"{"timestamp_ms":1,"domain":"d1","action":"NeutraliseSandboxWrite","root":"workspace","path":"x","kind":"quarantined","summary":"s"}"#;
        let parsed: JournalEntry = serde_json::from_str(minimal).expect("parses");
        assert!(parsed.event.is_observation());
    }
}

#[cfg(test)]
mod retirement_tests {
    //! A retiring machine against one keeping history: same decisions,
    //! same live states, bounded size, retired IDs refused.

    use super::*;

    const DOMAIN: &str = "d1";

    fn entry(domain: &str, event: Event) -> JournalEntry {
        JournalEntry { timestamp_ms: 0, domain: domain.to_owned(), event }
    }

    /// A small deterministic generator (splitmix64), so a failure
    /// reproduces from its seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn chance(&mut self, percent: usize) -> bool {
            self.below(100) < percent
        }
    }

    /// Random journal entries over a growing set of names: mostly one the
    /// machine holds live (so that whole lifecycles happen), sometimes a
    /// fresh one, sometimes any earlier one (retired by now, or never seen
    /// in this role), and now and then a second Domain.
    struct Generator {
        rng: Rng,
        sessions: usize,
        requests: usize,
        /// Names picked while live, newest last (bounded: the oldest go).
        once_live: Vec<String>,
    }

    impl Generator {
        /// A name: live, fresh, once live (most of them retired by now), or
        /// any number issued before.
        fn pick(&mut self, prefix: &str, count: &mut usize, live: &HashMap<String, impl Copy>) -> String {
            let roll = self.rng.below(100);
            if roll < 70 && !live.is_empty() {
                // Sorted: HashMap order differs between runs.
                let mut names: Vec<&String> = live.keys().collect();
                names.sort_unstable();
                let name = names[self.rng.below(names.len())].clone();
                if self.once_live.len() == 512 {
                    self.once_live.remove(0);
                }
                self.once_live.push(name.clone());
                return name;
            }
            if roll < 82 {
                *count += 1;
                return format!("{prefix}{count}");
            }
            let earlier: Vec<&String> = self.once_live.iter().filter(|n| n.starts_with(prefix)).collect();
            if roll < 95 && !earlier.is_empty() {
                return earlier[self.rng.below(earlier.len())].clone();
            }
            format!("{prefix}{}", self.rng.below(*count + 1))
        }

        fn session(&mut self, m: &Machine) -> String {
            let mut count = self.sessions;
            let name = self.pick("s", &mut count, &m.live.sessions);
            self.sessions = count;
            name
        }

        fn request(&mut self, m: &Machine) -> String {
            let mut count = self.requests;
            let name = self.pick("r", &mut count, &m.live.requests);
            self.requests = count;
            name
        }

        fn argv(&mut self) -> Vec<String> {
            let words = ["true", "make", "git fetch", "ls"];
            vec![words[self.rng.below(words.len())].to_owned()]
        }

        fn fingerprint(&mut self) -> String {
            if self.rng.chance(90) { "fp".into() } else { "other".into() }
        }

        fn entry(&mut self, m: &Machine) -> JournalEntry {
            let domain = if self.rng.chance(3) { "d2" } else { DOMAIN };
            // Weights: the request steps and session attachment most often,
            // the Domain's own steps less, the abandoning kinds least.
            let event = match self.rng.below(40) {
                // Failing is always possible while starting or ready: rare,
                // or the Domain would seldom get to serve a session.
                0 if self.rng.chance(10) => {
                    if self.rng.chance(70) {
                        Event::FailDomain { reason: String::new() }
                    } else {
                        Event::AbortUnsafeStart
                    }
                }
                0 => Event::AcquireDomainLock { session: self.session(m), fingerprint: "fp".into() },
                1 | 2 => {
                    [Event::MountStateAnchor, Event::CreateTrustAnchor, Event::StartSidecar, Event::StartSandbox, Event::PublishDomain]
                        [self.rng.below(5)]
                    .clone()
                }
                3 | 4 => [
                    Event::BeginTeardown,
                    Event::StopSandbox,
                    Event::StopSidecar,
                    Event::DestroyTrustAnchor,
                    Event::UnmountStateAnchor,
                    Event::ReleaseDomainLock,
                ][self.rng.below(6)]
                .clone(),
                5..=7 => Event::ConnectSession { session: self.session(m) },
                8..=10 => Event::RegisterSession { session: self.session(m), fingerprint: self.fingerprint() },
                11 => Event::RejectSession { session: self.session(m), fingerprint: self.fingerprint() },
                12 => Event::DisconnectSession { session: self.session(m) },
                13 => Event::EvictSession { session: self.session(m) },
                // Always possible for a fresh name: rare, or it would be
                // most of what is accepted.
                14 if self.rng.chance(15) => Event::AbandonLaunch { session: self.session(m) },
                14 | 15 => Event::CompleteHostExecution { request: self.request(m), exit_status: Some(1) },
                16..=19 => {
                    let (session, request, argv) = (self.session(m), self.request(m), self.argv());
                    let cwd = if self.rng.chance(50) { "/ws" } else { "/ws/sub" };
                    Event::verify_request(&session, &request, &argv, cwd, "", self.rng.chance(50))
                }
                20 | 21 => Event::AutoApprove {
                    request: self.request(m),
                    rule: if self.rng.chance(30) { DOMAIN_APPROVAL_RULE.into() } else { "rule".into() },
                },
                22 | 23 => Event::PromptDeveloper { request: self.request(m) },
                24 | 25 => Event::DeveloperApprove { request: self.request(m), for_domain: self.rng.chance(40) },
                26 => {
                    let (request, argv) = (self.request(m), self.argv());
                    Event::developer_edit_approve(&request, &argv)
                }
                27 => Event::DeveloperDeny { request: self.request(m), reason: String::new() },
                28..=30 => Event::StartHostExecution { request: self.request(m) },
                31 | 32 => Event::CompleteHostExecution { request: self.request(m), exit_status: Some(0) },
                33 => Event::TimeoutRequest { request: self.request(m) },
                34 => Event::CancelRequest { request: self.request(m) },
                35 => Event::FailHostExecution { request: self.request(m), reason: String::new() },
                _ => Event::DeliverResult { request: self.request(m) },
            };
            entry(domain, event)
        }
    }

    /// A session's variables with its active request by name.
    fn session_view(m: &Machine, id: &str) -> Option<(SessionState, Option<String>)> {
        let state = m.session_state(id)?.clone();
        let active = state.active_request.map(|r| m.config().requests[r.0].name.clone());
        Some((SessionState { active_request: None, ..state }, active))
    }

    /// A command constant by value: its text and whether it is auto-approved.
    type CommandView = (String, bool);

    /// A request's variables with its approved command by value, and its
    /// constants (session by name, command by value).
    fn request_view(m: &Machine, id: &str) -> Option<(RequestState, Option<CommandView>, String, CommandView)> {
        let r = m.request_index(id)?;
        let state = m.state().requests[r.0].clone();
        let command = |c: CommandId| {
            let spec = &m.config().commands[c.0];
            (spec.name.clone(), spec.auto_approved)
        };
        let approved = state.approved_command.map(command);
        let spec = &m.config().requests[r.0];
        let session = m.config().sessions[spec.session.0].name.clone();
        Some((RequestState { approved_command: None, ..state }, approved, session, command(spec.command)))
    }

    /// Every live entity of `retiring` is live in `full` with the same
    /// variables and constants; with `everything`, also every entity `full`
    /// holds is either live in `retiring` or retired there, and then ended.
    fn assert_equivalent(retiring: &Machine, full: &Machine, everything: bool) {
        for domain in retiring.live.domains.keys() {
            assert_eq!(retiring.domain_state(domain), full.domain_state(domain), "Domain {domain}");
        }
        for id in retiring.live.sessions.keys() {
            assert_eq!(session_view(retiring, id), session_view(full, id), "session {id}");
        }
        for id in retiring.live.requests.keys() {
            assert_eq!(request_view(retiring, id), request_view(full, id), "request {id}");
        }
        if !everything {
            return;
        }
        for (id, &s) in &full.live.sessions {
            if retiring.session_index(id).is_none() {
                assert!(retiring.is_retired_session(id), "session {id} neither live nor retired");
                assert_eq!(full.state().sessions[s.0].phase, SessionPhase::Closed, "retired session {id}");
            }
        }
        for (id, &r) in &full.live.requests {
            if retiring.request_index(id).is_none() {
                assert!(retiring.is_retired_request(id), "request {id} neither live nor retired");
                assert!(full.state().requests[r.0].phase.is_terminal(), "retired request {id}");
            }
        }
        assert_eq!(
            retiring.live.sessions.len() + retiring.live.requests.len() + retiring.retired_ids(),
            full.live.sessions.len() + full.live.requests.len(),
            "every entity is live or retired, once"
        );
    }

    #[test]
    fn a_retiring_machine_decides_as_one_keeping_history_on_random_journals() {
        // Two seeds of 20,000 entries each.
        for seed in [1_u64, 0xDEAD_BEEF] {
            let mut generator = Generator { rng: Rng(seed), sessions: 0, requests: 0, once_live: Vec::new() };
            let (mut retiring, mut full) = (Machine::new(), Machine::keeping_history());
            let (mut accepted, mut retired_refusals) = (0, 0);
            let mut accepted_by_kind: HashMap<&'static str, usize> = HashMap::new();
            for i in 0..20_000 {
                // Mostly one of the acceptable entries among 12 candidates,
                // so that lifecycles run to their end; otherwise any entry.
                let e = if generator.rng.chance(75) {
                    // (Asking the retiring machine is cheaper and, as this
                    // test checks, gives the same answers.)
                    let mut accepted: Vec<JournalEntry> =
                        (0..12).map(|_| generator.entry(&retiring)).filter(|e| retiring.check(e).is_ok()).collect();
                    if accepted.is_empty() {
                        generator.entry(&retiring)
                    } else {
                        let pick = generator.rng.below(accepted.len());
                        accepted.swap_remove(pick)
                    }
                } else {
                    generator.entry(&retiring)
                };
                // check() predicts apply() on both.
                let predicted = (retiring.check(&e).is_ok(), full.check(&e).is_ok());
                let got = (retiring.apply(&e), full.apply(&e));
                assert_eq!(predicted, (got.0.is_ok(), got.1.is_ok()), "seed {seed} entry {i}: check and apply disagree");
                match got {
                    (Ok(a), Ok(b)) => {
                        let show = |m: &Machine, a: Option<Action>| a.map(|a| a.display(m.config()).to_string());
                        assert_eq!(show(&retiring, a), show(&full, b), "seed {seed} entry {i}: {e:?}");
                        accepted += 1;
                        *accepted_by_kind.entry(e.event.name()).or_default() += 1;
                    }
                    (Err(TransitionError::Retired { .. }), Err(_)) => retired_refusals += 1,
                    (Err(_), Err(_)) => {}
                    (a, b) => panic!("seed {seed} entry {i}: {e:?}: retiring {a:?}, keeping history {b:?}"),
                }
                assert_equivalent(&retiring, &full, i % 500 == 0);
            }
            assert_equivalent(&retiring, &full, true);
            println!(
                "seed {seed}: {accepted} accepted, {retired_refusals} refused as retired, {} IDs retired, {} session slots against {}; {accepted_by_kind:?}",
                retiring.retired_ids(),
                retiring.state().sessions.len(),
                full.state().sessions.len()
            );
            // The walk must have exercised what it claims to test.
            assert!(accepted > 3_000, "seed {seed}: only {accepted} accepted");
            assert!(retired_refusals > 100, "seed {seed}: only {retired_refusals} refusals of retired IDs");
            for kind in ["DisconnectSession", "RejectSession", "DeliverResult", "DeveloperEditApprove", "ReleaseDomainLock", "AutoApprove"]
            {
                assert!(accepted_by_kind.get(kind).copied().unwrap_or(0) > 0, "seed {seed}: no {kind} accepted: {accepted_by_kind:?}");
            }
            assert!(retiring.retired_ids() > 500, "seed {seed}: {} retired", retiring.retired_ids());
            assert!(
                retiring.state().sessions.len() * 4 < full.state().sessions.len(),
                "seed {seed}: {} session slots against {}",
                retiring.state().sessions.len(),
                full.state().sessions.len()
            );
        }
    }

    /// A started, published Domain with `session` attached.
    fn running_with(session: &str) -> Machine {
        let mut m = Machine::new();
        let mut events = vec![Event::AcquireDomainLock { session: session.into(), fingerprint: "fp".into() }];
        events.extend([Event::MountStateAnchor, Event::CreateTrustAnchor, Event::StartSidecar, Event::StartSandbox, Event::PublishDomain]);
        events.extend([
            Event::ConnectSession { session: session.into() },
            Event::RegisterSession { session: session.into(), fingerprint: "fp".into() },
        ]);
        for e in events {
            m.apply(&entry(DOMAIN, e)).expect("start-up");
        }
        m
    }

    fn run_request(m: &mut Machine, session: &str, request: &str) {
        let argv = vec!["true".to_owned()];
        for e in [
            Event::verify_request(session, request, &argv, "/ws", "", true),
            Event::AutoApprove { request: request.into(), rule: "true".into() },
            Event::StartHostExecution { request: request.into() },
            Event::CompleteHostExecution { request: request.into(), exit_status: Some(0) },
            Event::DeliverResult { request: request.into() },
        ] {
            m.apply(&entry(DOMAIN, e)).expect("a rule-approved request");
        }
    }

    fn is_retired<T>(result: Result<T, TransitionError>, kind: &str, id: &str) -> bool {
        matches!(result, Err(TransitionError::Retired { kind: k, id: i, .. }) if k == kind && i == id)
    }

    #[test]
    fn a_retired_request_id_is_refused_whatever_the_entry() {
        let mut m = running_with("s1");
        run_request(&mut m, "s1", "r1");
        assert!(m.request_index("r1").is_none() && m.is_retired_request("r1"));
        let argv = vec!["true".to_owned()];
        let again = Event::verify_request("s1", "r1", &argv, "/ws", "", true);
        assert!(is_retired(m.check(&entry(DOMAIN, again.clone())), "request", "r1"));
        assert!(is_retired(m.apply(&entry(DOMAIN, again)), "request", "r1"));
        for late in [Event::DeliverResult { request: "r1".into() }, Event::CancelRequest { request: "r1".into() }] {
            assert!(is_retired(m.apply(&entry(DOMAIN, late)), "request", "r1"));
        }
        // A request that never was is unknown, not retired; a fresh one goes.
        assert!(matches!(m.apply(&entry(DOMAIN, Event::DeliverResult { request: "r9".into() })), Err(TransitionError::Unknown { .. })));
        run_request(&mut m, "s1", "r2");
    }

    #[test]
    fn a_retired_session_id_is_refused_whatever_the_entry() {
        let mut m = running_with("s1");
        let argv = vec!["make".to_owned()];
        // Its open request is cancelled by the disconnect and retired too.
        m.apply(&entry(DOMAIN, Event::verify_request("s1", "r1", &argv, "/ws", "", false))).expect("verified");
        m.apply(&entry(DOMAIN, Event::DisconnectSession { session: "s1".into() })).expect("disconnected");
        assert!(m.is_retired_session("s1") && m.is_retired_request("r1"));
        assert_eq!((m.session_index("s1"), m.request_index("r1")), (None, None));
        for e in [
            Event::ConnectSession { session: "s1".into() },
            Event::RegisterSession { session: "s1".into(), fingerprint: "fp".into() },
            Event::DisconnectSession { session: "s1".into() },
            Event::AbandonLaunch { session: "s1".into() },
            Event::verify_request("s1", "r2", &argv, "/ws", "", true),
        ] {
            assert!(is_retired(m.apply(&entry(DOMAIN, e)), "session", "s1"));
        }
        // Also in a later run of the Domain.
        for e in [
            Event::BeginTeardown,
            Event::StopSandbox,
            Event::StopSidecar,
            Event::DestroyTrustAnchor,
            Event::UnmountStateAnchor,
            Event::ReleaseDomainLock,
        ] {
            m.apply(&entry(DOMAIN, e)).expect("teardown");
        }
        let relaunch = Event::AcquireDomainLock { session: "s1".into(), fingerprint: "fp".into() };
        assert!(is_retired(m.apply(&entry(DOMAIN, relaunch)), "session", "s1"));
        m.apply(&entry(DOMAIN, Event::AcquireDomainLock { session: "s2".into(), fingerprint: "fp".into() }))
            .expect("a fresh session launches");
    }

    #[test]
    fn slots_stay_bounded_over_ten_thousand_sessions() {
        let mut m = running_with("holder");
        for i in 0..10_000 {
            let s = format!("s{i}");
            m.apply(&entry(DOMAIN, Event::ConnectSession { session: s.clone() })).expect("connect");
            m.apply(&entry(DOMAIN, Event::RegisterSession { session: s.clone(), fingerprint: "fp".into() })).expect("register");
            run_request(&mut m, &s, &format!("r{i}"));
            // A different command each time: its constant is freed with its request.
            let argv = vec!["echo".to_owned(), i.to_string()];
            m.apply(&entry(DOMAIN, Event::verify_request(&s, &format!("q{i}"), &argv, "/ws", "", false))).expect("verify");
            m.apply(&entry(DOMAIN, Event::DisconnectSession { session: s })).expect("disconnect");
        }
        // The holder and one session's worth of slots, reused 10,000 times.
        assert_eq!(m.state().sessions.len(), 2);
        assert_eq!(m.config().sessions.len(), 2);
        assert!(m.state().requests.len() <= 2, "{} request slots", m.state().requests.len());
        assert!(m.config().commands.len() <= 2, "{} command slots", m.config().commands.len());
        assert_eq!((m.live.sessions.len(), m.live.requests.len(), m.live.commands.len(), m.live.request_details.len()), (1, 0, 0, 0));
        assert_eq!(m.retired_ids(), 30_000);
        assert_eq!(m.live_sessions(), 1);
        // Every one of them is still refused.
        assert!(is_retired(m.apply(&entry(DOMAIN, Event::ConnectSession { session: "s0".into() })), "session", "s0"));
        assert!(is_retired(
            m.apply(&entry(DOMAIN, Event::verify_request("holder", "r9999", &["true".to_owned()], "/ws", "", true))),
            "request",
            "r9999"
        ));
    }

    #[test]
    fn a_history_keeping_machine_retires_nothing() {
        let mut m = Machine::keeping_history();
        assert!(m.keeps_history() && !Machine::new().keeps_history());
        for e in [
            Event::AcquireDomainLock { session: "s1".into(), fingerprint: "fp".into() },
            Event::MountStateAnchor,
            Event::CreateTrustAnchor,
            Event::StartSidecar,
            Event::StartSandbox,
            Event::PublishDomain,
            Event::ConnectSession { session: "s1".into() },
            Event::RegisterSession { session: "s1".into(), fingerprint: "fp".into() },
        ] {
            m.apply(&entry(DOMAIN, e)).expect("start-up");
        }
        run_request(&mut m, "s1", "r1");
        m.apply(&entry(DOMAIN, Event::DisconnectSession { session: "s1".into() })).expect("disconnect");
        assert_eq!(m.retired_ids(), 0);
        assert_eq!(m.request_state("r1").map(|r| r.phase), Some(crate::model::RequestPhase::Completed));
        assert_eq!(m.session_state("s1").map(|s| s.phase), Some(SessionPhase::Closed));
        // Refused for the model's own reason.
        let again = Event::ConnectSession { session: "s1".into() };
        assert!(matches!(m.apply(&entry(DOMAIN, again)), Err(TransitionError::Refused { .. })));
    }
}
