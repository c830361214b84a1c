//! A session's escalation identity belongs to that session (issue 32,
//! property 5): no process of one session can read another session's
//! certificate or key (environment, memory, files) or use another
//! session's escalation broker, so it can neither make a prompt appear on
//! another session's terminal nor act in its name.
//!
//! The agent runs as the non-root developer, as by default: every session's
//! processes share that uid and one PID namespace, which is exactly what an
//! attacker in one session has to work with.

use std::process::Stdio;

use lazaret_tests::escalation::*;
use lazaret_tests::*;

/// The `PREFIX PID: SEEN` lines of `lazaret-escprobe steal` with that prefix.
fn lines_with<'a>(stdout: &'a str, prefix: &str) -> Vec<&'a str> {
    stdout.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn one_session_can_neither_read_nor_use_another_sessions_escalation_identity() {
    require_root();
    let env = developer_env(&rules_toml(&[Rule::new("touch", &["touch"]).extra_args()]));
    let probe = install_escprobe(&env).display().to_string();

    // Session A: an agent that waits, holding the Domain open.
    let holder = Holder::start(&env, "test", "true", &[]);

    // Session B: the attacker, looking through every process it can see.
    let out = env.run(["run", "test", "--", &probe, "steal"]);
    let stdout = text(&out.stdout);
    println!("{stdout}");
    holder.release();

    assert!(out.status.success() && stdout.contains("\ndone\n"), "the probe did not finish: {}", text(&out.stderr));
    assert_eq!(
        lines_with(&stdout, "environ-key"),
        Vec::<&str>::new(),
        "another process's environment holds a session key the agent can read"
    );
    assert_eq!(lines_with(&stdout, "stolen-key"), Vec::<&str>::new());
    assert_eq!(lines_with(&stdout, "fd-key"), Vec::<&str>::new(), "another process's descriptor yields a session key");
    // Session A's agent announces its broker (its environment is the
    // agent's own uid's): the attacker tries it, and is refused.
    let foreign = lines_with(&stdout, "foreign-broker");
    assert!(!foreign.is_empty(), "no other session's broker was found to try: the test proves nothing");
    for attempt in &foreign {
        assert!(attempt.contains(": refused ("), "another session's broker served this session: {attempt}");
    }
    assert_eq!(lines_with(&stdout, "own-broker"), ["own-broker: completed 0"], "the session's own broker must work");
    let pwned: Vec<String> = std::fs::read_dir(&env.workspace)
        .expect("workspace")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pwned"))
        .collect();
    assert_eq!(pwned, Vec::<String>::new(), "a request made with another session's identity ran");
    assert!(env.workspace.join("own-broker-ok").exists(), "the session's own request did not run");
    env.assert_nothing_left();
}

#[test]
fn the_agent_holds_no_capabilities_and_runs_as_the_developer_under_a_root_session_init() {
    require_root();
    let env = developer_env("");
    let (uid, gid) = test_user();
    let script = "echo uid=$(id -u) gid=$(id -g); grep -E '^Cap(Inh|Prm|Eff|Bnd):' /proc/self/status; \
                  echo parent=$(stat -c %u /proc/$PPID); echo pwd=$(pwd); \
                  if tr '\\0' '\\n' < /proc/$PPID/environ | grep -q '^LAZARET_ESCALATE_KEY='; then echo parent-key=yes; else echo parent-key=no; fi; \
                  env | grep -c '^LAZARET_ESCALATE_\\(CERT\\|KEY\\|CA\\|ADDR\\)=' || true";
    let sub = env.workspace.join("sub");
    std::fs::create_dir(&sub).expect("sub");
    chown_tree(&env.workspace, uid, gid);
    let out = env
        .lazaret(["run", "test", "--", "sh", "-c", script])
        .current_dir(&sub)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let out = wait_output(out);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains(&format!("uid={uid} gid={gid}\n")), "{stdout}");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd"] {
        assert!(stdout.contains(&format!("{set}:\t0000000000000000")), "{set} is not empty:\n{stdout}");
    }
    assert!(stdout.contains("parent=0\n"), "the session's init is not root's:\n{stdout}");
    assert!(stdout.contains(&format!("pwd={}\n", sub.display())), "the agent did not start in the client's directory:\n{stdout}");
    assert!(
        stdout.contains("parent-key=no\n"),
        "the session's key is in its init's environment (which gVisor lets every process read):\n{stdout}"
    );
    assert!(stdout.ends_with("0\n"), "escalation credentials in the agent's environment:\n{stdout}");
    env.assert_nothing_left();
}
