//! protocol/src/wire.rs and coordinator/src/transport.rs: a byte stream from
//! a peer, read frame by frame as both sides read it. Every message that
//! parses encodes and parses back to itself, and the coordinator's
//! descriptor-passing reader (over a real unix socket) reads exactly what
//! the plain reader reads, with the same kind of error at the end.
#![no_main]

use std::io::Write;
use std::os::unix::net::UnixStream;

use lazaret_coordinator::transport::read_frame_with_fds;
use lazaret_protocol::wire::{self, ClientMessage, CoordinatorMessage, FrameError, MAX_FRAME};
use libfuzzer_sys::fuzz_target;
use serde::{Serialize, de::DeserializeOwned};

/// The most frames read from one input.
const MAX_FRAMES: usize = 64;
/// Inputs are written whole into a socket before they are read: stay under
/// its buffer.
const MAX_SOCKET_INPUT: usize = 64 * 1024;

fn kind(error: &FrameError) -> &'static str {
    match error {
        FrameError::Closed => "closed",
        FrameError::TooLarge(_) => "too large",
        FrameError::Malformed(_) => "malformed",
        FrameError::RateExceeded(_) => "rate",
        FrameError::Io(_) => "io",
    }
}

fn plain<T: DeserializeOwned>(mut bytes: &[u8]) -> (Vec<T>, &'static str) {
    let mut messages = Vec::new();
    loop {
        match wire::read_message::<T>(&mut bytes) {
            Ok(message) if messages.len() < MAX_FRAMES => messages.push(message),
            Ok(_) => return (messages, "enough"),
            Err(error) => return (messages, kind(&error)),
        }
    }
}

fn over_socket<T: DeserializeOwned>(bytes: &[u8]) -> (Vec<T>, &'static str) {
    let (mut tx, rx) = UnixStream::pair().expect("socketpair");
    tx.write_all(bytes).expect("write to socketpair");
    drop(tx);
    let mut messages = Vec::new();
    loop {
        match read_frame_with_fds::<T>(&rx) {
            Ok((message, fds)) if messages.len() < MAX_FRAMES => {
                assert!(fds.is_empty());
                messages.push(message);
            }
            Ok(_) => return (messages, "enough"),
            Err(error) => return (messages, kind(&error)),
        }
    }
}

fn check<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
    let (messages, end) = plain::<T>(bytes);
    for message in &messages {
        let frame = wire::encode(message).expect("a parsed message encodes");
        assert!(frame.len() - 4 <= MAX_FRAME);
        let again: T = wire::read_message(&mut frame.as_slice()).expect("an encoded message parses");
        assert_eq!(&again, message);
    }
    if bytes.len() <= MAX_SOCKET_INPUT {
        let (via_socket, socket_end) = over_socket::<T>(bytes);
        assert_eq!(via_socket, messages, "the socket reader read other messages");
        assert_eq!(socket_end, end, "the socket reader ended otherwise");
    }
}

fuzz_target!(|data: &[u8]| {
    check::<ClientMessage>(data);
    check::<CoordinatorMessage>(data);
});
