//! The environment of a host command: fixed, small, and never anything the
//! agent sent.
//!
//! - `PATH` is fixed ([`HOST_COMMAND_PATH`]): never the agent's, never the
//!   developer's (which may name directories inside the workspace);
//! - `HOME`, `USER`, `LOGNAME`, `SHELL` are the developer's;
//! - `SSH_AUTH_SOCK`, `LANG` and the `LC_*` variables of [`LAUNCHING_SESSION_ENV`] come
//!   from the environment of the `lazaret run` that started the requesting
//!   session (its Hello's `host_env`), so `git push` over ssh uses the
//!   developer's agent;
//! - the variables a matching rule names (its `env`), from the same place.

use std::path::Path;

use super::rules::{HOST_COMMAND_PATH, LAUNCHING_SESSION_ENV};

/// Most variables a Hello may carry.
pub const MAX_HOST_VARS: usize = 64;
/// Longest value of one of them, in bytes.
pub const MAX_HOST_VALUE: usize = 4096;

/// Keeps the Hello's variables that are in `allowed` and well-formed (a
/// name once, no NUL, a value of at most [`MAX_HOST_VALUE`] bytes); returns
/// them and the names it dropped (for the log).
pub fn accept_session_env(sent: Vec<(String, String)>, allowed: &[String]) -> (Vec<(String, String)>, Vec<String>) {
    let mut kept: Vec<(String, String)> = Vec::new();
    let mut dropped = Vec::new();
    for (name, value) in sent {
        let ok = kept.len() < MAX_HOST_VARS
            && allowed.contains(&name)
            && !kept.iter().any(|(k, _)| *k == name)
            && !value.contains('\0')
            && value.len() <= MAX_HOST_VALUE;
        if ok {
            kept.push((name, value));
        } else {
            dropped.push(name);
        }
    }
    (kept, dropped)
}

/// The developer as a host command sees them.
pub struct HostUser<'a> {
    /// Login name.
    pub name: &'a str,
    /// Home directory.
    pub home: &'a Path,
    /// Login shell.
    pub shell: &'a Path,
}

/// The complete environment of one host command: the fixed part, the
/// session's [`LAUNCHING_SESSION_ENV`], then the rule's `rule_env` names, each from
/// `session_env` when the session's `lazaret run` had it.
pub fn host_environment(user: &HostUser<'_>, session_env: &[(String, String)], rule_env: &[String]) -> Vec<(String, String)> {
    let mut env = vec![
        ("PATH".to_string(), HOST_COMMAND_PATH.to_string()),
        ("HOME".to_string(), user.home.to_string_lossy().into_owned()),
        ("USER".to_string(), user.name.to_string()),
        ("LOGNAME".to_string(), user.name.to_string()),
        ("SHELL".to_string(), user.shell.to_string_lossy().into_owned()),
    ];
    let wanted = LAUNCHING_SESSION_ENV.iter().map(|s| s.to_string()).chain(rule_env.iter().cloned());
    for name in wanted {
        if env.iter().any(|(k, _)| *k == name) {
            continue;
        }
        if let Some((_, value)) = session_env.iter().find(|(k, _)| *k == name) {
            env.push((name, value.clone()));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> HostUser<'static> {
        HostUser { name: "dev", home: Path::new("/home/dev"), shell: Path::new("/bin/zsh") }
    }

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_environment_is_the_fixed_part_the_session_vars_and_the_rules_names() {
        let session = vars(&[("SSH_AUTH_SOCK", "/tmp/ssh-x/agent.1"), ("LANG", "C.UTF-8"), ("GH_TOKEN", "t"), ("EDITOR", "vi")]);
        let env = host_environment(&user(), &session, &["GH_TOKEN".into(), "MISSING".into()]);
        assert_eq!(
            env,
            vars(&[
                ("PATH", HOST_COMMAND_PATH),
                ("HOME", "/home/dev"),
                ("USER", "dev"),
                ("LOGNAME", "dev"),
                ("SHELL", "/bin/zsh"),
                ("SSH_AUTH_SOCK", "/tmp/ssh-x/agent.1"),
                ("LANG", "C.UTF-8"),
                ("GH_TOKEN", "t"),
            ])
        );
        // Without the rule, the token stays out; EDITOR was never allowed.
        let env = host_environment(&user(), &session, &[]);
        assert!(!env.iter().any(|(k, _)| k == "GH_TOKEN" || k == "EDITOR"));
    }

    #[test]
    fn a_rule_cannot_replace_the_fixed_variables() {
        let session = vars(&[("PATH", "/home/dev/src/p/bin"), ("HOME", "/tmp/evil")]);
        let env = host_environment(&user(), &session, &["PATH".into(), "HOME".into()]);
        assert_eq!(env.iter().filter(|(k, _)| k == "PATH").count(), 1);
        assert!(env.contains(&("PATH".into(), HOST_COMMAND_PATH.into())));
        assert!(env.contains(&("HOME".into(), "/home/dev".into())));
    }

    #[test]
    fn the_hello_keeps_only_allowed_well_formed_variables() {
        let allowed: Vec<String> = ["SSH_AUTH_SOCK", "LANG"].iter().map(|s| s.to_string()).collect();
        let sent = vars(&[("SSH_AUTH_SOCK", "/s"), ("LD_PRELOAD", "/x.so"), ("LANG", "a\0b"), ("SSH_AUTH_SOCK", "/second")]);
        let (kept, dropped) = accept_session_env(sent, &allowed);
        assert_eq!(kept, vars(&[("SSH_AUTH_SOCK", "/s")]));
        assert_eq!(dropped, ["LD_PRELOAD", "LANG", "SSH_AUTH_SOCK"]);
        let long = vars(&[("LANG", &"x".repeat(MAX_HOST_VALUE + 1))]);
        assert!(accept_session_env(long, &allowed).0.is_empty());
    }
}
