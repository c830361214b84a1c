//! The Workspace Guard engine against a real fanotify mark (as root).
//!
//! "The sandbox" is a long-lived child process (this test binary re-run as
//! [`sandbox_helper_process`]) that performs file operations on request:
//! the guard's pid predicate accepts exactly its pid, so the test process's
//! own writes play the developer's. Temporary directories live on the
//! host's filesystem (ext4 here) and, in one test, on a tmpfs mounted in a
//! private mount namespace.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use lazaret_mounts::guard::{self, Action, GuardConfig, GuardEvent, GuardRoot, Neutralisation, Owner, RootKind};

/// The developer the guard chowns to (not the test's uid, so a change is visible).
const DEVELOPER: Owner = Owner { uid: 4242, gid: 4243 };

/// A v2 `security.capability` value granting CAP_NET_RAW (permitted, effective).
const CAP_NET_RAW_V2: [u8; 20] = [1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// Entry point of the helper process (not a test on its own: without the
/// environment variable it does nothing). Reads one tab-separated command
/// per line on stdin and answers `@@ok` or `@@err <message>` on stdout.
#[test]
fn sandbox_helper_process() {
    if std::env::var_os("LAZARET_GUARD_SANDBOX").is_none() {
        return;
    }
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let args: Vec<&str> = line.split('\t').collect();
        let result = run_command(&args);
        let answer = match result {
            Ok(()) => "@@ok\n".to_owned(),
            Err(e) => format!("@@err {e}\n"),
        };
        let _ = stdout.write_all(answer.as_bytes());
        let _ = stdout.flush();
        if args.first() == Some(&"exit") {
            break;
        }
    }
}

fn run_command(args: &[&str]) -> Result<(), String> {
    let e = |x: std::io::Error| x.to_string();
    match args {
        ["write", path, content] => std::fs::write(path, content.replace("\\n", "\n").replace("\\t", "\t")).map_err(e),
        ["mkdir", path] => std::fs::create_dir_all(path).map_err(e),
        ["chmod", path, mode] => {
            let mode = u32::from_str_radix(mode, 8).map_err(|x| x.to_string())?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(e)
        }
        ["chown", path, uid, gid] => std::os::unix::fs::lchown(path, uid.parse().ok(), gid.parse().ok()).map_err(e),
        ["rename", from, to] => std::fs::rename(from, to).map_err(e),
        ["rm", path] => std::fs::remove_file(path).map_err(e),
        ["swap-config-loop", lock, path, content, millis] => {
            // What `git config` does, again and again for `millis` ms: the
            // new version written to `lock`, then renamed over `path`.
            let until = std::time::Instant::now() + std::time::Duration::from_millis(millis.parse().map_err(|_| "millis")?);
            let content = content.replace("\\n", "\n").replace("\\t", "\t");
            while std::time::Instant::now() < until {
                let _ = std::fs::write(lock, &content).and_then(|()| std::fs::rename(lock, path));
            }
            Ok(())
        }
        ["symlink", target, path] => std::os::unix::fs::symlink(target, path).map_err(e),
        ["setcap", path] => {
            lazaret_mounts::sys::set_xattr_nofollow(Path::new(path), c"security.capability", &CAP_NET_RAW_V2).map_err(|x| x.to_string())
        }
        ["swap", a, b, count] => {
            // Exchanges two names again and again (a directory and a symlink).
            let count: usize = count.parse().map_err(|_| "count")?;
            for _ in 0..count {
                nix::fcntl::renameat2(nix::fcntl::AT_FDCWD, *a, nix::fcntl::AT_FDCWD, *b, nix::fcntl::RenameFlags::RENAME_EXCHANGE)
                    .map_err(|x| x.to_string())?;
            }
            Ok(())
        }
        ["plant", dir, count] => {
            // Creates setuid files and chmods a sentinel through `dir`, ignoring
            // failures (the directory may be a symlink at that moment).
            let count: usize = count.parse().map_err(|_| "count")?;
            for i in 0..count {
                let file = Path::new(dir).join(format!("f{i}"));
                let _ = std::fs::write(&file, b"#!/bin/sh\n");
                let _ = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o4755));
                // chmod only: a chown would clear the bits by itself.
                let _ = std::fs::set_permissions(Path::new(dir).join("sentinel"), std::fs::Permissions::from_mode(0o4755));
            }
            Ok(())
        }
        ["many", dir, count] => {
            // `count` small files in 100 subdirectories (an unpacked tree).
            let count: usize = count.parse().map_err(|_| "count")?;
            for i in 0..count {
                let sub = Path::new(dir).join(format!("d{}", i % 100));
                if i < 100 {
                    std::fs::create_dir_all(&sub).map_err(e)?;
                }
                std::fs::write(sub.join(format!("f{i}")), b"content\n").map_err(e)?;
            }
            Ok(())
        }
        ["append-and-keep-open", path, content] => {
            // Writes without closing (no FAN_CLOSE_WRITE): the fd is leaked on purpose.
            let mut file = std::fs::OpenOptions::new().append(true).open(path).map_err(e)?;
            file.write_all(content.replace("\\n", "\n").replace("\\t", "\t").as_bytes()).map_err(e)?;
            std::mem::forget(file);
            Ok(())
        }
        ["rewrite-loop", path, content, millis] => {
            // Writes `content` at `path` in place, again and again, for
            // `millis` ms (failures ignored: the guard may be moving it).
            let until = std::time::Instant::now() + std::time::Duration::from_millis(millis.parse().map_err(|_| "millis")?);
            let content = content.replace("\\n", "\n").replace("\\t", "\t");
            while std::time::Instant::now() < until {
                let _ = std::fs::write(path, &content);
            }
            Ok(())
        }
        ["swap-inject", stage, target, content, millis] => {
            // A fresh config in `stage` (not a git dir by itself), then
            // `stage` and `target` exchanged: a repository made by renaming
            // a prepared directory, again and again.
            let until = std::time::Instant::now() + std::time::Duration::from_millis(millis.parse().map_err(|_| "millis")?);
            let content = content.replace("\\n", "\n").replace("\\t", "\t");
            let config = Path::new(stage).join("config");
            while std::time::Instant::now() < until {
                let _ = std::fs::remove_file(&config);
                let _ = std::fs::write(&config, &content);
                let _ = nix::fcntl::renameat2(
                    nix::fcntl::AT_FDCWD,
                    *stage,
                    nix::fcntl::AT_FDCWD,
                    *target,
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                );
            }
            Ok(())
        }
        ["toggle-refs", git_dir, content, millis] => {
            // Renames a fresh config into `git_dir`, then takes its `refs`
            // away and back, again and again: a directory that is a git dir
            // one moment and not the next.
            let until = std::time::Instant::now() + std::time::Duration::from_millis(millis.parse().map_err(|_| "millis")?);
            let content = content.replace("\\n", "\n").replace("\\t", "\t");
            let dir = Path::new(git_dir);
            let (refs, refs_away, config, temp) = (dir.join("refs"), dir.join("refs.x"), dir.join("config"), dir.join("config.tmp"));
            while std::time::Instant::now() < until {
                let _ = std::fs::write(&temp, &content);
                let _ = std::fs::rename(&temp, &config);
                let _ = std::fs::rename(&refs, &refs_away);
                let _ = std::fs::rename(&refs_away, &refs);
            }
            Ok(())
        }
        ["plant-and-move", path, content, from, to, millis] => {
            // Renames a fresh executable file into `path`, then `from` to
            // `to` (and back, unless `from` is `path`), again and again: a
            // control file moved away just after a host open of it.
            let until = std::time::Instant::now() + std::time::Duration::from_millis(millis.parse().map_err(|_| "millis")?);
            let content = content.replace("\\n", "\n").replace("\\t", "\t");
            let temp = format!("{path}.tmp");
            while std::time::Instant::now() < until {
                let _ = std::fs::write(&temp, &content);
                let _ = std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o755));
                let _ = std::fs::rename(&temp, path);
                let _ = std::fs::rename(from, to);
                if from != path {
                    let _ = std::fs::rename(to, from);
                }
            }
            Ok(())
        }
        ["blink-dir", path, millis] => {
            // Makes and removes a directory at `path` every millisecond.
            let until = std::time::Instant::now() + std::time::Duration::from_millis(millis.parse().map_err(|_| "millis")?);
            while std::time::Instant::now() < until {
                let _ = std::fs::create_dir(path);
                let _ = std::fs::remove_dir(path);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Ok(())
        }
        ["exit"] => Ok(()),
        other => Err(format!("unknown command {other:?}")),
    }
}

/// The sandbox stand-in.
struct Sandbox {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Sandbox {
    fn spawn() -> Sandbox {
        let mut child = Command::new(std::env::current_exe().expect("current exe"))
            .args(["sandbox_helper_process", "--exact", "--nocapture", "--test-threads=1"])
            .env("LAZARET_GUARD_SANDBOX", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the sandbox helper");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Sandbox { child, stdin, stdout }
    }

    /// The helper as the developer (a developer agent), in a mount
    /// namespace of its own, reaching `dir` through a bind mount made
    /// there: its opens do not go through the mount the test's processes
    /// use (as the gofer's do not), so the gate never sees them.
    fn spawn_through_own_mount(dir: &Path) -> Sandbox {
        let exe = std::env::current_exe().expect("current exe");
        let drop_to = format!("--reuid={} --regid={} --clear-groups", DEVELOPER.uid, DEVELOPER.gid);
        let script = format!("mount --bind \"$0\" \"$0\" && exec setpriv {drop_to} \"$@\"");
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .arg(dir)
            .arg(exe)
            .args(["sandbox_helper_process", "--exact", "--nocapture", "--test-threads=1"])
            .env("LAZARET_GUARD_SANDBOX", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the sandbox helper (needs util-linux unshare and mount)");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Sandbox { child, stdin, stdout }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs one command; returns the helper's error message, if any.
    fn try_run(&mut self, args: &[&str]) -> Result<(), String> {
        writeln!(self.stdin, "{}", args.join("\t")).expect("send to helper");
        self.stdin.flush().expect("flush");
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line).expect("read helper") == 0 {
                panic!("the sandbox helper exited");
            }
            // libtest may print "test NAME ... " on the same line first.
            if let Some(rest) = line.find("@@").map(|at| &line[at + 2..]) {
                return match rest.trim_end() {
                    "ok" => Ok(()),
                    err => Err(err.to_owned()),
                };
            }
        }
    }

    fn run(&mut self, args: &[&str]) {
        if let Err(e) = self.try_run(args) {
            panic!("sandbox {args:?}: {e}");
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A workspace, a quarantine and a running guard that trusts `pids`.
struct Fixture {
    dir: tempfile::TempDir,
    guard: Option<guard::Guard>,
    events: Arc<Mutex<Vec<GuardEvent>>>,
    pids: Arc<Mutex<HashSet<u32>>>,
    config: GuardConfig,
    /// Trust every pid except this process's (instead of the sandbox helpers').
    trust_all_but_self: bool,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::in_dir(tempfile::tempdir().expect("tempdir"))
    }

    fn in_dir(dir: tempfile::TempDir) -> Fixture {
        common::require_root();
        let base = dir.path().canonicalize().expect("canonical");
        std::fs::create_dir(base.join("ws")).expect("mkdir ws");
        std::fs::create_dir(base.join("domain")).expect("mkdir domain");
        let config = GuardConfig {
            roots: vec![GuardRoot { label: "workspace".into(), path: base.join("ws"), kind: RootKind::Workspace }],
            developer: DEVELOPER,
            quarantine_dir: base.join("domain/quarantine"),
            ..Default::default()
        };
        Fixture { dir, guard: None, events: Arc::default(), pids: Arc::default(), config, trust_all_but_self: false }
    }

    fn base(&self) -> PathBuf {
        self.dir.path().canonicalize().expect("canonical")
    }

    fn ws(&self) -> PathBuf {
        self.base().join("ws")
    }

    fn start(&mut self) {
        let pids = Arc::clone(&self.pids);
        let events = Arc::clone(&self.events);
        let me = std::process::id();
        let all_but_self = self.trust_all_but_self;
        let guard = guard::Guard::start(
            self.config.clone(),
            Arc::new(move |pid| if all_but_self { pid != me } else { pids.lock().expect("pids").contains(&pid) }),
            Box::new(move |event| events.lock().expect("events").push(event)),
        )
        .expect("start the guard");
        assert_eq!(guard.backends(), vec![guard::Backend::Fanotify; self.config.roots.len()]);
        self.guard = Some(guard);
    }

    fn sandbox(&self) -> Sandbox {
        let sandbox = Sandbox::spawn();
        self.pids.lock().expect("pids").insert(sandbox.pid());
        sandbox
    }

    fn settle(&self) {
        self.guard.as_ref().expect("guard").settle().expect("settle");
    }

    fn neutralised(&self) -> Vec<Neutralisation> {
        self.events
            .lock()
            .expect("events")
            .iter()
            .filter_map(|e| match e {
                GuardEvent::Neutralised(n) => Some(n.clone()),
                _ => None,
            })
            .collect()
    }

    fn errors(&self) -> Vec<String> {
        self.events
            .lock()
            .expect("events")
            .iter()
            .filter_map(|e| match e {
                GuardEvent::Error(m) => Some(m.clone()),
                _ => None,
            })
            .collect()
    }

    fn actions_for(&self, rel: &str) -> Vec<Action> {
        self.neutralised().into_iter().filter(|n| n.path == Path::new(rel)).map(|n| n.action).collect()
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).expect("stat").mode() & 0o7777
}

fn has_cap(path: &Path) -> bool {
    let file = std::fs::File::open(path).expect("open");
    lazaret_mounts::sys::has_xattr(std::os::fd::AsFd::as_fd(&file), c"security.capability").expect("getxattr")
}

fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

#[test]
fn privilege_bits_and_capabilities_are_stripped_from_the_sandbox_files_only() {
    let mut fx = Fixture::new();
    fx.start();
    let ws = fx.ws();
    let mut sb = fx.sandbox();
    sb.run(&["write", s(&ws.join("suid")), "x"]);
    sb.run(&["chmod", s(&ws.join("suid")), "4755"]);
    sb.run(&["mkdir", s(&ws.join("sub/dir"))]);
    sb.run(&["write", s(&ws.join("sub/dir/sgid")), "x"]);
    sb.run(&["chmod", s(&ws.join("sub/dir/sgid")), "2711"]);
    sb.run(&["write", s(&ws.join("capped")), "x"]);
    sb.run(&["setcap", s(&ws.join("capped"))]);
    sb.run(&["mkdir", s(&ws.join("shared"))]);
    sb.run(&["chmod", s(&ws.join("shared")), "2775"]);
    // The developer's own setuid file (this process) is left alone.
    std::fs::write(ws.join("mine"), b"x").expect("write");
    std::fs::set_permissions(ws.join("mine"), std::fs::Permissions::from_mode(0o4755)).expect("chmod");
    lazaret_mounts::sys::set_xattr_nofollow(&ws.join("mine"), c"security.capability", &CAP_NET_RAW_V2).expect("setcap mine");
    fx.settle();
    assert_eq!(mode(&ws.join("suid")), 0o755);
    assert_eq!(mode(&ws.join("sub/dir/sgid")), 0o711);
    assert!(!has_cap(&ws.join("capped")));
    assert_eq!(mode(&ws.join("shared")), 0o2775, "a setgid directory is kept (documented)");
    assert_eq!(mode(&ws.join("mine")), 0o4755, "the developer's own file is not touched");
    assert!(has_cap(&ws.join("mine")));
    assert!(fx.actions_for("suid").contains(&Action::ClearedPrivilegeBits { old_mode: 0o4755, new_mode: 0o755 }), "{:?}", fx.neutralised());
    assert!(fx.actions_for("capped").contains(&Action::RemovedFileCapabilities));
    assert!(fx.actions_for("mine").is_empty());
    assert!(fx.neutralised().iter().all(|n| n.pid == Some(sb.pid()) && n.root == "workspace"));
    // Chmod again after the strip: caught again.
    sb.run(&["chmod", s(&ws.join("suid")), "6755"]);
    fx.settle();
    assert_eq!(mode(&ws.join("suid")), 0o755);
    assert!(fx.errors().is_empty(), "{:?}", fx.errors());
}

#[test]
fn files_a_root_sandbox_makes_are_given_to_the_developer() {
    let mut fx = Fixture::new();
    fx.start();
    let ws = fx.ws();
    std::os::unix::fs::chown(&ws, Some(DEVELOPER.uid), Some(DEVELOPER.gid)).expect("chown ws");
    let mut sb = fx.sandbox();
    sb.run(&["write", s(&ws.join("rootfile")), "x"]); // the helper runs as root
    sb.run(&["mkdir", s(&ws.join("rootdir"))]);
    sb.run(&["symlink", "/etc/shadow", s(&ws.join("link"))]);
    sb.run(&["write", s(&ws.join("suid-root")), "x"]);
    sb.run(&["chmod", s(&ws.join("suid-root")), "4755"]);
    std::fs::write(ws.join("developer-root-file"), b"x").expect("write");
    fx.settle();
    for name in ["rootfile", "rootdir", "link", "suid-root"] {
        let meta = std::fs::symlink_metadata(ws.join(name)).expect("stat");
        assert_eq!((meta.uid(), meta.gid()), (DEVELOPER.uid, DEVELOPER.gid), "{name}");
    }
    assert_eq!(mode(&ws.join("suid-root")), 0o755, "the bit strip follows the chown");
    let shadow = std::fs::metadata("/etc/shadow").expect("stat shadow");
    assert_ne!(shadow.uid(), DEVELOPER.uid, "the symlink itself was changed, not its target");
    assert_eq!(std::fs::metadata(ws.join("developer-root-file")).expect("stat").uid(), 0, "not the sandbox's");
    assert!(fx.actions_for("rootfile").contains(&Action::ChangedOwner { old_uid: 0, old_gid: 0 }));
}

#[test]
fn a_new_repository_is_defused_and_quarantine_restores_on_request() {
    let mut fx = Fixture::new();
    fx.start();
    let ws = fx.ws();
    let mut sb = fx.sandbox();
    let git = ws.join("planted/.git");
    sb.run(&["mkdir", s(&git.join("objects"))]);
    sb.run(&["mkdir", s(&git.join("refs/heads"))]);
    sb.run(&["mkdir", s(&git.join("hooks"))]);
    sb.run(&["write", s(&git.join("HEAD")), "ref: refs/heads/main\\n"]);
    sb.run(&[
        "write",
        s(&git.join("config")),
        "[core]\\n\\tbare = false\\n\\tfsmonitor = /tmp/evil\\n\\tpager = evil\\n[alias]\\n\\tst = !evil\\n",
    ]);
    sb.run(&["write", s(&git.join("hooks/pre-commit")), "#!/bin/sh\\nevil\\n"]);
    // The guard may have quarantined the hook already (that race is the point).
    let _ = sb.try_run(&["chmod", s(&git.join("hooks/pre-commit")), "755"]);
    sb.run(&["write", s(&git.join("hooks/pre-push.sample")), "sample"]);
    sb.run(&["mkdir", s(&git.join("info"))]);
    sb.run(&["write", s(&git.join("info/attributes")), "* filter=evil\\n"]);
    sb.run(&["write", s(&git.join("commondir")), "../../elsewhere/.git\\n"]);
    // A bare repository anywhere, completed last (HEAD after config and hooks).
    let bare = ws.join("deep/bare.git");
    sb.run(&["mkdir", s(&bare.join("objects"))]);
    sb.run(&["mkdir", s(&bare.join("refs"))]);
    sb.run(&["mkdir", s(&bare.join("hooks"))]);
    sb.run(&["write", s(&bare.join("config")), "[core]\\n\\tbare = true\\n\\tsshCommand = evil\\n"]);
    sb.run(&["write", s(&bare.join("hooks/post-checkout")), "evil"]);
    sb.run(&["write", s(&bare.join("HEAD")), "ref: refs/heads/main\\n"]);
    // The developer's own repository (this process) is left alone by the events.
    std::fs::create_dir_all(ws.join("mine/.git/hooks")).expect("mkdir");
    std::fs::write(ws.join("mine/.git/hooks/pre-commit"), b"developer's hook").expect("write");
    std::fs::write(ws.join("mine/.git/config"), b"[core]\n\tpager = less\n").expect("write");
    // A gitdir: file leading outside.
    sb.run(&["mkdir", s(&ws.join("outside-pointer"))]);
    sb.run(&["write", s(&ws.join("outside-pointer/.git")), "gitdir: /etc\\n"]);
    fx.settle();
    assert_eq!(std::fs::read_to_string(git.join("config")).expect("config"), "[core]\n\tbare = false\n");
    assert!(!git.join("hooks/pre-commit").exists());
    assert!(git.join("hooks/pre-push.sample").exists(), "samples are never run by git");
    assert!(!git.join("info/attributes").exists());
    assert!(!git.join("commondir").exists());
    assert_eq!(std::fs::read_to_string(bare.join("config")).expect("config"), "[core]\n\tbare = true\n");
    assert!(!bare.join("hooks/post-checkout").exists());
    assert!(!ws.join("outside-pointer/.git").exists());
    assert!(ws.join("mine/.git/hooks/pre-commit").exists(), "the developer's own hook is not the sandbox's");
    assert_eq!(std::fs::read_to_string(ws.join("mine/.git/config")).expect("config"), "[core]\n\tpager = less\n");
    let filtered = fx.actions_for("planted/.git/config");
    assert!(
        filtered
            .iter()
            .any(|a| matches!(a, Action::FilteredGitConfig { dropped_keys } if dropped_keys.iter().any(|k| k == "core.fsmonitor"))),
        "{filtered:?}"
    );
    // The quarantine holds the originals, not executable.
    let records = guard::quarantine::list(&fx.config.quarantine_dir).expect("list");
    let hook = records.iter().rev().find(|r| r.path == Path::new("planted/.git/hooks/pre-commit")).expect("hook record");
    let content = fx.config.quarantine_dir.join(&hook.id).join("content");
    assert_eq!(std::fs::read_to_string(&content).expect("content"), "#!/bin/sh\nevil\n");
    assert_eq!(mode(&content) & 0o111, 0, "never executable in the quarantine");
    let config_record = records.iter().find(|r| r.path == Path::new("planted/.git/config")).expect("config record");
    assert!(std::fs::read_to_string(fx.config.quarantine_dir.join(&config_record.id).join("content")).expect("orig").contains("fsmonitor"));
    // Restore: refused while occupied, done when free, and then left alone by a sweep.
    let err = guard::quarantine::restore(&fx.config, &config_record.id).expect_err("occupied");
    assert!(err.to_string().contains("occupied"), "{err}");
    let restored = guard::quarantine::restore(&fx.config, &hook.id).expect("restore the hook");
    assert_eq!(restored.path, Path::new("planted/.git/hooks/pre-commit"));
    assert_eq!(std::fs::read_to_string(git.join("hooks/pre-commit")).expect("restored"), "#!/bin/sh\nevil\n");
    assert_eq!(std::fs::metadata(git.join("hooks/pre-commit")).expect("stat").uid(), DEVELOPER.uid);
    let report = guard::sweep(&fx.config).expect("sweep");
    assert!(git.join("hooks/pre-commit").exists(), "a restored hook survives the sweep: {:?}", report.neutralised);
    assert!(!ws.join("mine/.git/hooks/pre-commit").exists(), "a sweep cannot tell writers apart (documented)");
    assert!(guard::quarantine::restore(&fx.config, "no-such-id").is_err());
}

#[test]
fn the_common_git_dir_of_a_linked_worktree_workspace_is_guarded_too() {
    // The workspace is a linked worktree; its repository's common git dir
    // lies outside (here `main/.git`) and is bound read-write. Whatever the
    // sandbox plants there would run in the developer's main checkout.
    let mut fx = Fixture::new();
    let main_git = fx.base().join("main/.git");
    for dir in ["objects", "refs/heads", "hooks", "info", "worktrees/ws"] {
        std::fs::create_dir_all(main_git.join(dir)).expect("mkdir");
    }
    std::fs::write(main_git.join("HEAD"), b"ref: refs/heads/main\n").expect("HEAD");
    std::fs::write(main_git.join("config"), b"[core]\n\tpager = less\n").expect("config");
    std::fs::write(main_git.join("hooks/pre-commit"), b"developer's hook").expect("hook");
    std::fs::write(main_git.join("worktrees/ws/HEAD"), b"ref: refs/heads/wt\n").expect("HEAD");
    std::fs::write(main_git.join("worktrees/ws/commondir"), b"../..\n").expect("commondir");
    let back_link = format!("{}/.git\n", fx.ws().display());
    std::fs::write(main_git.join("worktrees/ws/gitdir"), &back_link).expect("gitdir");
    fx.config.roots.push(GuardRoot { label: "git-dir".into(), path: main_git.clone(), kind: RootKind::GitDir });
    // Git Sentry's read-only paths there are absolute.
    fx.config.protected =
        vec![main_git.join("config"), main_git.join("hooks"), main_git.join("info"), main_git.join("worktrees/ws/commondir")];
    fx.start();
    let mut sb = fx.sandbox();
    // A commondir in the main repository's own git dir: the host's git in
    // the main checkout would take its config from `evil`.
    sb.run(&["mkdir", s(&main_git.join("evil"))]);
    sb.run(&["write", s(&main_git.join("evil/config")), "[core]\\n\\tfsmonitor = evil\\n"]);
    sb.run(&["write", s(&main_git.join("commondir")), "evil\\n"]);
    // A new submodule gitdir with a hook and a config.
    let module = main_git.join("modules/sub");
    for dir in ["objects", "refs", "hooks"] {
        sb.run(&["mkdir", s(&module.join(dir))]);
    }
    sb.run(&["write", s(&module.join("config")), "[core]\\n\\tbare = false\\n\\tfsmonitor = evil\\n"]);
    sb.run(&["write", s(&module.join("hooks/post-checkout")), "evil"]);
    sb.run(&["write", s(&module.join("HEAD")), "ref: refs/heads/main\\n"]);
    // Another worktree's gitdir redirected, and this one's config.worktree.
    sb.run(&["mkdir", s(&main_git.join("worktrees/other"))]);
    sb.run(&["write", s(&main_git.join("worktrees/other/HEAD")), "ref: refs/heads/main\\n"]);
    sb.run(&["write", s(&main_git.join("worktrees/other/commondir")), "../../evil\\n"]);
    sb.run(&["write", s(&main_git.join("worktrees/ws/config.worktree")), "[core]\\n\\tfsmonitor = evil\\n"]);
    // A back-link that is not of the form git writes (`/work/tree/.git`),
    // in a worktree gitdir that is otherwise well-formed.
    sb.run(&["mkdir", s(&main_git.join("worktrees/third"))]);
    sb.run(&["write", s(&main_git.join("worktrees/third/gitdir")), "/home/someone/.bashrc\\n"]);
    sb.run(&["write", s(&main_git.join("worktrees/third/HEAD")), "ref: refs/heads/main\\n"]);
    sb.run(&["write", s(&main_git.join("worktrees/third/commondir")), "../..\\n"]);
    // Ordinary work: a new ref and a loose object.
    sb.run(&["write", s(&main_git.join("refs/heads/topic")), "0123456789012345678901234567890123456789\\n"]);
    sb.run(&["mkdir", s(&main_git.join("objects/ab"))]);
    sb.run(&["write", s(&main_git.join("objects/ab/cdef")), "object"]);
    fx.settle();
    assert!(!main_git.join("commondir").exists(), "{:?}", fx.neutralised());
    assert_eq!(std::fs::read_to_string(module.join("config")).expect("config"), "[core]\n\tbare = false\n");
    assert!(!module.join("hooks/post-checkout").exists());
    assert!(!main_git.join("worktrees/other/commondir").exists());
    assert!(!main_git.join("worktrees/third/gitdir").exists());
    assert!(main_git.join("worktrees/third/commondir").exists(), "git's own commondir of a worktree is kept");
    assert_eq!(std::fs::read_to_string(main_git.join("worktrees/ws/config.worktree")).expect("config.worktree"), "");
    let labelled: Vec<_> = fx.neutralised().into_iter().filter(|n| n.root == "git-dir" && n.path == Path::new("commondir")).collect();
    assert!(labelled.iter().any(|n| n.action == Action::Quarantined), "{labelled:?}");
    // The developer's own files and the worktree's real links are left.
    let untouched = |rel: &str, content: &str| assert_eq!(std::fs::read_to_string(main_git.join(rel)).expect(rel), content, "{rel}");
    untouched("config", "[core]\n\tpager = less\n");
    untouched("hooks/pre-commit", "developer's hook");
    untouched("worktrees/ws/commondir", "../..\n");
    untouched("worktrees/ws/gitdir", &back_link);
    untouched("refs/heads/topic", "0123456789012345678901234567890123456789\n");
    untouched("objects/ab/cdef", "object");
    // A sweep (no writer known) keeps the developer's back-links, which
    // name work trees outside this root, and the main repository's own
    // files even when the protected list was lost (crash recovery).
    let report = guard::sweep(&GuardConfig { protected: Vec::new(), changed_since: None, ..fx.config.clone() }).expect("sweep");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    untouched("config", "[core]\n\tpager = less\n");
    untouched("hooks/pre-commit", "developer's hook");
    untouched("worktrees/ws/gitdir", &back_link);
    untouched("worktrees/ws/commondir", "../..\n");
    assert!(fx.errors().is_empty(), "{:?}", fx.errors());
}

#[test]
fn repositories_in_a_volume_are_guarded_and_the_developers_own_files_left() {
    // A writable volume holding the developer's repository: Git Sentry
    // protects nothing there, so the agent can write its hooks and config.
    let mut fx = Fixture::new();
    let vol = fx.base().join("vol");
    let repo = vol.join("repo/.git");
    for dir in ["objects", "refs/heads", "hooks"] {
        std::fs::create_dir_all(repo.join(dir)).expect("mkdir");
    }
    std::fs::write(repo.join("HEAD"), b"ref: refs/heads/main\n").expect("HEAD");
    std::fs::write(repo.join("config"), b"[core]\n\tfsmonitor = mine\n").expect("config");
    std::fs::write(repo.join("hooks/pre-commit"), b"developer's hook").expect("hook");
    // The developer's linked worktree in the volume (its gitdir elsewhere).
    std::fs::create_dir_all(vol.join("wt")).expect("mkdir");
    std::fs::write(vol.join("wt/.git"), b"gitdir: /home/d/main/.git/worktrees/wt\n").expect(".git");
    std::thread::sleep(std::time::Duration::from_millis(20));
    fx.config.changed_since = Some(std::time::SystemTime::now());
    fx.config.roots.push(GuardRoot { label: "volume:/work/vol".into(), path: vol.clone(), kind: RootKind::Volume });
    fx.start();
    let mut sb = fx.sandbox();
    sb.run(&["write", s(&repo.join("hooks/pre-push")), "evil"]);
    sb.run(&["append-and-keep-open", s(&repo.join("config")), "\\tpager = evil\\n"]);
    fx.settle();
    assert!(!repo.join("hooks/pre-push").exists(), "{:?}", fx.neutralised());
    assert_eq!(
        std::fs::read_to_string(repo.join("config")).expect("config"),
        "",
        "the config the agent changed is filtered (the developer's key with it)"
    );
    // The developer's untouched files survive a sweep.
    let report = guard::sweep(&fx.config).expect("sweep");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(std::fs::read_to_string(repo.join("hooks/pre-commit")).expect("hook"), "developer's hook");
    assert!(vol.join("wt/.git").exists(), "the developer's worktree link in the volume: {:?}", report.neutralised);
    // Without a start time (everything counts as changed) the same sweep
    // does check them: the rule is the start time, not the root.
    let report = guard::sweep(&GuardConfig { changed_since: None, ..fx.config.clone() }).expect("sweep");
    assert!(!repo.join("hooks/pre-commit").exists(), "{:?}", report.neutralised);
    assert!(fx.errors().is_empty(), "{:?}", fx.errors());
}

#[test]
fn a_rebase_left_in_progress_loses_its_exec_steps_at_the_sweep() {
    // `git rebase --continue` on the host runs the todo list's exec steps;
    // the sandbox may leave one planted. The developer's own rebase (older
    // than the Domain) keeps its steps.
    let mut fx = Fixture::new();
    let ws = fx.ws();
    for repo in ["mine", "planted"] {
        for dir in ["objects", "refs", "rebase-merge"] {
            std::fs::create_dir_all(ws.join(repo).join(".git").join(dir)).expect("mkdir");
        }
        std::fs::write(ws.join(repo).join(".git/HEAD"), b"ref: refs/heads/main\n").expect("HEAD");
    }
    std::fs::write(ws.join("mine/.git/rebase-merge/git-rebase-todo"), b"pick 1 a\nexec cargo test\n").expect("todo");
    std::thread::sleep(std::time::Duration::from_millis(20));
    fx.config.changed_since = Some(std::time::SystemTime::now());
    fx.start();
    let mut sb = fx.sandbox();
    let todo = ws.join("planted/.git/rebase-merge/git-rebase-todo");
    sb.run(&["write", s(&todo), "pick 2 b\\nexec touch /tmp/evil\\n"]);
    // The agent can learn the guard's pid (it polls the directory while a
    // filter runs) and make the temporary file's name first, if it can
    // guess it: the todo must be rewritten all the same.
    let guessed = ws.join(format!("planted/.git/rebase-merge/.lazaret-guard-{}-state", std::process::id()));
    sb.run(&["write", s(&guessed), "mine\\n"]);
    fx.settle();
    assert_eq!(
        std::fs::read_to_string(&todo).expect("todo"),
        "pick 2 b\nexec touch /tmp/evil\n",
        "events leave the sandbox's own rebase alone"
    );
    let report = guard::sweep(&fx.config).expect("sweep");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        std::fs::read_to_string(&todo).expect("todo"),
        "pick 2 b\n# disabled by Lazaret (an exec step the sandbox left): exec touch /tmp/evil\n"
    );
    let disabled: Vec<_> = report.neutralised.iter().filter(|n| n.path == Path::new("planted/.git/rebase-merge/git-rebase-todo")).collect();
    assert!(
        disabled
            .iter()
            .any(|n| n.action == Action::DisabledRebaseExec { commands: vec!["touch /tmp/evil".into()] } && n.quarantine_id.is_some()),
        "{:?}",
        report.neutralised
    );
    assert_eq!(std::fs::read_to_string(ws.join("mine/.git/rebase-merge/git-rebase-todo")).expect("todo"), "pick 1 a\nexec cargo test\n");
}

#[test]
fn git_dirs_places_and_hooks_are_judged_by_the_model_of_git() {
    // Issue 32: what git itself takes for a git dir, a hook or a place.
    let mut fx = Fixture::new();
    fx.config.host_hooks_paths = vec![".githooks".into()];
    // The developer's own repository borrowing objects from outside.
    std::fs::create_dir_all(fx.ws().join("mine/.git/objects/info")).expect("mkdir");
    std::fs::create_dir_all(fx.ws().join("mine/.git/refs")).expect("mkdir");
    std::fs::write(fx.ws().join("mine/.git/objects/info/alternates"), b"/srv/cache/objects\n").expect("write");
    std::thread::sleep(std::time::Duration::from_millis(20));
    fx.config.changed_since = Some(std::time::SystemTime::now());
    fx.start();
    let ws = fx.ws();
    let mut sb = fx.sandbox();
    let fsmonitor = "[core]\\n\\tfsmonitor = touch /tmp/evil\\n";
    // A bare repository whose objects and refs are symlinks.
    for dir in ["b1/store/objects", "b1/store/refs", "b1/bare"] {
        sb.run(&["mkdir", s(&ws.join(dir))]);
    }
    sb.run(&["symlink", "../store/objects", s(&ws.join("b1/bare/objects"))]);
    sb.run(&["symlink", "../store/refs", s(&ws.join("b1/bare/refs"))]);
    sb.run(&["write", s(&ws.join("b1/bare/config")), fsmonitor]);
    // A common dir without HEAD behind a linked worktree's gitdir.
    for dir in ["c1/common/worktrees/w", "c1/common/objects", "c1/common/refs", "c1/common/hooks"] {
        sb.run(&["mkdir", s(&ws.join(dir))]);
    }
    sb.run(&["write", s(&ws.join("c1/common/worktrees/w/HEAD")), "ref: refs/heads/main\\n"]);
    sb.run(&["write", s(&ws.join("c1/common/worktrees/w/commondir")), "../..\\n"]);
    sb.run(&["write", s(&ws.join("c1/common/config")), fsmonitor]);
    sb.run(&["write", s(&ws.join("c1/common/hooks/pre-commit")), "#!/bin/sh\\n"]);
    // Alternates: outside (quarantined), inside (kept); a symlink out.
    for dir in ["p/.git/objects/info", "p/.git/refs", "q/.git/objects/info", "q/.git/refs"] {
        sb.run(&["mkdir", s(&ws.join(dir))]);
    }
    sb.run(&["write", s(&ws.join("p/.git/objects/info/alternates")), "/home/dev/private/.git/objects\\n"]);
    sb.run(&["write", s(&ws.join("q/.git/objects/info/alternates")), "../../../p/.git/objects\\n"]);
    sb.run(&["symlink", "/home/dev/private/.git/refs", s(&ws.join("q/.git/packed-refs"))]);
    // A remote defined by a file (git fetches from it when the config has no URL).
    for dir in ["t/.git/objects", "t/.git/refs", "t/.git/branches"] {
        sb.run(&["mkdir", s(&ws.join(dir))]);
    }
    sb.run(&["write", s(&ws.join("t/.git/branches/origin")), "/home/dev/private\\n"]);
    // A symlink in a git dir whose text stays inside, through a symlink out.
    sb.run(&["mkdir", s(&ws.join("h/.git/refs"))]);
    sb.run(&["symlink", "/home/dev/private/.git/objects", s(&ws.join("lnk"))]);
    sb.run(&["symlink", "../../lnk", s(&ws.join("h/.git/objects"))]);
    // Hooks at the developer's own relative core.hooksPath.
    sb.run(&["mkdir", s(&ws.join("n/.githooks"))]);
    sb.run(&["write", s(&ws.join("n/.githooks/pre-commit")), "#!/bin/sh\\n"]);
    sb.run(&["write", s(&ws.join("n/.githooks/README")), "notes\\n"]);
    // A cherry-pick left in progress with a strategy that is a path.
    for dir in ["r/.git/objects", "r/.git/refs", "r/.git/sequencer"] {
        sb.run(&["mkdir", s(&ws.join(dir))]);
    }
    sb.run(&["write", s(&ws.join("r/.git/sequencer/opts")), "[options]\\n\\tsignoff = true\\n\\tstrategy = ../../x\\n"]);
    fx.settle();
    for config in ["b1/bare/config", "c1/common/config"] {
        assert!(!std::fs::read_to_string(ws.join(config)).expect("config").contains("fsmonitor"), "{config} kept core.fsmonitor");
    }
    for gone in [
        "c1/common/hooks/pre-commit",
        "p/.git/objects/info/alternates",
        "q/.git/packed-refs",
        "h/.git/objects",
        "t/.git/branches/origin",
        "n/.githooks/pre-commit",
    ] {
        assert!(std::fs::symlink_metadata(ws.join(gone)).is_err(), "{gone} is still there");
    }
    for kept in ["q/.git/objects/info/alternates", "n/.githooks/README"] {
        assert!(ws.join(kept).exists(), "{kept} was taken away");
    }
    let opts = ws.join("r/.git/sequencer/opts");
    assert!(std::fs::read_to_string(&opts).expect("opts").contains("strategy"), "events leave the sandbox's own operation alone");
    let report = guard::sweep(&fx.config).expect("sweep");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(std::fs::read_to_string(&opts).expect("opts"), "[options]\n\tsignoff = true\n");
    assert!(ws.join("mine/.git/objects/info/alternates").exists(), "the developer's own alternates (older than the run) stay");
    assert!(fx.errors().is_empty(), "{:?}", fx.errors());
}

#[test]
fn a_symlink_made_later_where_a_kept_value_leads_is_judged_again() {
    // A value judged before the path it names existed (or was a
    // directory) must not lead elsewhere once the agent puts a symlink
    // there: git would follow it.
    let mut fx = Fixture::new();
    fx.config.changed_since = Some(std::time::SystemTime::now());
    fx.start();
    let ws = fx.ws();
    let mut sb = fx.sandbox();
    for dir in ["r/.git/objects", "r/.git/refs"] {
        sb.run(&["mkdir", s(&ws.join(dir))]);
    }
    let config = ws.join("r/.git/config");
    let url = format!("{}/sub/repo", ws.display());
    sb.run(&["write", s(&config), &format!("[remote \"o\"]\\n\\turl = {url}\\n")]);
    fx.settle();
    assert!(std::fs::read_to_string(&config).expect("config").contains(&url), "a place inside is kept");
    sb.run(&["symlink", "/home/dev/private", s(&ws.join("sub"))]);
    fx.settle();
    assert!(!std::fs::read_to_string(&config).expect("config").contains(&url), "the url now leads through a symlink out");
    assert!(fx.errors().is_empty(), "{:?}", fx.errors());
}

#[test]
fn renaming_a_prepared_tree_into_the_workspace_is_caught() {
    let mut fx = Fixture::new();
    fx.start();
    let ws = fx.ws();
    let staging = fx.base().join("staging"); // outside every root
    let mut sb = fx.sandbox();
    sb.run(&["mkdir", s(&staging.join("tree/nested/.git/hooks"))]);
    sb.run(&["mkdir", s(&staging.join("tree/nested/.git/objects"))]);
    sb.run(&["write", s(&staging.join("tree/nested/.git/HEAD")), "ref: refs/heads/main\\n"]);
    sb.run(&["write", s(&staging.join("tree/nested/.git/config")), "[core]\\n\\thooksPath = /tmp\\n"]);
    sb.run(&["write", s(&staging.join("tree/nested/.git/hooks/post-merge")), "evil"]);
    sb.run(&["mkdir", s(&staging.join("tree/bin"))]);
    sb.run(&["write", s(&staging.join("tree/bin/tool")), "x"]);
    sb.run(&["chmod", s(&staging.join("tree/bin/tool")), "4755"]);
    sb.run(&["write", s(&staging.join("hook")), "evil"]);
    sb.run(&["mkdir", s(&ws.join("repo/.git/hooks"))]);
    fx.settle();
    let touched: Vec<_> = fx.neutralised().into_iter().filter(|n| !n.path.starts_with("repo")).collect();
    assert!(touched.is_empty(), "nothing outside the roots is touched: {touched:?}");
    assert_eq!(mode(&staging.join("tree/bin/tool")), 0o4755);
    sb.run(&["rename", s(&staging.join("tree")), s(&ws.join("tree"))]);
    sb.run(&["rename", s(&staging.join("hook")), s(&ws.join("repo/.git/hooks/pre-commit"))]);
    fx.settle();
    assert_eq!(mode(&ws.join("tree/bin/tool")), 0o755);
    assert_eq!(std::fs::read_to_string(ws.join("tree/nested/.git/config")).expect("config"), "");
    assert!(!ws.join("tree/nested/.git/hooks/post-merge").exists());
    assert!(!ws.join("repo/.git/hooks/pre-commit").exists());
}

#[test]
fn symlink_swaps_never_make_the_guard_touch_anything_outside() {
    let mut fx = Fixture::new();
    fx.start();
    let ws = fx.ws();
    let outside = fx.base().join("outside");
    std::fs::create_dir(&outside).expect("mkdir outside");
    std::fs::write(outside.join("sentinel"), b"x").expect("write");
    std::os::unix::fs::chown(outside.join("sentinel"), Some(4321), Some(4321)).expect("chown");
    std::fs::set_permissions(outside.join("sentinel"), std::fs::Permissions::from_mode(0o4755)).expect("chmod");
    std::fs::write(ws.join("placeholder"), b"x").expect("write");
    std::fs::create_dir(ws.join("a")).expect("mkdir a");
    std::fs::write(ws.join("a/sentinel"), b"x").expect("write");
    std::os::unix::fs::symlink(&outside, ws.join("decoy")).expect("symlink");
    let mut swapper = fx.sandbox();
    let mut planter = fx.sandbox();
    let swap = std::thread::spawn({
        let (a, decoy) = (ws.join("a"), ws.join("decoy"));
        move || {
            swapper.run(&["swap", s(&a), s(&decoy), "20000"]);
            swapper
        }
    });
    planter.run(&["plant", s(&ws.join("a")), "2000"]);
    let _swapper = swap.join().expect("swapper");
    fx.settle();
    let sentinel = std::fs::metadata(outside.join("sentinel")).expect("stat");
    assert_eq!(sentinel.mode() & 0o7777, 0o4755, "outside file's bits untouched");
    assert_eq!((sentinel.uid(), sentinel.gid()), (4321, 4321), "the guard did not chown the outside file");
    for n in fx.neutralised() {
        let full = ws.join(&n.path);
        assert!(!full.starts_with(&outside), "{n:?}");
    }
    // Nothing setuid is left inside the workspace (walking without following links).
    let report = guard::sweep(&GuardConfig { changed_since: None, ..fx.config.clone() }).expect("sweep");
    let leftover: Vec<_> = report.neutralised.iter().filter(|n| matches!(n.action, Action::ClearedPrivilegeBits { .. })).collect();
    assert!(leftover.is_empty(), "the event stream missed {leftover:?}");
    // Files planted outside through the symlink keep their bits.
    let outside_setuid =
        std::fs::read_dir(&outside).expect("ls").flatten().filter(|e| e.metadata().is_ok_and(|m| m.mode() & 0o4000 != 0)).count();
    assert!(outside_setuid >= 1);
}

#[test]
fn sweep_covers_what_the_events_did_not_see() {
    let fx = Fixture::new();
    let ws = fx.ws();
    std::fs::create_dir_all(ws.join("a/.git/hooks")).expect("mkdir");
    std::fs::create_dir_all(ws.join(".git/hooks")).expect("mkdir");
    std::fs::write(ws.join(".git/hooks/pre-commit"), b"developer's own").expect("write");
    std::fs::write(ws.join(".git/config"), b"[core]\n\thooksPath = mine\n").expect("write");
    std::fs::write(ws.join("a/.git/config"), b"[core]\n\tfsmonitor = evil\n").expect("write");
    std::fs::write(ws.join("a/.git/hooks/pre-commit"), b"evil").expect("write");
    std::fs::write(ws.join("a/.git/hooks/update.sample"), b"sample").expect("write");
    std::fs::write(ws.join("old-suid"), b"x").expect("write");
    std::fs::set_permissions(ws.join("old-suid"), std::fs::Permissions::from_mode(0o4755)).expect("chmod");
    std::os::unix::fs::symlink("/etc", ws.join("etc-link")).expect("symlink");
    let mut config = GuardConfig {
        protected: vec![PathBuf::from(".git/config"), PathBuf::from(".git/hooks")],
        changed_since: Some(std::time::SystemTime::now() + std::time::Duration::from_secs(3600)),
        ..fx.config.clone()
    };
    let report = guard::sweep(&config).expect("sweep");
    assert_eq!(mode(&ws.join("old-suid")), 0o4755, "older than the Domain: left");
    assert_eq!(std::fs::read_to_string(ws.join("a/.git/config")).expect("config"), "", "git control is always checked");
    assert!(!ws.join("a/.git/hooks/pre-commit").exists());
    assert!(ws.join("a/.git/hooks/update.sample").exists());
    assert!(ws.join(".git/hooks/pre-commit").exists(), "Git Sentry's protected files are not touched");
    assert_eq!(std::fs::read_to_string(ws.join(".git/config")).expect("config"), "[core]\n\thooksPath = mine\n");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    config.changed_since = None;
    let report = guard::sweep(&config).expect("sweep");
    assert_eq!(mode(&ws.join("old-suid")), 0o755);
    assert!(report.neutralised.iter().any(|n| n.path == Path::new("old-suid")));
    assert!(report.entries_seen >= 8);
    assert!(std::fs::metadata("/etc").expect("etc").uid() == 0, "the symlinked /etc was not chowned");
}

#[test]
fn ordinary_git_work_inside_survives_the_guard() {
    let mut fx = Fixture::new();
    // Every process but this one counts as the sandbox: git runs as this
    // process's children, so its writes are the sandbox's.
    fx.trust_all_but_self = true;
    fx.start();
    let ws = fx.ws();
    let scratch = fx.base().join("scratch");
    std::fs::create_dir(&scratch).expect("mkdir");
    // The upstream below is the "developer's" once the guard chowned it:
    // every git here (submodule clones too) must accept it.
    std::fs::write(scratch.join(".gitconfig"), "[safe]\n\tdirectory = *\n").expect("write");
    let git = |cwd: &Path, args: &[&str]| {
        let out = Command::new("git")
            .current_dir(cwd)
            .env("HOME", &scratch)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "init.defaultBranch=main"])
            .args(["-c", "protocol.file.allow=always", "-c", "safe.directory=*"])
            .args(args)
            .output()
            .expect("git is needed by this test");
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The upstream is in the workspace: a remote outside it is a place the
    // guard drops (a host path or a network URL the agent named).
    let upstream = ws.join("up");
    std::fs::create_dir(&upstream).expect("mkdir");
    git(&upstream, &["init", "-q", "lib"]);
    std::fs::write(upstream.join("lib/f"), b"lib").expect("write");
    git(&upstream.join("lib"), &["add", "f"]);
    git(&upstream.join("lib"), &["commit", "-qm", "lib"]);
    let proj = ws.join("proj");
    git(&ws, &["init", "-q", "proj"]);
    std::fs::write(proj.join("f"), b"one\n").expect("write");
    git(&proj, &["add", "f"]);
    git(&proj, &["commit", "-qm", "one"]);
    git(&proj, &["branch", "side"]);
    std::fs::write(proj.join("f"), b"two\n").expect("write");
    git(&proj, &["stash", "-q"]);
    git(&proj, &["stash", "pop", "-q"]);
    git(&proj, &["commit", "-qam", "two"]);
    git(&proj, &["checkout", "-q", "side"]);
    std::fs::write(proj.join("g"), b"side\n").expect("write");
    git(&proj, &["add", "g"]);
    git(&proj, &["commit", "-qm", "side"]);
    git(&proj, &["rebase", "-q", "main"]);
    git(&proj, &["submodule", "add", "-q", s(&upstream.join("lib")), "lib"]);
    git(&proj, &["commit", "-qm", "sub"]);
    git(&proj, &["submodule", "update", "--init", "-q"]);
    git(&proj, &["worktree", "add", "-q", s(&ws.join("wt")), "main"]);
    git(&ws, &["clone", "-q", s(&upstream.join("lib")), "nested-clone"]);
    fx.settle();
    git(&proj, &["status", "--short"]);
    git(&ws.join("wt"), &["status", "--short"]);
    git(&proj.join("lib"), &["log", "--oneline"]);
    assert!(git(&proj, &["submodule", "status"]).contains("lib"));
    assert!(git(&ws.join("nested-clone"), &["remote", "-v"]).contains("origin"));
    assert!(git(&proj, &["worktree", "list"]).contains("wt"));
    assert!(
        fx.neutralised().iter().any(|n| n.path == Path::new("proj/.git/modules/lib/config")),
        "the guard saw the submodule's config (its owner was fixed)"
    );
    let unexpected: Vec<_> = fx.neutralised().into_iter().filter(|n| !matches!(n.action, Action::ChangedOwner { .. })).collect();
    assert!(unexpected.is_empty(), "ordinary repositories need no neutralisation: {unexpected:?}");
    assert!(fx.errors().is_empty(), "{:?}", fx.errors());
}

#[test]
fn a_config_written_through_a_descriptor_kept_open_is_caught() {
    let mut fx = Fixture::new();
    fx.start();
    let ws = fx.ws();
    let mut sb = fx.sandbox();
    let git = ws.join("r/.git");
    sb.run(&["mkdir", s(&git.join("objects"))]);
    sb.run(&["mkdir", s(&git.join("refs"))]);
    sb.run(&["write", s(&git.join("HEAD")), "ref: refs/heads/main\\n"]);
    sb.run(&["write", s(&git.join("config")), "[core]\\n\\tbare = false\\n"]);
    fx.settle();
    assert!(
        !fx.actions_for("r/.git/config").iter().any(|a| matches!(a, Action::FilteredGitConfig { .. })),
        "an allowlisted config is left as it is: {:?}",
        fx.neutralised()
    );
    sb.run(&["append-and-keep-open", s(&git.join("config")), "\\tfsmonitor = evil\\n"]);
    fx.settle();
    assert_eq!(std::fs::read_to_string(git.join("config")).expect("config"), "[core]\n\tbare = false\n");
    assert!(fx.actions_for("r/.git/config").iter().any(|a| matches!(a, Action::FilteredGitConfig { .. })));
}

#[test]
fn a_tmpfs_root_is_watched_too() {
    common::in_private_mount_ns(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).expect("mkdir");
        nix::mount::mount(Some("tmpfs"), &mount, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=16m")).expect("mount tmpfs");
        let mut fx = Fixture::new();
        fx.config.roots.push(GuardRoot { label: "volume:tmp".into(), path: mount.clone(), kind: RootKind::Volume });
        fx.start();
        let mut sb = fx.sandbox();
        sb.run(&["write", s(&mount.join("suid")), "x"]);
        sb.run(&["chmod", s(&mount.join("suid")), "4755"]);
        sb.run(&["mkdir", s(&mount.join("d"))]);
        sb.run(&["write", s(&mount.join("d/capped")), "x"]);
        let cap = sb.try_run(&["setcap", s(&mount.join("d/capped"))]);
        sb.run(&["mkdir", s(&mount.join("staging/inner"))]);
        sb.run(&["write", s(&mount.join("staging/inner/tool")), "x"]);
        sb.run(&["chmod", s(&mount.join("staging/inner/tool")), "4755"]);
        fx.settle();
        // Renamed within the tmpfs root (FAN_MOVED_TO of a directory).
        sb.run(&["rename", s(&mount.join("staging/inner")), s(&mount.join("moved"))]);
        std::fs::set_permissions(mount.join("moved/tool"), std::fs::Permissions::from_mode(0o4755)).expect("developer chmod");
        sb.run(&["rename", s(&mount.join("moved")), s(&mount.join("moved-again"))]);
        fx.settle();
        assert_eq!(mode(&mount.join("moved-again/tool")), 0o755, "the renamed-in directory was walked");
        assert_eq!(mode(&mount.join("suid")), 0o755);
        assert!(fx.neutralised().iter().any(|n| n.root == "volume:tmp" && n.path == Path::new("suid")));
        assert_eq!(std::fs::metadata(mount.join("d")).expect("stat").uid(), DEVELOPER.uid);
        if cap.is_ok() {
            assert!(!has_cap(&mount.join("d/capped")));
        }
        drop(fx);
        nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH).expect("umount");
    });
}

/// Figures for the report, not a speed assertion: run with
/// `cargo test -p lazaret-mounts --test guard cost_figures -- --ignored --nocapture`.
#[test]
#[ignore = "prints timings; run on demand"]
fn cost_figures() {
    // Developer = the helper's uid (root) models a non-root agent (nothing
    // to chown); DEVELOPER models a root agent (every file chowned).
    for (case, developer) in [("agent = developer", Owner { uid: 0, gid: 0 }), ("root agent", DEVELOPER)] {
        cost_case(case, developer);
    }
}

fn cost_case(case: &str, developer: Owner) {
    const FILES: usize = 20_000;
    let mut fx = Fixture::new();
    fx.config.developer = developer;
    let ws = fx.ws();
    let mut sb = fx.sandbox();
    let started = std::time::Instant::now();
    sb.run(&["many", s(&ws.join("baseline")), &FILES.to_string()]);
    let baseline = started.elapsed();
    fx.start();
    let started = std::time::Instant::now();
    sb.run(&["many", s(&ws.join("guarded")), &FILES.to_string()]);
    let written = started.elapsed();
    fx.settle();
    let guarded = started.elapsed();
    println!("[{case}] {FILES} files by the sandbox: {baseline:?} without guard, {written:?} with (writer), {guarded:?} until settled");
    println!("[{case}] events handled: {:.0} files/s ({} neutralisations)", FILES as f64 / guarded.as_secs_f64(), fx.neutralised().len());
    drop(fx.guard.take());
    for (label, since) in [
        ("everything", None),
        ("git only (nothing changed since)", Some(std::time::SystemTime::now() + std::time::Duration::from_secs(3600))),
    ] {
        let config = GuardConfig { changed_since: since, ..fx.config.clone() };
        let report = guard::sweep(&config).expect("sweep");
        println!(
            "[{case}] sweep of {} entries ({label}): {:?}, {} neutralisations",
            report.entries_seen,
            report.duration,
            report.neutralised.len()
        );
    }
}

/// The gate: while the sandbox rewrites a new repository's config with
/// `core.fsmonitor` in a loop (in place, or by renaming prepared git dirs
/// into place), a host process reading that config never gets the
/// agent's version; with the gate off the same loop is read. On a tmpfs
/// in a private mount namespace, so that only this test's processes are
/// gated.
#[test]
fn the_gate_keeps_host_opens_from_a_config_the_guard_has_not_judged() {
    for renamed in [false, true] {
        for gated in [true, false] {
            let (leaked, reads, refused) = gate_race(gated, renamed);
            eprintln!("gate {gated}, renamed {renamed}: {reads} host reads, {leaked} saw the agent's config, {refused} refused");
            if gated {
                assert_eq!(leaked, 0, "with the gate, no host read sees the unjudged config ({reads} reads, renamed {renamed})");
            } else {
                assert!(leaked > 0, "without the gate the race is won at least once in {reads} reads (the test can fail)");
            }
        }
    }
}

/// One race of [`the_gate_keeps_host_opens_from_a_config_the_guard_has_not_judged`]:
/// (host reads that saw the agent's config, host reads, refused reads).
fn gate_race(gated: bool, renamed: bool) -> (usize, usize, usize) {
    common::in_private_mount_ns(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().canonicalize().expect("canonical");
        let mount = base.join("mnt");
        std::fs::create_dir(&mount).expect("mkdir");
        nix::mount::mount(Some("tmpfs"), &mount, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=16m")).expect("mount tmpfs");
        std::os::unix::fs::chown(&mount, Some(DEVELOPER.uid), Some(DEVELOPER.gid)).expect("chown the tmpfs");
        let mut fx = Fixture::new();
        fx.config.roots[0].path = mount.clone();
        fx.config.changed_since = Some(std::time::SystemTime::now());
        fx.config.gate = gated.then(guard::GateConfig::default);
        fx.start();
        let mut sb = Sandbox::spawn_through_own_mount(&mount);
        fx.pids.lock().expect("pids").insert(sb.pid());
        let git_dir = mount.join("tools/.git");
        for d in ["objects", "refs"] {
            sb.run(&["mkdir", s(&git_dir.join(d))]);
        }
        sb.run(&["write", s(&git_dir.join("HEAD")), "ref: refs/heads/main\\n"]);
        let evil = "[core]\\n\\tfsmonitor = agent-command\\n";
        let loop_args: Vec<String> = if renamed {
            let stage = mount.join("stage");
            sb.run(&["mkdir", s(&stage)]);
            sb.run(&["write", s(&stage.join("HEAD")), "ref: refs/heads/main\\n"]);
            ["swap-inject", s(&stage), s(&git_dir), evil, "3000"].map(str::to_owned).to_vec()
        } else {
            ["rewrite-loop", s(&git_dir.join("config")), evil, "3000"].map(str::to_owned).to_vec()
        };
        // The host reads while the sandbox writes (another thread drives it).
        let writer = std::thread::spawn(move || {
            sb.run(&loop_args.iter().map(String::as_str).collect::<Vec<_>>());
            sb
        });
        let (mut leaked, mut reads, mut refused) = (0, 0, 0);
        let until = std::time::Instant::now() + std::time::Duration::from_millis(2500);
        while std::time::Instant::now() < until {
            let out = Command::new("cat").arg(git_dir.join("config")).output().expect("cat");
            reads += 1;
            if out.status.success() {
                leaked += usize::from(String::from_utf8_lossy(&out.stdout).contains("fsmonitor"));
            } else {
                refused += 1;
            }
        }
        drop(writer.join().expect("writer"));
        if gated && !renamed {
            let st = std::fs::metadata(git_dir.join("config")).expect("the config");
            assert_eq!((st.uid(), st.mode() & 0o7777), (0, 0o444), "what the host reads is the guard's sealed copy");
        }
        drop(fx);
        if gated && !renamed {
            let st = std::fs::metadata(git_dir.join("config")).expect("the config");
            assert_eq!((st.uid(), st.mode() & 0o7777), (DEVELOPER.uid, 0o644), "the guard's stop gives the sealed copy back");
        }
        nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH).expect("umount");
        (leaked, reads, refused)
    })
}

/// A tmpfs in a private mount namespace with a gated guard on it (only
/// this test's processes are gated): `prep` fills it as the developer's
/// (before the run), then `body` gets the fixture, the mount and the
/// sandbox.
fn gated_tmpfs<R: Send>(
    prep: impl FnOnce(&Path) + Send,
    configure: impl FnOnce(&mut guard::GuardConfig) + Send,
    body: impl FnOnce(&mut Fixture, &Path, Sandbox) -> R + Send,
) -> R {
    common::in_private_mount_ns(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let mount = dir.path().canonicalize().expect("canonical").join("mnt");
        std::fs::create_dir(&mount).expect("mkdir");
        nix::mount::mount(Some("tmpfs"), &mount, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=256m")).expect("mount tmpfs");
        prep(&mount);
        let chowned = Command::new("chown").arg("-R").arg(format!("{}:{}", DEVELOPER.uid, DEVELOPER.gid)).arg(&mount).status();
        assert!(chowned.expect("chown").success(), "chown the tmpfs");
        // ctimes of the developer's files are then before the run's start.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut fx = Fixture::new();
        fx.config.roots[0].path = mount.clone();
        fx.config.changed_since = Some(std::time::SystemTime::now());
        fx.config.gate = Some(guard::GateConfig::default());
        configure(&mut fx.config);
        fx.start();
        let sb = Sandbox::spawn_through_own_mount(&mount);
        fx.pids.lock().expect("pids").insert(sb.pid());
        let result = body(&mut fx, &mount, sb);
        drop(fx);
        nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH).expect("umount");
        result
    })
}

/// Runs `script` with `sh` in `dir` as the host would, for `millis` ms:
/// (runs, runs whose output holds `needle`, runs that failed).
fn host_loop(dir: &Path, script: &str, needle: &str, millis: u64) -> (usize, usize, usize) {
    let (mut runs, mut seen, mut failed) = (0, 0, 0);
    let until = std::time::Instant::now() + std::time::Duration::from_millis(millis);
    while std::time::Instant::now() < until {
        let out = Command::new("sh").arg("-c").arg(script).current_dir(dir).output().expect("sh");
        runs += 1;
        seen += usize::from(String::from_utf8_lossy(&out.stdout).contains(needle));
        failed += usize::from(!out.status.success());
    }
    (runs, seen, failed)
}

/// [`host_loop`] while the sandbox runs its helper command `args` on
/// another thread (the sandbox ends with it).
fn host_loop_while_sandbox_runs(
    mut sb: Sandbox,
    args: &[&str],
    dir: &Path,
    script: &str,
    needle: &str,
    millis: u64,
) -> (usize, usize, usize) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let writer = std::thread::spawn(move || {
        sb.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        sb
    });
    let result = host_loop(dir, script, needle, millis);
    drop(writer.join().expect("writer"));
    result
}

/// A gitfile's target whose `refs` the sandbox takes away and puts back
/// while it renames configs in: the gate judges its config as a git dir's
/// even at a moment when the marks are not all there (the host's git saw
/// them a moment before). Found by review: 9 of 34 host `git status`
/// runs ran the agent's fsmonitor.
#[test]
fn the_gate_judges_a_config_whose_git_dir_marks_come_and_go() {
    gated_tmpfs(
        |_| {},
        |_| {},
        |_fx, mount, mut sb| {
            let git_dir = mount.join("gd");
            for d in ["objects", "refs"] {
                sb.run(&["mkdir", s(&git_dir.join(d))]);
            }
            sb.run(&["write", s(&git_dir.join("HEAD")), "ref: refs/heads/main\\n"]);
            sb.run(&["mkdir", s(&mount.join("tools"))]);
            sb.run(&["write", s(&mount.join("tools/.git")), "gitdir: ../gd\\n"]);
            let args = ["toggle-refs", s(&git_dir), "[core]\\n\\tfsmonitor = agent-command\\n", "3000"];
            // What a host git does: find a git dir, then read its config.
            let script = "test -e gd/HEAD && test -e gd/objects && test -e gd/refs || exit 0; exec cat gd/config";
            let (runs, leaked, _) = host_loop_while_sandbox_runs(sb, &args, mount, script, "fsmonitor", 2500);
            eprintln!("{runs} host reads, {leaked} saw the agent's config");
            assert!(runs > 20, "the host read too seldom to tell ({runs})");
            assert_eq!(leaked, 0, "a host read saw the agent's config in {runs} reads");
        },
    );
}

/// A config (or a hook) the sandbox renames away, or whose `hooks`
/// directory it renames away and back, just after each host open: the
/// gate finds the opened file under a name git never reads, and must
/// still not let the agent's version through. Found in review of the
/// first gate, which judged an open by the file's name at decision time.
#[test]
fn the_gate_refuses_a_control_file_the_sandbox_renames_away_as_it_is_opened() {
    let evil_config = "[core]\\n\\tfsmonitor = agent-command\\n";
    let evil_hook = "#!/bin/sh\\necho agent-hook-ran\\n";
    let cases = [
        ("config", "gd/config", evil_config, "gd/config", "gd/config.away", "exec cat gd/config", "fsmonitor"),
        ("hooks dir", "gd/hooks/pre-commit", evil_hook, "gd/hooks", "gd/hooks.away", "exec gd/hooks/pre-commit", "agent-hook-ran"),
    ];
    for (case, path, content, from, to, script, needle) in cases {
        let (runs, leaked, _) = gated_tmpfs(
            |_| {},
            |_| {},
            |_fx, mount, mut sb| {
                let git_dir = mount.join("gd");
                for d in ["objects", "refs", "hooks"] {
                    sb.run(&["mkdir", s(&git_dir.join(d))]);
                }
                sb.run(&["write", s(&git_dir.join("HEAD")), "ref: refs/heads/main\\n"]);
                let (path, from, to) = (mount.join(path), mount.join(from), mount.join(to));
                let args = ["plant-and-move", s(&path), content, s(&from), s(&to), "3000"];
                host_loop_while_sandbox_runs(sb, &args, mount, script, needle, 2500)
            },
        );
        eprintln!("{case}: {runs} host runs, {leaked} got the agent's file");
        assert!(runs > 20, "{case}: the host ran too seldom to tell ({runs})");
        assert_eq!(leaked, 0, "{case}: a host open got the agent's file in {runs} runs");
    }
}

/// A directory named `info` made and removed again and again (a build
/// does such things) does not make the gate refuse the developer's opens:
/// found by review, where every `cat` of a source file was refused.
#[test]
fn a_directory_named_info_coming_and_going_does_not_block_the_developer() {
    gated_tmpfs(
        |m| {
            std::fs::create_dir_all(m.join("src")).expect("mkdir");
            std::fs::create_dir_all(m.join("anything")).expect("mkdir");
            std::fs::write(m.join("src/main.rs"), "fn main() {}\n").expect("write");
        },
        |_| {},
        |_fx, mount, sb| {
            let blinking = mount.join("anything/info");
            let (runs, read, failed) =
                host_loop_while_sandbox_runs(sb, &["blink-dir", s(&blinking), "2500"], mount, "exec cat src/main.rs", "fn main", 2000);
            assert_eq!((failed, read), (0, runs), "the developer's reads of src/main.rs were refused");
        },
    );
}

/// A hook at the developer's own relative `core.hooksPath` that the
/// sandbox rewrites in a loop: not a name the gate decides on, but the
/// guard takes it away, and a host open waiting meanwhile is refused
/// (found by review: 74 of 93 host reads got the agent's hook).
#[test]
fn a_hook_at_the_developers_hooks_path_is_never_read_while_the_sandbox_writes_it() {
    gated_tmpfs(
        |m| std::fs::create_dir_all(m.join("tools/.githooks")).expect("mkdir"),
        |config| config.host_hooks_paths = vec![".githooks".into()],
        |fx, mount, mut sb| {
            let git_dir = mount.join("tools/.git");
            for d in ["objects", "refs"] {
                sb.run(&["mkdir", s(&git_dir.join(d))]);
            }
            sb.run(&["write", s(&git_dir.join("HEAD")), "ref: refs/heads/main\\n"]);
            let hook = mount.join("tools/.githooks/pre-commit");
            let args = ["rewrite-loop", s(&hook), "#!/bin/sh\\necho agent-hook\\n", "3000"];
            let (runs, leaked, _) =
                host_loop_while_sandbox_runs(sb, &args, mount, "exec cat tools/.githooks/pre-commit", "agent-hook", 2500);
            let taken = fx.neutralised().len();
            eprintln!("{runs} host reads, {leaked} got the agent's hook, {taken} neutralisations");
            assert!(taken > 0, "the guard took nothing away: the test cannot fail");
            assert_eq!(leaked, 0, "a host read got the agent's hook in {runs} reads");
        },
    );
}

/// The developer's own control files during a run: a hook they write is
/// read back, and a config they rename into place is read at once by
/// their next command.
#[test]
fn the_developers_own_control_file_writes_are_not_refused() {
    gated_tmpfs(
        |m| {
            let git_dir = m.join("tools/.git");
            for d in ["objects", "refs", "hooks"] {
                std::fs::create_dir_all(git_dir.join(d)).expect("mkdir");
            }
            std::fs::write(git_dir.join("HEAD"), "ref: refs/heads/main\n").expect("HEAD");
            std::fs::write(git_dir.join("config"), "[core]\n\tbare = false\n").expect("config");
        },
        |_| {},
        |_fx, mount, _sb| {
            let sh = |script: &str| Command::new("sh").arg("-c").arg(script).current_dir(mount).status().expect("sh").success();
            assert!(sh("printf '#!/bin/sh\\n' > tools/.git/hooks/pre-commit && cat tools/.git/hooks/pre-commit"), "a hook");
            for _ in 0..20 {
                assert!(
                    sh(
                        "cp tools/.git/config tools/.git/config.lock && mv tools/.git/config.lock tools/.git/config && cat tools/.git/config"
                    ),
                    "the developer's config rename, then a read"
                );
            }
        },
    );
}

/// Issue 30, part 2: the workspace's own config is writable in the
/// sandbox. Each version the sandbox writes is filtered against the
/// developer's (their entries kept, one the sandbox removed put back, the
/// sandbox's allowlisted) and sealed; a host reader never gets the
/// sandbox's version while it rewrites it in a loop; a sweep leaves the
/// developer's own write during the run as it is, and puts their version
/// back when the sandbox removed the file.
#[test]
fn the_developers_config_is_writable_inside_and_the_host_reads_only_what_the_guard_allowed() {
    const DEVELOPERS: &str = "[core]\n\trepositoryformatversion = 0\n\tfsmonitor = .git/hooks/watchman\n[alias]\n\tst = status\n\
                              [remote \"origin\"]\n\turl = git@example.invalid:dev/p.git\n";
    gated_tmpfs(
        |m| {
            let git_dir = m.join(".git");
            for d in ["objects", "refs", "hooks"] {
                std::fs::create_dir_all(git_dir.join(d)).expect("mkdir");
            }
            std::fs::write(git_dir.join("HEAD"), "ref: refs/heads/main\n").expect("HEAD");
            std::fs::write(git_dir.join("config"), DEVELOPERS).expect("config");
        },
        |config| {
            config.developer_configs = vec![lazaret_mounts::git_sentry::GatedConfig {
                path: PathBuf::from(".git/config"),
                developer: DEVELOPERS.as_bytes().to_vec(),
            }]
        },
        |fx, mount, mut sb| {
            let config = mount.join(".git/config");
            let lock = mount.join(".git/config.lock");
            // What `git remote add`, `git config user.name` and a planted
            // key make of it, with the developer's alias removed (git
            // writes config.lock and renames it over).
            let bare = mount.join("bare.git");
            let agents = format!(
                "[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = .git/hooks/watchman\\n\\tpager = agent-command\\n\
                 [remote \"origin\"]\\n\\turl = git@example.invalid:dev/p.git\\n\
                 [remote \"local\"]\\n\\turl = {}\\n[user]\\n\\tname = Agent\\n",
                bare.display()
            );
            sb.run(&["write", s(&lock), &agents]);
            sb.run(&["rename", s(&lock), s(&config)]);
            fx.settle();
            let text = std::fs::read_to_string(&config).expect("read");
            let local_url = format!("url = {}", bare.display());
            for kept in
                ["fsmonitor = .git/hooks/watchman", "st = status", "url = git@example.invalid:dev/p.git", &local_url, "name = Agent"]
            {
                assert!(text.contains(kept), "{kept} missing: {text}");
            }
            assert!(!text.contains("agent-command"), "{text}");
            let st = std::fs::metadata(&config).expect("stat");
            assert_eq!((st.uid(), st.mode() & 0o7777), (0, 0o444), "what the host reads is the guard's sealed copy");
            let filtered = fx.neutralised().into_iter().find(|n| n.path == Path::new(".git/config")).expect("a neutralisation");
            assert_eq!(filtered.action, Action::FilteredGitConfig { dropped_keys: vec!["core.pager".into()] });
            assert!(filtered.reason.contains("put back: alias.st"), "{}", filtered.reason);

            // A rewrite loop with the agent's key: the host never reads it.
            let evil = "[core]\\n\\trepositoryformatversion = 0\\n\\tpager = agent-command\\n";
            let args = ["swap-config-loop", s(&lock), s(&config), evil, "2000"];
            let (runs, leaked, _) = host_loop_while_sandbox_runs(sb, &args, mount, "cat .git/config", "agent-command", 1800);
            eprintln!("{runs} host reads, {leaked} saw the agent's config");
            assert!(runs > 20, "the host read too seldom to tell ({runs})");
            assert_eq!(leaked, 0, "a host read saw the agent's config in {runs} reads");
            fx.settle();
            assert!(std::fs::read_to_string(&config).expect("read").contains("st = status"), "the developer's entries are still there");

            // The developer's own change on the host during the run stands
            // through a sweep, whatever it holds.
            // (By another process, as the developer: the guard's own
            // process is never taken for the developer.)
            let ours = format!("{DEVELOPERS}[alias]\n\tco = checkout\n[core]\n\teditor = vim\n");
            let written = Command::new("setpriv")
                .args([format!("--reuid={}", DEVELOPER.uid), format!("--regid={}", DEVELOPER.gid), "--clear-groups".into()])
                .args(["sh", "-c", "cat > .git/config.lock && mv .git/config.lock .git/config"])
                .current_dir(mount)
                .stdin(Stdio::piped())
                .spawn()
                .and_then(|mut child| {
                    child.stdin.take().expect("stdin").write_all(ours.as_bytes())?;
                    child.wait()
                })
                .expect("the developer's write");
            assert!(written.success(), "the developer's write");
            fx.settle();
            let before = fx.neutralised().len();
            let swept = fx.guard.as_ref().expect("guard").sweep_now().expect("sweep");
            assert!(!swept.neutralised.iter().any(|n| n.path == Path::new(".git/config")), "{:?}", swept.neutralised);
            assert_eq!(std::fs::read_to_string(&config).expect("read"), ours, "the developer's write is left as it is");
            assert_eq!(fx.neutralised().len(), before);

            // Removed in the sandbox: the sweep puts the developer's version back.
            let mut sb = Sandbox::spawn_through_own_mount(mount);
            fx.pids.lock().expect("pids").insert(sb.pid());
            sb.run(&["rm", s(&config)]);
            fx.settle();
            let swept = fx.guard.as_ref().expect("guard").sweep_now().expect("sweep");
            assert!(
                swept.neutralised.iter().any(|n| n.path == Path::new(".git/config") && n.action == Action::RestoredDeveloperConfig),
                "{:?}",
                swept.neutralised
            );
            assert_eq!(std::fs::read_to_string(&config).expect("read"), DEVELOPERS);

            // Made a directory in the sandbox (git cannot read the config
            // then): moved aside, and the developer's version put back.
            sb.run(&["rm", s(&config)]);
            sb.run(&["mkdir", s(&config.join("sub"))]);
            fx.settle();
            let swept = fx.guard.as_ref().expect("guard").sweep_now().expect("sweep");
            let restored = swept.neutralised.iter().find(|n| n.action == Action::RestoredDeveloperConfig).expect("restored");
            assert!(restored.reason.contains("a directory the sandbox made (moved aside to config.lazaret-aside-"), "{restored:?}");
            assert_eq!(std::fs::read_to_string(&config).expect("read"), DEVELOPERS);
        },
    );
}

/// Issue 30, bad input: the guard's thread fails (a panic, as a bug would
/// make). It reports the failure (the coordinator then stops the Domain);
/// meanwhile the gate refuses host opens it can no longer order, so the
/// agent's new config is never read; the final sweep still judges
/// everything, and then the host reads the filtered config and the
/// developer's own files again.
#[test]
fn a_failed_guard_keeps_the_agents_config_from_the_host_until_the_final_sweep() {
    gated_tmpfs(
        |m| {
            std::fs::create_dir_all(m.join("mine")).expect("mkdir");
            std::fs::write(m.join("mine/notes.txt"), "the developer's\n").expect("notes");
        },
        |_| {},
        |fx, mount, mut sb| {
            fx.guard.as_ref().expect("guard").fail_for_test().expect("fail");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !fx.events.lock().expect("events").iter().any(|e| matches!(e, GuardEvent::Failed(_))) {
                assert!(std::time::Instant::now() < deadline, "the failure was not reported: {:?}", fx.events.lock().expect("events"));
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let git_dir = mount.join("agent/.git");
            for d in ["objects", "refs"] {
                sb.run(&["mkdir", s(&git_dir.join(d))]);
            }
            sb.run(&["write", s(&git_dir.join("HEAD")), "ref: refs/heads/main\\n"]);
            sb.run(&["write", s(&git_dir.join("config")), "[core]\\n\\tfsmonitor = agent-command\\n"]);
            let read = |rel: &str| Command::new("cat").arg(mount.join(rel)).output().expect("cat");
            let agents = read("agent/.git/config");
            assert!(!agents.status.success(), "read the agent's config with the guard failed: {}", String::from_utf8_lossy(&agents.stdout));
            // The final sweep judges what the failed guard did not.
            let report = fx.guard.take().expect("guard").stop().expect("the final sweep");
            assert!(report.neutralised.iter().any(|n| n.path == Path::new("agent/.git/config")), "{:?}", report.neutralised);
            let agents = read("agent/.git/config");
            assert!(agents.status.success() && !String::from_utf8_lossy(&agents.stdout).contains("agent-command"));
            assert_eq!(String::from_utf8_lossy(&read("mine/notes.txt").stdout), "the developer's\n");
        },
    );
}

/// Issue 30, bad input: the guard stalls (starved of CPU) while the
/// sandbox floods it with more events than the kernel queues (tens of
/// thousands of files) and makes a repository with `core.fsmonitor`. A
/// host open that waits longer than the gate's deadline is refused, never
/// allowed; the queue overflows, the guard sweeps instead of reading what
/// was lost, and then the host reads the filtered config.
#[test]
fn a_stalled_and_overflowed_guard_refuses_and_then_sweeps_never_allows() {
    gated_tmpfs(
        |_| {},
        |_| {},
        |fx, mount, mut sb| {
            let git_dir = mount.join("agent/.git");
            let guard = fx.guard.as_ref().expect("guard");
            guard.stall_for_test(std::time::Duration::from_secs(4)).expect("stall");
            // Let the loop take the command before the flood starts.
            std::thread::sleep(std::time::Duration::from_millis(100));
            for d in ["objects", "refs"] {
                sb.run(&["mkdir", s(&git_dir.join(d))]);
            }
            sb.run(&["write", s(&git_dir.join("HEAD")), "ref: refs/heads/main\\n"]);
            sb.run(&["write", s(&git_dir.join("config")), "[core]\\n\\tfsmonitor = agent-command\\n"]);
            sb.run(&["many", s(&mount.join("flood")), "20000"]);
            let started = std::time::Instant::now();
            let out = Command::new("cat").arg(git_dir.join("config")).output().expect("cat");
            let waited = started.elapsed();
            assert!(!out.status.success(), "a host read got the unjudged config: {}", String::from_utf8_lossy(&out.stdout));
            assert!(waited < std::time::Duration::from_secs(10), "the opener hung for {waited:?}");
            fx.settle();
            assert!(
                fx.events.lock().expect("events").iter().any(|e| matches!(e, GuardEvent::Overflow { .. })),
                "20,000 files did not overflow the queue (the test cannot show the fallback)"
            );
            let out = Command::new("cat").arg(git_dir.join("config")).output().expect("cat");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success() && !text.contains("agent-command"), "after the sweep: {text}");
        },
    );
}

/// Issue 30, bad input: the Domain Root is full, so the quarantine cannot
/// keep a hook the sandbox planted. The hook still goes (deleted, and
/// said so): the property comes before the agent's file.
#[test]
fn a_hook_the_full_quarantine_cannot_keep_is_deleted_not_left() {
    common::in_private_mount_ns(|| {
        let mut fx = Fixture::new();
        let domain = fx.base().join("domain");
        // A tmpfs with room for the quarantine directory and two more inodes.
        nix::mount::mount(Some("tmpfs"), &domain, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=64k,nr_inodes=4"))
            .expect("mount tmpfs");
        fx.start();
        let quarantine = domain.join("quarantine");
        let mut filled = 0;
        while std::fs::write(quarantine.join(format!("filler-{filled}")), b"").is_ok() {
            filled += 1;
            assert!(filled < 100, "the tmpfs does not fill up");
        }
        let ws = fx.ws();
        let mut sb = fx.sandbox();
        let git = ws.join("planted/.git");
        for d in ["objects", "refs", "hooks"] {
            sb.run(&["mkdir", s(&git.join(d))]);
        }
        sb.run(&["write", s(&git.join("HEAD")), "ref: refs/heads/main\\n"]);
        sb.run(&["write", s(&git.join("hooks/pre-commit")), "#!/bin/sh\\nevil\\n"]);
        fx.settle();
        assert!(!git.join("hooks/pre-commit").exists(), "the hook stayed: {:?} {:?}", fx.neutralised(), fx.errors());
        let taken = fx.neutralised().into_iter().find(|n| n.path == Path::new("planted/.git/hooks/pre-commit")).expect("reported");
        assert!(taken.quarantine_id.is_none() && taken.reason.contains("deleted: the quarantine could not keep it"), "{taken:?}");
        drop(fx);
        nix::mount::umount2(&domain, nix::mount::MntFlags::MNT_DETACH).expect("umount");
    });
}
