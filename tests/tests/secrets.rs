//! `env:NAME` values (secrets from the launching environment) reach the
//! agent and nothing else: no file Lazaret writes (Domain Root, runtime
//! directory with its run directory and runsc state, coordinator log,
//! journal), no runsc debug log and no output of `config show` or `ls --json` holds them, while
//! a session is running.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use lazaret_tests::*;

/// Every regular file under `dir` (not following symlinks) that contains
/// `needle`, and how many files were read.
fn files_containing(dir: &Path, needle: &[u8]) -> (Vec<PathBuf>, usize) {
    let mut found = Vec::new();
    let mut read = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else { continue };
            let path = entry.path();
            if kind.is_dir() {
                // The sandbox's root filesystem is the image (shared, read-only).
                if path.file_name().is_some_and(|n| n == "rootfs") {
                    continue;
                }
                stack.push(path);
            } else if kind.is_file() {
                let mut bytes = Vec::new();
                if std::fs::File::open(&path).and_then(|mut f| f.read_to_end(&mut bytes)).is_ok() {
                    read += 1;
                    if bytes.windows(needle.len()).any(|w| w == needle) {
                        found.push(path);
                    }
                }
            }
        }
    }
    (found, read)
}

#[test]
fn env_secrets_reach_the_agent_and_are_written_nowhere() {
    let secret = format!("lzsecret{}{}", std::process::id(), random_hex());
    let profile = "user = \"root\"\nenv = { AGENT_SECRET = \"env:LAZARET_TEST_SECRET\" }\n";
    let mut env = TestEnv::with_profile(profile);
    // runsc's debug logs too (runsc 20240729 logs an exec's arguments, not
    // its environment; the spec it reads is a memfd).
    let debug = env.scratch.join("runsc-debug");
    env.write_config(&format!("{profile}\n[runsc]\ndebug_log_dir = \"{}\"\n", debug.display()));
    env.env.push(("LAZARET_TEST_SECRET".into(), secret.clone()));

    // A session that prints the secret, then waits for a line on stdin.
    let mut session = env
        .lazaret(["run", "test", "--", "sh", "-c", "printf 'got:%s\\n' \"$AGENT_SECRET\"; read line; echo bye"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning lazaret run");
    let mut stdout = BufReader::new(session.stdout.take().expect("stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("reading the agent's output");
    assert_eq!(first.trim_end(), format!("got:{secret}"), "the secret did not arrive in the agent's environment");

    // While it runs: every file Lazaret wrote.
    let domain_root = env.domain_ids().first().map(|id| Path::new(TEST_STORAGE).join("domains").join(id)).expect("a Domain");
    let runtime = env.runtime_dir.clone();
    assert!(domain_root.join("journal.jsonl").is_file(), "no journal at {}", domain_root.display());
    let log = env.domain_dir().expect("domain dir").join("coordinator.log");
    assert!(log.is_file(), "no coordinator log at {}", log.display());
    for dir in [&domain_root, &runtime, &debug] {
        let (found, read) = files_containing(dir, secret.as_bytes());
        assert!(read > 0, "read no file under {}", dir.display());
        assert!(found.is_empty(), "the secret is written in {found:?}");
    }
    // The commands that show configuration and Domains.
    for args in [&["config", "show"][..], &["config", "show", "--json"], &["ls", "--json"], &["ls"]] {
        let out = env.run(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out.stderr));
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!all.contains(&secret), "{args:?} shows the secret: {all}");
        if args[0] == "config" {
            assert!(all.contains("env:LAZARET_TEST_SECRET"), "{args:?} should show the reference: {all}");
        }
    }

    // End the session; its own output is the only place the secret was.
    session.stdin.take().expect("stdin").write_all(b"\n").expect("ending the session");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("rest of stdout");
    let status = wait_with_limit(&mut session);
    let mut stderr = String::new();
    let _ = session.stderr.take().map(|mut e| e.read_to_string(&mut stderr));
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(rest.trim(), "bye");
    assert!(!stderr.contains(&secret), "lazaret's stderr shows the secret: {stderr}");
    // And after the Domain is gone, the Domain Root and the debug logs
    // (of every runsc call, exec's included) still hold none.
    for dir in [&domain_root, &debug] {
        let (found, _) = files_containing(dir, secret.as_bytes());
        assert!(found.is_empty(), "the secret is written in {found:?}");
    }
    let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&debug).expect("debug dir"));
    assert_eq!(mode & 0o777, 0o700, "the debug log directory is root's only");
    env.assert_nothing_left();
}

#[test]
fn a_missing_env_variable_is_named_with_the_sudo_hint() {
    let env = TestEnv::with_profile("user = \"root\"\nenv = { AGENT_SECRET = \"env:LAZARET_TEST_UNSET_SECRET\" }\n");
    let out = env.run(["run", "test", "--", "true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "stderr: {err}");
    for needle in ["LAZARET_TEST_UNSET_SECRET is not set", "sudo --preserve-env=LAZARET_TEST_UNSET_SECRET", "AGENT_SECRET"] {
        assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    }
    env.assert_nothing_left();
}

fn random_hex() -> String {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).expect("urandom");
    b.iter().map(|x| format!("{x:02x}")).collect()
}
