//! The client↔coordinator transport over the Domain's unix socket: the
//! length-prefixed JSON frames of [`lazaret_protocol::wire`], optionally
//! carrying file descriptors (SCM_RIGHTS), and one-shot requests.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use lazaret_protocol::wire::{self, FrameError};
use lazaret_runtime::fdpass;
use serde::{Serialize, de::DeserializeOwned};

/// How long a one-shot request waits for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads one frame with any descriptors sent along with it.
pub fn read_frame_with_fds<T: DeserializeOwned>(stream: &UnixStream) -> Result<(T, Vec<OwnedFd>), FrameError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < 4 {
        let (n, more) = fdpass::recv_with_fds(stream, &mut prefix[got..])?;
        if n == 0 {
            return Err(if got == 0 { FrameError::Closed } else { FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()) });
        }
        if fds.len() + more.len() > fdpass::MAX_FDS {
            return Err(FrameError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, "too many file descriptors")));
        }
        fds.extend(more);
        got += n;
    }
    let len = wire::body_len(prefix)?;
    let mut body = vec![0u8; len];
    std::io::Read::read_exact(&mut &*stream, &mut body)?;
    Ok((wire::decode(&body)?, fds))
}

/// Writes one frame, passing `fds` along with its first byte.
pub fn write_frame_with_fds<T: Serialize>(stream: &UnixStream, msg: &T, fds: &[BorrowedFd<'_>]) -> Result<(), FrameError> {
    let frame = wire::encode(msg)?;
    fdpass::send_with_fds(stream, &frame, fds)?;
    Ok(())
}

/// Connects to `socket`, sends `msg` and returns the one answer.
pub fn request<Q: Serialize, A: DeserializeOwned>(socket: &Path, msg: &Q) -> Result<A, FrameError> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut s = &stream;
    wire::write_message(&mut s, msg)?;
    wire::read_message(&mut s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazaret_protocol::wire::{ClientMessage, WIRE_VERSION};
    use std::os::fd::AsFd;

    #[test]
    fn a_frame_carries_its_descriptors() {
        let (a, b) = UnixStream::pair().expect("pair");
        let file = tempfile::tempfile().expect("tempfile");
        write_frame_with_fds(&a, &ClientMessage::Status { version: WIRE_VERSION }, &[file.as_fd()]).expect("write");
        let (msg, fds): (ClientMessage, _) = read_frame_with_fds(&b).expect("read");
        assert!(matches!(msg, ClientMessage::Status { version } if version == WIRE_VERSION));
        assert_eq!(fds.len(), 1);
    }

    #[test]
    fn a_closed_stream_is_reported_as_closed() {
        let (a, b) = UnixStream::pair().expect("pair");
        drop(a);
        assert!(matches!(read_frame_with_fds::<ClientMessage>(&b), Err(FrameError::Closed)));
    }

    #[test]
    fn an_oversized_frame_is_refused_before_reading_its_body() {
        let (a, b) = UnixStream::pair().expect("pair");
        std::io::Write::write_all(&mut &a, &u32::MAX.to_be_bytes()).expect("prefix");
        assert!(read_frame_with_fds::<ClientMessage>(&b).is_err());
    }
}
