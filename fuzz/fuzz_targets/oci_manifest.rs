//! oci/src/layout.rs, registry/reference.rs, registry/credentials.rs: the
//! documents a registry or an image layout serves (indexes, manifests,
//! configurations), image references and platforms as typed, and docker
//! credential files. A configuration that passes its checks has one
//! well-formed sha256 diff_id per layer; a reference that parses normalises
//! to a name that parses to itself; a platform prints back as it was typed.
//!
//! Input: the document, a NUL, the configuration, a NUL, then a reference
//! line, a platform line, and a credentials file.
#![no_main]

use std::path::Path;

use lazaret_oci::fuzzing::{is_sha256_digest, read_documents};
use lazaret_oci::registry::{ImageReference, Platform, credentials_from_json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == 0);
    let document = parts.next().unwrap_or_default();
    let config = parts.next().unwrap_or_default();
    let rest = parts.next().unwrap_or_default();

    let read = read_documents(document, config);
    if read.config_ok {
        assert_eq!(Some(read.diff_ids.len()), read.manifest_layers, "one diff_id per layer");
        assert!(read.diff_ids.iter().all(|d| is_sha256_digest(d)));
    }

    let text = String::from_utf8_lossy(rest);
    let mut lines = text.splitn(3, '\n');
    let reference = lines.next().unwrap_or_default();
    let platform = lines.next().unwrap_or_default();
    let credentials = lines.next().unwrap_or_default();
    if let Ok(parsed) = ImageReference::parse(reference) {
        let name = parsed.store_name();
        let again = ImageReference::parse(&name).unwrap_or_else(|e| panic!("{reference:?} normalises to {name:?}, which does not parse: {e}"));
        assert_eq!(again.store_name(), name, "normalising {reference:?} twice");
        assert_eq!(again.registry(), parsed.registry());
        assert_eq!(again.repository(), parsed.repository());
        assert_eq!(again.digest(), parsed.digest());
        if let Some(digest) = parsed.digest() {
            assert!(is_sha256_digest(digest));
        }
        let _ = ImageReference::names_registry(reference);
    }
    if let Ok(parsed) = Platform::parse(platform) {
        let shown = match &parsed.variant {
            Some(v) => format!("{}/{}/{v}", parsed.os, parsed.architecture),
            None => format!("{}/{}", parsed.os, parsed.architecture),
        };
        assert_eq!(shown, platform);
    }
    for registry in ["docker.io", "ghcr.io", "127.0.0.1:5000"] {
        if let Ok(Some(found)) = credentials_from_json(credentials.as_bytes(), registry, Path::new("/fuzz/auth.json")) {
            let _ = (found.username.len(), found.password.len());
        }
    }
});
