//! Journal conformance: good journals replay, bad ones fail at the right line.

use lazaret_protocol::journal::{ConformanceError, DOMAIN_APPROVAL_RULE, Event, JournalEntry, Machine, TransitionError};
use lazaret_protocol::model::{Action, ApprovalSource, Config, RequestPhase, SessionPhase, State, TerminalRoute, enabled, step};
use lazaret_protocol::{replay, replay_into, replay_reader, replay_reader_into};

const DOMAIN: &str = "dom-7f3a";

fn entry(event: Event) -> JournalEntry {
    JournalEntry { timestamp_ms: 1_700_000_000_000, domain: DOMAIN.to_owned(), event }
}

fn session(id: &str) -> String {
    id.to_owned()
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

/// A `VerifyRequest` as a coordinator writes it.
fn verify(session: &str, request: &str, words: &[&str], auto_approved: bool) -> Event {
    Event::verify_request(session, request, &argv(words), "/work", "the agent's reason", auto_approved)
}

/// Domain start-up as a coordinator journals it.
fn startup(launcher: &str) -> Vec<JournalEntry> {
    vec![
        entry(Event::AcquireDomainLock { session: session(launcher), fingerprint: "sha256:aa".into() }),
        entry(Event::MountStateAnchor),
        entry(Event::CreateTrustAnchor),
        entry(Event::StartSidecar),
        entry(Event::StartSandbox),
        entry(Event::PublishDomain),
    ]
}

fn join(id: &str) -> Vec<JournalEntry> {
    vec![
        entry(Event::ConnectSession { session: session(id) }),
        entry(Event::RegisterSession { session: session(id), fingerprint: "sha256:aa".into() }),
    ]
}

fn teardown() -> Vec<JournalEntry> {
    vec![
        entry(Event::BeginTeardown),
        entry(Event::StopSandbox),
        entry(Event::StopSidecar),
        entry(Event::DestroyTrustAnchor),
        entry(Event::UnmountStateAnchor),
        entry(Event::ReleaseDomainLock),
    ]
}

fn good_journal() -> Vec<JournalEntry> {
    let mut journal = startup("sess-a");
    journal.extend(join("sess-a"));
    journal.extend(join("sess-b"));
    journal.extend([
        entry(verify("sess-a", "req-1", &["git", "fetch"], true)),
        entry(Event::AutoApprove { request: "req-1".into(), rule: "git-fetch".into() }),
        entry(Event::StartHostExecution { request: "req-1".into() }),
        entry(verify("sess-b", "req-2", &["make", "install"], false)),
        entry(Event::PromptDeveloper { request: "req-2".into() }),
        entry(Event::developer_edit_approve("req-2", &argv(&["make", "install", "PREFIX=/tmp/x"]))),
        entry(Event::CompleteHostExecution { request: "req-1".into(), exit_status: Some(0) }),
        entry(Event::DeliverResult { request: "req-1".into() }),
        entry(Event::StartHostExecution { request: "req-2".into() }),
        entry(Event::CancelRequest { request: "req-2".into() }),
        entry(Event::DeliverResult { request: "req-2".into() }),
        entry(verify("sess-a", "req-3", &["make", "install"], false)),
        entry(Event::PromptDeveloper { request: "req-3".into() }),
        // The session goes away while the developer looks at the prompt.
        entry(Event::DisconnectSession { session: session("sess-a") }),
        entry(Event::DisconnectSession { session: session("sess-b") }),
    ]);
    journal.extend(teardown());
    journal
}

fn to_lines(journal: &[JournalEntry]) -> String {
    journal.iter().map(|e| e.to_json_line().expect("journal entries serialize")).collect::<Vec<_>>().join("\n")
}

#[test]
fn a_full_domain_lifetime_replays() {
    let journal = good_journal();
    // The default machine retires what ended: nothing is left but the
    // Domain, and every ID is remembered as used.
    let retiring = replay(&journal).expect("the journal conforms");
    assert_eq!(retiring.live_sessions(), 0);
    for id in ["sess-a", "sess-b"] {
        assert!(retiring.session_index(id).is_none() && retiring.is_retired_session(id), "{id}");
    }
    for id in ["req-1", "req-2", "req-3"] {
        assert!(retiring.request_index(id).is_none() && retiring.is_retired_request(id), "{id}");
    }
    assert_eq!(retiring.retired_ids(), 5);
    let machine = replay_into(Machine::keeping_history(), &journal).expect("the journal conforms");
    let state = machine.state();
    assert_eq!(state.domains.len(), 1);
    assert_eq!(state.sessions.len(), 2);
    assert!(state.sessions.iter().all(|s| s.phase == SessionPhase::Closed));
    let phase = |id: &str| state.requests[machine.request_index(id).expect("known").0].phase;
    assert_eq!(phase("req-1"), RequestPhase::Completed);
    assert_eq!(phase("req-2"), RequestPhase::Cancelled);
    // Abandoned by the disconnect: terminal without a delivered result.
    assert_eq!(phase("req-3"), RequestPhase::Cancelled);
}

#[test]
fn json_lines_round_trip_and_replay() {
    let text = to_lines(&good_journal());
    assert!(text.lines().next().is_some_and(|l| l.contains("\"action\":\"AcquireDomainLock\"")));
    let parsed: Vec<JournalEntry> = text.lines().map(|l| serde_json::from_str(l).expect("parses")).collect();
    assert_eq!(parsed, good_journal());
    replay_reader(text.as_bytes()).expect("conforms");
}

/// The line is refused, by the history-keeping machine for the model's
/// reason `guard`, by the retiring one for that reason too or because the
/// line names a retired ID.
fn expect_refusal(journal: &[JournalEntry], line: usize, event: &str, guard: &str) {
    expect_refused_or_retired(journal, line);
    match replay_into(Machine::keeping_history(), journal) {
        Err(ConformanceError::Transition { line: got_line, source: TransitionError::Refused { event: got_event, refused } }) => {
            assert_eq!((got_line, got_event), (line, event), "wrong line or action: {refused}");
            assert_eq!(refused.guard, guard);
        }
        other => panic!("expected line {line} ({event}) to be refused, got {other:?}"),
    }
}

#[test]
fn sandbox_before_sidecar_is_refused() {
    let mut journal = startup("sess-a");
    journal.swap(3, 4); // StartSandbox before StartSidecar
    expect_refusal(&journal, 4, "StartSandbox", "sidecarState[d] = \"Ready\"");
}

#[test]
fn result_after_disconnect_is_refused() {
    let mut journal = startup("sess-a");
    journal.extend(join("sess-a"));
    journal.extend([
        entry(verify("sess-a", "req-1", &["ls"], true)),
        entry(Event::TimeoutRequest { request: "req-1".into() }),
        entry(Event::DisconnectSession { session: session("sess-a") }),
        entry(Event::DeliverResult { request: "req-1".into() }),
    ]);
    let line = journal.len();
    expect_refusal(&journal, line, "DeliverResult", "requestPhase[r] \\in PendingResultPhases");
}

#[test]
fn execution_without_approval_is_refused() {
    let mut journal = startup("sess-a");
    journal.extend(join("sess-a"));
    journal.extend([
        entry(verify("sess-a", "req-1", &["rm", "-rf", "/"], false)),
        entry(Event::StartHostExecution { request: "req-1".into() }),
    ]);
    let line = journal.len();
    expect_refusal(&journal, line, "StartHostExecution", "requestPhase[r] = \"Approved\"");
}

#[test]
fn foreign_fingerprint_cannot_register_but_can_be_rejected() {
    let mut journal = startup("sess-a");
    journal.push(entry(Event::ConnectSession { session: session("sess-x") }));
    let mut bad = journal.clone();
    bad.push(entry(Event::RegisterSession { session: session("sess-x"), fingerprint: "sha256:bb".into() }));
    expect_refusal(&bad, bad.len(), "RegisterSession", "SessionFingerprint[s] = DomainFingerprint[d]");
    journal.push(entry(Event::RejectSession { session: session("sess-x"), fingerprint: "sha256:bb".into() }));
    replay(&journal).expect("rejection conforms");
}

#[test]
fn teardown_with_a_connected_session_is_refused() {
    let mut journal = startup("sess-a");
    journal.extend(join("sess-a"));
    journal.push(entry(Event::BeginTeardown));
    expect_refusal(&journal, journal.len(), "BeginTeardown", "connected[d] = {}");
}

#[test]
fn unknown_request_and_garbage_lines_are_reported_with_their_line() {
    let mut journal = startup("sess-a");
    journal.push(entry(Event::DeliverResult { request: "nope".into() }));
    match replay(&journal) {
        Err(ConformanceError::Transition { line: 7, source: TransitionError::Unknown { kind: "request", .. } }) => {}
        other => panic!("unexpected {other:?}"),
    }
    let text = format!("{}\n\n{{\"timestamp_ms\": 1}}\n", to_lines(&startup("sess-a")));
    match replay_reader(text.as_bytes()) {
        Err(err @ ConformanceError::Parse { line: 8, .. }) => {
            assert!(err.to_string().starts_with("journal line 8:"));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn refused_entries_leave_the_machine_unchanged() {
    let mut machine = Machine::new();
    for e in startup("sess-a") {
        machine.apply(&e).expect("start-up conforms");
    }
    let before = machine.state().clone();
    let bad = entry(Event::RegisterSession { session: session("sess-new"), fingerprint: "sha256:aa".into() });
    assert!(machine.apply(&bad).is_err());
    assert_eq!(machine.state(), &before);
    assert!(machine.session_index("sess-new").is_none());
}

/// The journal entry a coordinator of the user's fixture writes for `action`.
fn fixture_entry(config: &Config, action: &Action) -> JournalEntry {
    let s = |id: lazaret_protocol::model::SessionId| config.sessions[id.0].name.clone();
    let r = |id: lazaret_protocol::model::RequestId| config.requests[id.0].name.clone();
    let event = match *action {
        Action::AcquireDomainLock(id) => Event::AcquireDomainLock { session: s(id), fingerprint: config.domains[0].fingerprint.clone() },
        Action::MountStateAnchor(_) => Event::MountStateAnchor,
        Action::CreateTrustAnchor(_) => Event::CreateTrustAnchor,
        Action::StartSidecar(_) => Event::StartSidecar,
        Action::StartSandbox(_) => Event::StartSandbox,
        Action::AbortUnsafeStart(_) => Event::AbortUnsafeStart,
        Action::PublishDomain(_) => Event::PublishDomain,
        Action::FailDomain(_) => Event::FailDomain { reason: "test".into() },
        Action::BeginTeardown(_) => Event::BeginTeardown,
        Action::StopSandbox(_) => Event::StopSandbox,
        Action::StopSidecar(_) => Event::StopSidecar,
        Action::DestroyTrustAnchor(_) => Event::DestroyTrustAnchor,
        Action::UnmountStateAnchor(_) => Event::UnmountStateAnchor,
        Action::ReleaseDomainLock(_) => Event::ReleaseDomainLock,
        Action::ConnectSession(id) => Event::ConnectSession { session: s(id) },
        Action::RegisterSession(id) => Event::RegisterSession { session: s(id), fingerprint: config.sessions[id.0].fingerprint.clone() },
        Action::RejectSession(id) => Event::RejectSession { session: s(id), fingerprint: config.sessions[id.0].fingerprint.clone() },
        Action::DisconnectSession(id) => Event::DisconnectSession { session: s(id) },
        Action::EvictSession(id) => Event::EvictSession { session: s(id) },
        Action::AbandonLaunch(id) => Event::AbandonLaunch { session: s(id) },
        Action::VerifyRequest(id) => {
            let spec = &config.requests[id.0];
            let command = &config.commands[spec.command.0];
            // The fixture's commands are names, not argument vectors.
            Event::VerifyRequest {
                session: s(spec.session),
                request: r(id),
                command: command.name.clone(),
                auto_approved: command.auto_approved,
                argv: Vec::new(),
                cwd: String::new(),
                justification: String::new(),
            }
        }
        Action::AutoApprove(id) => Event::AutoApprove { request: r(id), rule: "fixture-rule".into() },
        Action::PromptDeveloper(id) => Event::PromptDeveloper { request: r(id) },
        Action::DeveloperApprove(id) => Event::DeveloperApprove { request: r(id), for_domain: false },
        Action::DeveloperEditApprove(id, c) => {
            Event::DeveloperEditApprove { request: r(id), command: config.commands[c.0].name.clone(), argv: Vec::new() }
        }
        Action::DeveloperDeny(id) => Event::DeveloperDeny { request: r(id), reason: String::new() },
        Action::StartHostExecution(id) => Event::StartHostExecution { request: r(id) },
        Action::CompleteHostExecution(id) => Event::CompleteHostExecution { request: r(id), exit_status: Some(0) },
        Action::TimeoutRequest(id) => Event::TimeoutRequest { request: r(id) },
        Action::CancelRequest(id) => Event::CancelRequest { request: r(id) },
        Action::FailHostExecution(id) => Event::FailHostExecution { request: r(id), reason: "test".into() },
        Action::DeliverResult(id) => Event::DeliverResult { request: r(id) },
    };
    JournalEntry { timestamp_ms: 0, domain: config.domains[0].name.clone(), event }
}

/// A small deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Compares the model state of the fixture with the replayed machine's,
/// entity by entity through the real names. A retiring machine no longer
/// holds what ended: a retired session must be Closed in the model, a
/// retired request terminal.
fn assert_same(config: &Config, model: &State, machine: &Machine) {
    let replayed = machine.state();
    if let Some(d) = machine.domain_index(&config.domains[0].name) {
        assert_eq!(model.domains[0], replayed.domains[d.0]);
    }
    for (i, spec) in config.sessions.iter().enumerate() {
        let expected = &model.sessions[i];
        let Some(s) = machine.session_index(&spec.name) else {
            if machine.is_retired_session(&spec.name) {
                assert_eq!(expected.phase, SessionPhase::Closed, "{} retired", spec.name);
            } else {
                assert_eq!(expected, &lazaret_protocol::model::SessionState::initial());
            }
            continue;
        };
        let got = &replayed.sessions[s.0];
        assert_eq!(
            (expected.phase, expected.connection, expected.route, expected.registered, expected.connected),
            (got.phase, got.connection, got.route, got.registered, got.connected)
        );
        let name_in_model = expected.active_request.map(|r| config.requests[r.0].name.clone());
        let name_replayed = got.active_request.map(|r| machine.config().requests[r.0].name.clone());
        assert_eq!(name_in_model, name_replayed);
    }
    for (i, spec) in config.requests.iter().enumerate() {
        let expected = &model.requests[i];
        let Some(r) = machine.request_index(&spec.name) else {
            if machine.is_retired_request(&spec.name) {
                assert!(expected.phase.is_terminal(), "{} retired", spec.name);
                assert!(!expected.host_running, "{} retired", spec.name);
            } else {
                assert_eq!(expected.phase, RequestPhase::Unused);
            }
            continue;
        };
        let got = &replayed.requests[r.0];
        assert_eq!((expected.phase, expected.approval_source, expected.host_running), (got.phase, got.approval_source, got.host_running));
        let cmd_model = expected.approved_command.map(|c| config.commands[c.0].name.clone());
        let cmd_replayed = got.approved_command.map(|c| machine.config().commands[c.0].name.clone());
        assert_eq!(cmd_model, cmd_replayed);
    }
}

#[test]
fn random_behaviours_of_the_model_replay_and_disabled_steps_are_refused() {
    let config = Config::user_fixture();
    let actions = Action::all(&config);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut replayed_steps = 0;
    let mut refused_checks = 0;
    // Each walk once with a retiring machine and once keeping history.
    for walk in 0..400 {
        let mut state = State::initial(&config);
        let mut machine = if walk % 2 == 0 { Machine::new() } else { Machine::keeping_history() };
        for _ in 0..60 {
            let enabled_now: Vec<&Action> = actions.iter().filter(|a| enabled(&config, &state, a)).collect();
            // A disabled action must be refused by the journal machine too.
            // VerifyRequest of the forged R3 and AbortUnsafeStart are excluded:
            // a journal records only verified requests and checked sandboxes.
            let disabled: Vec<&Action> = actions
                .iter()
                .filter(|a| !enabled(&config, &state, a))
                .filter(|a| !matches!(a, Action::VerifyRequest(r) if !config.requests[r.0].certificate_valid))
                .filter(|a| !matches!(a, Action::AbortUnsafeStart(_)))
                .collect();
            if !disabled.is_empty() {
                let bad = disabled[rng.below(disabled.len())];
                assert!(
                    machine.check(&fixture_entry(&config, bad)).is_err(),
                    "journal machine accepts {} which the model forbids",
                    bad.display(&config)
                );
                refused_checks += 1;
            }
            if enabled_now.is_empty() {
                break;
            }
            let action = enabled_now[rng.below(enabled_now.len())];
            state = step(&config, &state, action).expect("enabled");
            let line = fixture_entry(&config, action).to_json_line().expect("serializes");
            let parsed: JournalEntry = serde_json::from_str(&line).expect("parses");
            machine.apply(&parsed).expect("a model behaviour conforms");
            replayed_steps += 1;
            assert_same(&config, &state, &machine);
        }
    }
    println!("replayed {replayed_steps} steps, {refused_checks} disabled steps refused");
    assert!(replayed_steps > 2000);
}

// ---- Escalation requests, one test per outcome (the event orders of the
// journal module's documentation) ----

fn request_event(kind: &str, request: &str) -> Event {
    let request = request.to_owned();
    match kind {
        "prompt" => Event::PromptDeveloper { request },
        "approve" => Event::DeveloperApprove { request, for_domain: false },
        "approve-for-domain" => Event::DeveloperApprove { request, for_domain: true },
        "deny" => Event::DeveloperDeny { request, reason: String::new() },
        "start" => Event::StartHostExecution { request },
        "complete" => Event::CompleteHostExecution { request, exit_status: Some(0) },
        "timeout" => Event::TimeoutRequest { request },
        "cancel" => Event::CancelRequest { request },
        "fail" => Event::FailHostExecution { request, reason: "spawn failed: No such file or directory".into() },
        "deliver" => Event::DeliverResult { request },
        other => panic!("unknown step {other}"),
    }
}

/// Entries for `steps` of `request`, in order.
fn steps(request: &str, kinds: &[&str]) -> Vec<JournalEntry> {
    kinds.iter().map(|kind| entry(request_event(kind, request))).collect()
}

fn auto_approve(request: &str, rule: &str) -> JournalEntry {
    entry(Event::AutoApprove { request: request.into(), rule: rule.into() })
}

/// A running Domain with `sessions` registered.
fn domain_with(sessions: &[&str]) -> Vec<JournalEntry> {
    let mut journal = startup(sessions[0]);
    for s in sessions {
        journal.extend(join(s));
    }
    journal
}

/// The journal replayed: the default (retiring) machine must accept it;
/// returned is a history-keeping machine, whose ended sessions and
/// requests can still be looked at.
fn replayed(journal: &[JournalEntry]) -> Machine {
    if let Err(e) = replay(journal) {
        panic!("journal does not conform: {e}");
    }
    match replay_into(Machine::keeping_history(), journal) {
        Ok(machine) => machine,
        Err(e) => panic!("journal does not conform when keeping history: {e}"),
    }
}

fn phase(machine: &Machine, request: &str) -> RequestPhase {
    machine.request_state(request).expect("known request").phase
}

fn session_of(machine: &Machine, id: &str) -> lazaret_protocol::model::SessionState {
    machine.session_state(id).expect("known session").clone()
}

#[test]
fn rule_approved_request_completes_and_the_session_can_ask_again() {
    let mut journal = domain_with(&["sess-a"]);
    journal.push(entry(verify("sess-a", "req-1", &["git", "fetch"], true)));
    journal.push(auto_approve("req-1", "git-fetch"));
    journal.extend(steps("req-1", &["start", "complete", "deliver"]));
    let machine = replayed(&journal);
    assert_eq!(phase(&machine, "req-1"), RequestPhase::Completed);
    let request = machine.request_state("req-1").expect("known");
    assert_eq!(request.approval_source, Some(ApprovalSource::AutoRule));
    assert!(!request.host_running);
    let s = session_of(&machine, "sess-a");
    assert_eq!((s.phase, s.route, s.active_request), (SessionPhase::Attached, TerminalRoute::Sandbox, None));
    // The next request of the same session is accepted.
    journal.push(entry(verify("sess-a", "req-2", &["git", "fetch"], true)));
    replayed(&journal);
    // A prompted command cannot be auto-approved.
    let mut bad = domain_with(&["sess-a"]);
    bad.push(entry(verify("sess-a", "req-1", &["git", "push"], false)));
    bad.push(auto_approve("req-1", "git-fetch"));
    expect_refusal(&bad, bad.len(), "AutoApprove", "RequestCommand[r] \\in AutoApprovedCommands");
    // And an auto-approved one is never prompted.
    let mut bad = domain_with(&["sess-a"]);
    bad.push(entry(verify("sess-a", "req-1", &["git", "fetch"], true)));
    bad.extend(steps("req-1", &["prompt"]));
    expect_refusal(&bad, bad.len(), "PromptDeveloper", "RequestCommand[r] \\notin AutoApprovedCommands");
}

#[test]
fn prompt_routes_the_terminal_and_approval_runs_the_command() {
    let mut journal = domain_with(&["sess-a"]);
    journal.push(entry(verify("sess-a", "req-1", &["git", "push", "origin", "fix-123"], false)));
    journal.extend(steps("req-1", &["prompt"]));
    let machine = replayed(&journal);
    let s = session_of(&machine, "sess-a");
    assert_eq!((s.phase, s.route), (SessionPhase::Prompting, TerminalRoute::Prompt));
    // Nothing runs while the prompt is up.
    let mut early = journal.clone();
    early.extend(steps("req-1", &["start"]));
    expect_refusal(&early, early.len(), "StartHostExecution", "requestPhase[r] = \"Approved\"");

    journal.extend(steps("req-1", &["approve", "start"]));
    let machine = replayed(&journal);
    let s = session_of(&machine, "sess-a");
    assert_eq!((s.phase, s.route), (SessionPhase::Executing, TerminalRoute::HostProcess));
    // No result while the command runs.
    let mut early = journal.clone();
    early.extend(steps("req-1", &["deliver"]));
    expect_refusal(&early, early.len(), "DeliverResult", "requestPhase[r] \\in PendingResultPhases");

    journal.extend(steps("req-1", &["complete", "deliver"]));
    let machine = replayed(&journal);
    assert_eq!(phase(&machine, "req-1"), RequestPhase::Completed);
    let request = machine.request_state("req-1").expect("known");
    assert_eq!(request.approval_source, Some(ApprovalSource::Developer));
    assert!(!machine.is_domain_approved(DOMAIN, &argv(&["git", "push", "origin", "fix-123"]), "/work"));
}

#[test]
fn prompt_edit_approve_runs_the_edited_argv() {
    let edited = argv(&["git", "push", "--dry-run", "origin", "fix 123"]);
    let mut journal = domain_with(&["sess-a"]);
    journal.push(entry(verify("sess-a", "req-1", &["git", "push", "origin", "fix 123"], false)));
    journal.extend(steps("req-1", &["prompt"]));
    journal.push(entry(Event::developer_edit_approve("req-1", &edited)));
    journal.extend(steps("req-1", &["start", "complete", "deliver"]));
    let machine = replayed(&journal);
    assert_eq!(phase(&machine, "req-1"), RequestPhase::Completed);
    let approved = machine.request_state("req-1").and_then(|r| r.approved_command).expect("approved");
    let command = &machine.config().commands[approved.0];
    assert_eq!(command.name, "git push --dry-run origin 'fix 123'");
    assert!(!command.auto_approved, "an edited command is never auto-approved");

    // An "edit" that changes nothing is not an edit.
    let mut same = domain_with(&["sess-a"]);
    same.push(entry(verify("sess-a", "req-1", &["git", "push"], false)));
    same.extend(steps("req-1", &["prompt"]));
    same.push(entry(Event::developer_edit_approve("req-1", &argv(&["git", "push"]))));
    expect_refusal(&same, same.len(), "DeveloperEditApprove", "c # RequestCommand[r]");

    // The command string must be the argv, quoted.
    let mut forged = domain_with(&["sess-a"]);
    forged.push(entry(verify("sess-a", "req-1", &["git", "push"], false)));
    forged.extend(steps("req-1", &["prompt"]));
    forged.push(entry(Event::DeveloperEditApprove {
        request: "req-1".into(),
        command: "git status".into(),
        argv: argv(&["rm", "-rf", "/"]),
    }));
    assert!(matches!(replay(&forged), Err(ConformanceError::Transition { source: TransitionError::Inconsistent { .. }, .. })));
}

#[test]
fn denied_requests_get_a_result_and_never_run() {
    for reason in ["", "the session has no terminal"] {
        let mut journal = domain_with(&["sess-a"]);
        journal.push(entry(verify("sess-a", "req-1", &["curl", "evil.example"], false)));
        journal.extend(steps("req-1", &["prompt"]));
        journal.push(entry(Event::DeveloperDeny { request: "req-1".into(), reason: reason.into() }));
        let mut run_anyway = journal.clone();
        run_anyway.extend(steps("req-1", &["start"]));
        expect_refusal(&run_anyway, run_anyway.len(), "StartHostExecution", "requestPhase[r] = \"Approved\"");
        journal.extend(steps("req-1", &["deliver"]));
        let machine = replayed(&journal);
        assert_eq!(phase(&machine, "req-1"), RequestPhase::Denied);
        assert_eq!(machine.request_state("req-1").and_then(|r| r.approval_source), None);
    }
}

#[test]
fn unanswered_prompt_and_overlong_command_time_out() {
    let mut journal = domain_with(&["sess-a"]);
    journal.push(entry(verify("sess-a", "req-1", &["make", "deploy"], false)));
    journal.extend(steps("req-1", &["prompt", "timeout"]));
    let machine = replayed(&journal);
    let s = session_of(&machine, "sess-a");
    assert_eq!((s.phase, s.route), (SessionPhase::Attached, TerminalRoute::Sandbox));
    // The developer's late answer is refused.
    let mut late = journal.clone();
    late.extend(steps("req-1", &["approve"]));
    expect_refusal(&late, late.len(), "DeveloperApprove", "requestPhase[r] = \"AwaitingApproval\"");
    journal.extend(steps("req-1", &["deliver"]));
    assert_eq!(phase(&replayed(&journal), "req-1"), RequestPhase::TimedOut);

    // A running command that times out is killed: a late exit is refused.
    journal.push(entry(verify("sess-a", "req-2", &["sleep", "999"], true)));
    journal.push(auto_approve("req-2", "sleep"));
    journal.extend(steps("req-2", &["start", "timeout"]));
    assert!(!replayed(&journal).request_state("req-2").expect("known").host_running);
    let mut late = journal.clone();
    late.extend(steps("req-2", &["complete"]));
    expect_refusal(&late, late.len(), "CompleteHostExecution", "requestPhase[r] = \"Executing\"");
    journal.extend(steps("req-2", &["deliver"]));
    assert_eq!(phase(&replayed(&journal), "req-2"), RequestPhase::TimedOut);
}

#[test]
fn cancel_while_executing_kills_and_reports_cancelled() {
    let mut journal = domain_with(&["sess-a"]);
    journal.push(entry(verify("sess-a", "req-1", &["cargo", "publish"], false)));
    journal.extend(steps("req-1", &["prompt", "approve", "start", "cancel"]));
    let machine = replayed(&journal);
    assert!(!machine.request_state("req-1").expect("known").host_running);
    let s = session_of(&machine, "sess-a");
    assert_eq!(s.route, TerminalRoute::Sandbox);
    let mut late = journal.clone();
    late.extend(steps("req-1", &["complete"]));
    expect_refusal(&late, late.len(), "CompleteHostExecution", "requestPhase[r] = \"Executing\"");
    journal.extend(steps("req-1", &["deliver"]));
    assert_eq!(phase(&replayed(&journal), "req-1"), RequestPhase::Cancelled);

    // Cancelling a pending prompt withdraws it.
    let mut journal = domain_with(&["sess-a"]);
    journal.push(entry(verify("sess-a", "req-1", &["cargo", "publish"], false)));
    journal.extend(steps("req-1", &["prompt", "cancel", "deliver"]));
    assert_eq!(phase(&replayed(&journal), "req-1"), RequestPhase::Cancelled);

    // After the command completed, a cancel comes too late.
    let mut journal = domain_with(&["sess-a"]);
    journal.push(entry(verify("sess-a", "req-1", &["true"], true)));
    journal.push(auto_approve("req-1", "true"));
    journal.extend(steps("req-1", &["start", "complete", "cancel"]));
    expect_refusal(
        &journal,
        journal.len(),
        "CancelRequest",
        "requestPhase[r] \\in {\"Verified\", \"AwaitingApproval\", \"Approved\", \"Executing\"}",
    );
}

#[test]
fn a_command_that_cannot_start_fails_after_start() {
    let mut journal = domain_with(&["sess-a"]);
    journal.push(entry(verify("sess-a", "req-1", &["no-such-tool"], true)));
    journal.push(auto_approve("req-1", "tool"));
    let mut bare = journal.clone();
    bare.extend(steps("req-1", &["fail"]));
    expect_refusal(&bare, bare.len(), "FailHostExecution", "requestPhase[r] = \"Executing\"");
    journal.extend(steps("req-1", &["start", "fail", "deliver"]));
    assert_eq!(phase(&replayed(&journal), "req-1"), RequestPhase::Failed);
}

#[test]
fn a_session_disconnecting_mid_execution_ends_its_request_without_a_result() {
    let mut journal = domain_with(&["sess-a", "sess-b"]);
    journal.push(entry(verify("sess-a", "req-1", &["sleep", "999"], true)));
    journal.push(auto_approve("req-1", "sleep"));
    journal.extend(steps("req-1", &["start"]));
    journal.push(entry(Event::DisconnectSession { session: session("sess-a") }));
    let machine = replayed(&journal);
    let request = machine.request_state("req-1").expect("known");
    // CloseSession: the request is cancelled, its host process gone.
    assert_eq!(request.phase, RequestPhase::Cancelled);
    assert!(!request.host_running);
    let s = session_of(&machine, "sess-a");
    assert_eq!((s.phase, s.route, s.active_request), (SessionPhase::Closed, TerminalRoute::Detached, None));
    for late in ["complete", "deliver", "cancel", "timeout"] {
        let mut after = journal.clone();
        after.extend(steps("req-1", &[late]));
        assert!(
            matches!(
                replay(&after),
                Err(ConformanceError::Transition { source: TransitionError::Refused { .. } | TransitionError::Retired { .. }, .. })
            ),
            "{late} after the disconnect must be refused"
        );
    }
    // The other session carries on.
    journal.push(entry(verify("sess-b", "req-2", &["true"], true)));
    journal.push(auto_approve("req-2", "true"));
    journal.extend(steps("req-2", &["start", "complete", "deliver"]));
    assert_eq!(phase(&replayed(&journal), "req-2"), RequestPhase::Completed);
    // A closed session's certificate is worthless.
    journal.push(entry(verify("sess-a", "req-3", &["true"], true)));
    expect_refusal(&journal, journal.len(), "VerifyRequest", "s \\in registered[d]");
}

#[test]
fn approve_for_domain_makes_the_same_request_auto_approved() {
    let words = ["git", "push", "origin", "fix-123"];
    let mut journal = domain_with(&["sess-a", "sess-b"]);
    journal.push(entry(verify("sess-a", "req-1", &words, false)));
    journal.extend(steps("req-1", &["prompt", "approve-for-domain", "start", "complete", "deliver"]));
    let machine = replayed(&journal);
    assert!(machine.is_domain_approved(DOMAIN, &argv(&words), "/work"));
    assert!(!machine.is_domain_approved(DOMAIN, &argv(&words), "/work/sub"));
    assert!(!machine.is_domain_approved(DOMAIN, &argv(&["git", "push"]), "/work"));

    // The same command, now auto-approved (it was not, before): another
    // model command constant, so not a contradiction. From either session.
    let mut later = journal.clone();
    for (s, r) in [("sess-b", "req-2"), ("sess-a", "req-3")] {
        later.push(entry(verify(s, r, &words, true)));
        later.push(auto_approve(r, DOMAIN_APPROVAL_RULE));
        later.extend(steps(r, &["start", "complete", "deliver"]));
    }
    let machine = replayed(&later);
    assert_eq!(phase(&machine, "req-3"), RequestPhase::Completed);
    assert_eq!(machine.request_state("req-2").and_then(|r| r.approval_source), Some(ApprovalSource::AutoRule));
    // And back: a later prompted request of it is fine too (a rule set may say so).
    later.push(entry(verify("sess-a", "req-4", &words, false)));
    later.extend(steps("req-4", &["prompt", "deny", "deliver"]));
    replayed(&later);

    // "domain-approval" is checked: another working directory was not approved...
    let mut other_cwd = journal.clone();
    other_cwd.push(entry(Event::verify_request("sess-b", "req-2", &argv(&words), "/work/sub", "", true)));
    other_cwd.push(auto_approve("req-2", DOMAIN_APPROVAL_RULE));
    assert_inconsistent(&other_cwd, other_cwd.len());
    // ...nor anything by a once-only approval...
    let mut once = domain_with(&["sess-a"]);
    once.push(entry(verify("sess-a", "req-1", &words, false)));
    once.extend(steps("req-1", &["prompt", "approve", "start", "complete", "deliver"]));
    once.push(entry(verify("sess-a", "req-2", &words, true)));
    once.push(auto_approve("req-2", DOMAIN_APPROVAL_RULE));
    assert_inconsistent(&once, once.len());
    // ...and approvals end with the Domain's life.
    let mut next_life = journal.clone();
    for s in ["sess-a", "sess-b"] {
        next_life.push(entry(Event::DisconnectSession { session: session(s) }));
    }
    next_life.extend(teardown());
    next_life.extend(domain_with(&["sess-c"]));
    assert!(!replayed(&next_life).is_domain_approved(DOMAIN, &argv(&words), "/work"));
    next_life.push(entry(verify("sess-c", "req-9", &words, true)));
    next_life.push(auto_approve("req-9", DOMAIN_APPROVAL_RULE));
    assert_inconsistent(&next_life, next_life.len());
}

/// The default (retiring) machine refuses `line` as the model would, or
/// because it names a retired ID.
fn expect_refused_or_retired(journal: &[JournalEntry], line: usize) {
    match replay(journal) {
        Err(ConformanceError::Transition { line: got, source: TransitionError::Refused { .. } | TransitionError::Retired { .. } })
            if got == line => {}
        other => panic!("expected line {line} to be refused (or retired), got {other:?}"),
    }
}

fn assert_inconsistent(journal: &[JournalEntry], line: usize) {
    match replay(journal) {
        Err(ConformanceError::Transition { line: got, source: TransitionError::Inconsistent { .. } | TransitionError::Retired { .. } })
            if got == line => {}
        other => panic!("expected line {line} to be inconsistent or retired, got {other:?}"),
    }
    match replay_into(Machine::keeping_history(), journal) {
        Err(ConformanceError::Transition { line: got, source: TransitionError::Inconsistent { .. } }) if got == line => {}
        other => panic!("expected line {line} to be inconsistent, got {other:?}"),
    }
}

#[test]
fn two_sessions_interleave_and_neither_blocks_the_other() {
    let mut journal = domain_with(&["sess-a", "sess-b"]);
    journal.push(entry(verify("sess-a", "req-a1", &["git", "push"], false)));
    journal.extend(steps("req-a1", &["prompt"]));
    // While A's prompt is up, B runs two rule-approved commands.
    for r in ["req-b1", "req-b2"] {
        journal.push(entry(verify("sess-b", r, &["git", "fetch"], true)));
        journal.push(auto_approve(r, "git-fetch"));
        journal.extend(steps(r, &["start"]));
        if r == "req-b1" {
            journal.extend(steps("req-a1", &["approve", "start"]));
        }
        journal.extend(steps(r, &["complete", "deliver"]));
    }
    let machine = replayed(&journal);
    assert_eq!(session_of(&machine, "sess-a").route, TerminalRoute::HostProcess);
    assert_eq!(session_of(&machine, "sess-b").route, TerminalRoute::Sandbox);
    // One request at a time per session: A cannot ask again yet.
    let mut second = journal.clone();
    second.push(entry(verify("sess-a", "req-a2", &["ls"], true)));
    expect_refusal(&second, second.len(), "VerifyRequest", "sessionPhase[s] = \"Attached\"");
    journal.extend(steps("req-a1", &["complete"]));
    let mut second = journal.clone();
    second.push(entry(verify("sess-a", "req-a2", &["ls"], true)));
    expect_refusal(&second, second.len(), "VerifyRequest", "activeRequest[s] = NoRequest");
    journal.extend(steps("req-a1", &["deliver"]));
    journal.push(entry(verify("sess-a", "req-a2", &["ls"], true)));
    let machine = replayed(&journal);
    for r in ["req-a1", "req-b1", "req-b2"] {
        assert_eq!(phase(&machine, r), RequestPhase::Completed, "{r}");
    }
    assert_eq!(phase(&machine, "req-a2"), RequestPhase::Verified);
}

#[test]
fn a_replayed_request_id_is_refused() {
    let mut journal = domain_with(&["sess-a", "sess-b"]);
    journal.push(entry(verify("sess-a", "req-1", &["true"], true)));
    // While the first is open...
    let mut open = journal.clone();
    open.push(entry(verify("sess-a", "req-1", &["true"], true)));
    expect_refusal(&open, open.len(), "VerifyRequest", "requestPhase[r] = \"Unused\"");
    journal.push(auto_approve("req-1", "true"));
    journal.extend(steps("req-1", &["start", "complete", "deliver"]));
    // ...after it is finished, with another command...
    let mut again = journal.clone();
    again.push(entry(verify("sess-a", "req-1", &["rm", "-rf", "/"], false)));
    expect_refusal(&again, again.len(), "VerifyRequest", "requestPhase[r] = \"Unused\"");
    // ...and from another session.
    let mut stolen = journal.clone();
    stolen.push(entry(verify("sess-b", "req-1", &["true"], true)));
    assert_inconsistent(&stolen, stolen.len());
    // Machine::check lets a coordinator ask before acting, changing nothing.
    let machine = replayed(&journal);
    assert!(machine.check(&entry(verify("sess-a", "req-1", &["true"], true))).is_err());
    assert!(machine.check(&entry(verify("sess-a", "req-2", &["true"], true))).is_ok());
    assert!(machine.request_index("req-2").is_none());
}

#[test]
fn the_command_must_be_the_quoted_argv() {
    let mut journal = domain_with(&["sess-a"]);
    journal.push(entry(Event::VerifyRequest {
        session: session("sess-a"),
        request: "req-1".into(),
        // Two arguments would otherwise be the same command as one with a space.
        command: "git fetch".into(),
        auto_approved: true,
        argv: argv(&["git fetch"]),
        cwd: "/work".into(),
        justification: String::new(),
    }));
    assert_inconsistent(&journal, journal.len());
}

#[test]
fn journals_written_before_decision_details_still_replay() {
    let mut text = to_lines(&domain_with(&["sess-a"]));
    for line in [
        r#"{"timestamp_ms":1,"domain":"dom-7f3a","action":"VerifyRequest","session":"sess-a","request":"r1","command":"make","auto_approved":false}"#,
        r#"{"timestamp_ms":2,"domain":"dom-7f3a","action":"PromptDeveloper","request":"r1"}"#,
        r#"{"timestamp_ms":3,"domain":"dom-7f3a","action":"DeveloperEditApprove","request":"r1","command":"make -n"}"#,
        r#"{"timestamp_ms":4,"domain":"dom-7f3a","action":"StartHostExecution","request":"r1"}"#,
        r#"{"timestamp_ms":5,"domain":"dom-7f3a","action":"CompleteHostExecution","request":"r1","exit_status":0}"#,
        r#"{"timestamp_ms":6,"domain":"dom-7f3a","action":"DeliverResult","request":"r1"}"#,
        r#"{"timestamp_ms":7,"domain":"dom-7f3a","action":"VerifyRequest","session":"sess-a","request":"r2","command":"make","auto_approved":true}"#,
        r#"{"timestamp_ms":8,"domain":"dom-7f3a","action":"AutoApprove","request":"r2"}"#,
        r#"{"timestamp_ms":9,"domain":"dom-7f3a","action":"StartHostExecution","request":"r2"}"#,
        r#"{"timestamp_ms":10,"domain":"dom-7f3a","action":"CancelRequest","request":"r2"}"#,
        r#"{"timestamp_ms":11,"domain":"dom-7f3a","action":"DeliverResult","request":"r2"}"#,
        r#"{"timestamp_ms":12,"domain":"dom-7f3a","action":"VerifyRequest","session":"sess-a","request":"r3","command":"x","auto_approved":false}"#,
        r#"{"timestamp_ms":13,"domain":"dom-7f3a","action":"PromptDeveloper","request":"r3"}"#,
        r#"{"timestamp_ms":14,"domain":"dom-7f3a","action":"DeveloperApprove","request":"r3"}"#,
    ] {
        text.push('\n');
        text.push_str(line);
    }
    replay_reader(text.as_bytes()).expect("an old journal conforms");
    let machine = replay_reader_into(Machine::keeping_history(), text.as_bytes()).expect("an old journal conforms");
    assert_eq!(phase(&machine, "r1"), RequestPhase::Completed);
    assert_eq!(phase(&machine, "r2"), RequestPhase::Cancelled);
    assert_eq!(phase(&machine, "r3"), RequestPhase::Approved);
}

#[test]
fn decision_details_survive_the_json_line() {
    let events = [
        verify("sess-a", "req-1", &["printf", "%s\n", "\u{1b}[2J\u{202e}"], false),
        Event::AutoApprove { request: "req-1".into(), rule: "printf".into() },
        Event::DeveloperApprove { request: "req-1".into(), for_domain: true },
        Event::developer_edit_approve("req-1", &argv(&["printf", "ok"])),
        Event::DeveloperDeny { request: "req-1".into(), reason: "the session has no terminal".into() },
    ];
    for event in events {
        let line = entry(event.clone()).to_json_line().expect("serializes");
        assert!(!line.contains('\n') && !line.contains('\u{1b}'), "{line}");
        let parsed: JournalEntry = serde_json::from_str(&line).expect("parses");
        assert_eq!(parsed.event, event);
    }
    let Event::VerifyRequest { command, .. } = verify("s", "r", &["printf", "%s\n"], false) else {
        panic!("not a VerifyRequest");
    };
    assert_eq!(command, "printf $'%s\\n'");
}
