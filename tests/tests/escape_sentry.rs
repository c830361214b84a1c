//! Escape corpus: Git Sentry's protected paths (issue 17). A root agent
//! (the strongest one Lazaret runs) tries every write route on every kind
//! of path Git Sentry makes read-only (docs/workspace-guard.md,
//! mounts/src/git_sentry.rs): the repository's `config`, an existing hook
//! and the `hooks/` directory, `info/exclude` and `info/`, a file the
//! config includes, the `core.hooksPath` directory and the `core.excludesFile`
//! file, and the pinned `.git` directory above them. Routes: open with
//! O_WRONLY, O_RDWR, O_TRUNC, O_APPEND; truncate(2); rename over; a hard
//! link then a write through it; unlink; a symlink swapped in; setxattr
//! (user and trusted namespaces); chmod, chown, utimes; reopening a
//! read-only descriptor for writing through /proc/self/fd; and for
//! directories creating, renaming in, removing and replacing entries. Every
//! attempt must fail, and on the host every protected path must be exactly
//! as before (type, mode, owner, size, content, mtime, xattrs, entries).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use lazaret_tests::escape;
use lazaret_tests::*;

/// Protected files: label and path relative to the workspace.
const FILES: &[(&str, &str)] = &[
    ("config", ".git/config"),
    ("hook", ".git/hooks/pre-commit"),
    ("exclude", ".git/info/exclude"),
    ("include", "inc.cfg"),
    ("hookspath-hook", ".githooks/post-checkout"),
    ("excludesfile", ".excludes"),
];

/// Protected directories.
const DIRS: &[(&str, &str)] = &[("hooks", ".git/hooks"), ("info", ".git/info"), ("hookspath", ".githooks")];

/// Routes against the pinned `.git` itself (its other entries, objects
/// and refs, are the agent's to write): swapping in another one.
const GITDIR_ROUTES: &[(&str, &str)] = &[
    ("gitdir/rename-away", "tool rename \"$W/.git\" \"$W/.git-old\""),
    ("gitdir/symlink-swap", "mkdir -p /tmp/evil-git && mv \"$W/.git\" \"$W/.git-old2\" && ln -s /tmp/evil-git \"$W/.git\""),
];

/// Routes against a file `$P`: name and shell command (must fail).
const FILE_ROUTES: &[(&str, &str)] = &[
    ("open-wronly", "tool open \"$P\" w"),
    ("open-rdwr", "tool open \"$P\" rw"),
    ("open-trunc", "tool open \"$P\" wt"),
    ("open-append", "tool open \"$P\" wa"),
    ("shell-redirect", "sh -c 'echo evil >> \"$1\"' - \"$P\""),
    ("truncate", "tool truncate \"$P\""),
    ("rename-over", "echo evil > \"$W/.evil-$N\" && tool rename \"$W/.evil-$N\" \"$P\""),
    ("rename-over-from-same-dir", "echo evil > \"$P.new\" && tool rename \"$P.new\" \"$P\""),
    ("hard-link-then-write", "tool link \"$P\" \"$W/.hl-$N\" && tool open \"$W/.hl-$N\" wa"),
    ("hard-link-in-same-dir-then-write", "tool link \"$P\" \"$P.hl\" && tool open \"$P.hl\" wa"),
    ("unlink-then-create", "rm -f \"$P\" && echo evil > \"$P\""),
    ("rename-away-then-create", "tool rename \"$P\" \"$P.old\" && echo evil > \"$P\""),
    ("symlink-swap", "echo evil > /tmp/evil-$N && ln -sfn /tmp/evil-$N \"$P\""),
    ("setxattr-user", "tool setxattr \"$P\" user.evil x"),
    ("setxattr-trusted", "tool setxattr \"$P\" trusted.evil x"),
    ("setxattr-capability", "tool setxattr \"$P\" security.capability xxxxxxxxxxxxxxxxxxxx"),
    ("chmod", "chmod 4777 \"$P\""),
    ("chown", "chown 4242:4242 \"$P\""),
    ("utimes", "touch -d @0 \"$P\""),
    ("reopen-via-proc-fd", "tool reopen \"$P\""),
];

/// Routes against a directory `$D`.
const DIR_ROUTES: &[(&str, &str)] = &[
    ("create-entry", "echo evil > \"$D/evil-$N\""),
    ("mkdir-entry", "mkdir \"$D/evil-dir-$N\""),
    ("rename-entry-in", "echo evil > \"$W/.evil-in-$N\" && tool rename \"$W/.evil-in-$N\" \"$D/evil-in\""),
    ("symlink-entry", "ln -s /tmp \"$D/evil-link-$N\""),
    ("mknod-fifo-entry", "mkfifo \"$D/evil-fifo-$N\""),
    ("rename-dir-away", "tool rename \"$D\" \"$D.old\""),
    ("remove-and-replace", "rm -rf \"$D\" && mkdir \"$D\" && echo evil > \"$D/config\""),
    ("symlink-swap-dir", "mv \"$D\" \"$D.old2\" && ln -s /tmp \"$D\""),
    ("chmod-dir", "chmod 0777 \"$D\""),
    ("chown-dir", "chown 4242 \"$D\""),
    ("setxattr-dir", "tool setxattr \"$D\" user.evil x"),
    ("utimes-dir", "touch -d @0 \"$D\""),
];

/// Everything the host can see of `path` (recursively for a directory),
/// for an exact before/after comparison.
fn snapshot(path: &Path, into: &mut BTreeMap<String, String>) {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => {
            into.insert(path.display().to_string(), format!("missing: {e}"));
            return;
        }
    };
    let content =
        if meta.is_file() { fs::read(path).map(|b| format!("{:x?}", sha2_digest(&b))).unwrap_or_default() } else { String::new() };
    let xattrs = xattr_names(path);
    into.insert(
        path.display().to_string(),
        format!(
            "mode={:o} uid={} gid={} size={} nlink={} mtime={}.{} xattrs={xattrs:?} content={content}",
            meta.mode(),
            meta.uid(),
            meta.gid(),
            meta.size(),
            meta.nlink(),
            meta.mtime(),
            meta.mtime_nsec()
        ),
    );
    if meta.is_dir() {
        let mut names: Vec<_> = fs::read_dir(path).expect("read_dir").flatten().map(|e| e.path()).collect();
        names.sort();
        for p in names {
            snapshot(&p, into);
        }
    }
}

fn sha2_digest(bytes: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).to_vec()
}

fn xattr_names(path: &Path) -> Vec<String> {
    let mut buf = vec![0u8; 4096];
    match rustix::fs::llistxattr(path, &mut buf[..]) {
        Ok(n) => buf[..n].split(|b| *b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect(),
        Err(e) => vec![format!("error {e}")],
    }
}

#[test]
fn every_write_route_to_every_git_sentry_protected_path_fails_and_the_host_is_unchanged() {
    let env = TestEnv::new();
    let ws = env.workspace.clone();
    fs::write(ws.join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n").expect("hook");
    fs::set_permissions(ws.join(".git/hooks/pre-commit"), fs::Permissions::from_mode(0o755)).expect("chmod hook");
    fs::write(ws.join("inc.cfg"), "# included\n").expect("include");
    fs::create_dir(ws.join(".githooks")).expect("hooksPath dir");
    fs::write(ws.join(".githooks/post-checkout"), "#!/bin/sh\nexit 0\n").expect("hooksPath hook");
    fs::write(ws.join(".excludes"), "*.tmp\n").expect("excludes");
    git(&ws, &["config", "include.path", "../inc.cfg"]);
    git(&ws, &["config", "core.hooksPath", ".githooks"]);
    git(&ws, &["config", "core.excludesFile", ".excludes"]);

    let git_dir_ino = fs::metadata(ws.join(".git")).expect(".git").ino();
    let head = git(&ws, &["rev-parse", "HEAD"]);
    let mut before = BTreeMap::new();
    for (_, rel) in FILES.iter().chain(DIRS) {
        snapshot(&ws.join(rel), &mut before);
    }

    let mut script = String::new();
    let mut names = Vec::new();
    let mut n = 0;
    for (label, rel) in FILES {
        for (route, cmd) in FILE_ROUTES {
            n += 1;
            let name = format!("{label}/{route}");
            script.push_str(&format!("P=\"$W/{rel}\"; N={n}; must_fail {name} sh -c 'P=$1; N=$2; W=$3; TOOL=$4; tool() {{ perl \"$TOOL\" \"$@\"; }}; {}' - \"$P\" $N \"$W\" \"$TOOL\"\n", cmd.replace('\'', "'\\''")));
            names.push(name);
        }
    }
    for (label, rel) in DIRS {
        for (route, cmd) in DIR_ROUTES {
            n += 1;
            let name = format!("{label}/{route}");
            script.push_str(&format!("D=\"$W/{rel}\"; N={n}; must_fail {name} sh -c 'D=$1; N=$2; W=$3; TOOL=$4; tool() {{ perl \"$TOOL\" \"$@\"; }}; {}' - \"$D\" $N \"$W\" \"$TOOL\"\n", cmd.replace('\'', "'\\''")));
            names.push(name);
        }
    }
    for (name, cmd) in GITDIR_ROUTES {
        script.push_str(&format!(
            "must_fail {name} sh -c 'W=$1; TOOL=$2; tool() {{ perl \"$TOOL\" \"$@\"; }}; {}' - \"$W\" \"$TOOL\"\n",
            cmd.replace('\'', "'\\''")
        ));
        names.push(name.to_string());
    }
    // Controls: the same routes do work on an unprotected file and
    // directory of the workspace (a route that cannot write proves
    // nothing). setxattr is the exception: gVisor supports no extended
    // attributes on workspace files at all, so its control is only shown.
    script.push_str(
        r#"echo x > "$W/control"; mkdir "$W/control-dir"
ctl() { n=$1; shift; if o=$("$@" 2>&1); then echo "case control-$n: works"; else echo "case control-$n: failed: $o" | oneline; echo; fi; }
ctl open tool open "$W/control" wa
ctl truncate tool truncate "$W/control"
ctl chmod chmod 0600 "$W/control"
ctl link tool link "$W/control" "$W/control-link"
ctl rename sh -c 'echo z > "$1/control-new" && perl "$2" rename "$1/control-new" "$1/control"' - "$W" "$TOOL"
ctl create-entry sh -c 'echo y > "$1/control-dir/f"' - "$W"
ctl rename-dir tool rename "$W/control-dir" "$W/control-dir2"
ctl setxattr tool setxattr "$W/control" user.ok x
"#,
    );
    let path = escape::install(&env, "sentry", &script);
    let out = env.run(["run".as_ref(), "test".as_ref(), "--".as_ref(), "sh".as_ref(), path.as_os_str()]);
    let stdout = text(&out.stdout);
    println!("{stdout}\nstderr:\n{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let results = escape::cases(&stdout);
    for control in ["open", "truncate", "chmod", "link", "rename", "create-entry", "rename-dir"] {
        let got = results.get(&format!("control-{control}")).map(String::as_str);
        assert_eq!(got, Some("works"), "the control {control} failed on an unprotected path: its routes prove nothing\n{stdout}");
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();

    let mut after = BTreeMap::new();
    for (_, rel) in FILES.iter().chain(DIRS) {
        snapshot(&ws.join(rel), &mut after);
    }
    // The agent's own leftovers next to protected paths are its business;
    // only what existed (and what appeared inside protected directories) counts.
    let changed: Vec<String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| format!("{k}: {:?} -> {:?}", before.get(k), after.get(k)))
        .collect();
    escape::assert_refused(&results, &names, &stdout);
    assert!(changed.is_empty(), "protected paths changed on the host:\n  {}", changed.join("\n  "));
    assert_eq!(
        fs::symlink_metadata(ws.join(".git")).map(|m| (m.is_dir(), m.ino())).ok(),
        Some((true, git_dir_ino)),
        "the workspace's .git was swapped"
    );
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), head);
    // The developer's git on the host still reads the same configuration.
    assert_eq!(git(&ws, &["config", "core.hooksPath"]).trim(), ".githooks");
    env.assert_nothing_left();
}
