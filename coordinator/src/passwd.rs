//! The developer inside the sandbox: `/etc/passwd` and `/etc/group` with an
//! entry for the agent's uid.
//!
//! A non-root agent runs as the developer's uid, which the image's password
//! database does not know: the shell prompt says "I have no name!" and
//! `whoami` fails. So the coordinator writes a copy of the image's two files
//! into the run directory with the developer added, and binds them read-only
//! over the image's (root already has an entry in every image).
//!
//! Rules, in the files' own formats:
//! * passwd: every image entry with the developer's name or uid is replaced
//!   by `NAME:x:UID:GID::HOME:SHELL` (uid 0's entry is never touched, and a
//!   non-root developer called like it is refused); every other line is kept
//!   as it is, comments and lines Lazaret does not understand included;
//! * group: each of the developer's groups (the primary one first, then the
//!   supplementary ones) ends up as exactly one entry with the host's name
//!   and gid and the developer among its members. An image entry with that
//!   gid and name is kept (members added to); one with that gid and another
//!   name, or that name and another gid, is replaced (the members of a
//!   same-gid entry carry over). A group without a host name keeps the
//!   image's entry for its gid, or gets none, except the primary group,
//!   which is then named after the developer. gid 0's entry is never
//!   removed. The developer is taken out of the member lists of every other
//!   group: inside, its groups are exactly the ones the agent runs with.
//!
//! The parsing and rendering are pure functions; reading the image's files
//! resolves them inside the image (`openat2` with `RESOLVE_IN_ROOT`, no
//! magic links, the file itself never a symlink), caps their size and
//! accepts only regular files, although the image store is trusted.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use lazaret_oci::bundle::BindMount;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};

use crate::context::Context;
use crate::identity::HostGroup;

/// Largest image `/etc/passwd` or `/etc/group` accepted.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// Why the sandbox's password files could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PasswdError {
    /// A value cannot be written into a colon-separated entry.
    #[error("the {what} {value:?} cannot go into the sandbox's /etc/{file}: {reason}")]
    BadField {
        /// `passwd` or `group`.
        file: &'static str,
        /// Which value (user name, home, ...).
        what: &'static str,
        /// The value.
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// The image's file could not be read.
    #[error("reading the image's {path}: {source}")]
    Read {
        /// The file, as a path inside the image.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The image's file is not a plain file of reasonable size.
    #[error("the image's {path} {problem}")]
    Unusable {
        /// The file, as a path inside the image.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Writing the sandbox's copy failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The agent's account inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Login name (the developer's).
    pub name: String,
    /// uid the agent runs as (never 0).
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// The primary group's name on the host, if known.
    pub group_name: Option<String>,
    /// Supplementary groups (the agent runs with exactly these).
    pub groups: Vec<HostGroup>,
    /// Home directory inside the sandbox.
    pub home: PathBuf,
    /// Login shell inside the sandbox.
    pub shell: PathBuf,
}

/// For a non-root agent of `ctx`: writes `passwd` and `group` (built from
/// the image at `image_rootfs`) into `run_dir` and returns the read-only
/// binds that put them at `/etc/passwd` and `/etc/group`. Nothing for a root
/// agent.
pub fn bind_account_files(ctx: &Context, image_rootfs: &Path, run_dir: &Path) -> Result<Vec<BindMount>, PasswdError> {
    let (uid, gid) = ctx.agent_ids();
    if uid == 0 {
        return Ok(Vec::new());
    }
    let image = open_image_root(image_rootfs)?;
    let account = Account {
        name: ctx.developer.name.clone(),
        uid,
        gid,
        group_name: if gid == ctx.developer.gid { ctx.developer.group_name.clone() } else { None },
        groups: ctx.agent_groups(),
        home: ctx.agent_home(),
        shell: shell_in_image(&image),
    };
    let passwd = passwd_with(&read_image_file(&image, "etc/passwd")?.unwrap_or_default(), &account)?;
    let group = group_with(&read_image_file(&image, "etc/group")?.unwrap_or_default(), &account)?;
    let mut binds = Vec::new();
    for (name, text) in [("passwd", passwd), ("group", group)] {
        let path = run_dir.join(name);
        write_new(&path, text.as_bytes())?;
        binds.push(BindMount { source: path, destination: Path::new("/etc").join(name), readonly: true });
    }
    Ok(binds)
}

/// The image's `/etc/passwd` with `account`'s entry (see the module rules).
pub fn passwd_with(image: &str, account: &Account) -> Result<String, PasswdError> {
    let field = |what: &'static str, value: &str| check_field("passwd", what, value);
    field("user name", &account.name)?;
    check_name("passwd", "user name", &account.name)?;
    let home = account.home.to_string_lossy();
    let shell = account.shell.to_string_lossy();
    field("home directory", &home)?;
    field("shell", &shell)?;
    if account.uid == 0 {
        return Err(PasswdError::BadField { file: "passwd", what: "uid", value: "0".into(), reason: "root's entry is the image's own" });
    }
    let mut out = String::with_capacity(image.len() + 128);
    for line in image.lines() {
        if let Some((name, uid)) = passwd_name_uid(line) {
            if uid == Some(0) {
                if name == account.name {
                    return Err(PasswdError::BadField {
                        file: "passwd",
                        what: "user name",
                        value: account.name.clone(),
                        reason: "it is the name of uid 0 in the image",
                    });
                }
            } else if name == account.name || uid == Some(account.uid) {
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&format!("{}:x:{}:{}::{home}:{shell}\n", account.name, account.uid, account.gid));
    Ok(out)
}

/// The image's `/etc/group` with `account`'s groups (see the module rules).
pub fn group_with(image: &str, account: &Account) -> Result<String, PasswdError> {
    check_name("group", "user name", &account.name)?;
    // The groups wanted, primary first, each gid once.
    let mut wanted: Vec<Wanted> =
        vec![Wanted { gid: account.gid, name: account.group_name.clone(), primary: true, found: false, members: Vec::new() }];
    for g in &account.groups {
        if !wanted.iter().any(|w| w.gid == g.gid) {
            wanted.push(Wanted { gid: g.gid, name: g.name.clone(), primary: false, found: false, members: Vec::new() });
        }
    }
    for w in &wanted {
        if let Some(name) = &w.name {
            check_name("group", "group name", name)?;
        }
    }
    let me = account.name.as_str();
    let mut out = String::with_capacity(image.len() + 256);
    for line in image.lines() {
        let Some(entry) = GroupLine::parse(line) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let same_gid = wanted.iter().position(|w| entry.gid == Some(w.gid));
        let same_name = wanted.iter().position(|w| w.name.as_deref() == Some(entry.name));
        let keep = match (same_gid, same_name) {
            // The image's entry for a wanted group: keep it, once.
            (Some(i), _) if !wanted[i].found && (wanted[i].name.is_none() || wanted[i].name.as_deref() == Some(entry.name)) => {
                wanted[i].found = true;
                let mut members = entry.members();
                add_member(&mut members, me);
                out.push_str(&entry.with_members(&members));
                out.push('\n');
                continue;
            }
            _ if entry.gid == Some(0) => true,
            // Another name for a wanted gid (or a second entry for it):
            // replaced, its members carried over.
            (Some(i), _) => {
                for m in entry.members() {
                    if m != me {
                        add_member(&mut wanted[i].members, m);
                    }
                }
                false
            }
            // A wanted name on another gid: replaced.
            (None, Some(_)) => false,
            (None, None) => true,
        };
        if keep {
            let mut members = entry.members();
            let before = members.len();
            members.retain(|m| *m != me);
            if members.len() == before {
                out.push_str(line);
            } else {
                out.push_str(&entry.with_members(&members));
            }
            out.push('\n');
        }
    }
    for w in &wanted {
        if w.found {
            continue;
        }
        let name = match (&w.name, w.primary) {
            (Some(name), _) => name.as_str(),
            (None, true) => me,
            (None, false) => continue,
        };
        let mut members = w.members.clone();
        add_member(&mut members, me);
        out.push_str(&format!("{name}:x:{}:{}\n", w.gid, members.join(",")));
    }
    Ok(out)
}

struct Wanted<'a> {
    gid: u32,
    name: Option<String>,
    primary: bool,
    found: bool,
    members: Vec<&'a str>,
}

/// One well-formed `name:password:gid:members` line.
struct GroupLine<'a> {
    name: &'a str,
    password: &'a str,
    gid: Option<u32>,
    gid_text: &'a str,
    members: &'a str,
}

impl<'a> GroupLine<'a> {
    fn parse(line: &'a str) -> Option<GroupLine<'a>> {
        if line.starts_with(['#', '+', '-']) {
            return None;
        }
        let fields: Vec<&str> = line.split(':').collect();
        let [name, password, gid_text, members] = fields.as_slice() else { return None };
        if name.is_empty() {
            return None;
        }
        Some(GroupLine { name, password, gid: gid_text.parse().ok(), gid_text, members })
    }

    fn members(&self) -> Vec<&'a str> {
        self.members.split(',').map(str::trim).filter(|m| !m.is_empty()).collect()
    }

    fn with_members(&self, members: &[&str]) -> String {
        format!("{}:{}:{}:{}", self.name, self.password, self.gid_text, members.join(","))
    }
}

fn add_member<'a>(members: &mut Vec<&'a str>, name: &'a str) {
    if !members.contains(&name) {
        members.push(name);
    }
}

/// (name, uid) of a well-formed passwd line; the uid is `None` when not a
/// number. `None` for comments, NIS compat lines and malformed lines.
fn passwd_name_uid(line: &str) -> Option<(&str, Option<u32>)> {
    if line.starts_with(['#', '+', '-']) {
        return None;
    }
    let fields: Vec<&str> = line.split(':').collect();
    if fields.len() != 7 || fields[0].is_empty() {
        return None;
    }
    Some((fields[0], fields[2].parse().ok()))
}

/// A value for a colon-separated field: no `:`, no line breaks, no NUL or
/// other control characters.
fn check_field(file: &'static str, what: &'static str, value: &str) -> Result<(), PasswdError> {
    let bad = |reason| Err(PasswdError::BadField { file, what, value: value.to_string(), reason });
    if value.contains(':') {
        return bad("it contains ':'");
    }
    if value.chars().any(char::is_control) {
        return bad("it contains a line break or another control character");
    }
    Ok(())
}

/// A user or group name: a non-empty field value that is also usable in a
/// member list (no `,`, no spaces) and does not look like an option or a
/// NIS compat entry.
fn check_name(file: &'static str, what: &'static str, value: &str) -> Result<(), PasswdError> {
    check_field(file, what, value)?;
    let bad = |reason| Err(PasswdError::BadField { file, what, value: value.to_string(), reason });
    if value.is_empty() {
        return bad("it is empty");
    }
    if value.contains(',') || value.chars().any(char::is_whitespace) {
        return bad("it contains ',' or white space");
    }
    if value.starts_with(['-', '+', '#']) {
        return bad("it starts with '-', '+' or '#'");
    }
    Ok(())
}

/// Opens the image's root directory (a path of the trusted image store).
fn open_image_root(rootfs: &Path) -> Result<std::fs::File, PasswdError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(rootfs)
        .map_err(|source| PasswdError::Read { path: rootfs.to_path_buf(), source })
}

/// Resolves `rel` inside the image as if it were `/`.
fn open_in_image(image: &std::fs::File, rel: &str, flags: OFlag) -> nix::Result<std::os::fd::OwnedFd> {
    let how = OpenHow::new().flags(flags | OFlag::O_CLOEXEC).resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    nix::fcntl::openat2(image.as_fd(), rel, how)
}

/// The image's file `rel` (e.g. `etc/passwd`), `None` if it does not
/// exist. Directories on the way may be symlinks (resolved inside the
/// image), the file itself may not.
fn read_image_file(image: &std::fs::File, rel: &str) -> Result<Option<String>, PasswdError> {
    let shown = Path::new("/").join(rel);
    let fd = match open_in_image(image, rel, OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(nix::errno::Errno::ELOOP) => return Err(PasswdError::Unusable { path: shown, problem: "is a symlink".into() }),
        Err(errno) => return Err(PasswdError::Read { path: shown, source: errno.into() }),
    };
    let file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|source| PasswdError::Read { path: shown.clone(), source })?;
    if !meta.is_file() {
        return Err(PasswdError::Unusable { path: shown, problem: "is not a regular file".into() });
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(PasswdError::Unusable { path: shown, problem: format!("is larger than {MAX_FILE_BYTES} bytes") });
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|source| PasswdError::Read { path: shown.clone(), source })?;
    String::from_utf8(bytes).map(Some).map_err(|_| PasswdError::Unusable { path: shown, problem: "is not UTF-8".into() })
}

/// `/bin/bash` if the image has it (an executable regular file, symlinks
/// resolved inside the image), else `/bin/sh`.
fn shell_in_image(image: &std::fs::File) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bash = open_in_image(image, "bin/bash", OFlag::O_PATH)
        .ok()
        .and_then(|fd| std::fs::File::from(fd).metadata().ok())
        .is_some_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    PathBuf::from(if bash { "/bin/bash" } else { "/bin/sh" })
}

/// Creates `path` (which must not exist) with mode 0644 and `data`.
fn write_new(path: &Path, data: &[u8]) -> Result<(), PasswdError> {
    use std::io::Write;
    let err = |source| PasswdError::Write { path: path.to_path_buf(), source };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(err)?;
    file.write_all(data).map_err(err)?;
    file.sync_all().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEBIAN_PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n# a comment\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
    const DEBIAN_GROUP: &str = "root:x:0:\ndaemon:x:1:\nsudo:x:27:\nusers:x:100:\nnogroup:x:65534:\n";

    fn dev() -> Account {
        Account {
            name: "alice".into(),
            uid: 1000,
            gid: 1000,
            group_name: Some("alice".into()),
            groups: vec![HostGroup { gid: 27, name: Some("sudo".into()) }, HostGroup { gid: 998, name: Some("docker".into()) }],
            home: "/home/alice".into(),
            shell: "/bin/bash".into(),
        }
    }

    fn lines(s: &str) -> Vec<&str> {
        s.lines().collect()
    }

    #[test]
    fn the_developer_is_added_to_passwd() {
        let out = passwd_with(DEBIAN_PASSWD, &dev()).expect("passwd");
        let mut expected = lines(DEBIAN_PASSWD);
        expected.push("alice:x:1000:1000::/home/alice:/bin/bash");
        assert_eq!(lines(&out), expected);
        assert!(out.ends_with('\n'));
        // Without a trailing newline, or an image without the file at all.
        assert_eq!(
            passwd_with("root:x:0:0:root:/root:/bin/sh", &dev()).expect("passwd"),
            "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/bash\n"
        );
        assert_eq!(passwd_with("", &dev()).expect("passwd"), "alice:x:1000:1000::/home/alice:/bin/bash\n");
    }

    #[test]
    fn entries_for_the_developers_uid_or_name_are_replaced() {
        let image = "root:x:0:0:root:/root:/bin/bash\nubuntu:x:1000:1000:Ubuntu:/home/ubuntu:/bin/bash\nalice:x:1001:1001::/home/alice:/bin/sh\nbob:x:1002:1002::/home/bob:/bin/sh\n+nis\nbroken line\n";
        let out = passwd_with(image, &dev()).expect("passwd");
        assert_eq!(
            lines(&out),
            [
                "root:x:0:0:root:/root:/bin/bash",
                "bob:x:1002:1002::/home/bob:/bin/sh",
                "+nis",
                "broken line",
                "alice:x:1000:1000::/home/alice:/bin/bash"
            ]
        );
    }

    #[test]
    fn root_is_never_replaced() {
        let mut named_root = dev();
        named_root.name = "root".into();
        assert!(matches!(passwd_with(DEBIAN_PASSWD, &named_root), Err(PasswdError::BadField { what: "user name", .. })));
        let mut uid0 = dev();
        uid0.uid = 0;
        assert!(passwd_with(DEBIAN_PASSWD, &uid0).is_err());
        // A second uid-0 entry (toor) survives too.
        let out = passwd_with("root:x:0:0::/root:/bin/sh\ntoor:x:0:0::/root:/bin/sh\n", &dev()).expect("passwd");
        assert!(out.contains("toor:x:0:0"), "{out}");
    }

    #[test]
    fn values_that_would_forge_entries_are_refused() {
        for (mutate, what) in [
            (Box::new(|a: &mut Account| a.name = "evil:x:0:0::/:/bin/sh".into()) as Box<dyn Fn(&mut Account)>, "user name"),
            (Box::new(|a: &mut Account| a.name = "a\nroot2".into()), "user name"),
            (Box::new(|a: &mut Account| a.name = String::new()), "user name"),
            (Box::new(|a: &mut Account| a.name = "a,b".into()), "user name"),
            (Box::new(|a: &mut Account| a.name = "+x".into()), "user name"),
            (Box::new(|a: &mut Account| a.home = "/home/a:b".into()), "home directory"),
            (Box::new(|a: &mut Account| a.shell = "/bin/sh\nx".into()), "shell"),
        ] {
            let mut account = dev();
            mutate(&mut account);
            let err = passwd_with(DEBIAN_PASSWD, &account).expect_err("must be refused");
            assert!(matches!(err, PasswdError::BadField { file: "passwd", what: w, .. } if w == what), "{err}");
        }
        let mut bad_group = dev();
        bad_group.groups.push(HostGroup { gid: 5, name: Some("tty:x:0:alice".into()) });
        assert!(matches!(group_with(DEBIAN_GROUP, &bad_group), Err(PasswdError::BadField { file: "group", what: "group name", .. })));
    }

    #[test]
    fn groups_are_present_with_the_developer_as_member() {
        let out = group_with(DEBIAN_GROUP, &dev()).expect("group");
        assert_eq!(
            lines(&out),
            ["root:x:0:", "daemon:x:1:", "sudo:x:27:alice", "users:x:100:", "nogroup:x:65534:", "alice:x:1000:alice", "docker:x:998:alice"]
        );
    }

    #[test]
    fn image_groups_keep_their_members_and_lose_the_developer() {
        let image = "root:x:0:\nsudo:x:27:ubuntu,alice\naudio:x:29:pulse,alice\ndocker:x:999:ubuntu\nstaff:x:998:carol\nalice:x:1001:\n";
        let out = group_with(image, &dev()).expect("group");
        assert_eq!(
            lines(&out),
            [
                "root:x:0:",
                // A wanted group with the host's name: kept, member once.
                "sudo:x:27:ubuntu,alice",
                // Not one of the developer's groups: taken out.
                "audio:x:29:pulse",
                // docker on another gid and staff on docker's gid: replaced
                // by the host's docker (998), with staff's members; alice's
                // own group on the wrong gid: replaced.
                "alice:x:1000:alice",
                "docker:x:998:carol,alice",
            ]
        );
    }

    #[test]
    fn groups_without_a_host_name() {
        let mut account = dev();
        account.group_name = None;
        account.groups = vec![HostGroup { gid: 100, name: None }, HostGroup { gid: 4242, name: None }];
        let out = group_with(DEBIAN_GROUP, &account).expect("group");
        // The image's name for gid 100 is used; 4242 is nameless inside as
        // outside; the primary group is named after the developer.
        assert_eq!(lines(&out), ["root:x:0:", "daemon:x:1:", "sudo:x:27:", "users:x:100:alice", "nogroup:x:65534:", "alice:x:1000:alice"]);
        // A nameless primary gid the image knows keeps the image's name.
        account.gid = 100;
        account.groups.clear();
        let out = group_with(DEBIAN_GROUP, &account).expect("group");
        assert_eq!(lines(&out), ["root:x:0:", "daemon:x:1:", "sudo:x:27:", "users:x:100:alice", "nogroup:x:65534:"]);
    }

    #[test]
    fn gid_zero_is_never_removed_and_duplicates_collapse() {
        let mut account = dev();
        account.groups = vec![
            HostGroup { gid: 0, name: Some("wheel".into()) },
            HostGroup { gid: 27, name: Some("sudo".into()) },
            HostGroup { gid: 27, name: Some("sudo".into()) },
        ];
        let image = "root:x:0:\nwheel:x:10:\nsudo:x:27:\nsudo:x:27:\n";
        let out = group_with(image, &account).expect("group");
        assert_eq!(lines(&out), ["root:x:0:", "sudo:x:27:alice", "alice:x:1000:alice", "wheel:x:0:alice"]);
    }

    #[test]
    fn image_files_are_read_inside_the_image_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("rootfs");
        std::fs::create_dir_all(root.join("real-etc")).expect("mkdir");
        std::fs::create_dir_all(root.join("usr/bin")).expect("mkdir");
        // /etc is a symlink inside the image, absolute: resolved in the image.
        std::os::unix::fs::symlink("/real-etc", root.join("etc")).expect("symlink");
        std::fs::write(root.join("real-etc/passwd"), DEBIAN_PASSWD).expect("write");
        // /etc/group points at the host's file: refused, not followed.
        std::os::unix::fs::symlink("/etc/group", root.join("real-etc/group")).expect("symlink");
        let image = open_image_root(&root).expect("open");
        assert_eq!(read_image_file(&image, "etc/passwd").expect("read").as_deref(), Some(DEBIAN_PASSWD));
        assert!(matches!(read_image_file(&image, "etc/group"), Err(PasswdError::Unusable { .. })));
        assert_eq!(read_image_file(&image, "etc/shadow").expect("missing is fine"), None);
        // A directory where a file should be.
        std::fs::create_dir(root.join("real-etc/shadow")).expect("mkdir");
        assert!(matches!(read_image_file(&image, "etc/shadow"), Err(PasswdError::Unusable { .. })));

        // No bash: /bin/sh. A merged-/usr bash (/bin -> usr/bin): /bin/bash.
        assert_eq!(shell_in_image(&image), PathBuf::from("/bin/sh"));
        std::os::unix::fs::symlink("usr/bin", root.join("bin")).expect("symlink");
        std::fs::write(root.join("usr/bin/bash"), "").expect("write");
        assert_eq!(shell_in_image(&image), PathBuf::from("/bin/sh"), "not executable");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(root.join("usr/bin/bash"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(shell_in_image(&image), PathBuf::from("/bin/bash"));
    }

    #[test]
    fn account_files_are_written_and_bound_read_only_for_a_non_root_agent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("etc")).expect("mkdir");
        std::fs::write(rootfs.join("etc/passwd"), DEBIAN_PASSWD).expect("write");
        std::fs::write(rootfs.join("etc/group"), DEBIAN_GROUP).expect("write");
        let run = dir.path().join("run");
        std::fs::create_dir(&run).expect("mkdir");
        let ctx = crate::context::test_context(dir.path(), crate::context::test_developer(), "");
        let binds = bind_account_files(&ctx, &rootfs, &run).expect("files");
        assert_eq!(
            binds,
            [
                BindMount { source: run.join("passwd"), destination: "/etc/passwd".into(), readonly: true },
                BindMount { source: run.join("group"), destination: "/etc/group".into(), readonly: true },
            ]
        );
        let passwd = std::fs::read_to_string(run.join("passwd")).expect("passwd");
        assert!(passwd.ends_with("alice:x:1000:1000::/home/alice:/bin/sh\n"), "no bash in this image: {passwd}");
        let group = std::fs::read_to_string(run.join("group")).expect("group");
        assert_eq!(group, group_with(DEBIAN_GROUP, &dev()).expect("group"));

        // Root: nothing written, nothing bound.
        let root_run = dir.path().join("root-run");
        std::fs::create_dir(&root_run).expect("mkdir");
        let root = crate::context::test_context(dir.path(), crate::context::test_developer(), "user = \"root\"\n");
        assert_eq!(bind_account_files(&root, &rootfs, &root_run).expect("root"), []);
        assert_eq!(std::fs::read_dir(&root_run).expect("read_dir").count(), 0);

        // An explicit uid:gid gets the developer's name but not their groups.
        let other_run = dir.path().join("other-run");
        std::fs::create_dir(&other_run).expect("mkdir");
        let other = crate::context::test_context(dir.path(), crate::context::test_developer(), "user = \"2000:2001\"\n");
        bind_account_files(&other, &rootfs, &other_run).expect("files");
        let passwd = std::fs::read_to_string(other_run.join("passwd")).expect("passwd");
        assert!(passwd.ends_with("alice:x:2000:2001::/home/alice:/bin/sh\n"), "{passwd}");
        let group = std::fs::read_to_string(other_run.join("group")).expect("group");
        assert!(group.ends_with("nogroup:x:65534:\nalice:x:2001:alice\n") && !group.contains("docker"), "{group}");
    }

    #[test]
    fn written_files_are_new_and_world_readable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("passwd");
        write_new(&path, b"x\n").expect("write");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777, 0o644);
        assert!(matches!(write_new(&path, b"y\n"), Err(PasswdError::Write { .. })), "an existing file is not overwritten");
        assert_eq!(std::fs::read(&path).expect("read"), b"x\n");
    }
}
