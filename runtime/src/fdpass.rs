//! Passing file descriptors over a unix stream socket (SCM_RIGHTS), with a
//! data payload: a client hands its stdio to the coordinator, and the
//! coordinator hands a session's PTY master back.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

/// Most descriptors accepted in one message; extra ones are closed.
pub const MAX_FDS: usize = 3;

/// Sends all of `data`, attaching `fds` to its first byte.
pub fn send_with_fds(stream: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs = if raw.is_empty() { Vec::new() } else { vec![ControlMessage::ScmRights(&raw)] };
    let sent = sendmsg::<()>(stream.as_raw_fd(), &[IoSlice::new(data)], &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    let rest = data.get(sent..).unwrap_or_default();
    if !rest.is_empty() {
        use std::io::Write;
        (&*stream).write_all(rest)?;
    }
    Ok(())
}

/// Reads at least one byte into `buf` and returns how many, with the
/// descriptors that came with them (at most [`MAX_FDS`]; more are closed).
/// 0 bytes means the peer closed the connection.
pub fn recv_with_fds(stream: &UnixStream, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let (n, mut fds, truncated) = crate::sys::recv_with_rights(stream, buf)?;
    fds.truncate(MAX_FDS);
    if truncated {
        // Some descriptors were dropped by the kernel: the message is not
        // what the peer meant; refuse it.
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "too many file descriptors in one message"));
    }
    Ok((n, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn passes_descriptors_with_data() {
        let (a, b) = UnixStream::pair().expect("pair");
        let pty = nix::pty::openpty(None, None).expect("openpty");
        send_with_fds(&a, b"hello", &[pty.master.as_fd()]).expect("send");
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(&b, &mut buf).expect("recv");
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        crate::terminal::set_window_size(fds[0].as_fd(), crate::terminal::WindowSize { rows: 3, cols: 4 }).expect("set");
        assert_eq!(crate::terminal::window_size(pty.slave.as_fd()).expect("get").cols, 4);
    }
}
