//! coordinator/src/config/parse.rs: any text as the host configuration.
//! Errors render (their source excerpts and carets never slice text at a
//! wrong place); a configuration that validates renders as TOML that
//! validates again to the same configuration (same rendering, same
//! Configuration Fingerprint for every profile), and as JSON.
#![no_main]

use std::path::Path;

use lazaret_coordinator::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let file = Path::new("/fuzz/config.toml");
    let home = Path::new("/home/dev");
    let config = match Config::parse(text, file, home) {
        Ok(config) => config,
        Err(error) => {
            let _ = error.to_string();
            let _ = format!("{error:?}");
            return;
        }
    };
    let rendered = config.render_toml().expect("a valid configuration renders as TOML");
    config.render_json().expect("a valid configuration renders as JSON");
    let again = Config::parse(&rendered, file, home)
        .unwrap_or_else(|e| panic!("the rendering does not validate: {e}\n--- input\n{text}\n--- rendering\n{rendered}"));
    assert_eq!(again.render_toml().expect("renders"), rendered, "rendering is not a fixed point");
    assert_eq!(again.profiles.keys().collect::<Vec<_>>(), config.profiles.keys().collect::<Vec<_>>());
    for name in config.profiles.keys() {
        let before = config.fingerprint(name).expect("fingerprint");
        let after = again.fingerprint(name).expect("fingerprint");
        assert_eq!(format!("{before:?}"), format!("{after:?}"), "profile {name}: the fingerprint changed");
    }
});
