//! Starting a Domain's coordinator (`lazaret __coordinator`, detached) and
//! relaying what it says on its status pipe while it starts.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Child, Command, Stdio};

use crate::context::Context;
use crate::layout::DomainDir;

use super::{ClientError, RunRequest};

/// What a starting coordinator said on its status pipe: warnings are
/// relayed as they arrive; errors are kept for the final message.
#[derive(Debug, Default)]
pub(super) struct StatusLines {
    pending: Vec<u8>,
    errors: Vec<String>,
}

/// The prefix of an error line on the status pipe.
const ERROR_PREFIX: &str = "lazaret: error: ";

impl StatusLines {
    /// Takes `bytes`, returning the complete non-error lines (to print);
    /// with `all`, an unterminated last line counts too.
    pub fn feed(&mut self, bytes: &[u8], all: bool) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut shown = Vec::new();
        while let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=i).collect();
            self.line(String::from_utf8_lossy(&line).trim_end().to_string(), &mut shown);
        }
        if all && !self.pending.is_empty() {
            let line = String::from_utf8_lossy(&self.pending).trim_end().to_string();
            self.pending.clear();
            self.line(line, &mut shown);
        }
        shown
    }

    fn line(&mut self, line: String, shown: &mut Vec<String>) {
        match line.strip_prefix(ERROR_PREFIX) {
            Some(e) => self.errors.push(e.to_string()),
            None => shown.push(line),
        }
    }

    /// The errors the coordinator reported, one per line.
    pub fn errors(&self) -> Option<String> {
        (!self.errors.is_empty()).then(|| self.errors.join("\n"))
    }
}

/// A coordinator this client started, and its status pipe.
pub(super) struct Launched {
    pub child: Child,
    pipe: File,
    pub status: StatusLines,
}

impl Launched {
    /// Copies start-up messages to stderr. With `all`, also an
    /// unterminated last line.
    pub fn relay(&mut self, all: bool) {
        let mut buf = [0u8; 4096];
        let mut got = Vec::new();
        loop {
            match self.pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        for line in self.status.feed(&got, all) {
            eprintln!("{line}");
        }
    }
}

/// Starts the Domain's coordinator with its stdout a non-blocking status
/// pipe and its stderr the Domain's log.
pub(super) fn spawn_coordinator(req: &RunRequest, ctx: &Context, dir: &DomainDir, session: &str) -> Result<Launched, ClientError> {
    let exe = std::env::current_exe().map_err(ClientError::io("finding the lazaret binary"))?;
    let log_path = dir.log();
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&log_path)
        .map_err(ClientError::io(format!("opening {}", log_path.display())))?;
    let mut cmd = Command::new(exe);
    if let Some(c) = &req.config {
        cmd.arg("--config").arg(c);
    }
    cmd.arg("__coordinator")
        .arg("--domain-dir")
        .arg(dir.path())
        .arg("--session")
        .arg(session)
        .arg("--profile")
        .arg(&ctx.profile.name)
        .arg("-C")
        .arg(&req.dir);
    if req.reset_anchor {
        cmd.arg("--reset-anchor");
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::from(log));
    let mut child = cmd.spawn().map_err(ClientError::io("starting the Domain's coordinator"))?;
    let pipe = child
        .stdout
        .take()
        .map(|p| File::from(OwnedFd::from(p)))
        .ok_or_else(|| ClientError::Io { context: "the coordinator's status pipe".into(), source: std::io::ErrorKind::BrokenPipe.into() })?;
    nix::fcntl::fcntl(&pipe, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).map_err(ClientError::errno("status pipe"))?;
    Ok(Launched { child, pipe, status: StatusLines::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_shown_and_errors_kept_across_partial_reads() {
        let mut s = StatusLines::default();
        assert_eq!(s.feed(b"lazaret: warning: a\nlazaret: err", false), ["lazaret: warning: a"]);
        assert_eq!(s.feed(b"or: it broke\nhalf", false), Vec::<String>::new());
        assert_eq!(s.errors().as_deref(), Some("it broke"));
        assert_eq!(s.feed(b"", true), ["half"]);
        assert_eq!(s.feed(b"lazaret: error: and this\n", true), Vec::<String>::new());
        assert_eq!(s.errors().as_deref(), Some("it broke\nand this"));
    }
}
