//! Load (issue 17): many Domains with several sessions each at once, and a
//! thousand escalation round trips from concurrent sessions. Correctness
//! under load only (every session's output, none lost or duplicated,
//! nothing left on the host); the durations are printed, never asserted
//! (`scripts/bench.sh` and `scripts/soak.sh` measure).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Instant;

use lazaret_tests::escalation::*;
use lazaret_tests::netlab::NetLab;
use lazaret_tests::*;

const DOMAINS: usize = 10;
const SESSIONS_PER_DOMAIN: usize = 4;

type Session = PipedSession;

#[test]
fn ten_domains_with_four_sessions_each_at_once_finish_and_leave_nothing() {
    let lab = NetLab::new();
    let envs: Vec<TestEnv> = (0..DOMAINS)
        .map(|_| {
            let mut env = TestEnv::new();
            env.netns = Some(lab.host.clone());
            env
        })
        .collect();
    let baselines: Vec<HostCounts> = envs.iter().map(|e| HostCounts::take(e, Some(&lab.host))).collect();
    let t = Instant::now();
    // Every session of every Domain starts at once; each waits for the
    // others (a line on stdin) so all 40 run together.
    let mut sessions: Vec<(usize, usize, Session)> = Vec::new();
    for (d, env) in envs.iter().enumerate() {
        for s in 0..SESSIONS_PER_DOMAIN {
            sessions.push((d, s, Session::script(env, &format!("echo up; read x; echo out-{d}-{s}-$x"))));
        }
    }
    for (d, s, session) in sessions.iter_mut() {
        session.expect_line("up", &format!("session {s} of Domain {d} did not come up"));
    }
    let all_up = t.elapsed();
    for (d, env) in envs.iter().enumerate() {
        assert_eq!(env.coordinator_pids().len(), 1, "Domain {d}: coordinators {:?}", env.coordinator_pids());
        let ls = ls_json(env);
        assert_eq!(ls[0]["sessions"].as_array().map(Vec::len), Some(SESSIONS_PER_DOMAIN), "Domain {d}: {ls}");
    }
    for (_, _, session) in sessions.iter_mut() {
        send(session.child.stdin.as_mut().expect("stdin"), b"go\n");
    }
    for (d, s, session) in sessions {
        let (status, rest, err) = session.finish();
        assert_eq!(status, Some(0), "session {s} of Domain {d}: stderr: {err}");
        assert_eq!(rest, vec![format!("out-{d}-{s}-go")], "session {s} of Domain {d}: stderr: {err}");
    }
    let all_done = t.elapsed();
    // Every Domain down before any count: the veths are counted in the
    // lab's host namespace, which all ten share, so a Domain still tearing
    // down would show in another's count.
    for (d, env) in envs.iter().enumerate() {
        assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "Domain {d} still locked (not down)");
    }
    for (env, baseline) in envs.iter().zip(&baselines) {
        env.assert_nothing_left();
        assert_eq!(&HostCounts::take(env, Some(&lab.host)), baseline, "host counts differ after the load");
        env.assert_journal_conforms();
    }
    eprintln!(
        "load: {DOMAINS} Domains x {SESSIONS_PER_DOMAIN} sessions: all up after {:.1} s, all finished after {:.1} s, all down after {:.1} s",
        all_up.as_secs_f64(),
        all_done.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
}

const ESC_SESSIONS: usize = 8;
const ESC_PER_SESSION: usize = 125;

#[test]
fn a_thousand_escalation_round_trips_over_eight_sessions_none_lost_or_duplicated() {
    let host = HostDir::new();
    let log = host.arg("log");
    // Each request appends its token on the host and prints it: a request
    // that ran twice shows twice in the log, one that never ran not at all.
    let append = format!("echo \"$1\" >> {log}; echo \"$1\"");
    let env = developer_env(&format!("user = \"root\"\n{}", rules_toml(&[Rule::new("append", &["sh", "-c", &append, "sh"]).extra_args()])));
    let probe = install_escprobe(&env).display().to_string();
    let holder = {
        let mut child = env
            .lazaret(["run", "test", "--", "sh", "-c", "echo up; read x"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("holder");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("holder output");
        assert_eq!(line, "up\n");
        child
    };
    let t = Instant::now();
    let clients: Vec<Child> = (0..ESC_SESSIONS)
        .map(|s| {
            let per = ESC_PER_SESSION.to_string();
            let prefix = format!("s{s}");
            spawn_piped(&env, &["run", "test", "--", &probe, "requests", &per, &prefix, "--", "sh", "-c", &append, "sh"])
        })
        .collect();
    let outputs: Vec<std::process::Output> = clients.into_iter().map(wait_output).collect();
    let wall = t.elapsed();
    let mut printed: BTreeMap<String, usize> = BTreeMap::new();
    let mut round_trips = Vec::new();
    for (s, out) in outputs.iter().enumerate() {
        assert_eq!(out.status.code(), Some(0), "session {s}: stderr: {}", text(&out.stderr));
        for line in text(&out.stdout).lines() {
            if line.starts_with('s') {
                *printed.entry(line.to_string()).or_default() += 1;
            } else {
                assert!(!line.starts_with("failed"), "session {s}: {line}; stderr: {}", text(&out.stderr));
                round_trips.push(line.parse::<u64>().unwrap_or_else(|_| panic!("session {s}: unexpected line {line:?}")));
            }
        }
    }
    let expected: Vec<String> = (0..ESC_SESSIONS).flat_map(|s| (0..ESC_PER_SESSION).map(move |i| format!("s{s}-{i}"))).collect();
    let want: BTreeMap<String, usize> = expected.iter().map(|t| (t.clone(), 1)).collect();
    assert_eq!(round_trips.len(), expected.len(), "completed round trips");
    assert_eq!(printed, want, "tokens the clients got back (each exactly once)");
    let mut ran: BTreeMap<String, usize> = BTreeMap::new();
    for line in std::fs::read_to_string(host.file("log")).expect("the host log").lines() {
        *ran.entry(line.to_string()).or_default() += 1;
    }
    assert_eq!(ran, want, "host commands that ran (each exactly once)");
    // The journal: one request ID per request, each with one verdict, one
    // execution and one result.
    let entries = env.journal_entries();
    let mut by_request: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in &entries {
        if let (Some(id), Some(action)) = (e["request"].as_str(), e["action"].as_str()) {
            by_request.entry(id.to_string()).or_default().push(action.to_string());
        }
    }
    assert_eq!(by_request.len(), expected.len(), "request IDs in the journal");
    for (id, actions) in &by_request {
        assert_eq!(
            actions,
            &["VerifyRequest", "AutoApprove", "StartHostExecution", "CompleteHostExecution", "DeliverResult"],
            "request {id}"
        );
    }
    let mut holder = holder;
    send(holder.stdin.as_mut().expect("stdin"), b"\n");
    assert_eq!(wait_with_limit(&mut holder).code(), Some(0));
    env.assert_nothing_left();
    env.assert_journal_conforms();
    round_trips.sort_unstable();
    eprintln!(
        "load: {} escalation round trips over {ESC_SESSIONS} sessions in {:.1} s; round trip median {:.1} ms, p99 {:.1} ms",
        round_trips.len(),
        wall.as_secs_f64(),
        round_trips[round_trips.len() / 2] as f64 / 1000.0,
        round_trips[round_trips.len() * 99 / 100] as f64 / 1000.0
    );
}
