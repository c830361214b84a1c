//! protocol/src/escalation.rs: the escalation channel's byte streams, read
//! as the coordinator reads a client's (`read_client`, also through the
//! header check its buffered reader uses, `body_len`) and as the client
//! reads the coordinator's (`read_server`). Every frame that parses writes
//! and reads back to itself, the header check agrees with the reader, and a
//! request that validates keeps every limit `validate` promises.
#![no_main]

use lazaret_protocol::escalation::{
    self, ChannelError, ClientFrame, HEADER_LEN, MAX_ARGS, MAX_ARGV_BYTES, MAX_CHUNK, MAX_CWD, MAX_JUSTIFICATION,
    MAX_TIMEOUT_SECS, ServerFrame,
};
use libfuzzer_sys::fuzz_target;

const MAX_FRAMES: usize = 64;

fn client_side(mut bytes: &[u8]) {
    for _ in 0..MAX_FRAMES {
        // What the coordinator's buffered reader does first: the header alone.
        let header = bytes.first_chunk::<HEADER_LEN>().map(|head| escalation::body_len(*head));
        let before = bytes;
        match escalation::read_client(&mut bytes) {
            Ok(frame) => {
                let len = match header {
                    Some(Ok(len)) => len,
                    other => panic!("read_client read a frame whose header fails body_len: {other:?}"),
                };
                assert_eq!(before.len() - bytes.len(), HEADER_LEN + len, "frame length");
                let mut written = Vec::new();
                escalation::write_client(&mut written, &frame).expect("a parsed frame writes");
                let again = escalation::read_client(&mut written.as_slice()).expect("a written frame reads");
                assert_eq!(again, frame);
                if let ClientFrame::Request(request) = &frame {
                    if request.validate().is_ok() {
                        assert_eq!(request.id.len(), 32);
                        assert!(!request.argv.is_empty() && !request.argv[0].is_empty());
                        assert!(request.argv.len() <= MAX_ARGS);
                        assert!(request.argv.iter().map(String::len).sum::<usize>() <= MAX_ARGV_BYTES);
                        assert!(request.argv.iter().all(|a| !a.contains('\0')));
                        assert!(request.cwd.starts_with('/') && request.cwd.len() <= MAX_CWD);
                        assert!(request.justification.len() <= MAX_JUSTIFICATION);
                        assert!(request.timeout_secs.is_none_or(|t| (1..=MAX_TIMEOUT_SECS).contains(&t)));
                    }
                }
            }
            Err(ChannelError::Closed) => {
                assert!(before.is_empty());
                return;
            }
            Err(_) => {
                if let Some(Err(_)) = header {
                    // The buffered reader refuses it at the header as well.
                }
                return;
            }
        }
    }
}

fn server_side(mut bytes: &[u8]) {
    for _ in 0..MAX_FRAMES {
        match escalation::read_server(&mut bytes) {
            Ok(frame) => {
                if let ServerFrame::Stdout(data) | ServerFrame::Stderr(data) = &frame {
                    assert!(data.len() <= MAX_CHUNK);
                }
                let mut written = Vec::new();
                escalation::write_server(&mut written, &frame).expect("a parsed frame writes");
                if let ServerFrame::Stdout(data) | ServerFrame::Stderr(data) = &frame
                    && data.is_empty()
                {
                    // Empty output is no frame at all on the way out.
                    assert!(written.is_empty());
                    continue;
                }
                let again = escalation::read_server(&mut written.as_slice()).expect("a written frame reads");
                assert_eq!(again, frame);
                if let ServerFrame::Result(result) = &frame {
                    let _ = result.outcome.exit_code();
                }
            }
            Err(_) => return,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    client_side(data);
    server_side(data);
});
