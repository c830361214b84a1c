//! Host escalation end to end (issue 12): `lazaret-escalate` inside the
//! sandbox asks the Domain's coordinator over mutual TLS to run a command
//! on the host as the developer; a rule or the developer (on a terminal the
//! test drives) decides; exactly one result comes back.
//!
//! Every test makes the non-root [`TEST_USER`] the developer (as `sudo`
//! does), so a host command that ran as root is seen as wrong. Host
//! commands write into a [`HostDir`], which the sandbox cannot see: a file
//! there proves the command ran on the host.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lazaret_tests::escalation::*;
use lazaret_tests::images::{NOLIBC_IMAGE, ensure_nolibc_image};
use lazaret_tests::pty::TestTerminal;
use lazaret_tests::*;
use sha2::Digest;

/// The end of a prompt's first screen (its keys).
const PROMPT_KEYS: &str = "[n] deny";
/// The prompt's first line.
const PROMPT_HEADER: &str = "lazaret: the agent asks to run a command on the host";
/// The confirmation after an edit.
const PROMPT_CONFIRM: &str = "run this?";
/// Exit codes of `lazaret-escalate` (protocol/src/escalation.rs, `exit`).
const DENIED: i32 = 77;
const TIMED_OUT: i32 = 124;
const FAILED: i32 = 126;
const CANCELLED: i32 = 130;

/// A developer env (see [`developer_env`]) whose agent is root inside,
/// with `profile` keys for `[profiles.test]` and then `tail` (rules,
/// settings, other tables).
fn esc_env(profile: &str, tail: &str) -> TestEnv {
    developer_env(&format!("user = \"root\"\n{profile}{tail}"))
}

/// `lazaret run test -- ARGV` to completion.
fn agent<S: AsRef<str>>(env: &TestEnv, argv: &[S]) -> Output {
    let mut args = vec!["run".to_string(), "test".into(), "--".into()];
    args.extend(argv.iter().map(|s| s.as_ref().to_string()));
    env.run(&args)
}

fn describe(out: &Output) -> String {
    format!("status {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// `KEY=value` lines of an output.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    out.lines().find_map(|l| l.strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("no {key}= in output:\n{out}"))
}

/// The value of a prompt line `  LABEL: value` (up to the end of its row).
/// Only the text after the prompt's header counts: the agent's own output
/// (the escalation client's status line, say) may reach the terminal just
/// before the prompt and contain the same words.
fn prompt_field(prompt: &str, label: &str) -> String {
    let header = prompt.rfind(PROMPT_HEADER).unwrap_or_else(|| panic!("no prompt header in {prompt:?}"));
    let prompt = &prompt[header..];
    let needle = format!("  {label}:");
    let start = prompt.find(&needle).unwrap_or_else(|| panic!("the prompt has no {label:?} line: {prompt:?}")) + needle.len();
    let rest = &prompt[start..];
    let end = ["\x1b[K", "\r", "\n"].iter().filter_map(|t| rest.find(t)).min().unwrap_or(rest.len());
    rest[..end].trim().to_string()
}

/// Waits past the prompt's arming time (the client drops keys typed within
/// 300 ms of a prompt appearing: they were meant for the agent), then types
/// `keys`.
fn answer(pty: &TestTerminal, keys: &[u8]) {
    std::thread::sleep(ARMING);
    pty.write(keys);
}

/// Longer than the client's prompt arming time.
const ARMING: Duration = Duration::from_millis(700);

fn finish(env: &TestEnv) {
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

fn single_quoted(s: &str) -> String {
    assert!(!s.contains('\''), "{s:?} holds a quote");
    format!("'{s}'")
}

fn sha256(data: &[u8]) -> String {
    sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

fn assert_same_bytes(what: &str, got: &[u8], want: &[u8]) {
    assert!(
        got == want,
        "{what} differs: got {} bytes (sha256 {}), want {} bytes (sha256 {}); first difference at byte {:?}",
        got.len(),
        sha256(got),
        want.len(),
        sha256(want),
        got.iter().zip(want).position(|(a, b)| a != b)
    );
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    std::io::Read::read_exact(&mut fs::File::open("/dev/urandom").expect("urandom"), &mut v).expect("urandom");
    v
}

fn session_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(3)?.parse().ok()
}

/// The request ID of the only `VerifyRequest` for `argv`.
fn only_request(env: &TestEnv, argv: &[&str]) -> String {
    let ids = requests_for(env, argv);
    assert_eq!(ids.len(), 1, "VerifyRequest entries for {argv:?}: {ids:?}; journal: {:?}", env.journal_entries());
    ids[0].clone()
}

// ---------------------------------------------------------------------------
// Rule-approved commands.

#[test]
fn a_rule_approved_command_runs_on_the_host_as_the_developer() {
    let (uid, gid) = test_user();
    let home = nix::unistd::User::from_name(TEST_USER).ok().flatten().expect("test user").dir;
    let host = HostDir::new();
    host.write("host-only", b"seen on the host\n");
    let h = host.path.display();
    let script = format!(
        "echo uid=$(id -u); echo gid=$(id -g); echo pwd=$(pwd -P); echo host-only=$(cat {h}/host-only); \
         echo stdin=$(readlink /proc/self/fd/0); echo home=$HOME; echo user=$USER; echo agent-var=${{AGENT_VAR-unset}}; \
         echo lazaret-vars=$(env | grep -c '^LAZARET_'); echo ran-as-$(id -u) > {h}/marker"
    );
    let rules = [
        Rule::new("identity", &["sh", "-c", &script]),
        Rule::new("exit-7", &["sh", "-c", "exit 7"]),
        Rule::new("killed", &["sh", "-c", "kill -TERM $$"]),
    ];
    let env = esc_env("", &rules_toml(&rules));
    let sub = env.workspace.join("sub/dir");
    fs::create_dir_all(&sub).expect("sub/dir");
    chown_tree(&env.workspace.join("sub"), uid, gid);
    let sub_s = sub.display().to_string();
    let ws = env.workspace.display().to_string();

    for (dir, cwd_args) in [(ws.as_str(), vec![]), (sub_s.as_str(), vec!["--cwd", sub_s.as_str()])] {
        let mut argv = vec!["env", "AGENT_VAR=from-the-agent", "lazaret-escalate"];
        argv.extend(cwd_args);
        argv.extend(["--", "sh", "-c", &script]);
        let out = agent(&env, &argv);
        let stdout = ok(&out);
        assert_eq!(text(&out.stderr), "", "stderr of a completed request");
        assert_eq!(field(&stdout, "uid"), uid.to_string(), "the host command's uid:\n{stdout}");
        assert_eq!(field(&stdout, "gid"), gid.to_string());
        assert_eq!(field(&stdout, "pwd"), dir, "the host command's working directory");
        assert_eq!(field(&stdout, "host-only"), "seen on the host", "the command did not run on the host");
        assert_eq!(field(&stdout, "stdin"), "/dev/null");
        assert_eq!(field(&stdout, "home"), home.display().to_string());
        assert_eq!(field(&stdout, "user"), TEST_USER);
        assert_eq!(field(&stdout, "agent-var"), "unset", "the agent's environment reached the host command");
        assert_eq!(field(&stdout, "lazaret-vars"), "0", "LAZARET_ variables reached the host command");
        let marker = host.file("marker");
        assert_eq!(fs::read_to_string(&marker).expect("the host command's marker"), format!("ran-as-{uid}\n"));
        assert_eq!(fs::metadata(&marker).expect("stat marker").uid(), uid, "owner of the marker");
        fs::remove_file(&marker).expect("removing the marker");
    }

    let out = agent(&env, &["lazaret-escalate", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
    let out = agent(&env, &["lazaret-escalate", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15), "{}", describe(&out));

    let approvals: Vec<String> = journal_with(&env, "AutoApprove").iter().filter_map(|e| e["rule"].as_str().map(String::from)).collect();
    assert_eq!(approvals, ["identity", "identity", "exit-7", "killed"], "AutoApprove rules in the journal");
    let id = only_request(&env, &["sh", "-c", "exit 7"]);
    assert_eq!(
        request_actions(&env, &id),
        ["VerifyRequest", "AutoApprove", "StartHostExecution", "CompleteHostExecution", "DeliverResult"]
    );
    let complete =
        journal_with(&env, "CompleteHostExecution").into_iter().find(|e| e["request"] == id.as_str()).expect("CompleteHostExecution");
    assert_eq!(complete["exit_status"], 7);
    finish(&env);
}

#[test]
fn stdout_and_stderr_come_back_exactly_binary_and_megabytes() {
    let host = HostDir::new();
    let all: Vec<u8> = (0..=255u8).collect();
    let mut want_out = all.clone();
    want_out.extend(random_bytes(8 << 20));
    let mut want_err: Vec<u8> = all.iter().rev().copied().collect();
    want_err.extend(random_bytes(1 << 20));
    want_err.extend(&all);
    host.write("out.bin", &want_out);
    host.write("err.bin", &want_err);
    let script = format!("cat {}; cat {} >&2; exit 5", host.arg("out.bin"), host.arg("err.bin"));
    let env = esc_env("", &rules_toml(&[Rule::new("output", &["sh", "-c", &script])]));
    let out = agent(&env, &["lazaret-escalate", "--", "sh", "-c", &script]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "status; got {} bytes of stdout and {} of stderr, ending {:?}; coordinator log:\n{}",
        out.stdout.len(),
        out.stderr.len(),
        String::from_utf8_lossy(&out.stderr[out.stderr.len().saturating_sub(300)..]),
        coordinator_logs(&env)
    );
    assert_same_bytes("stdout", &out.stdout, &want_out);
    assert_same_bytes("stderr", &out.stderr, &want_err);
    finish(&env);
}

#[test]
fn output_arrives_while_the_host_command_still_runs() {
    let host = HostDir::new();
    let go = host.arg("go");
    let script = format!(
        "echo first-line; i=0; while [ ! -e {go} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; echo second-line; test -e {go}"
    );
    let env = esc_env("", &rules_toml(&[Rule::new("stream", &["sh", "-c", &script])]));
    let mut child = spawn_piped(&env, &["run", "test", "--", "lazaret-escalate", "--", "sh", "-c", &script]);
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(90)).unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("no first line from the host command within 90 s")
    });
    assert_eq!(first, "first-line");
    let running = host_processes(&format!("sh -c {script}"));
    assert!(!running.is_empty(), "the first line arrived, but the host command is no longer running");
    assert!(!Path::new(&go).exists());
    host.write("go", b"");
    let second = rx.recv_timeout(Duration::from_secs(60)).expect("the second line");
    assert_eq!(second, "second-line");
    let status = wait_with_limit(&mut child);
    let _ = reader.join();
    assert_eq!(status.code(), Some(0));
    finish(&env);
}

/// A session's requests one after another, and many at once (queued
/// behind each other: a session has one accepted request at a time), all
/// complete: none refused, lost or duplicated.
#[test]
fn a_sessions_requests_in_a_row_and_at_once_all_complete() {
    let env = esc_env("", &rules_toml(&[Rule::new("true", &["true"]), Rule::new("echo", &["echo"]).extra_args()]));
    let probe = install_escprobe(&env).display().to_string();
    let script = format!("{probe} time 100 -- lazaret-escalate -- true; echo --; {probe} concurrent 20 t -- lazaret-escalate -- echo");
    let out = agent(&env, &["sh", "-c", &script]);
    let stdout = ok(&out);
    let (in_a_row, at_once) = stdout.split_once("--\n").unwrap_or_else(|| panic!("{}", describe(&out)));
    let failed: Vec<&str> = in_a_row.lines().filter(|l| l.starts_with("failed")).collect();
    assert!(failed.is_empty(), "requests one after another failed (run, exit): {failed:?}\nstderr: {}", text(&out.stderr));
    assert_eq!(in_a_row.lines().count(), 100, "{in_a_row}");
    let mut results: Vec<&str> = at_once.lines().filter(|l| l.starts_with("t-")).collect();
    results.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("t-{i} exit=0 out=t-{i}\\n")).collect();
    want.sort();
    assert_eq!(results, want, "concurrent requests of one session\nstderr: {}", text(&out.stderr));
    finish(&env);
}

/// Git on the host takes its configuration from the nearest `.git` above
/// the working directory. A repository the agent made during the run has a
/// configuration it can rewrite faster than the Workspace Guard filters it
/// (a tight loop won that race against a rule-approved `git fetch` with
/// `core.sshCommand`), so host commands run only below a `.git` Git Sentry
/// protected at the start; `git` itself gets that repository pinned, so a
/// `.git` made after the check is never discovered. Git may also recurse
/// into a repository below its own (a submodule): while the agent's
/// repository exists, host commands in the repository above it are
/// refused as well.
#[test]
fn host_commands_run_only_in_repositories_protected_since_the_start() {
    let host = HostDir::new();
    let marker = host.arg("fsmonitor-ran");
    let rules = [
        Rule::new("status", &["git", "status", "--short"]),
        Rule::new("status-in-made", &["git", "-C", "made", "status", "--short"]),
        Rule::new("git-dir", &["git", "rev-parse", "--git-dir"]),
    ];
    let env = esc_env("", &rules_toml(&rules));
    let script = format!(
        "mkdir -p plain/deep; \
         lazaret-escalate --cwd plain/deep -- git status --short >/dev/null; echo plain=$?; \
         lazaret-escalate -- git rev-parse --git-dir; echo git-dir=$?; \
         mkdir -p made/.git/objects made/.git/refs; echo 'ref: refs/heads/main' > made/.git/HEAD; \
         printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch {marker}\\n' > made/.git/config; \
         lazaret-escalate --cwd made -- git status --short; echo made=$?; \
         lazaret-escalate -- git -C made status --short; echo dash-c=$?; \
         lazaret-escalate --cwd plain/deep -- git status --short >/dev/null; echo plain-beside-made=$?"
    );
    let out = agent(&env, &["sh", "-c", &script]);
    let stdout = ok(&out);
    let stderr = text(&out.stderr);
    assert_eq!(field(&stdout, "made"), FAILED.to_string(), "a repository made in the run: {stderr}");
    assert!(stderr.contains("made/.git, which was made during this run"), "the reason names the repository: {stderr}");
    assert_eq!(field(&stdout, "dash-c"), FAILED.to_string(), "git -C into a repository made in the run: {stderr}");
    assert!(!host.file("fsmonitor-ran").exists(), "the host's git ran the agent's core.fsmonitor");
    assert_eq!(field(&stdout, "plain"), "0", "a plain directory of the protected workspace repository: {stderr}");
    // Once the agent's repository exists below it, git in the workspace's
    // repository could enter it (as a submodule): refused too (issue 32).
    assert_eq!(field(&stdout, "plain-beside-made"), FAILED.to_string(), "git could recurse into the agent's repository: {stderr}");
    assert!(stderr.contains("git could enter the repository made/.git"), "{stderr}");
    assert_eq!(field(&stdout, "git-dir"), "0", "{stderr}");
    assert!(
        stdout.lines().any(|l| Path::new(l) == env.workspace.join(".git")),
        "git was not pinned to the workspace's repository (GIT_DIR): {stdout}"
    );
    finish(&env);
}

/// Issue 30: a developer agent may write the workspace's own
/// `.git/config` (the Workspace Guard's gate judges it). Host commands run
/// outside the sandbox in the coordinator's mount namespace, which the
/// gate covers as well: a rule-approved `git status` asked again and again
/// while the agent rewrites the config with `core.fsmonitor` in a loop
/// (`git config`, and a file renamed over it) never reads the agent's
/// version.
#[test]
fn a_host_git_command_never_reads_the_config_a_developer_agent_rewrites_in_a_loop() {
    let host = HostDir::new();
    let marker = host.arg("fsmonitor-ran");
    let rules = [Rule::new("status", &["git", "status", "--short"])];
    let env = developer_env(&rules_toml(&rules));
    let script = format!(
        "end=$(( $(date +%s) + 8 )); \
         ( while [ $(date +%s) -lt $end ]; do git config core.fsmonitor 'touch {marker}' 2>/dev/null; \
             printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch {marker}\\n' > .git/c.new && mv -f .git/c.new .git/config; done ) & \
         runs=0; ran=0; while [ $(date +%s) -lt $end ]; do lazaret-escalate -- git status --short >/dev/null 2>&1 && ran=$((ran+1)); runs=$((runs+1)); done; \
         wait; echo runs=$runs; echo ran=$ran"
    );
    let out = agent(&env, &["sh", "-c", &script]);
    let stdout = ok(&out);
    let stderr = text(&out.stderr);
    let (runs, ran): (u32, u32) = (field(&stdout, "runs").parse().expect("runs"), field(&stdout, "ran").parse().expect("ran"));
    println!("{runs} host git status runs, {ran} of them succeeded\n{stderr}");
    assert!(ran >= 5, "the host command ran too seldom to tell ({ran} of {runs}): {stderr}");
    assert!(!host.file("fsmonitor-ran").exists(), "the host's git ran the agent's core.fsmonitor ({runs} runs)");
    assert!(!fs::read_to_string(env.workspace.join(".git/config")).expect("config").contains("fsmonitor"), "the agent's key stayed");
    finish(&env);
}

#[test]
fn an_extra_argument_is_not_auto_approved_unless_the_rule_allows_it() {
    let (uid, gid) = test_user();
    let host = HostDir::new();
    let (a, b, c) = (host.arg("a"), host.arg("b"), host.arg("c"));
    let rules = [
        Rule::new("exact", &["touch", &a]),
        Rule::new("prefix", &["echo", "prefix"]).extra_args(),
        Rule::new("in-sub", &["touch", &c]).in_dir("sub"),
    ];
    let env = esc_env("", &rules_toml(&rules));
    fs::create_dir(env.workspace.join("sub")).expect("sub");
    chown_tree(&env.workspace.join("sub"), uid, gid);
    let sub = env.workspace.join("sub").display().to_string();
    let script = format!(
        "lazaret-escalate -- touch {a}; echo exact=$?; \
         lazaret-escalate -- touch {a} {b}; echo extra=$?; \
         lazaret-escalate -- echo prefix one two; echo prefix-extra=$?; \
         lazaret-escalate -- echo prefix; echo prefix-exact=$?; \
         lazaret-escalate -- echo prefi x; echo not-a-prefix=$?; \
         lazaret-escalate -- touch {c}; echo c-from-root=$?; \
         lazaret-escalate --cwd {sub} -- touch {c}; echo c-from-sub=$?"
    );
    let out = agent(&env, &["sh", "-c", &script]);
    let stdout = ok(&out);
    let stderr = text(&out.stderr);
    assert_eq!(field(&stdout, "exact"), "0", "{stdout}\n{stderr}");
    assert_eq!(field(&stdout, "extra"), DENIED.to_string(), "one extra argument must go to the developer (no terminal: denied)\n{stderr}");
    assert!(!host.file("b").exists(), "the command with the extra argument ran");
    assert_eq!(field(&stdout, "prefix-extra"), "0", "{stderr}");
    assert!(stdout.contains("prefix one two\n"), "{stdout}");
    assert_eq!(field(&stdout, "prefix-exact"), "0");
    assert_eq!(field(&stdout, "not-a-prefix"), DENIED.to_string());
    assert_eq!(field(&stdout, "c-from-root"), DENIED.to_string(), "a rule's cwd constraint was ignored");
    assert_eq!(field(&stdout, "c-from-sub"), "0", "{stderr}");
    assert!(host.file("a").exists() && host.file("c").exists());
    assert!(stderr.lines().any(|l| l.starts_with("lazaret-escalate: denied")), "no denial reason on stderr: {stderr}");
    assert!(stderr.contains("terminal"), "the denial does not say the session has no terminal: {stderr}");
    // The denied request was journalled as prompted and denied for lack of a terminal.
    let id = only_request(&env, &["touch", &a, &b]);
    assert_eq!(request_actions(&env, &id), ["VerifyRequest", "PromptDeveloper", "DeveloperDeny", "DeliverResult"]);
    let verify = journal_with(&env, "VerifyRequest").into_iter().find(|e| e["request"] == id.as_str()).expect("VerifyRequest");
    assert_eq!(verify["auto_approved"], false);
    finish(&env);
}

// ---------------------------------------------------------------------------
// Prompts on the developer's terminal.

#[test]
fn a_prompt_names_the_request_and_approving_runs_it_once() {
    let (uid, _) = test_user();
    let host = HostDir::new();
    let marker = host.arg("marker");
    let script = format!("echo ran-as-$(id -u) > {marker}; echo host-says-$((6*7))");
    let env = esc_env("", "");
    let mut pty = TestTerminal::new(40, 200);
    let mut child =
        tty_spawn(&pty, &env, &["run", "test", "--", "lazaret-escalate", "--justification", "push the fix", "--", "sh", "-c", &script]);
    let prompt = pty.expect_text(PROMPT_KEYS);
    let sessions = sessions(&env);
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(prompt_field(&prompt, "profile"), "test", "{prompt:?}");
    assert_eq!(prompt_field(&prompt, "session"), sessions[0]);
    assert_eq!(Path::new(&prompt_field(&prompt, "cwd")), env.workspace, "the prompt's cwd");
    assert_eq!(prompt_field(&prompt, "command"), format!("sh -c {}", single_quoted(&script)));
    assert_eq!(prompt_field(&prompt, "why"), "push the fix");
    assert!(!host.file("marker").exists(), "the command ran before it was approved");
    answer(&pty, b"y");
    pty.expect("host-says-42");
    assert_eq!(wait_with_limit(&mut child).code(), Some(0), "terminal showed {:?}", pty.seen());
    assert_eq!(fs::read_to_string(host.file("marker")).expect("marker"), format!("ran-as-{uid}\n"));
    let id = only_request(&env, &["sh", "-c", &script]);
    assert_eq!(
        request_actions(&env, &id),
        ["VerifyRequest", "PromptDeveloper", "DeveloperApprove", "StartHostExecution", "CompleteHostExecution", "DeliverResult"]
    );
    let approve = journal_with(&env, "DeveloperApprove");
    assert_eq!(approve[0]["for_domain"], false);
    finish(&env);
}

#[test]
fn denying_a_prompt_exits_77_and_ls_shows_the_pending_request() {
    let host = HostDir::new();
    let marker = host.arg("denied");
    let env = esc_env("", "");
    let mut pty = TestTerminal::new(40, 200);
    let mut child = tty_spawn(&pty, &env, &["run", "test", "--", "lazaret-escalate", "--justification", "j", "--", "touch", &marker]);
    pty.expect_text(PROMPT_KEYS);
    let sessions = sessions(&env);
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let pending = pending(&env);
    assert_eq!(pending.len(), 1, "lazaret ls --json pending: {pending:?}");
    assert_eq!(pending[0]["session"], sessions[0].as_str());
    assert_eq!(pending[0]["argv"], serde_json::json!(["touch", marker]));
    assert_eq!(pending[0]["state"], "awaiting-approval");
    let ls = env.run(["ls"]);
    let listing = text(&ls.stdout);
    assert_eq!(ls.status.code(), Some(0), "{}", text(&ls.stderr));
    assert!(
        listing.contains(&sessions[0]) && listing.contains(&marker),
        "lazaret ls does not show the pending request of {}:\n{listing}",
        sessions[0]
    );
    answer(&pty, b"n");
    assert_eq!(wait_with_limit(&mut child).code(), Some(DENIED), "terminal showed {:?}", pty.seen());
    assert!(!host.file("denied").exists(), "a denied command ran");
    let id = only_request(&env, &["touch", &marker]);
    assert_eq!(request_actions(&env, &id), ["VerifyRequest", "PromptDeveloper", "DeveloperDeny", "DeliverResult"]);
    finish(&env);
}

#[test]
fn editing_a_prompt_runs_the_edited_command_after_confirmation() {
    let host = HostDir::new();
    let (original, edited) = (host.arg("original"), host.arg("edited"));
    let env = esc_env("", "");
    let mut pty = TestTerminal::new(40, 200);
    let mut child = tty_spawn(&pty, &env, &["run", "test", "--", "lazaret-escalate", "--", "touch", &original]);
    pty.expect_text(PROMPT_KEYS);
    answer(&pty, b"e");
    // The editor starts with the request, shell-quoted.
    pty.expect(&format!("touch {original}"));
    pty.write(b"\x15");
    pty.write(format!("touch {edited} 'with space'").as_bytes());
    pty.write(b"\r");
    let confirm = pty.expect_text(PROMPT_CONFIRM);
    assert!(confirm.contains(&edited) && confirm.contains("with space"), "the confirmation does not show the edited command: {confirm:?}");
    assert!(!host.file("edited").exists() && !host.file("original").exists(), "something ran before the confirmation");
    answer(&pty, b"y");
    assert_eq!(wait_with_limit(&mut child).code(), Some(0), "terminal showed {:?}", pty.seen());
    assert!(host.file("edited").exists(), "the edited command did not run");
    // A relative name: created in the command's working directory, the workspace.
    assert!(env.workspace.join("with space").exists(), "the quoted argument was not one argument");
    assert!(!host.file("original").exists(), "the original command ran");
    let id = only_request(&env, &["touch", &original]);
    assert_eq!(
        request_actions(&env, &id),
        ["VerifyRequest", "PromptDeveloper", "DeveloperEditApprove", "StartHostExecution", "CompleteHostExecution", "DeliverResult"]
    );
    let edit = journal_with(&env, "DeveloperEditApprove");
    assert_eq!(edit[0]["argv"], serde_json::json!(["touch", edited, "with space"]));
    finish(&env);
}

#[test]
fn approving_for_the_domain_runs_the_same_argv_again_without_asking() {
    let host = HostDir::new();
    let count = host.arg("count");
    let same = format!("echo run >> {count}");
    let other = format!("echo other >> {count}");
    let (qs, qo) = (single_quoted(&same), single_quoted(&other));
    let script = format!(
        "lazaret-escalate -- sh -c {qs}; echo first=$?; lazaret-escalate -- sh -c {qs}; echo second=$?; \
         lazaret-escalate -- sh -c {qo}; echo third=$?; read x; echo bye"
    );
    let env = esc_env("", "");
    let mut pty = TestTerminal::new(40, 200);
    let mut child = tty_spawn(&pty, &env, &["run", "test", "--", "sh", "-c", &script]);
    pty.expect_text(PROMPT_KEYS);
    answer(&pty, b"a");
    pty.expect("first=0");
    let between = pty.expect_text("second=0");
    assert!(!between.contains(PROMPT_KEYS), "the same argv was prompted again after approve-for-Domain: {between:?}");
    let third = pty.expect_text(PROMPT_KEYS);
    assert!(third.contains("other"), "the third prompt is not for the other command: {third:?}");
    answer(&pty, b"n");
    pty.expect(&format!("third={DENIED}"));
    // Another session of the Domain, without a terminal: the approved argv
    // runs, another is denied (it cannot be asked).
    let out = agent(&env, &["lazaret-escalate", "--", "sh", "-c", &same]);
    assert_eq!(out.status.code(), Some(0), "approve-for-Domain does not hold for the Domain's other sessions: {}", describe(&out));
    let out = agent(&env, &["lazaret-escalate", "--", "sh", "-c", &other]);
    assert_eq!(out.status.code(), Some(DENIED), "{}", describe(&out));
    pty.write(b"\r");
    pty.expect("bye");
    assert_eq!(wait_with_limit(&mut child).code(), Some(0), "terminal showed {:?}", pty.seen());
    assert_eq!(fs::read_to_string(host.file("count")).expect("count"), "run\nrun\nrun\n");
    let for_domain: Vec<_> = journal_with(&env, "DeveloperApprove").iter().map(|e| e["for_domain"].clone()).collect();
    assert_eq!(for_domain, [serde_json::json!(true)]);
    let rules: Vec<_> = journal_with(&env, "AutoApprove").iter().map(|e| e["rule"].clone()).collect();
    assert_eq!(rules, [serde_json::json!("domain-approval"), serde_json::json!("domain-approval")]);
    finish(&env);
}

#[test]
fn an_unanswered_prompt_times_out_with_124() {
    let host = HostDir::new();
    let marker = host.arg("late");
    let env = esc_env("", &settings_toml("prompt_timeout = 2"));
    let mut pty = TestTerminal::new(40, 200);
    let mut child = tty_spawn(&pty, &env, &["run", "test", "--", "lazaret-escalate", "--", "touch", &marker]);
    pty.expect_text(PROMPT_KEYS);
    let shown = Instant::now();
    assert_eq!(wait_with_limit(&mut child).code(), Some(TIMED_OUT), "terminal showed {:?}", pty.seen());
    let waited = shown.elapsed();
    assert!(waited < Duration::from_secs(30), "the 2 s prompt timeout took {waited:?}");
    assert!(!host.file("late").exists(), "a timed-out request ran");
    let id = only_request(&env, &["touch", &marker]);
    assert_eq!(request_actions(&env, &id), ["VerifyRequest", "PromptDeveloper", "TimeoutRequest", "DeliverResult"]);
    finish(&env);
}

#[test]
fn a_justification_full_of_escape_sequences_is_shown_inert() {
    let why = "start\x1b[2Jclear\x1b]52;c;aGVsbG8=\x07osc\rCR\u{202e}RLO\u{200b}ZW-end";
    let env = esc_env("", "");
    let mut pty = TestTerminal::new(40, 200);
    let mut child = tty_spawn(&pty, &env, &["run", "test", "--", "lazaret-escalate", "--justification", why, "--", "true"]);
    let prompt = pty.expect_text(PROMPT_KEYS);
    answer(&pty, b"n");
    assert_eq!(wait_with_limit(&mut child).code(), Some(DENIED), "terminal showed {:?}", pty.seen());
    let raw = pty.received();
    for bad in ["\x1b[2Jclear", "\x1b]52;c;", "aGVsbG8=\x07", "\rCR", "\u{202e}RLO", "\u{200b}ZW"] {
        assert!(!raw.windows(bad.len()).any(|w| w == bad.as_bytes()), "the terminal received the raw {bad:?}");
    }
    let shown = prompt_field(&prompt, "why");
    for visible in ["start", "\\x1b[2Jclear", "\\x1b]52;c;aGVsbG8=\\x07osc", "\\rCR", "\\u{202e}RLO", "\\u{200b}ZW-end"] {
        assert!(shown.contains(visible), "the justification does not show {visible:?}: {shown:?}");
    }
    finish(&env);
}

#[test]
fn two_sessions_prompting_at_once_each_see_only_their_own() {
    let env = esc_env("", "");
    let mut pa = TestTerminal::new(40, 200);
    let mut a = tty_spawn(
        &pa,
        &env,
        &["run", "test", "--", "lazaret-escalate", "--justification", "from-session-A", "--", "sh", "-c", "echo A-ran"],
    );
    let prompt_a = pa.expect_text(PROMPT_KEYS);
    let mut pb = TestTerminal::new(40, 200);
    let mut b = tty_spawn(
        &pb,
        &env,
        &["run", "test", "--", "lazaret-escalate", "--justification", "from-session-B", "--", "sh", "-c", "echo B-ran"],
    );
    let prompt_b = pb.expect_text(PROMPT_KEYS);
    assert_eq!(prompt_field(&prompt_a, "why"), "from-session-A");
    assert_eq!(prompt_field(&prompt_b, "why"), "from-session-B");
    let (sa, sb) = (prompt_field(&prompt_a, "session"), prompt_field(&prompt_b, "session"));
    assert_ne!(sa, sb, "both prompts name one session");
    let mut listed = sessions(&env);
    listed.sort();
    let mut named = vec![sa.clone(), sb.clone()];
    named.sort();
    assert_eq!(listed, named, "the prompts' sessions are not the Domain's sessions");
    let pending = pending(&env);
    assert_eq!(pending.len(), 2, "{pending:?}");
    for p in &pending {
        let want = if p["session"] == sa.as_str() { "echo A-ran" } else { "echo B-ran" };
        assert_eq!(p["argv"][2], want, "pending request of the wrong session: {p}");
    }
    // B is answered while A's prompt stays up.
    answer(&pb, b"y");
    pb.expect("B-ran");
    assert_eq!(wait_with_limit(&mut b).code(), Some(0), "terminal B showed {:?}", pb.seen());
    let later = pa.settle(Duration::from_millis(500)).to_string();
    assert!(!later.contains("B-ran"), "session A's terminal shows B's output: {later:?}");
    answer(&pa, b"n");
    assert_eq!(wait_with_limit(&mut a).code(), Some(DENIED), "terminal A showed {:?}", pa.seen());
    let (ra, rb) = (text(pa.received()), text(pb.received()));
    assert!(!ra.contains("from-session-B") && !ra.contains("B-ran"), "session A's terminal shows B's request: {ra:?}");
    assert!(!rb.contains("from-session-A") && !rb.contains("A-ran"), "session B's terminal shows A's request: {rb:?}");
    finish(&env);
}

// ---------------------------------------------------------------------------
// Cancellation and disconnection kill the whole host tree.

/// `sh -c 'sleep A & setsid sleep B & wait'` with two unique durations.
fn tree_script() -> (String, String, String) {
    let (a, b) = (unique_sleep(), unique_sleep());
    (format!("sleep {a} & setsid sleep {b} & wait"), format!("sleep {a}"), format!("sleep {b}"))
}

/// Waits until both host sleeps run as the developer, the second in a
/// session of its own; returns nothing, fails otherwise.
fn wait_for_tree(a: &str, b: &str) {
    let (uid, _) = test_user();
    let (pa, pb) = wait_for("both host sleeps", Duration::from_secs(90), || {
        let (pa, pb) = (host_processes(a), host_processes(b));
        (!pa.is_empty() && !pb.is_empty()).then_some((pa, pb))
    });
    assert!(pa.iter().chain(&pb).all(|p| p.uid == uid), "host processes not run as the developer: {pa:?} {pb:?}");
    assert_ne!(session_of(pa[0].pid), session_of(pb[0].pid), "setsid did not give the second sleep its own session");
}

fn wait_tree_gone(a: &str, b: &str, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left: Vec<_> = host_processes(a).into_iter().chain(host_processes(b)).collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for p in &left {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid), nix::sys::signal::Signal::SIGKILL);
            }
            panic!("host processes still running 15 s after {after}: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ctrl_c_on_the_client_cancels_and_kills_the_whole_host_tree() {
    let (script, a, b) = tree_script();
    let env = esc_env("", &rules_toml(&[Rule::new("tree", &["sh", "-c", &script])]));
    let probe = install_escprobe(&env).display().to_string();
    let mut child = env
        .lazaret(["run", "test", "--", &probe, "interrupt", "INT", "--", "lazaret-escalate", "--", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning lazaret run");
    wait_for_tree(&a, &b);
    child.stdin.take().expect("stdin").write_all(b"go\n").expect("the go-ahead");
    let out = wait_output(child);
    let stdout = ok(&out);
    assert_eq!(field(&stdout, "status"), CANCELLED.to_string(), "{}", describe(&out));
    wait_tree_gone(&a, &b, "the client's SIGINT");
    let ids = requests_for(&env, &["sh", "-c", &script]);
    assert_eq!(ids.len(), 1);
    let actions = request_actions(&env, &ids[0]);
    assert_eq!(actions, ["VerifyRequest", "AutoApprove", "StartHostExecution", "CancelRequest", "DeliverResult"]);
    finish(&env);
}

#[test]
fn a_session_disconnecting_mid_execution_kills_the_whole_host_tree() {
    let (script, a, b) = tree_script();
    let env = esc_env("", &rules_toml(&[Rule::new("tree", &["sh", "-c", &script]), Rule::new("true", &["true"])]));
    // Another session keeps the Domain up: only the disconnect can end the tree.
    let holder = Holder::start(&env, "test", "true", &[]);
    let mut child = spawn_piped(&env, &["run", "test", "--", "lazaret-escalate", "--", "sh", "-c", &script]);
    wait_for_tree(&a, &b);
    child.kill().expect("killing the lazaret run client");
    let _ = child.wait();
    wait_tree_gone(&a, &b, "the session's client was killed");
    let ids = requests_for(&env, &["sh", "-c", &script]);
    assert_eq!(ids.len(), 1);
    let actions = request_actions(&env, &ids[0]);
    assert!(!actions.contains(&"CompleteHostExecution".to_string()), "{actions:?}");
    // The host tree can be gone (its request cancelled with the client's
    // connection) before the session's end is journalled: wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while journal_with(&env, "DisconnectSession").is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!journal_with(&env, "DisconnectSession").is_empty(), "no DisconnectSession in the journal");
    // The Domain carries on for its other sessions.
    let out = agent(&env, &["lazaret-escalate", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "after the disconnect: {}", describe(&out));
    holder.release();
    finish(&env);
}

// ---------------------------------------------------------------------------
// Hostile clients.

/// The `case NAME: ...` lines of `lazaret-escprobe hostile`.
fn cases(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("case "))
        .filter_map(|l| l.split_once(": "))
        .map(|(name, seen)| (name.to_string(), seen.to_string()))
        .collect()
}

fn pwned(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("pwned")).collect())
        .unwrap_or_default()
}

/// Prints the session's client certificate and key, each followed by a
/// marker line (in the agent's environment under [`credentials_hook`] only).
const PRINT_CREDENTIALS: &str = "printf '%s\\n--cert-end--\\n%s\\n--key-end--\\n' \"$LAZARET_ESCALATE_CERT\" \"$LAZARET_ESCALATE_KEY\"";

/// The test hook that puts each session's credentials into its agent's
/// environment (otherwise only its broker, `lazaret-session-init`, holds
/// them), for the tests of what the coordinator makes of stolen ones.
fn credentials_hook(env: &mut TestEnv) {
    env.env.push(("LAZARET_TEST_HOOKS".into(), "1".into()));
    env.env.push(("LAZARET_TEST_SESSION_CREDENTIALS".into(), "env".into()));
}

/// The certificate and key [`PRINT_CREDENTIALS`] printed (PEM, newline-terminated).
fn credentials(printed: &str) -> (String, String) {
    let (cert, rest) = printed.split_once("--cert-end--\n").unwrap_or_else(|| panic!("no certificate printed: {printed:?}"));
    let (key, _) = rest.split_once("--key-end--\n").unwrap_or_else(|| panic!("no key printed: {printed:?}"));
    let (cert, key) = (cert.trim_end().to_string() + "\n", key.trim_end().to_string() + "\n");
    assert!(cert.contains("BEGIN CERTIFICATE"), "LAZARET_ESCALATE_CERT is not a certificate: {cert:?}");
    assert!(key.contains("PRIVATE KEY"), "LAZARET_ESCALATE_KEY is not a key");
    (cert, key)
}

#[test]
fn foreign_self_made_missing_and_malformed_credentials_and_frames_are_refused() {
    let (uid, gid) = test_user();
    let touch = || rules_toml(&[Rule::new("touch", &["touch"]).extra_args()]);
    let mut env_a = esc_env("", &touch());
    let mut env_b = esc_env("", &touch());
    credentials_hook(&mut env_a);
    credentials_hook(&mut env_b);
    // Domain A: a connected session whose credentials go to Domain B's agent.
    let holder_a = Holder::start(&env_a, "test", PRINT_CREDENTIALS, &[]);
    let (cert, key) = credentials(&holder_a.printed);
    for (f, content) in [(".a.cert.pem", cert), (".a.key.pem", key)] {
        fs::write(env_b.workspace.join(f), content).expect("copying credentials");
        chown_tree(&env_b.workspace.join(f), uid, gid);
    }
    let probe = install_escprobe(&env_b).display().to_string();
    let ws = env_b.workspace.display().to_string();
    let script = format!(
        "echo foreign=\"$({probe} present .a.cert.pem .a.key.pem pwned-foreign-domain)\"; \
         {probe} hostile; echo hostile=$?; \
         lazaret-escalate -- touch {ws}/valid-after-all; echo valid=$?"
    );
    let out = agent(&env_b, &["sh", "-c", &script]);
    let stdout = ok(&out);
    println!("{stdout}");
    let foreign = field(&stdout, "foreign");
    assert!(
        foreign.starts_with("seen: refused") || foreign.starts_with("seen: connection error"),
        "another Domain's certificate: {foreign}: {}",
        describe(&out)
    );
    assert_eq!(field(&stdout, "hostile"), "0", "{}", describe(&out));
    let cases = cases(&stdout);
    let names: Vec<&str> = cases.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.len() >= 15 && names.contains(&"no-cert") && names.contains(&"self-ca") && names.contains(&"replay"), "{names:?}");
    for (name, seen) in &cases {
        if name == "replay-first" || name == "valid-after" {
            assert_eq!(seen, "completed 0", "case {name}");
        } else {
            assert!(seen.starts_with("refused") || seen.starts_with("connection error"), "case {name} was not refused: {seen}");
        }
    }
    assert_eq!(field(&stdout, "valid"), "0", "the coordinator does not carry on: {}", describe(&out));
    assert_eq!(pwned(&env_b.workspace), Vec::<String>::new(), "hostile requests ran");
    for done in ["replay-first", "valid-after", "valid-after-all"] {
        assert!(env_b.workspace.join(done).exists(), "{done} did not run");
    }
    // Refused requests are never journalled: only the three valid ones are.
    assert_eq!(journal_with(&env_b, "VerifyRequest").len(), 3, "{:?}", journal_with(&env_b, "VerifyRequest"));
    // Domain A's coordinator is fine too.
    let a_ws = env_a.workspace.display().to_string();
    let out = agent(&env_a, &["lazaret-escalate", "--", "touch", &format!("{a_ws}/a-ok")]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(env_a.workspace.join("a-ok").exists());
    holder_a.release();
    finish(&env_a);
    finish(&env_b);
}

#[test]
fn an_ended_sessions_certificate_is_refused() {
    let mut env = esc_env("", &rules_toml(&[Rule::new("touch", &["touch"]).extra_args()]));
    credentials_hook(&mut env);
    let ws = env.workspace.display().to_string();
    let holder = Holder::start(&env, "test", "true", &[]);
    // A session that keeps its credentials in the sandbox, then ends.
    let (old, old_key) = credentials(&ok(&agent(&env, &["sh", "-c", PRINT_CREDENTIALS])));
    fs::write(env.workspace.join(".old.cert"), &old).expect("saving the old certificate");
    fs::write(env.workspace.join(".old.key"), &old_key).expect("saving the old key");
    let probe = install_escprobe(&env).display().to_string();
    let script = format!(
        "{PRINT_CREDENTIALS}; \
         echo ended=\"$({probe} present .old.cert .old.key pwned-ended)\"; \
         lazaret-escalate -- touch {ws}/valid-after; echo valid=$?"
    );
    let out = agent(&env, &["sh", "-c", &script]);
    let stdout = ok(&out);
    let (new, _) = credentials(&stdout);
    assert_ne!(old, new, "two sessions got the same certificate");
    let ended = field(&stdout, "ended");
    assert!(
        ended.starts_with("seen: refused") || ended.starts_with("seen: connection error"),
        "an ended session's certificate: {ended}: {}",
        describe(&out)
    );
    assert_eq!(field(&stdout, "valid"), "0", "{}", describe(&out));
    assert_eq!(pwned(&env.workspace), Vec::<String>::new());
    assert!(env.workspace.join("valid-after").exists());
    holder.release();
    finish(&env);
}

// ---------------------------------------------------------------------------
// Whatever the egress policy and the image.

#[test]
fn escalation_works_from_a_profile_that_denies_all_egress() {
    use lazaret_tests::netlab::{DNS, NetLab, PORT, PUBLIC};
    let lab = NetLab::new();
    let mut env = esc_env(
        &format!("dns = [\"{DNS}\"]\ndeny_egress = [\"0.0.0.0/0\", \"::/0\"]\n"),
        &rules_toml(&[Rule::new("echo", &["echo", "escalated"])]),
    );
    env.netns = Some(lab.host.clone());
    let probe = env.install_probe().display().to_string();
    let script = format!("{probe} tcp {PUBLIC} {PORT} unreachable; echo probe=$?; lazaret-escalate -- echo escalated; echo escalate=$?");
    let out = agent(&env, &["sh", "-c", &script]);
    let stdout = ok(&out);
    assert_eq!(field(&stdout, "probe"), PROBE_PASS.to_string(), "egress is not denied: {}", describe(&out));
    assert!(stdout.contains("escalated\n"), "{}", describe(&out));
    assert_eq!(field(&stdout, "escalate"), "0", "{}", describe(&out));
    finish(&env);
}

#[test]
fn escalation_works_in_an_image_without_a_c_library() {
    let rules = rules_toml(&[Rule::new("true", &["true"]), Rule::new("three", &["sh", "-c", "exit 3"])]);
    let env = esc_env("", &format!("\n[profiles.nolibc]\nimage = \"{NOLIBC_IMAGE}\"\ncommand = [\"/bin/sh\"]\nuser = \"root\"\n{rules}"));
    ensure_nolibc_image(&env);
    let script = "for f in /lib/x86_64-linux-gnu/libc.so.6 /lib64/ld-linux-x86-64.so.2 /usr/lib/x86_64-linux-gnu/libc.so.6; do test -e $f && echo found=$f; done; \
                  lazaret-escalate -- true; echo true=$?; lazaret-escalate -- sh -c 'exit 3'; echo three=$?";
    let out = env.run(["run", NOLIBC_IMAGE, "--", "sh", "-c", script]);
    let stdout = ok(&out);
    assert!(!stdout.contains("found="), "the image has a C library: {stdout}");
    assert_eq!(field(&stdout, "true"), "0", "{}", describe(&out));
    assert_eq!(field(&stdout, "three"), "3", "{}", describe(&out));
    finish(&env);
}
