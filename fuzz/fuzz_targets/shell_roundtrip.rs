//! protocol/src/shell.rs: `split(quote_argv(argv)) == argv` for every argv,
//! quoted text is inert on a terminal, and a line the developer typed that
//! splits is a fixed point of quote-then-split.
#![no_main]

use lazaret_protocol::display::needs_escape;
use lazaret_protocol::shell::{quote_argv, split};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (String, Vec<String>)| {
    let (line, argv) = input;
    // Any argv: quoted, it splits back exactly and shows no raw escape.
    let quoted = quote_argv(&argv);
    assert!(!quoted.chars().any(needs_escape), "raw escaped character in {quoted:?}");
    assert_eq!(split(&quoted).as_deref(), Ok(argv.as_slice()), "line {quoted:?}");
    // Any line: when it splits, its words quote and split back to themselves.
    match split(&line) {
        Ok(words) => {
            let again = quote_argv(&words);
            assert_eq!(split(&again).as_deref(), Ok(words.as_slice()), "line {line:?} requoted {again:?}");
        }
        Err(error) => {
            // The offset it names is a character of the line.
            assert!(error.offset < line.len() && line.is_char_boundary(error.offset), "{error} in {line:?}");
            let _ = error.to_string();
        }
    }
});
