//! `lazaret init [--force] [PATH]`: writes the commented starter
//! configuration (`init-template.toml`) with profiles for claude, codex,
//! gemini, grok, opencode and shell.
//!
//! The file is written *as the developer* (under sudo: `SUDO_UID`'s uid and
//! gid, by switching this thread's filesystem ids), so it and any parent
//! directory it creates are theirs, permission checks are theirs, and a
//! symlink in their home can lead nowhere they could not write themselves.
//! An existing file is never replaced without `--force`, which keeps it as
//! `FILE.bak`. Each agent profile keeps the agent's own state directory per
//! profile (`profile_state`), so one login serves every checkout. The
//! agents' own state directories on the host (`~/.claude`,
//! ...) are not shared with their sandboxes: the template's `volumes` lines
//! that would share them are comments (an agent that can write them can make
//! the developer's unsandboxed CLI run its commands).

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};
use lazaret_coordinator::config::{self, Config};
use lazaret_coordinator::identity::Developer;

/// The template. Its (commented) volumes are written `~/X:~/X`: the
/// developer's `~/X` bound at the agent's home inside the sandbox, so the
/// file names no user and suits whoever runs it (the coordinator resolves
/// the sandbox side for the agent of each run).
pub const TEMPLATE: &str = include_str!("init-template.toml");

/// Runs `lazaret init`.
pub fn init(config: Option<PathBuf>, path: Option<PathBuf>, force: bool) -> Result<ExitCode> {
    let developer = Developer::from_process()?;
    let lookup = |name: &str| std::env::var_os(name);
    let target = match path.or(config) {
        Some(p) => p,
        None => config::config_path(None, &lookup, &developer),
    };
    let target = if target.is_absolute() { target } else { std::env::current_dir().context("reading the current directory")?.join(target) };
    let text = TEMPLATE;
    // The text must be a configuration Lazaret accepts (the checks of a
    // real run that need the filesystem come later, at `lazaret run`).
    let parsed =
        Config::parse(text, &target, &developer.home).map_err(|e| anyhow::anyhow!("the built-in template does not parse (a bug): {e}"))?;
    let _as_developer = FsIds::switch_to(&developer)?;
    let backup = write_new(&target, text.as_bytes(), force)?;
    drop(_as_developer);
    println!("wrote {} (profiles: {})", target.display(), parsed.profiles.keys().cloned().collect::<Vec<_>>().join(", "));
    if let Some(b) = backup {
        println!("kept the previous file as {}", b.display());
    }
    println!(
        "check it with `lazaret config check`; start with `lazaret run` (profile {}) or `lazaret run claude`",
        parsed.default_profile.as_deref().unwrap_or("shell")
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes `bytes` to a new file at `target` (0644), creating missing parent
/// directories (0755). An existing entry (a symlink too) is refused, or
/// with `force` renamed to `TARGET.bak` first, which is returned.
fn write_new(target: &Path, bytes: &[u8], force: bool) -> Result<Option<PathBuf>> {
    let parent = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("/"));
    let name = target.file_name().with_context(|| format!("{} names no file", target.display()))?;
    create_dirs(parent)?;
    let mut backup = None;
    match std::fs::symlink_metadata(target) {
        Ok(_) if !force => bail!(
            "{} exists; not overwriting it\n  hint: `lazaret init --force` replaces it (keeping it as {}.bak), or `lazaret init OTHER_PATH` writes elsewhere",
            target.display(),
            target.display()
        ),
        Ok(_) => {
            let mut b = target.as_os_str().to_owned();
            b.push(".bak");
            let b = PathBuf::from(b);
            std::fs::rename(target, &b).with_context(|| format!("keeping the existing {} as {}", target.display(), b.display()))?;
            backup = Some(b);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("looking at {}", target.display())),
    }
    let tmp = parent.join(format!(".{}.lazaret-init", name.to_string_lossy()));
    let _ = std::fs::remove_file(&tmp);
    // O_EXCL | O_NOFOLLOW: a file or symlink planted meanwhile is refused.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    let written = (|| -> std::io::Result<()> {
        file.write_all(bytes)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        file.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", tmp.display()));
    }
    // No replacing rename: something created at the target meanwhile wins.
    if let Err(e) = std::fs::hard_link(&tmp, target) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("creating {}", target.display()));
    }
    let _ = std::fs::remove_file(&tmp);
    Ok(backup)
}

/// Creates `dir` and its missing ancestors, 0755 (as the developer).
fn create_dirs(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dirs(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).with_context(|| format!("chmod {}", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {}", dir.display())),
    }
}

/// This thread's filesystem uid and gid switched to the developer's while
/// it lives (a no-op when they are ours already): files are created as
/// theirs and access is checked as theirs.
struct FsIds {
    restore: Option<(u32, u32)>,
}

impl FsIds {
    fn switch_to(developer: &Developer) -> Result<FsIds> {
        let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        if uid == developer.uid && gid == developer.gid {
            return Ok(FsIds { restore: None });
        }
        if uid != 0 {
            bail!(
                "lazaret init writes the configuration of uid {}, but runs as uid {uid}; run it as that user (or with sudo from their account)",
                developer.uid
            );
        }
        // gid first: once the fsuid is not 0, changing the fsgid is refused.
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(developer.gid));
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(developer.uid));
        if nix::unistd::setfsuid(nix::unistd::Uid::from_raw(developer.uid)).as_raw() != developer.uid {
            bail!("cannot act as uid {} to write the configuration", developer.uid);
        }
        Ok(FsIds { restore: Some((uid, gid)) })
    }
}

impl Drop for FsIds {
    fn drop(&mut self) {
        if let Some((uid, gid)) = self.restore {
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(gid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use lazaret_coordinator::config::SandboxPath;

    /// The template with its commented `volumes` lines (the opt-in to share
    /// the host state directories) uncommented.
    fn with_shared_state() -> String {
        TEMPLATE
            .lines()
            .map(|l| {
                l.strip_prefix("# volumes = ")
                    .map_or(l.to_string(), |rest| format!("volumes = {}", rest.split("   #").next().unwrap_or(rest)))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn the_template_parses_with_every_agent_profile_installing_its_cli() {
        let config = Config::parse(TEMPLATE, Path::new("/home/alice/.config/lazaret/config.toml"), Path::new("/home/alice"))
            .expect("the template parses");
        let names: Vec<&str> = config.profiles.keys().map(String::as_str).collect();
        assert_eq!(names, ["claude", "codex", "gemini", "grok", "opencode", "shell"]);
        let packages = [
            ("claude", "@anthropic-ai/claude-code"),
            ("codex", "@openai/codex"),
            ("gemini", "@google/gemini-cli"),
            ("grok", "@vibe-kit/grok-cli"),
            ("opencode", "opencode-ai"),
        ];
        for (name, package) in packages {
            let p = &config.profiles[name];
            assert_eq!(p.image, "docker.io/library/debian:trixie", "{name}");
            assert!(p.isolate_gitignored && p.persistent_dirs.iter().any(|d| d == Path::new("/usr")), "{name}");
            assert_eq!(p.setup.last().map(|s| s.join(" ")), Some(format!("npm install -g {package}")), "{name}");
            assert!(p.setup.iter().any(|s| s.contains(&"nodejs".to_string()) && s.contains(&"npm".to_string())), "{name}");
            assert!(p.env.values().any(|v| v.to_string().starts_with("env:")), "{name}: an API key from the environment");
            assert!(p.volumes.is_empty(), "{name}: the developer's own state directory is not shared unless they say so");
            assert!(!p.profile_state.is_empty(), "{name}: the agent's state is kept per profile");
        }
        // Uncommented, each agent profile's volumes line shares exactly the
        // agent's state directory, at the same place below both homes.
        let shared = Config::parse(&with_shared_state(), Path::new("/x.toml"), Path::new("/home/alice")).expect("the opt-in parses");
        for (name, _) in packages {
            let p = &shared.profiles[name];
            assert!(!p.volumes.is_empty(), "{name}: no commented volumes line");
            for v in &p.volumes {
                let SandboxPath::AgentHome(rel) = &v.sandbox else { panic!("{name}: {v} is not below the agent's home") };
                assert!(v.host.starts_with("/home/alice/.") && rel.to_string_lossy().starts_with('.'), "{name}: {v}");
                assert_eq!(v.host.strip_prefix("/home/alice").ok(), Some(rel.as_path()), "{name}: the same state directory on both sides");
            }
        }
        // Each agent's state directory is kept per profile, where the
        // commented volumes line would bind the host's.
        for (name, _) in packages {
            let state: Vec<String> = config.profiles[name].profile_state.iter().map(ToString::to_string).collect();
            let volumes: Vec<String> =
                shared.profiles[name].volumes.iter().map(|v| v.written.split(':').nth(1).unwrap_or_default().to_string()).collect();
            assert_eq!(state, volumes, "{name}");
        }
        assert_eq!(config.profiles["claude"].env.get("CLAUDE_CONFIG_DIR").map(ToString::to_string).as_deref(), Some("~/.claude"));
        assert!(config.profiles["shell"].profile_state.is_empty());
        assert_eq!(config.profiles["codex"].command, ["codex", "--sandbox", "danger-full-access"]);
        assert_eq!(config.profiles["gemini"].env.get("GEMINI_CLI_TRUST_WORKSPACE").map(ToString::to_string).as_deref(), Some("true"));
        assert_eq!(config.default_profile.as_deref(), Some("shell"));
    }

    #[test]
    fn the_template_names_no_user_and_suits_any_agent() {
        for line in TEMPLATE.lines().filter(|l| !l.trim_start().starts_with('#')) {
            assert!(!line.contains("/home/") && !line.contains("/root/"), "a home written out: {line}");
        }
        assert!(TEMPLATE.contains("\"~/.claude:~/.claude\""));
        // Parsed for two developers, the volumes differ only on the host
        // side; the sandbox side is the agent's home for each.
        let parse = |home: &str| Config::parse(&with_shared_state(), Path::new("/x.toml"), Path::new(home)).expect("parse");
        let (alice, bob) = (parse("/home/alice"), parse("/home/bob"));
        for (name, a) in &alice.profiles {
            let b = &bob.profiles[name];
            let sandbox = |p: &lazaret_coordinator::config::Profile| p.volumes.iter().map(|v| v.sandbox.clone()).collect::<Vec<_>>();
            assert_eq!(sandbox(a), sandbox(b), "{name}");
            for v in &a.volumes {
                assert_eq!(
                    v.resolve(Path::new("/root")).sandbox,
                    Path::new("/root").join(v.host.strip_prefix("/home/alice").expect("below home")),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn the_example_configuration_has_the_templates_profiles() {
        // docs/config.example.toml shows the same profiles.
        let example = include_str!("../../docs/config.example.toml");
        let home = Path::new("/home/alice");
        let example = Config::parse(example, Path::new("/x.toml"), home).expect("the example parses");
        let template = Config::parse(TEMPLATE, Path::new("/x.toml"), home).expect("template");
        for (name, t) in &template.profiles {
            let e = example.profiles.get(name).unwrap_or_else(|| panic!("docs/config.example.toml lacks profile {name}"));
            assert_eq!(
                (&e.image, &e.command, &e.setup, &e.persistent_dirs, e.isolate_gitignored),
                (&t.image, &t.command, &t.setup, &t.persistent_dirs, t.isolate_gitignored),
                "profile {name}"
            );
            assert_eq!(e.env, t.env, "profile {name}");
            let vols = |p: &lazaret_coordinator::config::Profile| p.volumes.iter().map(|v| v.written.clone()).collect::<Vec<_>>();
            assert_eq!(vols(e), vols(t), "profile {name}");
            assert_eq!(e.profile_state, t.profile_state, "profile {name}");
        }
    }
}
