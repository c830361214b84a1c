//! coordinator/src/client/prompt.rs (through its `fuzzing` entry point): an
//! escalation prompt with agent-chosen fields and developer-typed bytes.
//! Apart from the prompt's own control sequences, everything it writes is
//! text with no control, escape, invisible or direction-changing
//! character, so the agent can neither forge nor hide prompt text; an
//! edited command that is approved is exactly what the edit line splits to.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use lazaret_coordinator::client::prompt_fuzzing::{Event, OWN_SEQUENCES, drive_prompt};
use lazaret_protocol::display::needs_escape;
use lazaret_protocol::wire::{PromptDecision, PromptRequest};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Happening {
    Input(Vec<u8>),
    Width(u16),
    Tick(u32),
}

#[derive(Debug, Arbitrary)]
struct Input {
    request: String,
    profile: String,
    session: String,
    cwd: String,
    argv: Vec<String>,
    justification: String,
    timeout_secs: u64,
    happenings: Vec<Happening>,
    withdrawn: String,
}

fn remove_all(bytes: &mut Vec<u8>, needle: &[u8]) {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(needle) {
            i += needle.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    *bytes = out;
}

fuzz_target!(|input: Input| {
    let argv = input.argv.clone();
    let request = PromptRequest {
        request: input.request,
        profile: input.profile,
        session: input.session,
        cwd: input.cwd,
        argv: input.argv,
        justification: input.justification,
        timeout_secs: input.timeout_secs,
    };
    let events: Vec<Event> = input
        .happenings
        .into_iter()
        .take(64)
        .map(|h| match h {
            Happening::Input(bytes) => Event::Input(bytes),
            Happening::Width(cols) => Event::Width(cols),
            Happening::Tick(ms) => Event::Tick(Duration::from_millis(u64::from(ms))),
        })
        .collect();
    let (written, decision) = drive_prompt(request, &events, &input.withdrawn);
    for chunk in written {
        let mut text = chunk;
        for own in OWN_SEQUENCES {
            remove_all(&mut text, own);
        }
        remove_all(&mut text, b"\r\n");
        let text = String::from_utf8(text).unwrap_or_else(|e| panic!("the prompt wrote bytes that are not UTF-8: {e}"));
        if let Some(bad) = text.chars().find(|&c| needs_escape(c)) {
            panic!("the prompt wrote a raw {bad:?} in {text:?}");
        }
    }
    if let Some(PromptDecision::Edit { argv: edited }) = &decision {
        assert_ne!(edited, &argv, "an unchanged edit is an approval");
        assert!(!edited.is_empty());
    }
});
