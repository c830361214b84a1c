//! Receiving the PTY master that runsc creates for a container with
//! `terminal: true` (`--console-socket`): runsc connects to our unix socket and
//! sends the master fd with SCM_RIGHTS.

use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

/// Errors while receiving the console.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// Socket set-up or transfer failed.
    #[error("console socket {path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// runsc never connected.
    #[error("runsc did not hand over the terminal on {path} within {secs} s")]
    Timeout {
        /// The socket path.
        path: PathBuf,
        /// The wait.
        secs: u64,
    },
    /// runsc connected but sent no fd.
    #[error("runsc connected to {path} but sent no terminal")]
    NoFd {
        /// The socket path.
        path: PathBuf,
    },
}

/// A listening console socket.
pub struct ConsoleSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl ConsoleSocket {
    /// Binds a new socket at `path` (which must not exist), mode 0600.
    pub fn bind(path: &Path) -> Result<ConsoleSocket, ConsoleError> {
        let io = |source| ConsoleError::Io { path: path.to_path_buf(), source };
        let listener = UnixListener::bind(path).map_err(io)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
        Ok(ConsoleSocket { listener, path: path.to_path_buf() })
    }

    /// The socket path to give runsc.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for runsc's connection and returns the PTY master it sends.
    pub fn receive_master(&self, timeout: Duration) -> Result<OwnedFd, ConsoleError> {
        let io = |source| ConsoleError::Io { path: self.path.clone(), source };
        let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
        let ms = PollTimeout::try_from(timeout.as_millis().min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX);
        let ready = poll(&mut fds, ms).map_err(|e| io(e.into()))?;
        if ready == 0 {
            return Err(ConsoleError::Timeout { path: self.path.clone(), secs: timeout.as_secs() });
        }
        let (stream, _) = self.listener.accept().map_err(io)?;
        let mut buf = [0u8; 4096];
        let mut iov = [IoSliceMut::new(&mut buf)];
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 4]);
        let msg = recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)
            .map_err(|e| io(e.into()))?;
        let mut received: Vec<OwnedFd> = Vec::new();
        for c in msg.cmsgs().map_err(|e| io(e.into()))? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: SCM_RIGHTS installed `fd` in our table just now;
                    // nothing else owns it, so we take ownership exactly once.
                    received.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        // runsc sends exactly one fd; any extra is closed by dropping it.
        received.into_iter().next().ok_or_else(|| ConsoleError::NoFd { path: self.path.clone() })
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{sendmsg, ControlMessage};
    use std::io::IoSlice;
    use std::os::unix::net::UnixStream;

    #[test]
    fn receives_a_passed_fd() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("console.sock");
        let sock = ConsoleSocket::bind(&path).expect("bind");
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let client = UnixStream::connect(&path).expect("connect");
        let fds = [pty.master.as_raw_fd()];
        sendmsg::<()>(client.as_raw_fd(), &[IoSlice::new(b"x")], &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None)
            .expect("sendmsg");
        let got = sock.receive_master(Duration::from_secs(5)).expect("receive");
        // The received fd is the same PTY master: setting its size shows on the slave.
        crate::terminal::set_window_size(got.as_fd(), crate::terminal::WindowSize { rows: 11, cols: 22 }).expect("set");
        assert_eq!(crate::terminal::window_size(pty.slave.as_fd()).expect("get").cols, 22);
    }

    #[test]
    fn times_out_without_a_connection() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = ConsoleSocket::bind(&dir.path().join("c.sock")).expect("bind");
        assert!(matches!(sock.receive_master(Duration::from_millis(50)), Err(ConsoleError::Timeout { .. })));
    }
}
