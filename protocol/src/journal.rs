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
//! it appears and records the model constants the entry implies.
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

use std::collections::HashMap;
use std::io::BufRead;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::model::{
    Action, CommandId, Config, DomainId, DomainPhase, DomainState, Invariant, Refused, RequestId,
    RequestState, SessionId, SessionPhase, SessionState, State, check_invariants, step,
};

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
        /// The requested command (the argument vector, as the coordinator
        /// renders it).
        command: String,
        /// Whether an auto-approval rule matches the command.
        auto_approved: bool,
    },
    /// A rule approved the request.
    AutoApprove {
        /// The request.
        request: String,
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
    },
    /// The developer edited the command, then approved the edited one.
    DeveloperEditApprove {
        /// The request.
        request: String,
        /// The edited command; must differ from the requested one.
        command: String,
    },
    /// The developer denied the request.
    DeveloperDeny {
        /// The request.
        request: String,
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
}

impl Event {
    /// The TLA+ action name of the event.
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
        let timestamp_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            timestamp_ms,
            domain: domain.to_owned(),
            event,
        }
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
    /// The entry contradicts a constant an earlier entry established (a
    /// session's fingerprint, a request's session, a command's auto-approval,
    /// a session's Domain).
    #[error("{event} contradicts the journal: {detail}")]
    Inconsistent {
        /// The event's action name.
        event: &'static str,
        /// What it contradicts.
        detail: String,
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
#[derive(Clone, Debug, Default)]
pub struct Machine {
    config: Config,
    state: State,
    domains: HashMap<String, DomainId>,
    sessions: HashMap<String, SessionId>,
    requests: HashMap<String, RequestId>,
    commands: HashMap<String, CommandId>,
}

impl Machine {
    /// A machine with no Domain, session or request yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current model state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The model constants established so far.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The model index of a real Domain ID, if it has appeared.
    pub fn domain_index(&self, domain: &str) -> Option<DomainId> {
        self.domains.get(domain).copied()
    }

    /// The model index of a real Session ID, if it has appeared.
    pub fn session_index(&self, session: &str) -> Option<SessionId> {
        self.sessions.get(session).copied()
    }

    /// The model index of a real Escalation Request ID, if it has appeared.
    pub fn request_index(&self, request: &str) -> Option<RequestId> {
        self.requests.get(request).copied()
    }

    /// The model variables of a real Domain, if it has appeared.
    pub fn domain_state(&self, domain: &str) -> Option<&DomainState> {
        self.domain_index(domain).map(|d| &self.state.domains[d.0])
    }

    /// The model variables of a real session, if it has appeared.
    pub fn session_state(&self, session: &str) -> Option<&SessionState> {
        self.session_index(session)
            .map(|s| &self.state.sessions[s.0])
    }

    /// The model variables of a real request, if it has appeared.
    pub fn request_state(&self, request: &str) -> Option<&RequestState> {
        self.request_index(request)
            .map(|r| &self.state.requests[r.0])
    }

    /// Whether the model would accept `entry` now, without applying it.
    pub fn check(&self, entry: &JournalEntry) -> Result<(), TransitionError> {
        self.clone().apply(entry).map(|_| ())
    }

    /// Applies `entry` if the model allows it and returns the model action;
    /// on refusal nothing changes.
    pub fn apply(&mut self, entry: &JournalEntry) -> Result<Action, TransitionError> {
        let mut next = self.clone();
        let action = next.action_for(entry)?;
        let event = entry.event.name();
        next.state = step(&next.config, &next.state, &action)
            .map_err(|refused| TransitionError::Refused { event, refused })?;
        check_invariants(&next.config, &next.state)
            .map_err(|invariant| TransitionError::Invariant { event, invariant })?;
        *self = next;
        Ok(action)
    }

    /// Maps an entry to its model action, adding the Domain, session, request
    /// or command it introduces and the constants it implies.
    fn action_for(&mut self, entry: &JournalEntry) -> Result<Action, TransitionError> {
        let event = entry.event.name();
        let d = self.domain(&entry.domain);
        let action = match &entry.event {
            Event::AcquireDomainLock {
                session,
                fingerprint,
            } => {
                let s = self.session(event, d, session)?;
                // A new run of an absent Domain may use an edited configuration:
                // the fingerprint is a constant of the run. The launcher validated
                // the configuration, so it is confined (ConfigSafe).
                if self.state.domains[d.0].phase == DomainPhase::Absent {
                    let spec = &mut self.config.domains[d.0];
                    spec.fingerprint = fingerprint.clone();
                    spec.config_safe = true;
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
            Event::ConnectSession { session } => {
                Action::ConnectSession(self.session(event, d, session)?)
            }
            Event::RegisterSession {
                session,
                fingerprint,
            } => {
                let s = self.session(event, d, session)?;
                self.set_fingerprint(event, s, fingerprint)?;
                Action::RegisterSession(s)
            }
            Event::RejectSession {
                session,
                fingerprint,
            } => {
                let s = self.session(event, d, session)?;
                self.set_fingerprint(event, s, fingerprint)?;
                Action::RejectSession(s)
            }
            Event::DisconnectSession { session } => {
                Action::DisconnectSession(self.known_session(event, session)?)
            }
            Event::EvictSession { session } => {
                Action::EvictSession(self.known_session(event, session)?)
            }
            Event::AbandonLaunch { session } => {
                Action::AbandonLaunch(self.session(event, d, session)?)
            }
            Event::VerifyRequest {
                session,
                request,
                command,
                auto_approved,
            } => {
                let s = self.known_session(event, session)?;
                let c = self.command(event, command, Some(*auto_approved))?;
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
                    None => {
                        // Only requests with a valid client certificate are journalled.
                        let r = self.config.add_request(request, s, c, true);
                        self.state.requests.push(RequestState::initial());
                        self.requests.insert(request.clone(), r);
                        r
                    }
                };
                Action::VerifyRequest(r)
            }
            Event::AutoApprove { request } => Action::AutoApprove(self.request(event, request)?),
            Event::PromptDeveloper { request } => {
                Action::PromptDeveloper(self.request(event, request)?)
            }
            Event::DeveloperApprove { request } => {
                Action::DeveloperApprove(self.request(event, request)?)
            }
            Event::DeveloperEditApprove { request, command } => {
                let r = self.request(event, request)?;
                let c = self.command(event, command, None)?;
                Action::DeveloperEditApprove(r, c)
            }
            Event::DeveloperDeny { request } => {
                Action::DeveloperDeny(self.request(event, request)?)
            }
            Event::StartHostExecution { request } => {
                Action::StartHostExecution(self.request(event, request)?)
            }
            Event::CompleteHostExecution { request, .. } => {
                Action::CompleteHostExecution(self.request(event, request)?)
            }
            Event::TimeoutRequest { request } => {
                Action::TimeoutRequest(self.request(event, request)?)
            }
            Event::CancelRequest { request } => {
                Action::CancelRequest(self.request(event, request)?)
            }
            Event::FailHostExecution { request, .. } => {
                Action::FailHostExecution(self.request(event, request)?)
            }
            Event::DeliverResult { request } => {
                Action::DeliverResult(self.request(event, request)?)
            }
        };
        // Every action concerns the entry's Domain.
        let concerned = self.config.action_domain(&action);
        if concerned != d {
            return Err(TransitionError::Inconsistent {
                event,
                detail: format!("it concerns another Domain than {:?}", entry.domain),
            });
        }
        Ok(action)
    }

    fn domain(&mut self, domain: &str) -> DomainId {
        if let Some(&d) = self.domains.get(domain) {
            return d;
        }
        // Fingerprint and safety are set by the entries that establish them.
        let d = self.config.add_domain(domain, "");
        self.state
            .domains
            .push(crate::model::DomainState::initial());
        self.domains.insert(domain.to_owned(), d);
        d
    }

    /// The session `id` of Domain `d`, added (as New) if it has not appeared.
    fn session(
        &mut self,
        event: &'static str,
        d: DomainId,
        id: &str,
    ) -> Result<SessionId, TransitionError> {
        if let Some(&s) = self.sessions.get(id) {
            if self.config.sessions[s.0].domain != d {
                return Err(TransitionError::Inconsistent {
                    event,
                    detail: format!("session {id:?} belongs to another Domain"),
                });
            }
            return Ok(s);
        }
        let s = self.config.add_session(id, d, "");
        self.state.sessions.push(SessionState::initial());
        self.sessions.insert(id.to_owned(), s);
        Ok(s)
    }

    fn known_session(&self, event: &'static str, id: &str) -> Result<SessionId, TransitionError> {
        self.sessions
            .get(id)
            .copied()
            .ok_or_else(|| TransitionError::Unknown {
                event,
                kind: "session",
                id: id.to_owned(),
            })
    }

    fn request(&self, event: &'static str, id: &str) -> Result<RequestId, TransitionError> {
        self.requests
            .get(id)
            .copied()
            .ok_or_else(|| TransitionError::Unknown {
                event,
                kind: "request",
                id: id.to_owned(),
            })
    }

    fn command(
        &mut self,
        event: &'static str,
        command: &str,
        auto_approved: Option<bool>,
    ) -> Result<CommandId, TransitionError> {
        if let Some(&c) = self.commands.get(command) {
            let known = self.config.commands[c.0].auto_approved;
            if auto_approved.is_some_and(|auto| auto != known) {
                return Err(TransitionError::Inconsistent {
                    event,
                    detail: format!("command {command:?} was auto-approved={known} before"),
                });
            }
            return Ok(c);
        }
        // An edited command the rules were never asked about is not auto-approved.
        let c = self
            .config
            .add_command(command, auto_approved.unwrap_or(false));
        self.commands.insert(command.to_owned(), c);
        Ok(c)
    }

    /// A session's fingerprint is a constant: learned once, then checked.
    fn set_fingerprint(
        &mut self,
        event: &'static str,
        s: SessionId,
        fingerprint: &str,
    ) -> Result<(), TransitionError> {
        let spec = &mut self.config.sessions[s.0];
        if spec.fingerprint.is_empty() {
            spec.fingerprint = fingerprint.to_owned();
            Ok(())
        } else if spec.fingerprint == fingerprint {
            Ok(())
        } else {
            Err(TransitionError::Inconsistent {
                event,
                detail: format!(
                    "session {:?} presented another fingerprint before",
                    spec.name
                ),
            })
        }
    }

    fn set_isolation(&mut self, d: DomainId, safe: bool) {
        // The runtime checks the generated sandbox specification before it
        // starts anything; the entry records the outcome of that check.
        if self.state.domains[d.0].phase == DomainPhase::Starting {
            self.config.domains[d.0].sandbox_isolation_safe = safe;
        }
    }

    /// Sessions that are neither New nor Closed.
    pub fn live_sessions(&self) -> usize {
        self.state
            .sessions
            .iter()
            .filter(|s| !matches!(s.phase, SessionPhase::New | SessionPhase::Closed))
            .count()
    }
}

/// Replays journal entries from `Init`; fails at the first entry the model
/// does not allow, naming its (1-based) position.
pub fn replay<'a>(
    entries: impl IntoIterator<Item = &'a JournalEntry>,
) -> Result<Machine, ConformanceError> {
    let mut machine = Machine::new();
    for (i, entry) in entries.into_iter().enumerate() {
        machine
            .apply(entry)
            .map_err(|source| ConformanceError::Transition {
                line: i + 1,
                source,
            })?;
    }
    Ok(machine)
}

/// Replays a JSON-lines journal (blank lines are skipped).
pub fn replay_reader(reader: impl BufRead) -> Result<Machine, ConformanceError> {
    let mut machine = Machine::new();
    for (i, line) in reader.lines().enumerate() {
        let line_number = i + 1;
        let line = line.map_err(|source| ConformanceError::Read {
            line: line_number,
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let entry: JournalEntry =
            serde_json::from_str(&line).map_err(|source| ConformanceError::Parse {
                line: line_number,
                source,
            })?;
        machine
            .apply(&entry)
            .map_err(|source| ConformanceError::Transition {
                line: line_number,
                source,
            })?;
    }
    Ok(machine)
}
