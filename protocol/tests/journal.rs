//! Journal conformance: good journals replay, bad ones fail at the right line.

use lazaret_protocol::journal::{ConformanceError, Event, JournalEntry, Machine, TransitionError};
use lazaret_protocol::model::{Action, Config, RequestPhase, SessionPhase, State, enabled, step};
use lazaret_protocol::{replay, replay_reader};

const DOMAIN: &str = "dom-7f3a";

fn entry(event: Event) -> JournalEntry {
    JournalEntry {
        timestamp_ms: 1_700_000_000_000,
        domain: DOMAIN.to_owned(),
        event,
    }
}

fn session(id: &str) -> String {
    id.to_owned()
}

/// Domain start-up as a coordinator journals it.
fn startup(launcher: &str) -> Vec<JournalEntry> {
    vec![
        entry(Event::AcquireDomainLock {
            session: session(launcher),
            fingerprint: "sha256:aa".into(),
        }),
        entry(Event::MountStateAnchor),
        entry(Event::CreateTrustAnchor),
        entry(Event::StartSidecar),
        entry(Event::StartSandbox),
        entry(Event::PublishDomain),
    ]
}

fn join(id: &str) -> Vec<JournalEntry> {
    vec![
        entry(Event::ConnectSession {
            session: session(id),
        }),
        entry(Event::RegisterSession {
            session: session(id),
            fingerprint: "sha256:aa".into(),
        }),
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
        entry(Event::VerifyRequest {
            session: session("sess-a"),
            request: "req-1".into(),
            command: "git fetch".into(),
            auto_approved: true,
        }),
        entry(Event::AutoApprove {
            request: "req-1".into(),
        }),
        entry(Event::StartHostExecution {
            request: "req-1".into(),
        }),
        entry(Event::VerifyRequest {
            session: session("sess-b"),
            request: "req-2".into(),
            command: "make install".into(),
            auto_approved: false,
        }),
        entry(Event::PromptDeveloper {
            request: "req-2".into(),
        }),
        entry(Event::DeveloperEditApprove {
            request: "req-2".into(),
            command: "make install PREFIX=/tmp/x".into(),
        }),
        entry(Event::CompleteHostExecution {
            request: "req-1".into(),
            exit_status: Some(0),
        }),
        entry(Event::DeliverResult {
            request: "req-1".into(),
        }),
        entry(Event::StartHostExecution {
            request: "req-2".into(),
        }),
        entry(Event::CancelRequest {
            request: "req-2".into(),
        }),
        entry(Event::DeliverResult {
            request: "req-2".into(),
        }),
        entry(Event::VerifyRequest {
            session: session("sess-a"),
            request: "req-3".into(),
            command: "make install".into(),
            auto_approved: false,
        }),
        entry(Event::PromptDeveloper {
            request: "req-3".into(),
        }),
        // The session goes away while the developer looks at the prompt.
        entry(Event::DisconnectSession {
            session: session("sess-a"),
        }),
        entry(Event::DisconnectSession {
            session: session("sess-b"),
        }),
    ]);
    journal.extend(teardown());
    journal
}

fn to_lines(journal: &[JournalEntry]) -> String {
    journal
        .iter()
        .map(|e| e.to_json_line().expect("journal entries serialize"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_full_domain_lifetime_replays() {
    let journal = good_journal();
    let machine = replay(&journal).expect("the journal conforms");
    let state = machine.state();
    assert_eq!(state.domains.len(), 1);
    assert_eq!(state.sessions.len(), 2);
    assert!(
        state
            .sessions
            .iter()
            .all(|s| s.phase == SessionPhase::Closed)
    );
    let phase = |id: &str| state.requests[machine.request_index(id).expect("known").0].phase;
    assert_eq!(phase("req-1"), RequestPhase::Completed);
    assert_eq!(phase("req-2"), RequestPhase::Cancelled);
    // Abandoned by the disconnect: terminal without a delivered result.
    assert_eq!(phase("req-3"), RequestPhase::Cancelled);
}

#[test]
fn json_lines_round_trip_and_replay() {
    let text = to_lines(&good_journal());
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.contains("\"action\":\"AcquireDomainLock\""))
    );
    let parsed: Vec<JournalEntry> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("parses"))
        .collect();
    assert_eq!(parsed, good_journal());
    replay_reader(text.as_bytes()).expect("conforms");
}

fn expect_refusal(journal: &[JournalEntry], line: usize, event: &str, guard: &str) {
    match replay(journal) {
        Err(ConformanceError::Transition {
            line: got_line,
            source:
                TransitionError::Refused {
                    event: got_event,
                    refused,
                },
        }) => {
            assert_eq!(
                (got_line, got_event),
                (line, event),
                "wrong line or action: {refused}"
            );
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
        entry(Event::VerifyRequest {
            session: session("sess-a"),
            request: "req-1".into(),
            command: "ls".into(),
            auto_approved: true,
        }),
        entry(Event::TimeoutRequest {
            request: "req-1".into(),
        }),
        entry(Event::DisconnectSession {
            session: session("sess-a"),
        }),
        entry(Event::DeliverResult {
            request: "req-1".into(),
        }),
    ]);
    let line = journal.len();
    expect_refusal(
        &journal,
        line,
        "DeliverResult",
        "requestPhase[r] \\in PendingResultPhases",
    );
}

#[test]
fn execution_without_approval_is_refused() {
    let mut journal = startup("sess-a");
    journal.extend(join("sess-a"));
    journal.extend([
        entry(Event::VerifyRequest {
            session: session("sess-a"),
            request: "req-1".into(),
            command: "rm -rf /".into(),
            auto_approved: false,
        }),
        entry(Event::StartHostExecution {
            request: "req-1".into(),
        }),
    ]);
    let line = journal.len();
    expect_refusal(
        &journal,
        line,
        "StartHostExecution",
        "requestPhase[r] = \"Approved\"",
    );
}

#[test]
fn foreign_fingerprint_cannot_register_but_can_be_rejected() {
    let mut journal = startup("sess-a");
    journal.push(entry(Event::ConnectSession {
        session: session("sess-x"),
    }));
    let mut bad = journal.clone();
    bad.push(entry(Event::RegisterSession {
        session: session("sess-x"),
        fingerprint: "sha256:bb".into(),
    }));
    expect_refusal(
        &bad,
        bad.len(),
        "RegisterSession",
        "SessionFingerprint[s] = DomainFingerprint[d]",
    );
    journal.push(entry(Event::RejectSession {
        session: session("sess-x"),
        fingerprint: "sha256:bb".into(),
    }));
    replay(&journal).expect("rejection conforms");
}

#[test]
fn teardown_with_a_connected_session_is_refused() {
    let mut journal = startup("sess-a");
    journal.extend(join("sess-a"));
    journal.push(entry(Event::BeginTeardown));
    expect_refusal(
        &journal,
        journal.len(),
        "BeginTeardown",
        "connected[d] = {}",
    );
}

#[test]
fn unknown_request_and_garbage_lines_are_reported_with_their_line() {
    let mut journal = startup("sess-a");
    journal.push(entry(Event::DeliverResult {
        request: "nope".into(),
    }));
    match replay(&journal) {
        Err(ConformanceError::Transition {
            line: 7,
            source: TransitionError::Unknown {
                kind: "request", ..
            },
        }) => {}
        other => panic!("unexpected {other:?}"),
    }
    let text = format!(
        "{}\n\n{{\"timestamp_ms\": 1}}\n",
        to_lines(&startup("sess-a"))
    );
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
    let bad = entry(Event::RegisterSession {
        session: session("sess-new"),
        fingerprint: "sha256:aa".into(),
    });
    assert!(machine.apply(&bad).is_err());
    assert_eq!(machine.state(), &before);
    assert!(machine.session_index("sess-new").is_none());
}

/// The journal entry a coordinator of the user's fixture writes for `action`.
fn fixture_entry(config: &Config, action: &Action) -> JournalEntry {
    let s = |id: lazaret_protocol::model::SessionId| config.sessions[id.0].name.clone();
    let r = |id: lazaret_protocol::model::RequestId| config.requests[id.0].name.clone();
    let event = match *action {
        Action::AcquireDomainLock(id) => Event::AcquireDomainLock {
            session: s(id),
            fingerprint: config.domains[0].fingerprint.clone(),
        },
        Action::MountStateAnchor(_) => Event::MountStateAnchor,
        Action::CreateTrustAnchor(_) => Event::CreateTrustAnchor,
        Action::StartSidecar(_) => Event::StartSidecar,
        Action::StartSandbox(_) => Event::StartSandbox,
        Action::AbortUnsafeStart(_) => Event::AbortUnsafeStart,
        Action::PublishDomain(_) => Event::PublishDomain,
        Action::FailDomain(_) => Event::FailDomain {
            reason: "test".into(),
        },
        Action::BeginTeardown(_) => Event::BeginTeardown,
        Action::StopSandbox(_) => Event::StopSandbox,
        Action::StopSidecar(_) => Event::StopSidecar,
        Action::DestroyTrustAnchor(_) => Event::DestroyTrustAnchor,
        Action::UnmountStateAnchor(_) => Event::UnmountStateAnchor,
        Action::ReleaseDomainLock(_) => Event::ReleaseDomainLock,
        Action::ConnectSession(id) => Event::ConnectSession { session: s(id) },
        Action::RegisterSession(id) => Event::RegisterSession {
            session: s(id),
            fingerprint: config.sessions[id.0].fingerprint.clone(),
        },
        Action::RejectSession(id) => Event::RejectSession {
            session: s(id),
            fingerprint: config.sessions[id.0].fingerprint.clone(),
        },
        Action::DisconnectSession(id) => Event::DisconnectSession { session: s(id) },
        Action::EvictSession(id) => Event::EvictSession { session: s(id) },
        Action::AbandonLaunch(id) => Event::AbandonLaunch { session: s(id) },
        Action::VerifyRequest(id) => {
            let spec = &config.requests[id.0];
            let command = &config.commands[spec.command.0];
            Event::VerifyRequest {
                session: s(spec.session),
                request: r(id),
                command: command.name.clone(),
                auto_approved: command.auto_approved,
            }
        }
        Action::AutoApprove(id) => Event::AutoApprove { request: r(id) },
        Action::PromptDeveloper(id) => Event::PromptDeveloper { request: r(id) },
        Action::DeveloperApprove(id) => Event::DeveloperApprove { request: r(id) },
        Action::DeveloperEditApprove(id, c) => Event::DeveloperEditApprove {
            request: r(id),
            command: config.commands[c.0].name.clone(),
        },
        Action::DeveloperDeny(id) => Event::DeveloperDeny { request: r(id) },
        Action::StartHostExecution(id) => Event::StartHostExecution { request: r(id) },
        Action::CompleteHostExecution(id) => Event::CompleteHostExecution {
            request: r(id),
            exit_status: Some(0),
        },
        Action::TimeoutRequest(id) => Event::TimeoutRequest { request: r(id) },
        Action::CancelRequest(id) => Event::CancelRequest { request: r(id) },
        Action::FailHostExecution(id) => Event::FailHostExecution {
            request: r(id),
            reason: "test".into(),
        },
        Action::DeliverResult(id) => Event::DeliverResult { request: r(id) },
    };
    JournalEntry {
        timestamp_ms: 0,
        domain: config.domains[0].name.clone(),
        event,
    }
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
/// entity by entity through the real names.
fn assert_same(config: &Config, model: &State, machine: &Machine) {
    let replayed = machine.state();
    if let Some(d) = machine.domain_index(&config.domains[0].name) {
        assert_eq!(model.domains[0], replayed.domains[d.0]);
    }
    for (i, spec) in config.sessions.iter().enumerate() {
        let expected = &model.sessions[i];
        let Some(s) = machine.session_index(&spec.name) else {
            assert_eq!(expected, &lazaret_protocol::model::SessionState::initial());
            continue;
        };
        let got = &replayed.sessions[s.0];
        assert_eq!(
            (
                expected.phase,
                expected.connection,
                expected.route,
                expected.registered,
                expected.connected
            ),
            (
                got.phase,
                got.connection,
                got.route,
                got.registered,
                got.connected
            )
        );
        let name_in_model = expected
            .active_request
            .map(|r| config.requests[r.0].name.clone());
        let name_replayed = got
            .active_request
            .map(|r| machine.config().requests[r.0].name.clone());
        assert_eq!(name_in_model, name_replayed);
    }
    for (i, spec) in config.requests.iter().enumerate() {
        let expected = &model.requests[i];
        let Some(r) = machine.request_index(&spec.name) else {
            assert_eq!(expected.phase, RequestPhase::Unused);
            continue;
        };
        let got = &replayed.requests[r.0];
        assert_eq!(
            (
                expected.phase,
                expected.approval_source,
                expected.host_running
            ),
            (got.phase, got.approval_source, got.host_running)
        );
        let cmd_model = expected
            .approved_command
            .map(|c| config.commands[c.0].name.clone());
        let cmd_replayed = got
            .approved_command
            .map(|c| machine.config().commands[c.0].name.clone());
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
    for _walk in 0..200 {
        let mut state = State::initial(&config);
        let mut machine = Machine::new();
        for _ in 0..60 {
            let enabled_now: Vec<&Action> = actions
                .iter()
                .filter(|a| enabled(&config, &state, a))
                .collect();
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
            let line = fixture_entry(&config, action)
                .to_json_line()
                .expect("serializes");
            let parsed: JournalEntry = serde_json::from_str(&line).expect("parses");
            machine.apply(&parsed).expect("a model behaviour conforms");
            replayed_steps += 1;
            assert_same(&config, &state, &machine);
        }
    }
    println!("replayed {replayed_steps} steps, {refused_checks} disabled steps refused");
    assert!(replayed_steps > 1000);
}
