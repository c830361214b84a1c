//! The allowlist a git config the guard did not expect (a repository made
//! or changed by the sandbox) is reduced to (pure logic).
//!
//! Kept: what `git init`, `git clone`, `git submodule add/update`, `git
//! worktree add` and ordinary work write, and nothing that names a program,
//! a hook, another configuration or a path outside the workspace:
//!
//! * `core.`: repositoryformatversion, filemode, bare, logallrefupdates,
//!   ignorecase, precomposeunicode, symlinks, autocrlf, eol, safecrlf,
//!   quotepath, checkstat, trustctime, sparsecheckout, sparsecheckoutcone,
//!   splitindex, untrackedcache, abbrev, bigfilethreshold, and `worktree`
//!   (a submodule's gitdir has it) only when it stays inside the workspace
//!   (checked lexically here, for symlinks by the caller);
//! * `extensions.`: objectformat, worktreeconfig, refstorage,
//!   preciousobjects, noop, and partialclone when it names a remote whose
//!   url is kept (or a place as below);
//! * `remote.<name>.`: url and pushurl only when they name a place inside
//!   the workspace (a local path or `file://` that stays inside, no
//!   symlink on the way: [`git_model::url_place`]; network URLs, host
//!   paths outside, `<helper>::` transports and option look-alikes are
//!   dropped), fetch, push, mirror, tagopt, prune, prunetags, promisor,
//!   partialclonefilter, skipdefaultupdate, skipfetchall;
//! * `branch.<name>.`: remote and pushremote when they name a remote whose
//!   url this config keeps (git reads a remote without one from
//!   `remotes/NAME` or `branches/NAME`, or takes the name as a URL:
//!   `evilhost:x` is an ssh address), or a place as above, merge, rebase,
//!   description;
//! * `submodule.<name>.`: url (same check as remotes), active, path, branch, ignore,
//!   fetchrecursesubmodules, shallow, and `update` only as
//!   checkout/rebase/merge/none (`!command` runs a command);
//!   `submodule.`: active, recurse, fetchjobs;
//! * `user.name`, `user.email`, `init.defaultbranch`, `gc.auto`,
//!   `pull.rebase`, `pull.ff`, `push.default`, `push.autosetupremote`,
//!   `fetch.prune`, `worktree.guessremote`, `i18n.commitencoding`,
//!   `i18n.logoutputencoding`, `index.version`.
//!
//! Dropped, notably: `core.hooksPath`, `core.fsmonitor`, `core.pager`,
//! `core.editor`, `core.sshCommand`, `core.askPass`, `core.excludesFile`,
//! `core.attributesFile`, `core.gitProxy`, `include*`, `alias.*`,
//! `filter.*`, `diff.*`, `merge.*`, `credential.*`, `gpg.*`, `sequence.*`,
//! `uploadpack.*`, `protocol.*`, `http.*`, `url.*`, `safe.*`,
//! `remote.*.uploadpack/receivepack/vcs/proxy`, and every line the parser
//! could not read. The output is written in git's own layout, so a config
//! git itself wrote and that holds only allowed keys comes out unchanged.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::git_model;
use crate::gitconfig::{ConfigEntry, GitConfig};

/// What [`filter_config`] made of a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilteredConfig {
    /// The config to write (git's layout).
    pub text: Vec<u8>,
    /// `section[.subsection].key` of every dropped entry, in file order.
    pub dropped: Vec<String>,
    /// Lines the parser skipped (malformed for git too; they are dropped).
    pub skipped_lines: usize,
    /// `section[.subsection].key` of every entry of the developer's version
    /// that the filtered text puts back ([`filter_config_against`]).
    pub restored: Vec<String>,
}

impl FilteredConfig {
    /// Whether `original` must be replaced by [`FilteredConfig::text`].
    pub fn changes(&self, original: &[u8]) -> bool {
        self.text != original
    }
}

/// Where a config lives, to judge its path values.
#[derive(Debug, Clone, Copy)]
pub struct ConfigLocation<'a> {
    /// Canonical absolute path of the workspace (inside the sandbox too).
    pub workspace_abs: &'a Path,
    /// The git directory holding the config, relative to the workspace.
    pub git_dir: &'a Path,
}

/// Reduces `text` to the allowlist. `path_ok` is asked about every path
/// value that stays lexically inside the workspace (workspace-relative):
/// the caller refuses one that goes through a symlink.
pub fn filter_config(text: &[u8], location: ConfigLocation<'_>, path_ok: &dyn Fn(&Path) -> bool) -> FilteredConfig {
    filter_config_against(text, b"", location, path_ok)
}

/// [`filter_config`] of a config the developer had written before the
/// sandbox rewrote it (`developer`: the developer's own version): every
/// entry of the developer's is kept as well, wherever the sandbox moved
/// it; a key the sandbox removed, or set only to values that are dropped,
/// gets the developer's entries back at the end (a key the developer set
/// is never lost). A key the sandbox set to a value that is kept (an
/// allowlisted one: `git config user.name X`, `git push -u`) has that
/// value instead of the developer's, which the caller keeps in the
/// quarantine's copy of the original. Entries compare by section,
/// subsection, key and value, each occurrence once.
pub fn filter_config_against(
    text: &[u8],
    developer: &[u8],
    location: ConfigLocation<'_>,
    path_ok: &dyn Fn(&Path) -> bool,
) -> FilteredConfig {
    let parsed = GitConfig::parse(text);
    let theirs = GitConfig::parse(developer);
    let key = |e: &ConfigEntry<'_>| -> (String, Option<String>, String, String) {
        (e.section.to_owned(), e.subsection.map(str::to_owned), e.key.to_owned(), e.value.to_owned())
    };
    let mut unclaimed: std::collections::HashMap<(String, Option<String>, String, String), usize> = std::collections::HashMap::new();
    for entry in theirs.entries() {
        *unclaimed.entry(key(&entry)).or_default() += 1;
    }
    let is_developers = |entry: &ConfigEntry<'_>| unclaimed.contains_key(&key(entry));
    // A value older git reads otherwise means two things: it goes.
    let allowed = |entry: &ConfigEntry<'_>, remotes: &HashSet<&str>| {
        entry.older_git_value.is_none()
            && entry_allowed(entry.section, entry.subsection, entry.key, entry.value, location, path_ok, remotes)
            && writable(entry.section, entry.subsection, entry.value)
    };
    // The remotes this config keeps a URL for (the developer's included):
    // a name anywhere else is only kept if it is one of them (`remote.c`:
    // for a remote with no URL, git reads `remotes/NAME`, `branches/NAME`,
    // then takes NAME as the URL).
    let no_remotes = HashSet::new();
    let kept_remotes: HashSet<&str> = parsed
        .entries()
        .chain(theirs.entries())
        .filter(|e| e.section == "remote" && e.key == "url" && (is_developers(e) || allowed(e, &no_remotes)))
        .filter_map(|e| e.subsection)
        .collect();
    let mut writer = Writer::default();
    let mut dropped = Vec::new();
    // The names (section, subsection, key) the filtered text sets.
    let name = |e: &ConfigEntry<'_>| (e.section.to_owned(), e.subsection.map(str::to_owned), e.key.to_owned());
    let mut kept_names = HashSet::new();
    for entry in parsed.entries() {
        let k = key(&entry);
        let developers = match unclaimed.get_mut(&k) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        };
        if !developers && !allowed(&entry, &kept_remotes) {
            dropped.push(entry_name(&entry));
            continue;
        }
        kept_names.insert(name(&entry));
        writer.entry(&entry);
    }
    // What the sandbox took away of the developer's, in their order: a
    // name it removed, or set only to values that were dropped. (One it set
    // to a kept value has that value now: `git config user.name X`.)
    let mut restored = Vec::new();
    for entry in theirs.entries() {
        if kept_names.contains(&name(&entry)) {
            continue;
        }
        if let Some(n) = unclaimed.get_mut(&key(&entry)).filter(|n| **n > 0) {
            *n -= 1;
            writer.entry(&entry);
            restored.push(entry_name(&entry));
        }
    }
    FilteredConfig { text: writer.out.into_bytes(), dropped, skipped_lines: parsed.skipped_lines().len(), restored }
}

/// `section[.subsection].key` of an entry, for messages.
fn entry_name(entry: &ConfigEntry<'_>) -> String {
    match entry.subsection {
        Some(sub) => format!("{}.{sub}.{}", entry.section, entry.key),
        None => format!("{}.{}", entry.section, entry.key),
    }
}

/// Writes entries in git's layout, a header whenever the section changes.
#[derive(Default)]
struct Writer {
    out: String,
    current: Option<(String, Option<String>)>,
}

impl Writer {
    fn entry(&mut self, entry: &ConfigEntry<'_>) {
        let ConfigEntry { section, subsection, key_as_written: key, value, .. } = *entry;
        let header = (section.to_owned(), subsection.map(str::to_owned));
        if self.current.as_ref() != Some(&header) {
            match subsection {
                Some(sub) => self.out.push_str(&format!("[{section} \"{}\"]\n", escape_subsection(sub))),
                None => self.out.push_str(&format!("[{section}]\n")),
            }
            self.current = Some(header);
        }
        self.out.push_str(&format!("\t{key} = {}\n", encode_value(value)));
    }
}

/// Whether the entry can be written back faithfully (names git would read
/// the same way).
fn writable(section: &str, subsection: Option<&str>, value: &str) -> bool {
    !section.is_empty()
        && section.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && subsection.is_none_or(|s| !s.contains(['\n', '\r', '\0']))
        && !value.contains('\0')
}

/// The allowlist itself (see the module documentation).
fn entry_allowed(
    section: &str,
    subsection: Option<&str>,
    key: &str,
    value: &str,
    location: ConfigLocation<'_>,
    path_ok: &dyn Fn(&Path) -> bool,
    kept_remotes: &HashSet<&str>,
) -> bool {
    // A remote's name, or else a place (git takes a value that is no
    // remote's name as a URL).
    let remote_ok = |value: &str| {
        if git_model::is_remote_name(value) { kept_remotes.contains(value) } else { place_ok(value, location, path_ok) }
    };
    match (section, subsection) {
        ("core", None) => match key {
            "worktree" => path_value_ok(value, location, path_ok),
            _ => matches!(
                key,
                "repositoryformatversion"
                    | "filemode"
                    | "bare"
                    | "logallrefupdates"
                    | "ignorecase"
                    | "precomposeunicode"
                    | "symlinks"
                    | "autocrlf"
                    | "eol"
                    | "safecrlf"
                    | "quotepath"
                    | "checkstat"
                    | "trustctime"
                    | "sparsecheckout"
                    | "sparsecheckoutcone"
                    | "splitindex"
                    | "untrackedcache"
                    | "abbrev"
                    | "bigfilethreshold"
            ),
        },
        ("extensions", None) => match key {
            // Names the promisor remote; a value that is no remote's name
            // is taken as a URL (`remote.c`: `valid_remote_nick`).
            "partialclone" => remote_ok(value),
            _ => matches!(key, "objectformat" | "worktreeconfig" | "refstorage" | "preciousobjects" | "noop"),
        },
        ("remote", Some(_)) => match key {
            "url" | "pushurl" => place_ok(value, location, path_ok),
            _ => matches!(
                key,
                "fetch"
                    | "push"
                    | "mirror"
                    | "tagopt"
                    | "prune"
                    | "prunetags"
                    | "promisor"
                    | "partialclonefilter"
                    | "skipdefaultupdate"
                    | "skipfetchall"
            ),
        },
        ("branch", Some(_)) => match key {
            "remote" | "pushremote" => remote_ok(value),
            _ => matches!(key, "merge" | "rebase" | "description"),
        },
        ("submodule", Some(_)) => match key {
            "url" => place_ok(value, location, path_ok),
            "update" => matches!(value, "checkout" | "rebase" | "merge" | "none"),
            _ => matches!(key, "active" | "path" | "branch" | "ignore" | "fetchrecursesubmodules" | "shallow"),
        },
        ("submodule", None) => matches!(key, "active" | "recurse" | "fetchjobs"),
        ("user", None) => matches!(key, "name" | "email"),
        ("init", None) => key == "defaultbranch",
        ("gc", None) => key == "auto",
        ("pull", None) => matches!(key, "rebase" | "ff"),
        ("push", None) => matches!(key, "default" | "autosetupremote"),
        ("fetch", None) => key == "prune",
        ("worktree", None) => key == "guessremote",
        ("i18n", None) => matches!(key, "commitencoding" | "logoutputencoding"),
        ("index", None) => key == "version",
        _ => false,
    }
}

/// A remote or submodule URL git will not turn into a command: no option
/// look-alike, no `<helper>::address` (transport helpers `ext::`, `fd::`,
/// or any `git-remote-<helper>` program), no control characters.
pub fn url_ok(url: &str) -> bool {
    git_model::url_place(url) != git_model::UrlPlace::Refused
}

/// Whether a URL names a place inside the root the repository is in
/// ([`git_model::url_place`]): a local path (or `file://`) that stays
/// inside lexically, from the git dir and from its parent (the work tree
/// git runs a fetch in), with no symlink on the way. Network URLs and
/// places outside are dropped: the host's git would fetch from or push to
/// them, past the Domain's egress policy, or copy host data into the
/// workspace.
fn place_ok(value: &str, location: ConfigLocation<'_>, path_ok: &dyn Fn(&Path) -> bool) -> bool {
    let git_dir = location.git_dir;
    let work_tree = git_dir.parent().unwrap_or(Path::new(""));
    match git_model::url_place(value) {
        git_model::UrlPlace::Local(path) => git_model::local_place_inside(&path, location.workspace_abs, &[git_dir, work_tree])
            .is_some_and(|paths| paths.iter().all(|p| path_ok(p))),
        git_model::UrlPlace::Network | git_model::UrlPlace::Refused => false,
    }
}

/// Whether a path value (relative to the git dir, or absolute) stays in
/// the workspace lexically and `path_ok` accepts it.
fn path_value_ok(value: &str, location: ConfigLocation<'_>, path_ok: &dyn Fn(&Path) -> bool) -> bool {
    match workspace_relative(value, location) {
        Some(rel) => path_ok(&rel),
        None => false,
    }
}

/// `value` (absolute, or relative to the git dir) as a normalised
/// workspace-relative path, if it stays inside the workspace lexically.
/// `~` paths and empty values are refused.
pub fn workspace_relative(value: &str, location: ConfigLocation<'_>) -> Option<PathBuf> {
    if value.is_empty() || value.starts_with('~') {
        return None;
    }
    let value = Path::new(value);
    if value.is_absolute() {
        super::git_model::join_inside(Path::new(""), value.strip_prefix(location.workspace_abs).ok()?)
    } else {
        super::git_model::join_inside(location.git_dir, value)
    }
}

/// A subsection name in quotes (`\` and `"` escaped).
fn escape_subsection(sub: &str) -> String {
    sub.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A value as git writes it: bare when that reads back the same, quoted
/// with escapes otherwise.
fn encode_value(value: &str) -> String {
    let plain = !value.is_empty()
        && !value.starts_with(char::is_whitespace)
        && !value.ends_with(char::is_whitespace)
        && !value.contains(['"', '\\', '#', ';', '\n', '\t', '\r']);
    if plain {
        return value.to_owned();
    }
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location() -> ConfigLocation<'static> {
        ConfigLocation { workspace_abs: Path::new("/ws"), git_dir: Path::new(".git/modules/sub") }
    }

    fn filter(text: &str) -> FilteredConfig {
        filter_config(text.as_bytes(), location(), &|_| true)
    }

    #[test]
    fn against_the_developers_version_their_entries_stay_and_the_agents_are_allowlisted() {
        let developer = "[core]\n\trepositoryformatversion = 0\n\tfsmonitor = .git/hooks/watchman\n\
                         [remote \"origin\"]\n\turl = git@github.com:dev/project.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n\
                         [branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n[alias]\n\tst = status\n";
        // What `git remote add`, `git config user.name` and a planted key
        // inside make of it (git keeps the other entries where they were).
        let agents = format!(
            "{developer}[remote \"local\"]\n\turl = /ws/bare.git\n\tfetch = +refs/heads/*:refs/remotes/local/*\n\
             [user]\n\tname = Agent\n[core]\n\tpager = touch /tmp/pwned\n[branch \"work\"]\n\tremote = local\n\tmerge = refs/heads/work\n"
        );
        let out = filter_config_against(agents.as_bytes(), developer.as_bytes(), location(), &|_| true);
        let text = String::from_utf8_lossy(&out.text);
        assert_eq!(out.dropped, ["core.pager"], "{text}");
        for kept in [
            "fsmonitor = .git/hooks/watchman",
            "url = git@github.com:dev/project.git",
            "st = status",
            "url = /ws/bare.git",
            "name = Agent",
            "remote = local",
        ] {
            assert!(text.contains(kept), "{kept} missing: {text}");
        }
        // Without the developer's version, their keys would go too.
        let plain = filter_config(agents.as_bytes(), location(), &|_| true);
        assert!(plain.dropped.contains(&"core.fsmonitor".to_owned()) && plain.dropped.contains(&"remote.origin.url".to_owned()));
    }

    /// The user's trial: `git config user.name Agent` inside replaced the
    /// developer's `user.name = Dev`, and putting Dev back after it made
    /// the key multi-valued (git's last value wins: the agent's change was
    /// undone, and `git config user.name` then refused to set it).
    #[test]
    fn a_developer_key_the_agent_set_to_an_allowlisted_value_takes_that_value() {
        let developer = "[user]\n\tname = Dev\n[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n\
                         [remote \"origin\"]\n\turl = git@github.com:dev/project.git\n";
        let agents = "[user]\n\tname = Agent\n[branch \"main\"]\n\tremote = local\n\tmerge = refs/heads/work\n\
                      [remote \"origin\"]\n\turl = git@github.com:dev/project.git\n[remote \"local\"]\n\turl = /ws/bare.git\n";
        let out = filter_config_against(agents.as_bytes(), developer.as_bytes(), location(), &|_| true);
        assert!(out.dropped.is_empty() && out.restored.is_empty(), "{:?} {:?}", out.dropped, out.restored);
        assert!(!out.changes(agents.as_bytes()), "{}", String::from_utf8_lossy(&out.text));
        // Set to a value that is dropped: the developer's comes back, once.
        let agents = "[user]\n\tname = Agent\n[remote \"origin\"]\n\turl = https://evil.example/x.git\n";
        let out = filter_config_against(agents.as_bytes(), developer.as_bytes(), location(), &|_| true);
        assert_eq!(out.dropped, ["remote.origin.url"]);
        assert_eq!(out.restored, ["branch.main.remote", "branch.main.merge", "remote.origin.url"]);
        let text = String::from_utf8_lossy(&out.text);
        assert_eq!(text.matches("url = ").count(), 1, "{text}");
        assert!(
            text.contains("url = git@github.com:dev/project.git") && text.contains("name = Agent") && !text.contains("name = Dev"),
            "{text}"
        );
    }

    #[test]
    fn a_developer_entry_the_agent_changed_or_removed_comes_back() {
        let developer = "[remote \"origin\"]\n\turl = git@github.com:dev/project.git\n[alias]\n\tst = status\n";
        let agents = "[remote \"origin\"]\n\turl = ext::sh -c touch% /tmp/pwned\n";
        let out = filter_config_against(agents.as_bytes(), developer.as_bytes(), location(), &|_| true);
        let text = String::from_utf8_lossy(&out.text);
        assert_eq!(out.dropped, ["remote.origin.url"]);
        assert_eq!(out.restored, ["remote.origin.url", "alias.st"]);
        assert!(!text.contains("ext::"), "{text}");
        assert!(text.contains("url = git@github.com:dev/project.git") && text.contains("st = status"), "{text}");
        // Each occurrence is the developer's once: a copy the agent adds is judged.
        let doubled = "[core]\n\tfsmonitor = x\n[core]\n\tfsmonitor = x\n";
        let out = filter_config_against(doubled.as_bytes(), b"[core]\n\tfsmonitor = x\n", location(), &|_| true);
        assert_eq!(out.dropped, ["core.fsmonitor"]);
    }

    #[test]
    fn git_init_and_clone_configs_come_out_unchanged() {
        let init = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n";
        let clone = format!(
            "{init}[remote \"origin\"]\n\turl = /ws/upstream.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n\
             [branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n"
        );
        for text in [init.to_owned(), clone] {
            let out = filter(&text);
            assert!(out.dropped.is_empty(), "{:?}", out.dropped);
            assert!(!out.changes(text.as_bytes()), "{}", String::from_utf8_lossy(&out.text));
        }
        let module =
            "[core]\n\trepositoryformatversion = 0\n\tworktree = ../../../sub\n[submodule \"lib\"]\n\turl = ../lib.git\n\tactive = true\n";
        let out = filter(module);
        assert!(out.dropped.is_empty(), "{:?}", out.dropped);
        assert!(!out.changes(module.as_bytes()));
    }

    /// git keeps the case a key was set with (`git config
    /// extensions.worktreeConfig true` writes `worktreeConfig`): written
    /// back the same, so the developer's config that the agent's `git
    /// submodule add` extended needs no rewrite.
    #[test]
    fn keys_keep_their_spelling_and_a_git_written_developer_config_comes_out_unchanged() {
        let developer = "[core]\n\trepositoryFormatVersion = 1\n\tfilemode = true\n[extensions]\n\tworktreeConfig = true\n";
        let agents = format!("{developer}[submodule \"sub\"]\n\turl = /ws/nested\n\tactive = true\n");
        let out = filter_config_against(agents.as_bytes(), developer.as_bytes(), location(), &|_| true);
        assert!(out.dropped.is_empty() && out.restored.is_empty(), "{:?} {:?}", out.dropped, out.restored);
        assert!(!out.changes(agents.as_bytes()), "{}", String::from_utf8_lossy(&out.text));
    }

    #[test]
    fn drops_everything_that_runs_or_loads_something() {
        let text = "[core]\n\tfsmonitor = /tmp/x\n\thooksPath = h\n\tpager = evil\n\tsshCommand = evil\n\teditor = e\n\
                    \tbare = false\n[include]\n\tpath = /tmp/c\n[includeIf \"gitdir:/\"]\n\tpath = c\n[alias]\n\tst = !evil\n\
                    [filter \"x\"]\n\tclean = evil\n[diff]\n\texternal = evil\n[remote \"o\"]\n\turl = ext::sh -c evil\n\
                    \tuploadpack = evil\n\tpushurl = fd::7\n[remote \"p\"]\n\turl = -oProxyCommand=evil\n[remote \"q\"]\n\
                    \turl = weird::thing\n[submodule \"s\"]\n\tupdate = !evil\n\turl = ../ok\n[credential]\n\thelper = evil\n";
        let out = filter(text);
        let kept = String::from_utf8_lossy(&out.text).into_owned();
        assert_eq!(kept, "[core]\n\tbare = false\n[submodule \"s\"]\n\turl = ../ok\n");
        for key in [
            "core.fsmonitor",
            "core.hookspath",
            "include.path",
            "includeif.gitdir:/.path",
            "alias.st",
            "remote.o.url",
            "remote.o.pushurl",
            "submodule.s.update",
        ] {
            assert!(out.dropped.iter().any(|d| d == key), "{key} not in {:?}", out.dropped);
        }
    }

    #[test]
    fn path_values_must_stay_inside() {
        let out = filter("[core]\n\tworktree = ../../../../../etc\n");
        assert_eq!(out.dropped, vec!["core.worktree"]);
        let out = filter("[core]\n\tworktree = /elsewhere/x\n");
        assert_eq!(out.dropped, vec!["core.worktree"]);
        let out = filter("[core]\n\tworktree = /ws/sub\n");
        assert!(out.dropped.is_empty());
        let refused = filter_config(b"[core]\n\tworktree = ../../../sub\n", location(), &|p| p != Path::new("sub"));
        assert_eq!(refused.dropped, vec!["core.worktree"], "the caller's symlink check is honoured");
        assert_eq!(workspace_relative("../../../sub", location()), Some(PathBuf::from("sub")));
        assert_eq!(workspace_relative("~/x", location()), None);
    }

    #[test]
    fn only_places_inside_the_workspace_are_kept() {
        let text = "[remote \"net\"]\n\turl = https://example.com/x.git\n\tpushurl = git@example.com:x.git\n\
                    [remote \"host\"]\n\turl = /home/dev/private\n[remote \"file\"]\n\turl = file:///home/dev/private\n\
                    [remote \"up\"]\n\turl = ../../../../../etc\n[remote \"in\"]\n\turl = /ws/lib\n\
                    [branch \"main\"]\n\tremote = /home/dev/private\n\tpushremote = in\n\
                    [branch \"dev\"]\n\tremote = net\n\tpushremote = evilhost:x\n\
                    [extensions]\n\tpartialclone = file:///home/dev/private\n[submodule \"s\"]\n\turl = https://example.com/s\n";
        let out = filter(text);
        assert_eq!(
            out.dropped,
            [
                "remote.net.url",
                "remote.net.pushurl",
                "remote.host.url",
                "remote.file.url",
                "remote.up.url",
                "branch.main.remote",
                // `net` keeps no URL: git would read remotes/net, branches/net,
                // then take `net` as the URL; `evilhost:x` is an ssh address.
                "branch.dev.remote",
                "branch.dev.pushremote",
                "extensions.partialclone",
                "submodule.s.url"
            ]
        );
        let kept = String::from_utf8_lossy(&out.text).into_owned();
        assert_eq!(kept, "[remote \"in\"]\n\turl = /ws/lib\n[branch \"main\"]\n\tpushremote = in\n");
        let through_symlink = filter_config(b"[remote \"o\"]\n\turl = /ws/link/x\n", location(), &|p| !p.starts_with("link"));
        assert_eq!(through_symlink.dropped, ["remote.o.url"]);
    }

    #[test]
    fn urls() {
        for ok in ["https://h/x", "git@h:x.git", "../rel", "/abs/path", "file:///x", "ssh://h/x::y"] {
            assert!(url_ok(ok), "{ok}");
        }
        for bad in ["ext::sh -c x", "fd::3", "EXT::x", "hg::x", "-u x", "", "a\nb"] {
            assert!(!url_ok(bad), "{bad}");
        }
    }

    #[test]
    fn malformed_and_odd_values_are_rewritten_safely() {
        let out = filter("garbage line\n[core]\n\tbare = \"a # b\"\n[user]\n\tname = \" x\\\"y\"\n");
        assert_eq!(out.skipped_lines, 1);
        let text = String::from_utf8_lossy(&out.text).into_owned();
        assert_eq!(text, "[core]\n\tbare = \"a # b\"\n[user]\n\tname = \" x\\\"y\"\n");
        let reparsed = GitConfig::parse(&out.text);
        assert_eq!(reparsed.get("user", "name"), Some(" x\"y"));
        // A subsection spelled the old way is written quoted, lower-cased as git reads it.
        let out = filter("[remote \"o\"]\n\turl = ../o\n[branch.Main]\n\tremote = o\n");
        assert_eq!(String::from_utf8_lossy(&out.text), "[remote \"o\"]\n\turl = ../o\n[branch \"main\"]\n\tremote = o\n");
    }
}
