------------------------------ MODULE Lazaret ------------------------------
EXTENDS Naturals, FiniteSets, Sequences, TLC

(***************************************************************************
Application-wide protocol model for Lazaret.

The model covers Domain startup, ordered resource preparation, sandbox launch
isolation, Client Session registration, host escalation, correlated result
delivery, terminal ownership, failure, and teardown.
Cryptographic algorithms, serialization, container commands, filesystems, and
network packet handling are refinement boundaries validated by implementation
tests rather than modeled internally.

The Rust crate `lazaret-protocol` (protocol/src/model.rs) implements the same
state machine; every action below has one Rust counterpart with the same name
and the same enabling condition and effect (see protocol/README.md).
***************************************************************************)

CONSTANTS
    Domains,
    Sessions,
    Requests,
    Commands,
    SessionDomain,
    SessionFingerprint,
    DomainFingerprint,
    ConfigSafe,
    SandboxIsolationSafe,
    RequestSession,
    RequestCommand,
    CertificateValid,
    AutoApprovedCommands,
    NoRequest,
    NoApproval,
    NoCommand,
    D1, S1, S2, R1, R2, R3, C1, C2

VARIABLES
    domainPhase,
    coordinatorState,
    stateAnchorState,
    sidecarState,
    sandboxState,
    trustReady,
    lockOwner,
    published,
    registered,
    connected,
    connectionState,
    sessionPhase,
    terminalRoute,
    activeRequest,
    requestPhase,
    approvalSource,
    approvedCommand,
    hostRunning

vars == <<
    domainPhase, coordinatorState, stateAnchorState, sidecarState,
    sandboxState, trustReady, lockOwner, published, registered, connected,
    connectionState, sessionPhase, terminalRoute, activeRequest, requestPhase,
    approvalSource, approvedCommand, hostRunning
>>

ASSUME
    /\ IsFiniteSet(Domains)
    /\ IsFiniteSet(Sessions)
    /\ IsFiniteSet(Requests)
    /\ IsFiniteSet(Commands)
    /\ SessionDomain \in [Sessions -> Domains]
    /\ SessionFingerprint \in [Sessions -> STRING]
    /\ DomainFingerprint \in [Domains -> STRING]
    /\ ConfigSafe \in [Domains -> BOOLEAN]
    /\ SandboxIsolationSafe \in [Domains -> BOOLEAN]
    /\ RequestSession \in [Requests -> Sessions]
    /\ RequestCommand \in [Requests -> Commands]
    /\ CertificateValid \in [Requests -> BOOLEAN]
    /\ AutoApprovedCommands \subseteq Commands
    /\ NoRequest \notin Requests
    /\ NoCommand \notin Commands

DomainPhases == {"Absent", "Starting", "Ready", "Stopping", "Failed"}
CoordinatorStates == {"Stopped", "Starting", "Ready", "Stopping"}
AnchorStates == {"Unmounted", "Mounted"}
ContainerStates == {"Stopped", "Ready"}
LockOwners == {"Nobody", "Coordinator"}
SessionPhases == {"New", "Attached", "Prompting", "Executing", "Closed"}
TerminalRoutes == {"Detached", "Sandbox", "Prompt", "HostProcess"}
ConnectionStates == {"Disconnected", "Connected"}
RequestPhases == {
    "Unused", "Verified", "AwaitingApproval", "Approved", "Executing",
    "CompletionPending", "DenialPending", "TimeoutPending",
    "CancellationPending", "FailurePending",
    "Completed", "Denied", "TimedOut", "Cancelled", "Failed"
}
ApprovalSources == {NoApproval, "AutoRule", "Developer"}
PendingResultPhases == {
    "CompletionPending", "DenialPending", "TimeoutPending",
    "CancellationPending", "FailurePending"
}
TerminalRequestPhases == {"Completed", "Denied", "TimedOut", "Cancelled", "Failed"}
OpenRequestPhases == {"Verified", "AwaitingApproval", "Approved", "Executing"}
DeliveredResultPhase(p) ==
    CASE p = "CompletionPending" -> "Completed"
      [] p = "DenialPending" -> "Denied"
      [] p = "TimeoutPending" -> "TimedOut"
      [] p = "CancellationPending" -> "Cancelled"
      [] p = "FailurePending" -> "Failed"

(***************************************************************************
Finite fixture operators used by Lazaret.cfg. The protocol itself depends only
on the abstract constants above; other TLC configurations may override them with
larger finite sets.
***************************************************************************)
DomainsFixture == {D1}
SessionsFixture == {S1, S2}
RequestsFixture == {R1, R2, R3}
CommandsFixture == {C1, C2}
SessionDomainFixture == (S1 :> D1) @@ (S2 :> D1)
SessionFingerprintFixture ==
    (S1 :> "config-a") @@ (S2 :> "config-a")
DomainFingerprintFixture == D1 :> "config-a"
ConfigSafeFixture == D1 :> TRUE
SandboxIsolationSafeFixture == D1 :> TRUE
RequestSessionFixture ==
    (R1 :> S1) @@ (R2 :> S2) @@ (R3 :> S1)
RequestCommandFixture ==
    (R1 :> C1) @@ (R2 :> C2) @@ (R3 :> C2)
\* R3 carries a forged client certificate: it must never be accepted.
CertificateValidFixture ==
    (R1 :> TRUE) @@ (R2 :> TRUE) @@ (R3 :> FALSE)
AutoApprovedCommandsFixture == {C1}

ReqSession(r) == RequestSession[r]
DomainOf(s) == SessionDomain[s]
SessionsOf(d) == {s \in Sessions : SessionDomain[s] = d}

(***************************************************************************
Initial state.
***************************************************************************)
Init ==
    /\ domainPhase = [d \in Domains |-> "Absent"]
    /\ coordinatorState = [d \in Domains |-> "Stopped"]
    /\ stateAnchorState = [d \in Domains |-> "Unmounted"]
    /\ sidecarState = [d \in Domains |-> "Stopped"]
    /\ sandboxState = [d \in Domains |-> "Stopped"]
    /\ trustReady = [d \in Domains |-> FALSE]
    /\ lockOwner = [d \in Domains |-> "Nobody"]
    /\ published = [d \in Domains |-> FALSE]
    /\ registered = [d \in Domains |-> {}]
    /\ connected = [d \in Domains |-> {}]
    /\ connectionState = [s \in Sessions |-> "Disconnected"]
    /\ sessionPhase = [s \in Sessions |-> "New"]
    /\ terminalRoute = [s \in Sessions |-> "Detached"]
    /\ activeRequest = [s \in Sessions |-> NoRequest]
    /\ requestPhase = [r \in Requests |-> "Unused"]
    /\ approvalSource = [r \in Requests |-> NoApproval]
    /\ approvedCommand = [r \in Requests |-> NoCommand]
    /\ hostRunning = {}

(***************************************************************************
Domain start-up, in the order lock, State Anchor, Trust Anchor, sidecar,
sandbox, publish. The launcher of a session that finds its Domain absent takes
the Domain lock and becomes the Domain's coordinator.
***************************************************************************)
DomainResources == <<
    domainPhase, coordinatorState, stateAnchorState, sidecarState,
    sandboxState, trustReady, lockOwner, published
>>
SessionVars == <<
    registered, connected, connectionState, sessionPhase, terminalRoute,
    activeRequest
>>
RequestVars == <<requestPhase, approvalSource, approvedCommand, hostRunning>>

AcquireDomainLock(s) ==
    LET d == DomainOf(s) IN
    /\ sessionPhase[s] = "New"
    /\ domainPhase[d] = "Absent"
    /\ lockOwner[d] = "Nobody"
    /\ ConfigSafe[d]
    /\ lockOwner' = [lockOwner EXCEPT ![d] = "Coordinator"]
    /\ domainPhase' = [domainPhase EXCEPT ![d] = "Starting"]
    /\ coordinatorState' = [coordinatorState EXCEPT ![d] = "Starting"]
    /\ UNCHANGED <<
        stateAnchorState, sidecarState, sandboxState, trustReady, published
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

MountStateAnchor(d) ==
    /\ domainPhase[d] = "Starting"
    /\ coordinatorState[d] = "Starting"
    /\ lockOwner[d] = "Coordinator"
    /\ stateAnchorState[d] = "Unmounted"
    /\ stateAnchorState' = [stateAnchorState EXCEPT ![d] = "Mounted"]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, sidecarState, sandboxState,
        trustReady, lockOwner, published
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

CreateTrustAnchor(d) ==
    /\ domainPhase[d] = "Starting"
    /\ stateAnchorState[d] = "Mounted"
    /\ ~trustReady[d]
    /\ trustReady' = [trustReady EXCEPT ![d] = TRUE]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sidecarState,
        sandboxState, lockOwner, published
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

StartSidecar(d) ==
    /\ domainPhase[d] = "Starting"
    /\ trustReady[d]
    /\ sidecarState[d] = "Stopped"
    /\ sidecarState' = [sidecarState EXCEPT ![d] = "Ready"]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sandboxState,
        trustReady, lockOwner, published
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

StartSandbox(d) ==
    /\ domainPhase[d] = "Starting"
    /\ sidecarState[d] = "Ready"
    /\ sandboxState[d] = "Stopped"
    /\ SandboxIsolationSafe[d]
    /\ sandboxState' = [sandboxState EXCEPT ![d] = "Ready"]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sidecarState,
        trustReady, lockOwner, published
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

\* The generated sandbox specification would join a host namespace: refuse it.
AbortUnsafeStart(d) ==
    /\ domainPhase[d] = "Starting"
    /\ sidecarState[d] = "Ready"
    /\ sandboxState[d] = "Stopped"
    /\ ~SandboxIsolationSafe[d]
    /\ domainPhase' = [domainPhase EXCEPT ![d] = "Failed"]
    /\ coordinatorState' = [coordinatorState EXCEPT ![d] = "Stopping"]
    /\ UNCHANGED <<
        stateAnchorState, sidecarState, sandboxState, trustReady, lockOwner,
        published
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

PublishDomain(d) ==
    /\ domainPhase[d] = "Starting"
    /\ sandboxState[d] = "Ready"
    /\ ~published[d]
    /\ published' = [published EXCEPT ![d] = TRUE]
    /\ domainPhase' = [domainPhase EXCEPT ![d] = "Ready"]
    /\ coordinatorState' = [coordinatorState EXCEPT ![d] = "Ready"]
    /\ UNCHANGED <<
        stateAnchorState, sidecarState, sandboxState, trustReady, lockOwner
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

(***************************************************************************
Failure and teardown. A failure withdraws the Domain's socket at once; the
coordinator then evicts every session (which kills their host processes) and
releases resources in the reverse order of start-up.
***************************************************************************)
FailDomain(d) ==
    /\ domainPhase[d] \in {"Starting", "Ready"}
    /\ domainPhase' = [domainPhase EXCEPT ![d] = "Failed"]
    /\ coordinatorState' = [coordinatorState EXCEPT ![d] = "Stopping"]
    /\ published' = [published EXCEPT ![d] = FALSE]
    /\ UNCHANGED <<
        stateAnchorState, sidecarState, sandboxState, trustReady, lockOwner
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

BeginTeardown(d) ==
    /\ domainPhase[d] = "Ready"
    /\ connected[d] = {}
    /\ domainPhase' = [domainPhase EXCEPT ![d] = "Stopping"]
    /\ coordinatorState' = [coordinatorState EXCEPT ![d] = "Stopping"]
    /\ published' = [published EXCEPT ![d] = FALSE]
    /\ UNCHANGED <<
        stateAnchorState, sidecarState, sandboxState, trustReady, lockOwner
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

TearingDown(d) ==
    /\ domainPhase[d] \in {"Stopping", "Failed"}
    /\ connected[d] = {}

StopSandbox(d) ==
    /\ TearingDown(d)
    /\ sandboxState[d] = "Ready"
    /\ sandboxState' = [sandboxState EXCEPT ![d] = "Stopped"]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sidecarState,
        trustReady, lockOwner, published
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

StopSidecar(d) ==
    /\ TearingDown(d)
    /\ sandboxState[d] = "Stopped"
    /\ sidecarState[d] = "Ready"
    /\ sidecarState' = [sidecarState EXCEPT ![d] = "Stopped"]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sandboxState,
        trustReady, lockOwner, published
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

DestroyTrustAnchor(d) ==
    /\ TearingDown(d)
    /\ sidecarState[d] = "Stopped"
    /\ trustReady[d]
    /\ trustReady' = [trustReady EXCEPT ![d] = FALSE]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sidecarState,
        sandboxState, lockOwner, published
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

UnmountStateAnchor(d) ==
    /\ TearingDown(d)
    /\ sidecarState[d] = "Stopped"
    /\ ~trustReady[d]
    /\ stateAnchorState[d] = "Mounted"
    /\ stateAnchorState' = [stateAnchorState EXCEPT ![d] = "Unmounted"]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, sidecarState, sandboxState,
        trustReady, lockOwner, published
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

ReleaseDomainLock(d) ==
    /\ TearingDown(d)
    /\ sandboxState[d] = "Stopped"
    /\ sidecarState[d] = "Stopped"
    /\ ~trustReady[d]
    /\ stateAnchorState[d] = "Unmounted"
    /\ lockOwner' = [lockOwner EXCEPT ![d] = "Nobody"]
    /\ coordinatorState' = [coordinatorState EXCEPT ![d] = "Stopped"]
    /\ domainPhase' = [domainPhase EXCEPT ![d] = "Absent"]
    /\ UNCHANGED <<
        stateAnchorState, sidecarState, sandboxState, trustReady, published
       >>
    /\ UNCHANGED SessionVars
    /\ UNCHANGED RequestVars

(***************************************************************************
Client Sessions. A session connects over mutual TLS (which needs the Trust
Anchor), registers its Session ID with its Configuration Fingerprint, and is
closed by a disconnect, a fingerprint rejection, or an eviction. Closing a
session kills the host process of its active request and abandons that
request: it becomes terminal (Cancelled) without a delivered result.
***************************************************************************)
ConnectSession(s) ==
    LET d == DomainOf(s) IN
    /\ sessionPhase[s] = "New"
    /\ connectionState[s] = "Disconnected"
    /\ published[d]
    /\ trustReady[d]
    /\ connectionState' = [connectionState EXCEPT ![s] = "Connected"]
    /\ connected' = [connected EXCEPT ![d] = @ \cup {s}]
    /\ UNCHANGED DomainResources
    /\ UNCHANGED <<registered, sessionPhase, terminalRoute, activeRequest>>
    /\ UNCHANGED RequestVars

RegisterSession(s) ==
    LET d == DomainOf(s) IN
    /\ sessionPhase[s] = "New"
    /\ connectionState[s] = "Connected"
    /\ s \in connected[d]
    /\ s \notin registered[d]
    /\ domainPhase[d] = "Ready"
    /\ SessionFingerprint[s] = DomainFingerprint[d]
    /\ registered' = [registered EXCEPT ![d] = @ \cup {s}]
    /\ sessionPhase' = [sessionPhase EXCEPT ![s] = "Attached"]
    /\ terminalRoute' = [terminalRoute EXCEPT ![s] = "Sandbox"]
    /\ UNCHANGED DomainResources
    /\ UNCHANGED <<connected, connectionState, activeRequest>>
    /\ UNCHANGED RequestVars

CloseSession(s) ==
    LET d == DomainOf(s)
        r == activeRequest[s]
    IN
    /\ connectionState' = [connectionState EXCEPT ![s] = "Disconnected"]
    /\ connected' = [connected EXCEPT ![d] = @ \ {s}]
    /\ registered' = [registered EXCEPT ![d] = @ \ {s}]
    /\ sessionPhase' = [sessionPhase EXCEPT ![s] = "Closed"]
    /\ terminalRoute' = [terminalRoute EXCEPT ![s] = "Detached"]
    /\ activeRequest' = [activeRequest EXCEPT ![s] = NoRequest]
    /\ requestPhase' =
        IF r = NoRequest THEN requestPhase
        ELSE [requestPhase EXCEPT ![r] = "Cancelled"]
    /\ hostRunning' = hostRunning \ {r}
    /\ UNCHANGED DomainResources
    /\ UNCHANGED <<approvalSource, approvedCommand>>

RejectSession(s) ==
    LET d == DomainOf(s) IN
    /\ sessionPhase[s] = "New"
    /\ connectionState[s] = "Connected"
    /\ SessionFingerprint[s] # DomainFingerprint[d]
    /\ CloseSession(s)

DisconnectSession(s) ==
    /\ connectionState[s] = "Connected"
    /\ CloseSession(s)

EvictSession(s) ==
    /\ connectionState[s] = "Connected"
    /\ domainPhase[DomainOf(s)] = "Failed"
    /\ CloseSession(s)

AbandonLaunch(s) ==
    /\ sessionPhase[s] = "New"
    /\ connectionState[s] = "Disconnected"
    /\ sessionPhase' = [sessionPhase EXCEPT ![s] = "Closed"]
    /\ UNCHANGED DomainResources
    /\ UNCHANGED <<
        registered, connected, connectionState, terminalRoute, activeRequest
       >>
    /\ UNCHANGED RequestVars

(***************************************************************************
Host escalation. A request is accepted only with a valid client certificate
from a registered session of a published Domain (SR-9), one at a time per
session; it is then auto-approved by a rule or shown to the developer, who
may approve, edit then approve, or deny it.
***************************************************************************)
VerifyRequest(r) ==
    LET s == ReqSession(r)
        d == DomainOf(s)
    IN
    /\ requestPhase[r] = "Unused"
    /\ CertificateValid[r]
    /\ published[d]
    /\ s \in registered[d]
    /\ connectionState[s] = "Connected"
    /\ sessionPhase[s] = "Attached"
    /\ activeRequest[s] = NoRequest
    /\ requestPhase' = [requestPhase EXCEPT ![r] = "Verified"]
    /\ activeRequest' = [activeRequest EXCEPT ![s] = r]
    /\ UNCHANGED DomainResources
    /\ UNCHANGED <<
        registered, connected, connectionState, sessionPhase, terminalRoute
       >>
    /\ UNCHANGED <<approvalSource, approvedCommand, hostRunning>>

AutoApprove(r) ==
    /\ requestPhase[r] = "Verified"
    /\ RequestCommand[r] \in AutoApprovedCommands
    /\ requestPhase' = [requestPhase EXCEPT ![r] = "Approved"]
    /\ approvalSource' = [approvalSource EXCEPT ![r] = "AutoRule"]
    /\ approvedCommand' = [approvedCommand EXCEPT ![r] = RequestCommand[r]]
    /\ UNCHANGED DomainResources
    /\ UNCHANGED SessionVars
    /\ UNCHANGED hostRunning

PromptDeveloper(r) ==
    LET s == ReqSession(r) IN
    /\ requestPhase[r] = "Verified"
    /\ RequestCommand[r] \notin AutoApprovedCommands
    /\ activeRequest[s] = r
    /\ sessionPhase[s] = "Attached"
    /\ requestPhase' = [requestPhase EXCEPT ![r] = "AwaitingApproval"]
    /\ sessionPhase' = [sessionPhase EXCEPT ![s] = "Prompting"]
    /\ terminalRoute' = [terminalRoute EXCEPT ![s] = "Prompt"]
    /\ UNCHANGED DomainResources
    /\ UNCHANGED <<registered, connected, connectionState, activeRequest>>
    /\ UNCHANGED <<approvalSource, approvedCommand, hostRunning>>

DeveloperApproveAs(r, c) ==
    LET s == ReqSession(r) IN
    /\ requestPhase[r] = "AwaitingApproval"
    /\ sessionPhase[s] = "Prompting"
    /\ requestPhase' = [requestPhase EXCEPT ![r] = "Approved"]
    /\ approvalSource' = [approvalSource EXCEPT ![r] = "Developer"]
    /\ approvedCommand' = [approvedCommand EXCEPT ![r] = c]
    /\ sessionPhase' = [sessionPhase EXCEPT ![s] = "Attached"]
    /\ terminalRoute' = [terminalRoute EXCEPT ![s] = "Sandbox"]
    /\ UNCHANGED DomainResources
    /\ UNCHANGED <<registered, connected, connectionState, activeRequest>>
    /\ UNCHANGED hostRunning

DeveloperApprove(r) == DeveloperApproveAs(r, RequestCommand[r])

DeveloperEditApprove(r, c) ==
    /\ c # RequestCommand[r]
    /\ DeveloperApproveAs(r, c)

DeveloperDeny(r) ==
    LET s == ReqSession(r) IN
    /\ requestPhase[r] = "AwaitingApproval"
    /\ sessionPhase[s] = "Prompting"
    /\ requestPhase' = [requestPhase EXCEPT ![r] = "DenialPending"]
    /\ sessionPhase' = [sessionPhase EXCEPT ![s] = "Attached"]
    /\ terminalRoute' = [terminalRoute EXCEPT ![s] = "Sandbox"]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sidecarState,
        sandboxState, trustReady, lockOwner, published, registered, connected,
        connectionState, activeRequest, approvalSource, approvedCommand,
        hostRunning
       >>

StartHostExecution(r) ==
    LET s == ReqSession(r) IN
    /\ requestPhase[r] = "Approved"
    /\ approvalSource[r] # NoApproval
    /\ approvedCommand[r] # NoCommand
    /\ activeRequest[s] = r
    /\ connectionState[s] = "Connected"
    /\ sessionPhase[s] = "Attached"
    /\ r \notin hostRunning
    /\ requestPhase' = [requestPhase EXCEPT ![r] = "Executing"]
    /\ hostRunning' = hostRunning \cup {r}
    /\ sessionPhase' = [sessionPhase EXCEPT ![s] = "Executing"]
    /\ terminalRoute' = [terminalRoute EXCEPT ![s] = "HostProcess"]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sidecarState,
        sandboxState, trustReady, lockOwner, published, registered, connected,
        connectionState, activeRequest, approvalSource, approvedCommand
       >>

CompleteHostExecution(r) ==
    LET s == ReqSession(r) IN
    /\ requestPhase[r] = "Executing"
    /\ r \in hostRunning
    /\ requestPhase' = [requestPhase EXCEPT ![r] = "CompletionPending"]
    /\ hostRunning' = hostRunning \ {r}
    /\ sessionPhase' = [sessionPhase EXCEPT ![s] = "Attached"]
    /\ terminalRoute' = [terminalRoute EXCEPT ![s] = "Sandbox"]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sidecarState,
        sandboxState, trustReady, lockOwner, published, registered, connected,
        connectionState, activeRequest, approvalSource, approvedCommand
       >>

TimeoutRequest(r) ==
    LET s == ReqSession(r) IN
    /\ requestPhase[r] \in {"Verified", "AwaitingApproval", "Approved", "Executing"}
    /\ activeRequest[s] = r
    /\ requestPhase' = [requestPhase EXCEPT ![r] = "TimeoutPending"]
    /\ sessionPhase' = [sessionPhase EXCEPT ![s] = "Attached"]
    /\ terminalRoute' = [terminalRoute EXCEPT ![s] = "Sandbox"]
    /\ hostRunning' = hostRunning \ {r}
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sidecarState,
        sandboxState, trustReady, lockOwner, published, registered, connected,
        connectionState, activeRequest, approvalSource, approvedCommand
       >>

CancelRequest(r) ==
    LET s == ReqSession(r) IN
    /\ requestPhase[r] \in {
        "Verified", "AwaitingApproval", "Approved", "Executing"
       }
    /\ activeRequest[s] = r
    /\ connectionState[s] = "Connected"
    /\ requestPhase' = [requestPhase EXCEPT ![r] = "CancellationPending"]
    /\ sessionPhase' = [sessionPhase EXCEPT ![s] = "Attached"]
    /\ terminalRoute' = [terminalRoute EXCEPT ![s] = "Sandbox"]
    /\ hostRunning' = hostRunning \ {r}
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sidecarState,
        sandboxState, trustReady, lockOwner, published, registered, connected,
        connectionState, activeRequest, approvalSource, approvedCommand
       >>

FailHostExecution(r) ==
    LET s == ReqSession(r) IN
    /\ requestPhase[r] = "Executing"
    /\ activeRequest[s] = r
    /\ connectionState[s] = "Connected"
    /\ requestPhase' = [requestPhase EXCEPT ![r] = "FailurePending"]
    /\ sessionPhase' = [sessionPhase EXCEPT ![s] = "Attached"]
    /\ terminalRoute' = [terminalRoute EXCEPT ![s] = "Sandbox"]
    /\ hostRunning' = hostRunning \ {r}
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sidecarState,
        sandboxState, trustReady, lockOwner, published, registered, connected,
        connectionState, activeRequest, approvalSource, approvedCommand
       >>

DeliverResult(r) ==
    LET s == ReqSession(r) IN
    /\ requestPhase[r] \in PendingResultPhases
    /\ activeRequest[s] = r
    /\ connectionState[s] = "Connected"
    /\ sessionPhase[s] = "Attached"
    /\ requestPhase' = [requestPhase EXCEPT
        ![r] = DeliveredResultPhase(@)]
    /\ activeRequest' = [activeRequest EXCEPT ![s] = NoRequest]
    /\ UNCHANGED <<
        domainPhase, coordinatorState, stateAnchorState, sidecarState,
        sandboxState, trustReady, lockOwner, published, registered, connected,
        sessionPhase, terminalRoute, connectionState, approvalSource,
        approvedCommand, hostRunning
       >>

(***************************************************************************
Next-state relation, grouped as the fairness conditions need it.
***************************************************************************)
DomainProgress(d) ==
    \/ MountStateAnchor(d)
    \/ CreateTrustAnchor(d)
    \/ StartSidecar(d)
    \/ StartSandbox(d)
    \/ AbortUnsafeStart(d)
    \/ PublishDomain(d)
    \/ BeginTeardown(d)
    \/ StopSandbox(d)
    \/ StopSidecar(d)
    \/ DestroyTrustAnchor(d)
    \/ UnmountStateAnchor(d)
    \/ ReleaseDomainLock(d)

\* Steps the coordinator takes on its own for a connected session.
SessionProgress(s) ==
    \/ RegisterSession(s)
    \/ RejectSession(s)
    \/ EvictSession(s)

\* Steps of the client or the outside world for a session.
SessionEnvironment(s) ==
    \/ AcquireDomainLock(s)
    \/ ConnectSession(s)
    \/ DisconnectSession(s)
    \/ AbandonLaunch(s)

RequestProgress(r) ==
    \/ AutoApprove(r)
    \/ PromptDeveloper(r)
    \/ DeveloperApprove(r)
    \/ (\E c \in Commands : DeveloperEditApprove(r, c))
    \/ DeveloperDeny(r)
    \/ StartHostExecution(r)
    \/ CompleteHostExecution(r)
    \/ TimeoutRequest(r)
    \/ CancelRequest(r)
    \/ FailHostExecution(r)
    \/ DeliverResult(r)

Next ==
    \/ (\E s \in Sessions :
            SessionEnvironment(s) \/ SessionProgress(s))
    \/ (\E d \in Domains : DomainProgress(d) \/ FailDomain(d))
    \/ (\E r \in Requests : VerifyRequest(r) \/ RequestProgress(r))

\* Clients, developers, host processes and failures get no fairness: only the
\* coordinator's own steps must eventually happen while they stay enabled.
Fairness ==
    /\ \A d \in Domains : WF_vars(DomainProgress(d))
    /\ \A s \in Sessions : WF_vars(SessionProgress(s))
    /\ \A r \in Requests : WF_vars(RequestProgress(r))

Spec == Init /\ [][Next]_vars /\ Fairness

(***************************************************************************
Safety invariants.
***************************************************************************)
TypeOK ==
    /\ domainPhase \in [Domains -> DomainPhases]
    /\ coordinatorState \in [Domains -> CoordinatorStates]
    /\ stateAnchorState \in [Domains -> AnchorStates]
    /\ sidecarState \in [Domains -> ContainerStates]
    /\ sandboxState \in [Domains -> ContainerStates]
    /\ trustReady \in [Domains -> BOOLEAN]
    /\ lockOwner \in [Domains -> LockOwners]
    /\ published \in [Domains -> BOOLEAN]
    /\ registered \in [Domains -> SUBSET Sessions]
    /\ connected \in [Domains -> SUBSET Sessions]
    /\ connectionState \in [Sessions -> ConnectionStates]
    /\ sessionPhase \in [Sessions -> SessionPhases]
    /\ terminalRoute \in [Sessions -> TerminalRoutes]
    /\ activeRequest \in [Sessions -> Requests \cup {NoRequest}]
    /\ requestPhase \in [Requests -> RequestPhases]
    /\ approvalSource \in [Requests -> ApprovalSources]
    /\ approvedCommand \in [Requests -> Commands \cup {NoCommand}]
    /\ hostRunning \subseteq Requests

ConfigurationConfinement ==
    \A d \in Domains : domainPhase[d] # "Absent" => ConfigSafe[d]

SandboxNamespaceIsolation ==
    \A d \in Domains : sandboxState[d] = "Ready" => SandboxIsolationSafe[d]

OrderedNetworkStartup ==
    \A d \in Domains : sandboxState[d] = "Ready" => sidecarState[d] = "Ready"

\* Each resource exists only while the ones it is started after exist.
OrderedResourceStack ==
    \A d \in Domains :
        /\ sidecarState[d] = "Ready" => trustReady[d]
        /\ trustReady[d] => stateAnchorState[d] = "Mounted"
        /\ domainPhase[d] = "Absent" =>
            /\ stateAnchorState[d] = "Unmounted"
            /\ lockOwner[d] = "Nobody"
            /\ coordinatorState[d] = "Stopped"

PublishedDomainsReady ==
    \A d \in Domains : published[d] =>
        /\ domainPhase[d] = "Ready"
        /\ coordinatorState[d] = "Ready"
        /\ lockOwner[d] = "Coordinator"
        /\ stateAnchorState[d] = "Mounted"
        /\ trustReady[d]
        /\ sidecarState[d] = "Ready"
        /\ sandboxState[d] = "Ready"

RegisteredSessionsConnected ==
    \A d \in Domains :
        /\ registered[d] \subseteq connected[d]
        /\ \A s \in connected[d] :
            /\ SessionDomain[s] = d
            /\ connectionState[s] = "Connected"
        /\ \A s \in SessionsOf(d) :
            connectionState[s] = "Connected" => s \in connected[d]

\* A registered session presented the Domain's Configuration Fingerprint.
SessionFingerprintMatch ==
    \A d \in Domains : \A s \in registered[d] :
        SessionFingerprint[s] = DomainFingerprint[d]

\* SR-9: nothing is routed or executed for a request that was not
\* authenticated and bound to a registered session.
AuthenticatedEscalation ==
    \A r \in Requests :
        /\ requestPhase[r] # "Unused" => CertificateValid[r]
        /\ requestPhase[r] \in OpenRequestPhases \cup PendingResultPhases =>
            ReqSession(r) \in registered[DomainOf(ReqSession(r))]

\* A host command runs only as approved, by a rule that matches or by the
\* developer.
ApprovedHostExecution ==
    \A r \in hostRunning :
        /\ approvalSource[r] \in {"AutoRule", "Developer"}
        /\ approvedCommand[r] \in Commands
        /\ approvalSource[r] = "AutoRule" =>
            /\ approvedCommand[r] = RequestCommand[r]
            /\ approvedCommand[r] \in AutoApprovedCommands

TerminalIsolation ==
    \A s \in Sessions :
        /\ sessionPhase[s] \in {"New", "Closed"} <=> terminalRoute[s] = "Detached"
        /\ sessionPhase[s] = "Attached" <=> terminalRoute[s] = "Sandbox"
        /\ sessionPhase[s] = "Prompting" <=> terminalRoute[s] = "Prompt"
        /\ sessionPhase[s] = "Executing" <=> terminalRoute[s] = "HostProcess"
        /\ terminalRoute[s] = "Prompt" =>
            /\ activeRequest[s] # NoRequest
            /\ requestPhase[activeRequest[s]] = "AwaitingApproval"
        /\ terminalRoute[s] = "HostProcess" =>
            /\ activeRequest[s] # NoRequest
            /\ requestPhase[activeRequest[s]] = "Executing"

ActiveRequestConsistent ==
    /\ \A s \in Sessions : activeRequest[s] # NoRequest =>
        /\ ReqSession(activeRequest[s]) = s
        /\ connectionState[s] = "Connected"
        /\ requestPhase[activeRequest[s]] \in OpenRequestPhases \cup PendingResultPhases
    /\ \A r \in Requests : requestPhase[r] \in OpenRequestPhases =>
        activeRequest[ReqSession(r)] = r

NoOrphanHostProcess ==
    \A r \in hostRunning :
        LET s == ReqSession(r) IN
        /\ requestPhase[r] = "Executing"
        /\ activeRequest[s] = r
        /\ connectionState[s] = "Connected"
        /\ terminalRoute[s] = "HostProcess"
        /\ coordinatorState[DomainOf(s)] # "Stopped"

StateAnchorOwnership ==
    \A d \in Domains : stateAnchorState[d] = "Mounted" =>
        coordinatorState[d] \in {"Starting", "Ready", "Stopping"}

ResultDeliveryStateConsistent ==
    /\ \A r \in Requests : requestPhase[r] \in PendingResultPhases =>
        LET s == ReqSession(r) IN
        /\ activeRequest[s] = r
        /\ connectionState[s] = "Connected"
        /\ sessionPhase[s] = "Attached"
        /\ r \notin hostRunning
    /\ \A r \in Requests : requestPhase[r] \in TerminalRequestPhases =>
        /\ activeRequest[ReqSession(r)] # r
        /\ r \notin hostRunning

Safety ==
    /\ TypeOK
    /\ ConfigurationConfinement
    /\ SandboxNamespaceIsolation
    /\ OrderedNetworkStartup
    /\ OrderedResourceStack
    /\ PublishedDomainsReady
    /\ RegisteredSessionsConnected
    /\ SessionFingerprintMatch
    /\ AuthenticatedEscalation
    /\ ApprovedHostExecution
    /\ TerminalIsolation
    /\ ActiveRequestConsistent
    /\ NoOrphanHostProcess
    /\ StateAnchorOwnership
    /\ ResultDeliveryStateConsistent

(***************************************************************************
Liveness properties. TLC configurations may check these separately from the
safety invariants; they hold under the Fairness conjunct of Spec.
***************************************************************************)

\* OR-2: an accepted request reaches a terminal phase (its result delivered),
\* unless its session disconnects first.
SessionEventuallyResolves ==
    \A r \in Requests :
        (requestPhase[r] \in OpenRequestPhases \cup PendingResultPhases) ~>
            (requestPhase[r] \in TerminalRequestPhases
                \/ connectionState[ReqSession(r)] = "Disconnected")

\* FR-6: once every session of a Domain has ended, the Domain tears down.
DomainEventuallyTearsDown ==
    \A d \in Domains :
        (\A s \in SessionsOf(d) : sessionPhase[s] = "Closed") ~>
            (domainPhase[d] = "Absent")

=============================================================================
