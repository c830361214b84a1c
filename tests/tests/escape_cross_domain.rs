//! Escape corpus: reach across Domains (issue 17). Two Domains of the same
//! developer run at once (two workspaces, one runtime directory, one lab
//! network namespace: [`NetLab`]). Domain A listens on TCP (all addresses),
//! on an abstract and a path unix socket, and leaves markers in /tmp and
//! /dev/shm; it checks that it reaches its own listeners. Domain B, while A
//! runs, tries A's sandbox address, loopback, both sockets, the markers, A's
//! workspace, processes, runtime directory, coordinator socket and Domain
//! Root. Every attempt must fail, and A's listeners must have accepted only
//! A's own connections.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;

use lazaret_tests::escape;
use lazaret_tests::netlab::NetLab;
use lazaret_tests::*;

const PORT: u16 = 7000;

fn accepted(path: &Path) -> usize {
    fs::read_to_string(path).map(|t| t.lines().count()).unwrap_or(0)
}

#[test]
fn one_domain_cannot_reach_another_by_socket_network_or_state() {
    let lab = NetLab::new();
    let mut env = TestEnv::new();
    env.netns = Some(lab.host.clone());
    let ws_a = env.workspace.clone();
    let ws_b = env.scratch.join("ws-b");
    fs::create_dir(&ws_b).expect("second workspace");
    git(&ws_b, &["init", "-q", "-b", "main"]);
    fs::write(ws_b.join("README"), "second Domain\n").expect("README");
    git(&ws_b, &["add", "README"]);
    git(&ws_b, &["-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "init"]);

    let script_a = format!(
        r#"tool listen tcp {PORT} "$W/.accepted-tcp" >/dev/null & p1=$!
tool listen unix @escape-domain-a "$W/.accepted-abstract" >/dev/null & p2=$!
tool listen unix /tmp/escape-a.sock "$W/.accepted-path" >/dev/null & p3=$!
echo a-secret > /tmp/escape-a-marker; echo a-secret > /dev/shm/escape-a-marker
sleep 1
IP=$(tool myip)
echo "case a-reaches-own-tcp: $(tool connect tcp "$IP" {PORT})"
echo "case a-reaches-own-abstract: $(tool connect unix @escape-domain-a)"
echo "case a-reaches-own-path-socket: $(tool connect unix /tmp/escape-a.sock)"
echo "a-ready ip=$IP"
while [ ! -e "$W/.b-done" ]; do sleep 0.2; done
kill $p1 $p2 $p3
"#
    );
    let path_a = escape::install(&env, "domain-a", &script_a);
    let mut a = env
        .lazaret(["run".as_ref(), "test".as_ref(), "--".as_ref(), "sh".as_ref(), path_a.as_os_str()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning Domain A's session");
    let mut a_out = String::new();
    let mut lines = BufReader::new(a.stdout.take().expect("A's stdout")).lines();
    let a_ip = loop {
        let line = lines.next().and_then(Result::ok).unwrap_or_else(|| panic!("Domain A ended before it was ready:\n{a_out}"));
        a_out.push_str(&line);
        a_out.push('\n');
        if let Some(ip) = line.strip_prefix("a-ready ip=") {
            break ip.to_string();
        }
    };
    let a_results = escape::cases(&a_out);
    for own in ["a-reaches-own-tcp", "a-reaches-own-abstract", "a-reaches-own-path-socket"] {
        assert!(
            a_results.get(own).is_some_and(|v| v.starts_with("ok")),
            "Domain A cannot reach its own listener ({own}): the attempts from B prove nothing\n{a_out}"
        );
    }
    let a_id = env.domain_ids().into_iter().next().expect("Domain A's runtime directory");

    let script_b = format!(
        r#"A_IP={a_ip}; A_WS={ws_a}; A_RUNTIME={runtime}/{a_id}; A_ROOT={storage}/domains/{a_id}
echo "case b-address: $(tool myip)"
must_fail tcp-to-other-sandbox tool connect tcp "$A_IP" {PORT}
must_fail tcp-to-other-sandbox-other-port tool connect tcp "$A_IP" 22
must_fail tcp-to-loopback tool connect tcp 127.0.0.1 {PORT}
must_fail abstract-unix-socket tool connect unix @escape-domain-a
must_fail path-unix-socket tool connect unix /tmp/escape-a.sock
must_fail other-tmp test -e /tmp/escape-a-marker
must_fail other-dev-shm test -e /dev/shm/escape-a-marker
must_fail other-workspace test -e "$A_WS"
must_fail other-processes sh -c 'grep -l "escape-domain-[a]\.sh" /proc/[0-9]*/cmdline'
must_fail other-runtime-dir test -e "$A_RUNTIME"
must_fail other-coordinator-socket tool connect unix "$A_RUNTIME/coordinator.sock"
must_fail other-domain-root test -e "$A_ROOT"
"#,
        ws_a = ws_a.display(),
        runtime = env.runtime_dir.display(),
        storage = TEST_STORAGE,
    );
    let path_b = escape::install_in(&ws_b, "domain-b", &script_b);
    let b = wait_output(
        env.lazaret(["run".as_ref(), "test".as_ref(), "--".as_ref(), "sh".as_ref(), path_b.as_os_str()])
            .current_dir(&ws_b)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning Domain B's session"),
    );
    fs::write(ws_a.join(".b-done"), "").expect("releasing Domain A");
    let a_status = wait_with_limit(&mut a);
    let b_out = text(&b.stdout);
    println!("A:\n{a_out}\nB:\n{b_out}\nB's stderr:\n{}", text(&b.stderr));
    assert_eq!(b.status.code(), Some(0), "Domain B's session: {}", text(&b.stderr));
    assert_eq!(a_status.code(), Some(0), "Domain A's session");
    assert_eq!(env.domain_ids().len(), 2, "two Domains expected");
    escape::assert_refused(
        &escape::cases(&b_out),
        &[
            "tcp-to-other-sandbox",
            "tcp-to-other-sandbox-other-port",
            "tcp-to-loopback",
            "abstract-unix-socket",
            "path-unix-socket",
            "other-tmp",
            "other-dev-shm",
            "other-workspace",
            "other-processes",
            "other-runtime-dir",
            "other-coordinator-socket",
            "other-domain-root",
        ],
        &b_out,
    );
    // Only A's own connections were accepted.
    for file in [".accepted-tcp", ".accepted-abstract", ".accepted-path"] {
        assert_eq!(accepted(&ws_a.join(file)), 1, "{file}: A's listener accepted more than A's own connection");
    }
    env.assert_nothing_left();
    drop(lab);
}
