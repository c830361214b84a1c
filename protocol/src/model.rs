//! The protocol state machine: the Rust twin of `protocol/Lazaret.tla`.
//!
//! Every TLA+ action has one [`Action`] variant of the same name. Its enabling
//! condition lives in [`guard`] and its effect in [`effect`]; [`step`] is the
//! only way to obtain a successor [`State`]. Invariants ([`Invariant`]) and
//! liveness properties ([`LivenessProperty`]) carry the TLA+ names too.
//!
//! Representation differences from the TLA+ text (all one-to-one):
//! `registered[d]` and `connected[d]` are per-session flags here (a session
//! belongs to exactly one Domain, `SessionDomain`), `hostRunning` is a flag
//! per request, and the `No*` model values are `None`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Index of a Domain in a [`Config`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DomainId(pub usize);

/// Index of a Client Session in a [`Config`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SessionId(pub usize);

/// Index of an Escalation Request in a [`Config`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId(pub usize);

/// Index of a host command in a [`Config`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CommandId(pub usize);

/// The constants of one Domain (`DomainFingerprint`, `ConfigSafe`,
/// `SandboxIsolationSafe`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainSpec {
    /// Display name (the fixture's `D1`, or the real Domain ID).
    pub name: String,
    /// Configuration Fingerprint of the configuration that created the Domain.
    pub fingerprint: String,
    /// No configuration file is mounted into the sandbox (`ConfigSafe[d]`).
    pub config_safe: bool,
    /// The sandbox joins no host namespace (`SandboxIsolationSafe[d]`).
    pub sandbox_isolation_safe: bool,
}

/// The constants of one Client Session (`SessionDomain`, `SessionFingerprint`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSpec {
    /// Display name (`S1`, or the real Session ID).
    pub name: String,
    /// The Domain the session launches into.
    pub domain: DomainId,
    /// Configuration Fingerprint the session presents when it registers.
    pub fingerprint: String,
}

/// The constants of one Escalation Request (`RequestSession`,
/// `RequestCommand`, `CertificateValid`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestSpec {
    /// Display name (`R1`, or the real Escalation Request ID).
    pub name: String,
    /// The session the request claims to come from.
    pub session: SessionId,
    /// The command the request asks for.
    pub command: CommandId,
    /// The request arrived with a valid client certificate for its session.
    pub certificate_valid: bool,
}

/// A host command and whether an auto-approval rule matches it
/// (`AutoApprovedCommands`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandSpec {
    /// Display name (`C1`, or the real argument vector joined by spaces).
    pub name: String,
    /// Some auto-approval rule matches this exact command.
    pub auto_approved: bool,
}

/// The finite universe a [`State`] ranges over: the TLA+ CONSTANTS.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// `Domains` with their per-Domain constants.
    pub domains: Vec<DomainSpec>,
    /// `Sessions` with their per-session constants.
    pub sessions: Vec<SessionSpec>,
    /// `Requests` with their per-request constants.
    pub requests: Vec<RequestSpec>,
    /// `Commands` with the auto-approval set.
    pub commands: Vec<CommandSpec>,
}

/// A [`Config`] whose indices point outside its own tables.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid protocol configuration: {0}")]
pub struct ConfigError(String);

impl Config {
    /// The user's TLC fixture (`Lazaret.cfg`): Domain D1; sessions S1 and S2;
    /// requests R1 (S1, auto-approved C1), R2 (S2, C2) and R3 (S1, C2, invalid
    /// certificate); every fingerprint "config-a".
    pub fn user_fixture() -> Self {
        let mut config = Config::default();
        let d1 = config.add_domain("D1", "config-a");
        let s1 = config.add_session("S1", d1, "config-a");
        let s2 = config.add_session("S2", d1, "config-a");
        let c1 = config.add_command("C1", true);
        let c2 = config.add_command("C2", false);
        config.add_request("R1", s1, c1, true);
        config.add_request("R2", s2, c2, true);
        config.add_request("R3", s1, c2, false);
        config
    }

    /// A larger configuration for the long check: one Domain, sessions S1..S3
    /// (S3 with a different fingerprint, so it is rejected), requests R1 (S1,
    /// C1 auto), R2 (S2, C2), R3 (S1, C2), R4 (S2, C1 auto), all certificates
    /// valid.
    pub fn larger_fixture() -> Self {
        let mut config = Config::default();
        let d1 = config.add_domain("D1", "config-a");
        let s1 = config.add_session("S1", d1, "config-a");
        let s2 = config.add_session("S2", d1, "config-a");
        config.add_session("S3", d1, "config-b");
        let c1 = config.add_command("C1", true);
        let c2 = config.add_command("C2", false);
        config.add_request("R1", s1, c1, true);
        config.add_request("R2", s2, c2, true);
        config.add_request("R3", s1, c2, true);
        config.add_request("R4", s2, c1, true);
        config
    }

    /// Two Domains of one session and one request each, one of them with an
    /// unsafe sandbox specification: checks Domain separation.
    pub fn two_domain_fixture() -> Self {
        let mut config = Config::default();
        let d1 = config.add_domain("D1", "config-a");
        let d2 = config.add_domain("D2", "config-a");
        config.domains[d2.0].sandbox_isolation_safe = false;
        let s1 = config.add_session("S1", d1, "config-a");
        let s2 = config.add_session("S2", d2, "config-a");
        let c1 = config.add_command("C1", true);
        let c2 = config.add_command("C2", false);
        config.add_request("R1", s1, c2, true);
        config.add_request("R2", s2, c1, true);
        config
    }

    /// Adds a Domain with safe configuration and sandbox isolation.
    pub fn add_domain(&mut self, name: &str, fingerprint: &str) -> DomainId {
        self.domains.push(DomainSpec {
            name: name.to_owned(),
            fingerprint: fingerprint.to_owned(),
            config_safe: true,
            sandbox_isolation_safe: true,
        });
        DomainId(self.domains.len() - 1)
    }

    /// Adds a session of `domain`.
    pub fn add_session(&mut self, name: &str, domain: DomainId, fingerprint: &str) -> SessionId {
        self.sessions.push(SessionSpec { name: name.to_owned(), domain, fingerprint: fingerprint.to_owned() });
        SessionId(self.sessions.len() - 1)
    }

    /// Adds a command.
    pub fn add_command(&mut self, name: &str, auto_approved: bool) -> CommandId {
        self.commands.push(CommandSpec { name: name.to_owned(), auto_approved });
        CommandId(self.commands.len() - 1)
    }

    /// Adds a request of `session` for `command`.
    pub fn add_request(&mut self, name: &str, session: SessionId, command: CommandId, certificate_valid: bool) -> RequestId {
        self.requests.push(RequestSpec { name: name.to_owned(), session, command, certificate_valid });
        RequestId(self.requests.len() - 1)
    }

    /// Checks that every index points into its table (the TLA+ ASSUME).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for session in &self.sessions {
            if session.domain.0 >= self.domains.len() {
                return Err(ConfigError(format!("session {} names a Domain that does not exist", session.name)));
            }
        }
        for request in &self.requests {
            if request.session.0 >= self.sessions.len() {
                return Err(ConfigError(format!("request {} names a session that does not exist", request.name)));
            }
            if request.command.0 >= self.commands.len() {
                return Err(ConfigError(format!("request {} names a command that does not exist", request.name)));
            }
        }
        Ok(())
    }

    fn session_domain(&self, s: SessionId) -> DomainId {
        self.sessions[s.0].domain
    }

    /// The Domain an action concerns: its own, its session's, or its
    /// request's session's. Exhaustive, so a new action must say which.
    pub fn action_domain(&self, action: &Action) -> DomainId {
        match action.subject() {
            Subject::Domain(d) => d,
            Subject::Session(s) => self.session_domain(s),
            Subject::Request(r) => self.session_domain(self.request_session(r)),
        }
    }

    fn request_session(&self, r: RequestId) -> SessionId {
        self.requests[r.0].session
    }

    fn sessions_of(&self, d: DomainId) -> impl Iterator<Item = SessionId> + '_ {
        self.sessions.iter().enumerate().filter(move |(_, spec)| spec.domain == d).map(|(i, _)| SessionId(i))
    }
}

/// `domainPhase[d]`.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DomainPhase {
    Absent,
    Starting,
    Ready,
    Stopping,
    Failed,
}

/// `coordinatorState[d]`.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CoordinatorState {
    Stopped,
    Starting,
    Ready,
    Stopping,
}

/// `stateAnchorState[d]`.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AnchorState {
    Unmounted,
    Mounted,
}

/// `sidecarState[d]` and `sandboxState[d]`.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ContainerState {
    Stopped,
    Ready,
}

/// `lockOwner[d]`.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockOwner {
    Nobody,
    Coordinator,
}

/// `connectionState[s]`.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConnectionState {
    Disconnected,
    Connected,
}

/// `sessionPhase[s]`.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SessionPhase {
    New,
    Attached,
    Prompting,
    Executing,
    Closed,
}

/// `terminalRoute[s]`: who owns the session's terminal.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TerminalRoute {
    Detached,
    Sandbox,
    Prompt,
    HostProcess,
}

/// `requestPhase[r]`.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RequestPhase {
    Unused,
    Verified,
    AwaitingApproval,
    Approved,
    Executing,
    CompletionPending,
    DenialPending,
    TimeoutPending,
    CancellationPending,
    FailurePending,
    Completed,
    Denied,
    TimedOut,
    Cancelled,
    Failed,
}

impl RequestPhase {
    /// `OpenRequestPhases`: accepted and not yet resolved.
    pub fn is_open(self) -> bool {
        matches!(self, Self::Verified | Self::AwaitingApproval | Self::Approved | Self::Executing)
    }

    /// `PendingResultPhases`: resolved, result not yet delivered.
    pub fn is_pending_result(self) -> bool {
        self.delivered().is_some()
    }

    /// `TerminalRequestPhases`.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Denied | Self::TimedOut | Self::Cancelled | Self::Failed)
    }

    /// `DeliveredResultPhase(p)` for a pending phase.
    pub fn delivered(self) -> Option<Self> {
        match self {
            Self::CompletionPending => Some(Self::Completed),
            Self::DenialPending => Some(Self::Denied),
            Self::TimeoutPending => Some(Self::TimedOut),
            Self::CancellationPending => Some(Self::Cancelled),
            Self::FailurePending => Some(Self::Failed),
            _ => None,
        }
    }
}

/// `approvalSource[r]` (`None` is `NoApproval`).
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ApprovalSource {
    AutoRule,
    Developer,
}

/// The variables of one Domain.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DomainState {
    pub phase: DomainPhase,
    pub coordinator: CoordinatorState,
    pub state_anchor: AnchorState,
    pub sidecar: ContainerState,
    pub sandbox: ContainerState,
    pub trust_ready: bool,
    pub lock_owner: LockOwner,
    pub published: bool,
}

/// The variables of one session; `registered` and `connected` are its
/// membership in `registered[d]` and `connected[d]` of its Domain.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionState {
    pub registered: bool,
    pub connected: bool,
    pub connection: ConnectionState,
    pub phase: SessionPhase,
    pub route: TerminalRoute,
    pub active_request: Option<RequestId>,
}

/// The variables of one request; `host_running` is `r \in hostRunning`.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestState {
    pub phase: RequestPhase,
    pub approval_source: Option<ApprovalSource>,
    pub approved_command: Option<CommandId>,
    pub host_running: bool,
}

/// One state of the protocol: the TLA+ VARIABLES.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct State {
    /// Per-Domain variables, indexed by [`DomainId`].
    pub domains: Vec<DomainState>,
    /// Per-session variables, indexed by [`SessionId`].
    pub sessions: Vec<SessionState>,
    /// Per-request variables, indexed by [`RequestId`].
    pub requests: Vec<RequestState>,
}

impl DomainState {
    /// The `Init` value of one Domain.
    pub fn initial() -> Self {
        Self {
            phase: DomainPhase::Absent,
            coordinator: CoordinatorState::Stopped,
            state_anchor: AnchorState::Unmounted,
            sidecar: ContainerState::Stopped,
            sandbox: ContainerState::Stopped,
            trust_ready: false,
            lock_owner: LockOwner::Nobody,
            published: false,
        }
    }
}

impl SessionState {
    /// The `Init` value of one session.
    pub fn initial() -> Self {
        Self {
            registered: false,
            connected: false,
            connection: ConnectionState::Disconnected,
            phase: SessionPhase::New,
            route: TerminalRoute::Detached,
            active_request: None,
        }
    }
}

impl RequestState {
    /// The `Init` value of one request.
    pub fn initial() -> Self {
        Self { phase: RequestPhase::Unused, approval_source: None, approved_command: None, host_running: false }
    }
}

impl Default for State {
    /// The state of an empty configuration.
    fn default() -> Self {
        State::initial(&Config::default())
    }
}

impl State {
    /// `Init`: every Domain absent, every session new, every request unused.
    pub fn initial(config: &Config) -> Self {
        Self {
            domains: config.domains.iter().map(|_| DomainState::initial()).collect(),
            sessions: config.sessions.iter().map(|_| SessionState::initial()).collect(),
            requests: config.requests.iter().map(|_| RequestState::initial()).collect(),
        }
    }
}

/// The TLA+ actions, with their parameters.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    AcquireDomainLock(SessionId),
    MountStateAnchor(DomainId),
    CreateTrustAnchor(DomainId),
    StartSidecar(DomainId),
    StartSandbox(DomainId),
    AbortUnsafeStart(DomainId),
    PublishDomain(DomainId),
    FailDomain(DomainId),
    BeginTeardown(DomainId),
    StopSandbox(DomainId),
    StopSidecar(DomainId),
    DestroyTrustAnchor(DomainId),
    UnmountStateAnchor(DomainId),
    ReleaseDomainLock(DomainId),
    ConnectSession(SessionId),
    RegisterSession(SessionId),
    RejectSession(SessionId),
    DisconnectSession(SessionId),
    EvictSession(SessionId),
    AbandonLaunch(SessionId),
    VerifyRequest(RequestId),
    AutoApprove(RequestId),
    PromptDeveloper(RequestId),
    DeveloperApprove(RequestId),
    DeveloperEditApprove(RequestId, CommandId),
    DeveloperDeny(RequestId),
    StartHostExecution(RequestId),
    CompleteHostExecution(RequestId),
    TimeoutRequest(RequestId),
    CancelRequest(RequestId),
    FailHostExecution(RequestId),
    DeliverResult(RequestId),
}

/// What an [`Action`] acts on ([`Action::subject`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    /// A Domain's start-up or teardown step.
    Domain(DomainId),
    /// A session's step (the lock acquisition included: a session asks).
    Session(SessionId),
    /// A request's step.
    Request(RequestId),
}

/// The fairness groups of the TLA+ `Fairness` conjunct: each is under weak
/// fairness (`WF_vars(DomainProgress(d))` and so on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FairnessGroup {
    /// `DomainProgress(d)`: the coordinator's start-up and teardown steps.
    DomainProgress(DomainId),
    /// `SessionProgress(s)`: registration, rejection and eviction.
    SessionProgress(SessionId),
    /// `RequestProgress(r)`: every step of an accepted request.
    RequestProgress(RequestId),
}

impl Action {
    /// The TLA+ name of the action, without parameters.
    pub fn name(&self) -> &'static str {
        match self {
            Self::AcquireDomainLock(_) => "AcquireDomainLock",
            Self::MountStateAnchor(_) => "MountStateAnchor",
            Self::CreateTrustAnchor(_) => "CreateTrustAnchor",
            Self::StartSidecar(_) => "StartSidecar",
            Self::StartSandbox(_) => "StartSandbox",
            Self::AbortUnsafeStart(_) => "AbortUnsafeStart",
            Self::PublishDomain(_) => "PublishDomain",
            Self::FailDomain(_) => "FailDomain",
            Self::BeginTeardown(_) => "BeginTeardown",
            Self::StopSandbox(_) => "StopSandbox",
            Self::StopSidecar(_) => "StopSidecar",
            Self::DestroyTrustAnchor(_) => "DestroyTrustAnchor",
            Self::UnmountStateAnchor(_) => "UnmountStateAnchor",
            Self::ReleaseDomainLock(_) => "ReleaseDomainLock",
            Self::ConnectSession(_) => "ConnectSession",
            Self::RegisterSession(_) => "RegisterSession",
            Self::RejectSession(_) => "RejectSession",
            Self::DisconnectSession(_) => "DisconnectSession",
            Self::EvictSession(_) => "EvictSession",
            Self::AbandonLaunch(_) => "AbandonLaunch",
            Self::VerifyRequest(_) => "VerifyRequest",
            Self::AutoApprove(_) => "AutoApprove",
            Self::PromptDeveloper(_) => "PromptDeveloper",
            Self::DeveloperApprove(_) => "DeveloperApprove",
            Self::DeveloperEditApprove(_, _) => "DeveloperEditApprove",
            Self::DeveloperDeny(_) => "DeveloperDeny",
            Self::StartHostExecution(_) => "StartHostExecution",
            Self::CompleteHostExecution(_) => "CompleteHostExecution",
            Self::TimeoutRequest(_) => "TimeoutRequest",
            Self::CancelRequest(_) => "CancelRequest",
            Self::FailHostExecution(_) => "FailHostExecution",
            Self::DeliverResult(_) => "DeliverResult",
        }
    }

    /// What this action acts on: a Domain, a session or a request. The one
    /// exhaustive classification that range checks, the Domain of an action,
    /// its display and the journal's retirement all use, so a new action
    /// says here once which kind it is.
    pub fn subject(&self) -> Subject {
        match *self {
            Self::MountStateAnchor(d)
            | Self::CreateTrustAnchor(d)
            | Self::StartSidecar(d)
            | Self::StartSandbox(d)
            | Self::AbortUnsafeStart(d)
            | Self::PublishDomain(d)
            | Self::FailDomain(d)
            | Self::BeginTeardown(d)
            | Self::StopSandbox(d)
            | Self::StopSidecar(d)
            | Self::DestroyTrustAnchor(d)
            | Self::UnmountStateAnchor(d)
            | Self::ReleaseDomainLock(d) => Subject::Domain(d),
            Self::AcquireDomainLock(s)
            | Self::ConnectSession(s)
            | Self::RegisterSession(s)
            | Self::RejectSession(s)
            | Self::DisconnectSession(s)
            | Self::EvictSession(s)
            | Self::AbandonLaunch(s) => Subject::Session(s),
            Self::VerifyRequest(r)
            | Self::AutoApprove(r)
            | Self::PromptDeveloper(r)
            | Self::DeveloperApprove(r)
            | Self::DeveloperEditApprove(r, _)
            | Self::DeveloperDeny(r)
            | Self::StartHostExecution(r)
            | Self::CompleteHostExecution(r)
            | Self::TimeoutRequest(r)
            | Self::CancelRequest(r)
            | Self::FailHostExecution(r)
            | Self::DeliverResult(r) => Subject::Request(r),
        }
    }

    /// The weak-fairness group this action belongs to, if any. Client,
    /// developer, host-process and failure steps have none.
    pub fn fairness_group(&self) -> Option<FairnessGroup> {
        use FairnessGroup::*;
        match *self {
            Self::MountStateAnchor(d)
            | Self::CreateTrustAnchor(d)
            | Self::StartSidecar(d)
            | Self::StartSandbox(d)
            | Self::AbortUnsafeStart(d)
            | Self::PublishDomain(d)
            | Self::BeginTeardown(d)
            | Self::StopSandbox(d)
            | Self::StopSidecar(d)
            | Self::DestroyTrustAnchor(d)
            | Self::UnmountStateAnchor(d)
            | Self::ReleaseDomainLock(d) => Some(DomainProgress(d)),
            Self::RegisterSession(s) | Self::RejectSession(s) | Self::EvictSession(s) => Some(SessionProgress(s)),
            Self::AutoApprove(r)
            | Self::PromptDeveloper(r)
            | Self::DeveloperApprove(r)
            | Self::DeveloperEditApprove(r, _)
            | Self::DeveloperDeny(r)
            | Self::StartHostExecution(r)
            | Self::CompleteHostExecution(r)
            | Self::TimeoutRequest(r)
            | Self::CancelRequest(r)
            | Self::FailHostExecution(r)
            | Self::DeliverResult(r) => Some(RequestProgress(r)),
            Self::FailDomain(_)
            | Self::AcquireDomainLock(_)
            | Self::ConnectSession(_)
            | Self::DisconnectSession(_)
            | Self::AbandonLaunch(_)
            | Self::VerifyRequest(_) => None,
        }
    }

    /// Every action instance of `config` (the disjuncts of `Next`).
    pub fn all(config: &Config) -> Vec<Action> {
        let mut actions = Vec::new();
        for d in (0..config.domains.len()).map(DomainId) {
            actions.extend([
                Self::MountStateAnchor(d),
                Self::CreateTrustAnchor(d),
                Self::StartSidecar(d),
                Self::StartSandbox(d),
                Self::AbortUnsafeStart(d),
                Self::PublishDomain(d),
                Self::FailDomain(d),
                Self::BeginTeardown(d),
                Self::StopSandbox(d),
                Self::StopSidecar(d),
                Self::DestroyTrustAnchor(d),
                Self::UnmountStateAnchor(d),
                Self::ReleaseDomainLock(d),
            ]);
        }
        for s in (0..config.sessions.len()).map(SessionId) {
            actions.extend([
                Self::AcquireDomainLock(s),
                Self::ConnectSession(s),
                Self::RegisterSession(s),
                Self::RejectSession(s),
                Self::DisconnectSession(s),
                Self::EvictSession(s),
                Self::AbandonLaunch(s),
            ]);
        }
        for r in (0..config.requests.len()).map(RequestId) {
            actions.extend([Self::VerifyRequest(r), Self::AutoApprove(r), Self::PromptDeveloper(r), Self::DeveloperApprove(r)]);
            actions.extend((0..config.commands.len()).map(|c| Self::DeveloperEditApprove(r, CommandId(c))));
            actions.extend([
                Self::DeveloperDeny(r),
                Self::StartHostExecution(r),
                Self::CompleteHostExecution(r),
                Self::TimeoutRequest(r),
                Self::CancelRequest(r),
                Self::FailHostExecution(r),
                Self::DeliverResult(r),
            ]);
        }
        actions
    }

    /// The action written with the configuration's display names, as in a
    /// TLC trace: `StartSandbox(D1)`.
    pub fn display<'a>(&'a self, config: &'a Config) -> impl fmt::Display + 'a {
        ActionDisplay { action: self, config }
    }
}

struct ActionDisplay<'a> {
    action: &'a Action,
    config: &'a Config,
}

fn name_or_index<T>(table: &[T], index: usize, name: impl Fn(&T) -> &str) -> String {
    table.get(index).map_or_else(|| format!("#{index}"), |item| name(item).to_owned())
}

impl fmt::Display for ActionDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = self.config;
        let domain = |d: DomainId| name_or_index(&config.domains, d.0, |x| &x.name);
        let session = |s: SessionId| name_or_index(&config.sessions, s.0, |x| &x.name);
        let request = |r: RequestId| name_or_index(&config.requests, r.0, |x| &x.name);
        let command = |c: CommandId| name_or_index(&config.commands, c.0, |x| &x.name);
        let name = self.action.name();
        match (*self.action, self.action.subject()) {
            (Action::DeveloperEditApprove(r, c), _) => {
                write!(f, "{name}({}, {})", request(r), command(c))
            }
            (_, Subject::Domain(d)) => write!(f, "{name}({})", domain(d)),
            (_, Subject::Session(s)) => write!(f, "{name}({})", session(s)),
            (_, Subject::Request(r)) => write!(f, "{name}({})", request(r)),
        }
    }
}

/// Why [`step`] refused an action: the first conjunct of its enabling
/// condition that is false, written as in the TLA+ text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} is not enabled: {guard} does not hold", action.name())]
pub struct Refused {
    /// The refused action.
    pub action: Action,
    /// The conjunct that failed.
    pub guard: &'static str,
}

/// Deliberately broken variants of the model. They exist to prove that the
/// checker catches real protocol bugs; [`step`] always uses
/// [`Mutation::None`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// The correct model.
    None,
    /// `StartSandbox` no longer waits for the sidecar to be Ready.
    SandboxBeforeSidecarReady,
    /// Closing a session leaves its pending result queued, and
    /// `DeliverResult` no longer checks that the session is connected.
    ResultToDisconnectedSession,
    /// `TimeoutRequest` and `CancelRequest` leave the host process running.
    HostProcessOutlivesRequest,
    /// `VerifyRequest` accepts a request without a valid certificate.
    ExecuteWithoutCertificate,
    /// Liveness mutant: `DeliverResult` is never enabled.
    ResultNeverDelivered,
    /// Liveness mutant: `BeginTeardown` is never enabled.
    TeardownNeverStarts,
}

impl Mutation {
    /// The four safety mutants named by the issue.
    pub const MUTANTS: [Mutation; 4] = [
        Mutation::SandboxBeforeSidecarReady,
        Mutation::ResultToDisconnectedSession,
        Mutation::HostProcessOutlivesRequest,
        Mutation::ExecuteWithoutCertificate,
    ];

    /// Mutants that break only liveness.
    pub const LIVENESS_MUTANTS: [Mutation; 2] = [Mutation::ResultNeverDelivered, Mutation::TeardownNeverStarts];
}

/// Whether `action` is enabled in `state` (its guard holds).
pub fn enabled(config: &Config, state: &State, action: &Action) -> bool {
    guard(config, state, action, Mutation::None).is_ok()
}

/// Applies `action` to `state`: the successor state, or why the action is not
/// enabled. This is the one place where transitions are defined.
pub fn step(config: &Config, state: &State, action: &Action) -> Result<State, Refused> {
    step_mutated(config, state, action, Mutation::None)
}

/// [`step`] of a (possibly) mutated model; used by the checker's mutant tests.
pub fn step_mutated(config: &Config, state: &State, action: &Action, mutation: Mutation) -> Result<State, Refused> {
    guard(config, state, action, mutation)?;
    let mut next = state.clone();
    effect(config, &mut next, action, mutation);
    Ok(next)
}

/// Refuses with the given TLA+ conjunct unless `cond` holds.
macro_rules! require {
    ($action:expr, $cond:expr, $text:literal) => {
        if !$cond {
            return Err(Refused { action: *$action, guard: $text });
        }
    };
}

/// Checks that every index of `action` exists in `config`.
fn in_range(config: &Config, state: &State, action: &Action) -> bool {
    let d_ok = |d: DomainId| d.0 < config.domains.len() && d.0 < state.domains.len();
    let s_ok = |s: SessionId| s.0 < config.sessions.len() && s.0 < state.sessions.len();
    let r_ok = |r: RequestId| r.0 < config.requests.len() && r.0 < state.requests.len();
    let command_ok = match *action {
        Action::DeveloperEditApprove(_, c) => c.0 < config.commands.len(),
        _ => true,
    };
    command_ok
        && match action.subject() {
            Subject::Domain(d) => d_ok(d),
            Subject::Session(s) => s_ok(s),
            Subject::Request(r) => r_ok(r),
        }
}

/// The enabling condition of every action, conjunct by conjunct as in
/// `Lazaret.tla`. The session-level indices (`SessionDomain`, `ReqSession`) are
/// validated by [`Config::validate`]; out-of-range parameters are refused.
pub fn guard(config: &Config, state: &State, action: &Action, mutation: Mutation) -> Result<(), Refused> {
    require!(action, in_range(config, state, action), "parameters \\in their sets");
    let dom = |d: DomainId| &state.domains[d.0];
    let ses = |s: SessionId| &state.sessions[s.0];
    let req = |r: RequestId| &state.requests[r.0];
    match *action {
        Action::AcquireDomainLock(s) => {
            let d = config.session_domain(s);
            require!(action, ses(s).phase == SessionPhase::New, "sessionPhase[s] = \"New\"");
            require!(action, dom(d).phase == DomainPhase::Absent, "domainPhase[d] = \"Absent\"");
            require!(action, dom(d).lock_owner == LockOwner::Nobody, "lockOwner[d] = \"Nobody\"");
            require!(action, config.domains[d.0].config_safe, "ConfigSafe[d]");
        }
        Action::MountStateAnchor(d) => {
            require!(action, dom(d).phase == DomainPhase::Starting, "domainPhase[d] = \"Starting\"");
            require!(action, dom(d).coordinator == CoordinatorState::Starting, "coordinatorState[d] = \"Starting\"");
            require!(action, dom(d).lock_owner == LockOwner::Coordinator, "lockOwner[d] = \"Coordinator\"");
            require!(action, dom(d).state_anchor == AnchorState::Unmounted, "stateAnchorState[d] = \"Unmounted\"");
        }
        Action::CreateTrustAnchor(d) => {
            require!(action, dom(d).phase == DomainPhase::Starting, "domainPhase[d] = \"Starting\"");
            require!(action, dom(d).state_anchor == AnchorState::Mounted, "stateAnchorState[d] = \"Mounted\"");
            require!(action, !dom(d).trust_ready, "~trustReady[d]");
        }
        Action::StartSidecar(d) => {
            require!(action, dom(d).phase == DomainPhase::Starting, "domainPhase[d] = \"Starting\"");
            require!(action, dom(d).trust_ready, "trustReady[d]");
            require!(action, dom(d).sidecar == ContainerState::Stopped, "sidecarState[d] = \"Stopped\"");
        }
        Action::StartSandbox(d) => {
            require!(action, dom(d).phase == DomainPhase::Starting, "domainPhase[d] = \"Starting\"");
            if mutation != Mutation::SandboxBeforeSidecarReady {
                require!(action, dom(d).sidecar == ContainerState::Ready, "sidecarState[d] = \"Ready\"");
            }
            require!(action, dom(d).sandbox == ContainerState::Stopped, "sandboxState[d] = \"Stopped\"");
            require!(action, config.domains[d.0].sandbox_isolation_safe, "SandboxIsolationSafe[d]");
        }
        Action::AbortUnsafeStart(d) => {
            require!(action, dom(d).phase == DomainPhase::Starting, "domainPhase[d] = \"Starting\"");
            require!(action, dom(d).sidecar == ContainerState::Ready, "sidecarState[d] = \"Ready\"");
            require!(action, dom(d).sandbox == ContainerState::Stopped, "sandboxState[d] = \"Stopped\"");
            require!(action, !config.domains[d.0].sandbox_isolation_safe, "~SandboxIsolationSafe[d]");
        }
        Action::PublishDomain(d) => {
            require!(action, dom(d).phase == DomainPhase::Starting, "domainPhase[d] = \"Starting\"");
            require!(action, dom(d).sandbox == ContainerState::Ready, "sandboxState[d] = \"Ready\"");
            require!(action, !dom(d).published, "~published[d]");
        }
        Action::FailDomain(d) => {
            require!(
                action,
                matches!(dom(d).phase, DomainPhase::Starting | DomainPhase::Ready),
                "domainPhase[d] \\in {\"Starting\", \"Ready\"}"
            );
        }
        Action::BeginTeardown(d) => {
            require!(action, dom(d).phase == DomainPhase::Ready, "domainPhase[d] = \"Ready\"");
            require!(action, no_connected_session(config, state, d), "connected[d] = {}");
            require!(action, mutation != Mutation::TeardownNeverStarts, "FALSE (mutant)");
        }
        Action::StopSandbox(d) => {
            tearing_down(config, state, action, d)?;
            require!(action, dom(d).sandbox == ContainerState::Ready, "sandboxState[d] = \"Ready\"");
        }
        Action::StopSidecar(d) => {
            tearing_down(config, state, action, d)?;
            require!(action, dom(d).sandbox == ContainerState::Stopped, "sandboxState[d] = \"Stopped\"");
            require!(action, dom(d).sidecar == ContainerState::Ready, "sidecarState[d] = \"Ready\"");
        }
        Action::DestroyTrustAnchor(d) => {
            tearing_down(config, state, action, d)?;
            require!(action, dom(d).sidecar == ContainerState::Stopped, "sidecarState[d] = \"Stopped\"");
            require!(action, dom(d).trust_ready, "trustReady[d]");
        }
        Action::UnmountStateAnchor(d) => {
            tearing_down(config, state, action, d)?;
            require!(action, dom(d).sidecar == ContainerState::Stopped, "sidecarState[d] = \"Stopped\"");
            require!(action, !dom(d).trust_ready, "~trustReady[d]");
            require!(action, dom(d).state_anchor == AnchorState::Mounted, "stateAnchorState[d] = \"Mounted\"");
        }
        Action::ReleaseDomainLock(d) => {
            tearing_down(config, state, action, d)?;
            require!(action, dom(d).sandbox == ContainerState::Stopped, "sandboxState[d] = \"Stopped\"");
            require!(action, dom(d).sidecar == ContainerState::Stopped, "sidecarState[d] = \"Stopped\"");
            require!(action, !dom(d).trust_ready, "~trustReady[d]");
            require!(action, dom(d).state_anchor == AnchorState::Unmounted, "stateAnchorState[d] = \"Unmounted\"");
        }
        Action::ConnectSession(s) => {
            let d = config.session_domain(s);
            require!(action, ses(s).phase == SessionPhase::New, "sessionPhase[s] = \"New\"");
            require!(action, ses(s).connection == ConnectionState::Disconnected, "connectionState[s] = \"Disconnected\"");
            require!(action, dom(d).published, "published[d]");
            require!(action, dom(d).trust_ready, "trustReady[d]");
        }
        Action::RegisterSession(s) => {
            let d = config.session_domain(s);
            require!(action, ses(s).phase == SessionPhase::New, "sessionPhase[s] = \"New\"");
            require!(action, ses(s).connection == ConnectionState::Connected, "connectionState[s] = \"Connected\"");
            require!(action, ses(s).connected, "s \\in connected[d]");
            require!(action, !ses(s).registered, "s \\notin registered[d]");
            require!(action, dom(d).phase == DomainPhase::Ready, "domainPhase[d] = \"Ready\"");
            require!(
                action,
                config.sessions[s.0].fingerprint == config.domains[d.0].fingerprint,
                "SessionFingerprint[s] = DomainFingerprint[d]"
            );
        }
        Action::RejectSession(s) => {
            let d = config.session_domain(s);
            require!(action, ses(s).phase == SessionPhase::New, "sessionPhase[s] = \"New\"");
            require!(action, ses(s).connection == ConnectionState::Connected, "connectionState[s] = \"Connected\"");
            require!(
                action,
                config.sessions[s.0].fingerprint != config.domains[d.0].fingerprint,
                "SessionFingerprint[s] # DomainFingerprint[d]"
            );
        }
        Action::DisconnectSession(s) => {
            require!(action, ses(s).connection == ConnectionState::Connected, "connectionState[s] = \"Connected\"");
        }
        Action::EvictSession(s) => {
            let d = config.session_domain(s);
            require!(action, ses(s).connection == ConnectionState::Connected, "connectionState[s] = \"Connected\"");
            require!(action, dom(d).phase == DomainPhase::Failed, "domainPhase[DomainOf(s)] = \"Failed\"");
        }
        Action::AbandonLaunch(s) => {
            require!(action, ses(s).phase == SessionPhase::New, "sessionPhase[s] = \"New\"");
            require!(action, ses(s).connection == ConnectionState::Disconnected, "connectionState[s] = \"Disconnected\"");
        }
        Action::VerifyRequest(r) => {
            let s = config.request_session(r);
            let d = config.session_domain(s);
            require!(action, req(r).phase == RequestPhase::Unused, "requestPhase[r] = \"Unused\"");
            if mutation != Mutation::ExecuteWithoutCertificate {
                require!(action, config.requests[r.0].certificate_valid, "CertificateValid[r]");
            }
            require!(action, dom(d).published, "published[d]");
            require!(action, ses(s).registered, "s \\in registered[d]");
            require!(action, ses(s).connection == ConnectionState::Connected, "connectionState[s] = \"Connected\"");
            require!(action, ses(s).phase == SessionPhase::Attached, "sessionPhase[s] = \"Attached\"");
            require!(action, ses(s).active_request.is_none(), "activeRequest[s] = NoRequest");
        }
        Action::AutoApprove(r) => {
            let c = config.requests[r.0].command;
            require!(action, req(r).phase == RequestPhase::Verified, "requestPhase[r] = \"Verified\"");
            require!(action, config.commands[c.0].auto_approved, "RequestCommand[r] \\in AutoApprovedCommands");
        }
        Action::PromptDeveloper(r) => {
            let s = config.request_session(r);
            let c = config.requests[r.0].command;
            require!(action, req(r).phase == RequestPhase::Verified, "requestPhase[r] = \"Verified\"");
            require!(action, !config.commands[c.0].auto_approved, "RequestCommand[r] \\notin AutoApprovedCommands");
            require!(action, ses(s).active_request == Some(r), "activeRequest[s] = r");
            require!(action, ses(s).phase == SessionPhase::Attached, "sessionPhase[s] = \"Attached\"");
        }
        Action::DeveloperApprove(r) | Action::DeveloperDeny(r) => {
            let s = config.request_session(r);
            require!(action, req(r).phase == RequestPhase::AwaitingApproval, "requestPhase[r] = \"AwaitingApproval\"");
            require!(action, ses(s).phase == SessionPhase::Prompting, "sessionPhase[s] = \"Prompting\"");
        }
        Action::DeveloperEditApprove(r, c) => {
            let s = config.request_session(r);
            require!(action, c != config.requests[r.0].command, "c # RequestCommand[r]");
            require!(action, req(r).phase == RequestPhase::AwaitingApproval, "requestPhase[r] = \"AwaitingApproval\"");
            require!(action, ses(s).phase == SessionPhase::Prompting, "sessionPhase[s] = \"Prompting\"");
        }
        Action::StartHostExecution(r) => {
            let s = config.request_session(r);
            require!(action, req(r).phase == RequestPhase::Approved, "requestPhase[r] = \"Approved\"");
            require!(action, req(r).approval_source.is_some(), "approvalSource[r] # NoApproval");
            require!(action, req(r).approved_command.is_some(), "approvedCommand[r] # NoCommand");
            require!(action, ses(s).active_request == Some(r), "activeRequest[s] = r");
            require!(action, ses(s).connection == ConnectionState::Connected, "connectionState[s] = \"Connected\"");
            require!(action, ses(s).phase == SessionPhase::Attached, "sessionPhase[s] = \"Attached\"");
            require!(action, !req(r).host_running, "r \\notin hostRunning");
        }
        Action::CompleteHostExecution(r) => {
            require!(action, req(r).phase == RequestPhase::Executing, "requestPhase[r] = \"Executing\"");
            require!(action, req(r).host_running, "r \\in hostRunning");
        }
        Action::TimeoutRequest(r) => {
            let s = config.request_session(r);
            require!(
                action,
                req(r).phase.is_open(),
                "requestPhase[r] \\in {\"Verified\", \"AwaitingApproval\", \"Approved\", \"Executing\"}"
            );
            require!(action, ses(s).active_request == Some(r), "activeRequest[s] = r");
        }
        Action::CancelRequest(r) => {
            let s = config.request_session(r);
            require!(
                action,
                req(r).phase.is_open(),
                "requestPhase[r] \\in {\"Verified\", \"AwaitingApproval\", \"Approved\", \"Executing\"}"
            );
            require!(action, ses(s).active_request == Some(r), "activeRequest[s] = r");
            require!(action, ses(s).connection == ConnectionState::Connected, "connectionState[s] = \"Connected\"");
        }
        Action::FailHostExecution(r) => {
            let s = config.request_session(r);
            require!(action, req(r).phase == RequestPhase::Executing, "requestPhase[r] = \"Executing\"");
            require!(action, ses(s).active_request == Some(r), "activeRequest[s] = r");
            require!(action, ses(s).connection == ConnectionState::Connected, "connectionState[s] = \"Connected\"");
        }
        Action::DeliverResult(r) => {
            let s = config.request_session(r);
            require!(action, req(r).phase.is_pending_result(), "requestPhase[r] \\in PendingResultPhases");
            require!(action, mutation != Mutation::ResultNeverDelivered, "FALSE (mutant)");
            require!(action, ses(s).active_request == Some(r), "activeRequest[s] = r");
            if mutation != Mutation::ResultToDisconnectedSession {
                require!(action, ses(s).connection == ConnectionState::Connected, "connectionState[s] = \"Connected\"");
                require!(action, ses(s).phase == SessionPhase::Attached, "sessionPhase[s] = \"Attached\"");
            }
        }
    }
    Ok(())
}

fn no_connected_session(config: &Config, state: &State, d: DomainId) -> bool {
    config.sessions_of(d).all(|s| !state.sessions[s.0].connected)
}

/// `TearingDown(d)`.
fn tearing_down(config: &Config, state: &State, action: &Action, d: DomainId) -> Result<(), Refused> {
    require!(
        action,
        matches!(state.domains[d.0].phase, DomainPhase::Stopping | DomainPhase::Failed),
        "domainPhase[d] \\in {\"Stopping\", \"Failed\"}"
    );
    require!(action, no_connected_session(config, state, d), "connected[d] = {}");
    Ok(())
}

/// The effect of an enabled action (the primed conjuncts of the TLA+
/// action); variables not assigned here are UNCHANGED.
fn effect(config: &Config, next: &mut State, action: &Action, mutation: Mutation) {
    match *action {
        Action::AcquireDomainLock(s) => {
            let d = &mut next.domains[config.session_domain(s).0];
            d.lock_owner = LockOwner::Coordinator;
            d.phase = DomainPhase::Starting;
            d.coordinator = CoordinatorState::Starting;
        }
        Action::MountStateAnchor(d) => next.domains[d.0].state_anchor = AnchorState::Mounted,
        Action::CreateTrustAnchor(d) => next.domains[d.0].trust_ready = true,
        Action::StartSidecar(d) => next.domains[d.0].sidecar = ContainerState::Ready,
        Action::StartSandbox(d) => next.domains[d.0].sandbox = ContainerState::Ready,
        Action::AbortUnsafeStart(d) => {
            let d = &mut next.domains[d.0];
            d.phase = DomainPhase::Failed;
            d.coordinator = CoordinatorState::Stopping;
        }
        Action::PublishDomain(d) => {
            let d = &mut next.domains[d.0];
            d.published = true;
            d.phase = DomainPhase::Ready;
            d.coordinator = CoordinatorState::Ready;
        }
        Action::FailDomain(d) => {
            let d = &mut next.domains[d.0];
            d.phase = DomainPhase::Failed;
            d.coordinator = CoordinatorState::Stopping;
            d.published = false;
        }
        Action::BeginTeardown(d) => {
            let d = &mut next.domains[d.0];
            d.phase = DomainPhase::Stopping;
            d.coordinator = CoordinatorState::Stopping;
            d.published = false;
        }
        Action::StopSandbox(d) => next.domains[d.0].sandbox = ContainerState::Stopped,
        Action::StopSidecar(d) => next.domains[d.0].sidecar = ContainerState::Stopped,
        Action::DestroyTrustAnchor(d) => next.domains[d.0].trust_ready = false,
        Action::UnmountStateAnchor(d) => next.domains[d.0].state_anchor = AnchorState::Unmounted,
        Action::ReleaseDomainLock(d) => {
            let d = &mut next.domains[d.0];
            d.lock_owner = LockOwner::Nobody;
            d.coordinator = CoordinatorState::Stopped;
            d.phase = DomainPhase::Absent;
        }
        Action::ConnectSession(s) => {
            let s = &mut next.sessions[s.0];
            s.connection = ConnectionState::Connected;
            s.connected = true;
        }
        Action::RegisterSession(s) => {
            let s = &mut next.sessions[s.0];
            s.registered = true;
            s.phase = SessionPhase::Attached;
            s.route = TerminalRoute::Sandbox;
        }
        Action::RejectSession(s) | Action::DisconnectSession(s) | Action::EvictSession(s) => {
            close_session(next, s, mutation);
        }
        Action::AbandonLaunch(s) => next.sessions[s.0].phase = SessionPhase::Closed,
        Action::VerifyRequest(r) => {
            next.requests[r.0].phase = RequestPhase::Verified;
            next.sessions[config.request_session(r).0].active_request = Some(r);
        }
        Action::AutoApprove(r) => {
            let command = config.requests[r.0].command;
            let r = &mut next.requests[r.0];
            r.phase = RequestPhase::Approved;
            r.approval_source = Some(ApprovalSource::AutoRule);
            r.approved_command = Some(command);
        }
        Action::PromptDeveloper(r) => {
            next.requests[r.0].phase = RequestPhase::AwaitingApproval;
            set_terminal(next, config.request_session(r), SessionPhase::Prompting);
        }
        Action::DeveloperApprove(r) => {
            developer_approve_as(config, next, r, config.requests[r.0].command);
        }
        Action::DeveloperEditApprove(r, c) => developer_approve_as(config, next, r, c),
        Action::DeveloperDeny(r) => {
            next.requests[r.0].phase = RequestPhase::DenialPending;
            set_terminal(next, config.request_session(r), SessionPhase::Attached);
        }
        Action::StartHostExecution(r) => {
            next.requests[r.0].phase = RequestPhase::Executing;
            next.requests[r.0].host_running = true;
            set_terminal(next, config.request_session(r), SessionPhase::Executing);
        }
        Action::CompleteHostExecution(r) => {
            next.requests[r.0].phase = RequestPhase::CompletionPending;
            next.requests[r.0].host_running = false;
            set_terminal(next, config.request_session(r), SessionPhase::Attached);
        }
        Action::TimeoutRequest(r) | Action::CancelRequest(r) | Action::FailHostExecution(r) => {
            let phase = match action {
                Action::TimeoutRequest(_) => RequestPhase::TimeoutPending,
                Action::CancelRequest(_) => RequestPhase::CancellationPending,
                _ => RequestPhase::FailurePending,
            };
            next.requests[r.0].phase = phase;
            let leave_running = mutation == Mutation::HostProcessOutlivesRequest && !matches!(action, Action::FailHostExecution(_));
            if !leave_running {
                next.requests[r.0].host_running = false;
            }
            set_terminal(next, config.request_session(r), SessionPhase::Attached);
        }
        Action::DeliverResult(r) => {
            let request = &mut next.requests[r.0];
            if let Some(delivered) = request.phase.delivered() {
                request.phase = delivered;
            }
            next.sessions[config.request_session(r).0].active_request = None;
        }
    }
}

/// Sets `sessionPhase[s]` and the `terminalRoute[s]` that goes with it.
fn set_terminal(next: &mut State, s: SessionId, phase: SessionPhase) {
    let session = &mut next.sessions[s.0];
    session.phase = phase;
    session.route = route_for(phase);
}

/// The terminal route `TerminalIsolation` pairs with each session phase.
fn route_for(phase: SessionPhase) -> TerminalRoute {
    match phase {
        SessionPhase::New | SessionPhase::Closed => TerminalRoute::Detached,
        SessionPhase::Attached => TerminalRoute::Sandbox,
        SessionPhase::Prompting => TerminalRoute::Prompt,
        SessionPhase::Executing => TerminalRoute::HostProcess,
    }
}

/// `DeveloperApproveAs(r, c)`.
fn developer_approve_as(config: &Config, next: &mut State, r: RequestId, c: CommandId) {
    let request = &mut next.requests[r.0];
    request.phase = RequestPhase::Approved;
    request.approval_source = Some(ApprovalSource::Developer);
    request.approved_command = Some(c);
    set_terminal(next, config.request_session(r), SessionPhase::Attached);
}

/// `CloseSession(s)`: the session leaves its Domain; its active request is
/// abandoned (Cancelled, no result delivered) and its host process killed.
fn close_session(next: &mut State, s: SessionId, mutation: Mutation) {
    let active = next.sessions[s.0].active_request;
    let keep_pending =
        mutation == Mutation::ResultToDisconnectedSession && active.is_some_and(|r| next.requests[r.0].phase.is_pending_result());
    let session = &mut next.sessions[s.0];
    session.connection = ConnectionState::Disconnected;
    session.connected = false;
    session.registered = false;
    session.phase = SessionPhase::Closed;
    session.route = TerminalRoute::Detached;
    if keep_pending {
        return;
    }
    session.active_request = None;
    if let Some(r) = active {
        next.requests[r.0].phase = RequestPhase::Cancelled;
        next.requests[r.0].host_running = false;
    }
}

/// The safety invariants of `Lazaret.cfg`, in its order.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Invariant {
    TypeOK,
    ConfigurationConfinement,
    SandboxNamespaceIsolation,
    OrderedNetworkStartup,
    OrderedResourceStack,
    PublishedDomainsReady,
    RegisteredSessionsConnected,
    SessionFingerprintMatch,
    AuthenticatedEscalation,
    ApprovedHostExecution,
    TerminalIsolation,
    ActiveRequestConsistent,
    NoOrphanHostProcess,
    StateAnchorOwnership,
    ResultDeliveryStateConsistent,
}

impl Invariant {
    /// Every invariant, in the order of `Lazaret.cfg`.
    pub const ALL: [Invariant; 15] = [
        Invariant::TypeOK,
        Invariant::ConfigurationConfinement,
        Invariant::SandboxNamespaceIsolation,
        Invariant::OrderedNetworkStartup,
        Invariant::OrderedResourceStack,
        Invariant::PublishedDomainsReady,
        Invariant::RegisteredSessionsConnected,
        Invariant::SessionFingerprintMatch,
        Invariant::AuthenticatedEscalation,
        Invariant::ApprovedHostExecution,
        Invariant::TerminalIsolation,
        Invariant::ActiveRequestConsistent,
        Invariant::NoOrphanHostProcess,
        Invariant::StateAnchorOwnership,
        Invariant::ResultDeliveryStateConsistent,
    ];

    /// Whether the invariant holds in `state`.
    pub fn holds(self, config: &Config, state: &State) -> bool {
        let domains = || (0..state.domains.len()).map(|d| (DomainId(d), &state.domains[d]));
        let sessions = || (0..state.sessions.len()).map(|s| (SessionId(s), &state.sessions[s]));
        let requests = || (0..state.requests.len()).map(|r| (RequestId(r), &state.requests[r]));
        let session_of = |r: RequestId| config.request_session(r);
        match self {
            // The Rust types carry the TLA+ sets; what is left is that the
            // state has one entry per constant and indices stay in range.
            Invariant::TypeOK => {
                state.domains.len() == config.domains.len()
                    && state.sessions.len() == config.sessions.len()
                    && state.requests.len() == config.requests.len()
                    && sessions().all(|(_, s)| s.active_request.is_none_or(|r| r.0 < config.requests.len()))
                    && requests().all(|(_, r)| r.approved_command.is_none_or(|c| c.0 < config.commands.len()))
            }
            Invariant::ConfigurationConfinement => {
                domains().all(|(d, x)| x.phase == DomainPhase::Absent || config.domains[d.0].config_safe)
            }
            Invariant::SandboxNamespaceIsolation => {
                domains().all(|(d, x)| x.sandbox != ContainerState::Ready || config.domains[d.0].sandbox_isolation_safe)
            }
            Invariant::OrderedNetworkStartup => {
                domains().all(|(_, x)| x.sandbox != ContainerState::Ready || x.sidecar == ContainerState::Ready)
            }
            Invariant::OrderedResourceStack => domains().all(|(_, x)| {
                (x.sidecar != ContainerState::Ready || x.trust_ready)
                    && (!x.trust_ready || x.state_anchor == AnchorState::Mounted)
                    && (x.phase != DomainPhase::Absent
                        || (x.state_anchor == AnchorState::Unmounted
                            && x.lock_owner == LockOwner::Nobody
                            && x.coordinator == CoordinatorState::Stopped))
            }),
            Invariant::PublishedDomainsReady => domains().all(|(_, x)| {
                !x.published
                    || (x.phase == DomainPhase::Ready
                        && x.coordinator == CoordinatorState::Ready
                        && x.lock_owner == LockOwner::Coordinator
                        && x.state_anchor == AnchorState::Mounted
                        && x.trust_ready
                        && x.sidecar == ContainerState::Ready
                        && x.sandbox == ContainerState::Ready)
            }),
            Invariant::RegisteredSessionsConnected => {
                sessions().all(|(_, s)| (!s.registered || s.connected) && (s.connected == (s.connection == ConnectionState::Connected)))
            }
            Invariant::SessionFingerprintMatch => sessions().all(|(id, s)| {
                !s.registered || config.sessions[id.0].fingerprint == config.domains[config.session_domain(id).0].fingerprint
            }),
            Invariant::AuthenticatedEscalation => requests().all(|(id, r)| {
                (r.phase == RequestPhase::Unused || config.requests[id.0].certificate_valid)
                    && (!(r.phase.is_open() || r.phase.is_pending_result()) || state.sessions[session_of(id).0].registered)
            }),
            Invariant::ApprovedHostExecution => requests().all(|(id, r)| {
                !r.host_running
                    || match (r.approval_source, r.approved_command) {
                        (Some(ApprovalSource::Developer), Some(_)) => true,
                        (Some(ApprovalSource::AutoRule), Some(c)) => {
                            c == config.requests[id.0].command && config.commands[c.0].auto_approved
                        }
                        _ => false,
                    }
            }),
            Invariant::TerminalIsolation => sessions().all(|(_, s)| {
                let active_phase = s.active_request.map(|r| state.requests[r.0].phase);
                s.route == route_for(s.phase)
                    && (s.route != TerminalRoute::Prompt || active_phase == Some(RequestPhase::AwaitingApproval))
                    && (s.route != TerminalRoute::HostProcess || active_phase == Some(RequestPhase::Executing))
            }),
            Invariant::ActiveRequestConsistent => {
                sessions().all(|(id, s)| {
                    s.active_request.is_none_or(|r| {
                        session_of(r) == id
                            && s.connection == ConnectionState::Connected
                            && (state.requests[r.0].phase.is_open() || state.requests[r.0].phase.is_pending_result())
                    })
                }) && requests().all(|(id, r)| !r.phase.is_open() || state.sessions[session_of(id).0].active_request == Some(id))
            }
            Invariant::NoOrphanHostProcess => requests().all(|(id, r)| {
                let s = session_of(id);
                let session = &state.sessions[s.0];
                !r.host_running
                    || (r.phase == RequestPhase::Executing
                        && session.active_request == Some(id)
                        && session.connection == ConnectionState::Connected
                        && session.route == TerminalRoute::HostProcess
                        && state.domains[config.session_domain(s).0].coordinator != CoordinatorState::Stopped)
            }),
            Invariant::StateAnchorOwnership => domains().all(|(_, x)| {
                x.state_anchor != AnchorState::Mounted
                    || matches!(x.coordinator, CoordinatorState::Starting | CoordinatorState::Ready | CoordinatorState::Stopping)
            }),
            Invariant::ResultDeliveryStateConsistent => requests().all(|(id, r)| {
                let session = &state.sessions[session_of(id).0];
                (!r.phase.is_pending_result()
                    || (session.active_request == Some(id)
                        && session.connection == ConnectionState::Connected
                        && session.phase == SessionPhase::Attached
                        && !r.host_running))
                    && (!r.phase.is_terminal() || (session.active_request != Some(id) && !r.host_running))
            }),
        }
    }
}

/// The first invariant (in `Lazaret.cfg` order) that `state` violates.
pub fn check_invariants(config: &Config, state: &State) -> Result<(), Invariant> {
    match Invariant::ALL.into_iter().find(|inv| !inv.holds(config, state)) {
        Some(violated) => Err(violated),
        None => Ok(()),
    }
}

/// The liveness properties of `Lazaret.cfg`, instantiated per Domain or
/// request. Each is a leads-to `trigger ~> goal`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LivenessProperty {
    /// `SessionEventuallyResolves` for one request: once accepted, it reaches
    /// a terminal phase or its session disconnects.
    SessionEventuallyResolves(RequestId),
    /// `DomainEventuallyTearsDown` for one Domain: once all its sessions have
    /// ended, it becomes Absent.
    DomainEventuallyTearsDown(DomainId),
}

impl LivenessProperty {
    /// Every instance of every liveness property of `config`.
    pub fn all(config: &Config) -> Vec<LivenessProperty> {
        let mut all: Vec<_> = (0..config.requests.len()).map(|r| Self::SessionEventuallyResolves(RequestId(r))).collect();
        all.extend((0..config.domains.len()).map(|d| Self::DomainEventuallyTearsDown(DomainId(d))));
        all
    }

    /// The left side of the leads-to.
    pub fn trigger(self, config: &Config, state: &State) -> bool {
        match self {
            Self::SessionEventuallyResolves(r) => {
                let phase = state.requests[r.0].phase;
                phase.is_open() || phase.is_pending_result()
            }
            Self::DomainEventuallyTearsDown(d) => config.sessions_of(d).all(|s| state.sessions[s.0].phase == SessionPhase::Closed),
        }
    }

    /// The right side of the leads-to.
    pub fn goal(self, config: &Config, state: &State) -> bool {
        match self {
            Self::SessionEventuallyResolves(r) => {
                state.requests[r.0].phase.is_terminal()
                    || state.sessions[config.request_session(r).0].connection == ConnectionState::Disconnected
            }
            Self::DomainEventuallyTearsDown(d) => state.domains[d.0].phase == DomainPhase::Absent,
        }
    }

    /// The property written with display names: `SessionEventuallyResolves(R1)`.
    pub fn describe(self, config: &Config) -> String {
        match self {
            Self::SessionEventuallyResolves(r) => {
                format!("SessionEventuallyResolves({})", name_or_index(&config.requests, r.0, |x| &x.name))
            }
            Self::DomainEventuallyTearsDown(d) => {
                format!("DomainEventuallyTearsDown({})", name_or_index(&config.domains, d.0, |x| &x.name))
            }
        }
    }
}
