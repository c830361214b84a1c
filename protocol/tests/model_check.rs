//! Exhaustive checks of the protocol model and proof that the checker fails
//! on broken models.

use lazaret_protocol::checker::{CheckOptions, CheckReport, Violation, check};
use lazaret_protocol::model::{
    Action, Config, ConnectionState, Invariant, Mutation, RequestId, RequestPhase, State, check_invariants, step, step_mutated,
};

fn report(label: &str, config: &Config, report: &CheckReport) {
    println!(
        "{label}: {} states, {} transitions, depth {}, {} liveness instances, {:.3} s",
        report.states,
        report.transitions,
        report.depth,
        report.liveness_checked,
        report.elapsed.as_secs_f64()
    );
    if let Some(violation) = &report.violation {
        match violation {
            Violation::Invariant { invariant, trace } => {
                println!("{invariant:?} violated after:\n{}", trace.describe(config));
            }
            Violation::Liveness { property, prefix, cycle } => {
                println!(
                    "{} violated after:\n{}\nthen forever: {:?}",
                    property.describe(config),
                    prefix.describe(config),
                    cycle.iter().map(|a| a.display(config).to_string()).collect::<Vec<_>>()
                );
            }
        }
    }
}

/// How often the checker took the action called `name`.
fn taken(report: &CheckReport, name: &str) -> usize {
    report.action_counts.get(name).copied().unwrap_or(0)
}

/// Whether the correct model rejects the behaviour `actions`: it refuses one
/// of the steps, or the same steps end in a state meeting every invariant.
fn correct_model_avoids(config: &Config, actions: &[Action]) -> bool {
    let mut state = State::initial(config);
    for action in actions {
        match step(config, &state, action) {
            Ok(next) => state = next,
            Err(_) => return true,
        }
    }
    check_invariants(config, &state).is_ok()
}

#[test]
fn user_fixture_satisfies_every_invariant_and_liveness_property() {
    let config = Config::user_fixture();
    let result = check(&config, CheckOptions::default());
    report("user fixture (D1; S1, S2; R1..R3)", &config, &result);
    assert!(result.violation.is_none(), "the model violates a property");
    assert_eq!(result.liveness_checked, 4, "3 SessionEventuallyResolves + 1 DomainEventuallyTearsDown");
    // Non-vacuity: every action the fixture can exercise is taken somewhere.
    // AbortUnsafeStart needs an unsafe sandbox and RejectSession a foreign
    // fingerprint; the fixture has neither.
    let expected_unused = ["AbortUnsafeStart", "RejectSession"];
    for name in Action::all(&config).iter().map(Action::name) {
        let taken = taken(&result, name);
        if expected_unused.contains(&name) {
            assert_eq!(taken, 0, "{name} should be impossible in the fixture");
        } else {
            assert!(taken > 0, "{name} is never taken: the model is vacuous there");
        }
    }
}

#[test]
fn forged_request_is_never_accepted_in_the_fixture() {
    // R3 has an invalid certificate; no reachable state has it accepted. The
    // invariant check covers this, but make the fixture's intent explicit.
    let config = Config::user_fixture();
    let r3 = lazaret_protocol::model::RequestId(2);
    assert!(!config.requests[r3.0].certificate_valid);
    let result = check(&config, CheckOptions { mutation: Mutation::None, liveness: false });
    assert!(result.violation.is_none());
    assert!(taken(&result, "VerifyRequest") > 0);
}

#[test]
fn two_domain_fixture_keeps_domains_apart_and_refuses_unsafe_sandboxes() {
    let config = Config::two_domain_fixture();
    let result = check(&config, CheckOptions::default());
    report("two domains (D2 with an unsafe sandbox spec)", &config, &result);
    assert!(result.violation.is_none());
    assert!(taken(&result, "AbortUnsafeStart") > 0);
}

fn assert_mutant_caught(mutation: Mutation, expected: &[Invariant]) -> State {
    let config = Config::user_fixture();
    let result = check(&config, CheckOptions { mutation, liveness: false });
    report(&format!("mutant {mutation:?}"), &config, &result);
    let Some(Violation::Invariant { invariant, trace }) = &result.violation else {
        panic!("mutant {mutation:?} was not caught");
    };
    assert!(expected.contains(invariant), "{mutation:?} caught by unexpected {invariant:?}");
    assert!(!trace.steps.is_empty(), "counterexample trace is empty");
    assert!(!invariant.holds(&config, trace.last_state()), "the trace does not end in a violating state");
    // The bad state is the mutant's doing, not the correct model's.
    assert!(correct_model_avoids(&config, &trace.actions()), "the correct model reaches the same violation");
    trace.last_state().clone()
}

#[test]
fn mutant_sandbox_before_sidecar_ready_is_caught() {
    assert_mutant_caught(Mutation::SandboxBeforeSidecarReady, &[Invariant::OrderedNetworkStartup]);
}

#[test]
fn mutant_result_to_disconnected_session_is_caught() {
    let bad = assert_mutant_caught(
        Mutation::ResultToDisconnectedSession,
        &[Invariant::AuthenticatedEscalation, Invariant::ActiveRequestConsistent, Invariant::ResultDeliveryStateConsistent],
    );
    // The state reached has a result queued for delivery to a disconnected
    // session, which the mutant's DeliverResult would then deliver.
    let config = Config::user_fixture();
    assert!(!Invariant::ResultDeliveryStateConsistent.holds(&config, &bad));
    let queued = bad.requests.iter().enumerate().find(|(_, r)| r.phase.is_pending_result());
    let (r, _) = queued.expect("a pending result");
    let s = config.requests[r].session;
    assert_eq!(bad.sessions[s.0].connection, ConnectionState::Disconnected);
    let deliver = Action::DeliverResult(RequestId(r));
    assert!(step_mutated(&config, &bad, &deliver, Mutation::ResultToDisconnectedSession).is_ok());
}

#[test]
fn mutant_host_process_outliving_request_is_caught() {
    let bad = assert_mutant_caught(
        Mutation::HostProcessOutlivesRequest,
        &[Invariant::NoOrphanHostProcess, Invariant::ResultDeliveryStateConsistent],
    );
    // A host process still runs for a request that is no longer Executing.
    assert!(bad.requests.iter().any(|r| r.host_running && r.phase != RequestPhase::Executing));
}

#[test]
fn mutant_execution_without_certificate_is_caught() {
    assert_mutant_caught(Mutation::ExecuteWithoutCertificate, &[Invariant::AuthenticatedEscalation]);
}

#[test]
fn liveness_mutants_are_caught_with_a_fair_lasso() {
    let config = Config::user_fixture();
    for mutation in Mutation::LIVENESS_MUTANTS {
        let result = check(&config, CheckOptions { mutation, liveness: true });
        report(&format!("liveness mutant {mutation:?}"), &config, &result);
        let Some(Violation::Liveness { property, prefix, .. }) = &result.violation else {
            panic!("liveness mutant {mutation:?} was not caught");
        };
        assert!(!prefix.steps.is_empty());
        // The lasso's loop stays where the goal is false.
        assert!(!property.goal(&config, prefix.last_state()));
    }
}

#[test]
#[ignore = "long: run with --ignored to check the larger configuration"]
fn larger_configuration_satisfies_every_property() {
    let config = Config::larger_fixture();
    let result = check(&config, CheckOptions::default());
    report("larger (D1; S1..S3 with S3 foreign; R1..R4)", &config, &result);
    assert!(result.violation.is_none());
    assert!(taken(&result, "RejectSession") > 0);
}
