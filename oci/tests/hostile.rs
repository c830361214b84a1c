//! A corpus of hostile archives, built in the test: each must be refused or
//! neutralised, with nothing written outside the store.

mod common;

use std::path::Path;

use common::{Arena, RawTar, gzip, zstd};
use lazaret_oci::{ImageError, ImageStore, UnpackLimits, unpack_layer};

/// Limits small enough to exercise every bound quickly.
fn small_limits() -> UnpackLimits {
    UnpackLimits {
        max_total_bytes: 1 << 20,
        max_entries: 50,
        max_path_bytes: 4096,
        max_path_depth: 32,
        max_compression_ratio: 20,
        ratio_check_after_bytes: 256 << 10,
    }
}

/// A hostile archive and how it must end.
struct Case {
    name: &'static str,
    archive: Vec<u8>,
    expect: Expect,
}

enum Expect {
    /// Refused with an error whose variant satisfies the predicate.
    Refused(fn(&ImageError) -> bool),
    /// Accepted, with the attack neutralised (checked by the function on the destination).
    Neutralised(fn(&Path)),
}

fn is_unsafe(e: &ImageError) -> bool {
    matches!(e, ImageError::UnsafeEntry { .. })
}
fn is_limit(e: &ImageError) -> bool {
    matches!(e, ImageError::LimitExceeded(_))
}
fn is_invalid(e: &ImageError) -> bool {
    matches!(e, ImageError::InvalidArchive(_))
}

fn corpus(arena: &Arena) -> Vec<Case> {
    let canary = arena.canary();
    let canary_secret = canary.join("secret");
    let canary_str = canary.to_str().expect("utf-8 temp path").to_string();
    let secret_str = canary_secret.to_str().expect("utf-8 temp path").to_string();
    // Leak the strings: the corpus is built once per test and the archive
    // builders want &str with the lifetime of the call only.
    let mut cases = vec![
        Case {
            name: "dotdot file",
            archive: RawTar::new().file("../../../../canary/pwned", b"x").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "dotdot in the middle",
            archive: RawTar::new().file("a/../../../../../canary/pwned", b"x").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "dotdot via PAX path",
            archive: RawTar::new().pax_file(&[("path", "../../../../canary/pwned")], "harmless", b"x").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "dotdot via GNU long name",
            archive: RawTar::new().long_file(format!("{}/../../../../../canary/pwned", "d".repeat(150)).as_bytes(), b"x").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "absolute path is made relative",
            archive: RawTar::new().file("/lazaret-hostile-abs/pwned", b"x").finish(),
            expect: Expect::Neutralised(|dest| {
                assert!(dest.join("lazaret-hostile-abs/pwned").is_file());
                assert!(!Path::new("/lazaret-hostile-abs").exists());
            }),
        },
        Case {
            name: "file through a relative symlink to outside",
            archive: RawTar::new().symlink("escape", "../../../../canary").file("escape/pwned", b"x").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "file through an absolute symlink to outside",
            archive: RawTar::new().symlink("escape", &canary_str).file("escape/pwned", b"x").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "directory through a symlink chain",
            archive: RawTar::new()
                .symlink("one", "two")
                .symlink("two", &canary_str)
                .dir("one/inner/")
                .file("one/inner/pwned", b"x")
                .finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "file over a symlink replaces the symlink",
            archive: RawTar::new().symlink("escape", &secret_str).file("escape", b"overwritten?").finish(),
            expect: Expect::Neutralised(|dest| {
                let meta = std::fs::symlink_metadata(dest.join("escape")).expect("lstat");
                assert!(meta.is_file(), "the symlink must have been replaced by a file");
            }),
        },
        Case {
            name: "directory over a symlink replaces the symlink",
            archive: RawTar::new().symlink("d", &canary_str).dir("d/").file("d/pwned", b"x").finish(),
            expect: Expect::Neutralised(|dest| {
                assert!(std::fs::symlink_metadata(dest.join("d")).expect("lstat").is_dir());
                assert!(dest.join("d/pwned").is_file());
            }),
        },
        Case {
            name: "hard link to /etc/passwd",
            archive: RawTar::new().hardlink("passwd", "/etc/passwd").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "hard link with dotdot",
            archive: RawTar::new().hardlink("secret", "../../../../canary/secret").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "hard link through a symlink",
            archive: RawTar::new().symlink("sl", &canary_str).hardlink("secret", "sl/secret").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "hard link to a symlink links the symlink itself",
            archive: RawTar::new().symlink("sl", &secret_str).hardlink("hl", "sl").finish(),
            expect: Expect::Neutralised(|dest| {
                let meta = std::fs::symlink_metadata(dest.join("hl")).expect("lstat");
                assert!(meta.file_type().is_symlink());
                assert_eq!(common::ino(&dest.join("hl")), common::ino(&dest.join("sl")));
            }),
        },
        Case {
            name: "device nodes and fifos are skipped",
            archive: RawTar::new()
                .special(tar::EntryType::Char, "dev/mem")
                .special(tar::EntryType::Block, "dev/sda")
                .special(tar::EntryType::Fifo, "fifo")
                .file("ok", b"fine")
                .finish(),
            expect: Expect::Neutralised(|dest| {
                assert!(!dest.join("dev/mem").exists());
                assert!(!dest.join("dev/sda").exists());
                assert!(!dest.join("fifo").exists());
                assert!(dest.join("ok").is_file());
            }),
        },
        Case {
            name: "declared size beyond the limit",
            archive: RawTar::new().declared_only("huge", 1 << 40).finish(),
            expect: Expect::Refused(is_limit),
        },
        Case {
            name: "content beyond the limit",
            archive: {
                let mut t = RawTar::new();
                let chunk = vec![7u8; 300 << 10];
                for i in 0..5 {
                    t.file(&format!("f{i}"), &chunk);
                }
                t.finish()
            },
            expect: Expect::Refused(is_limit),
        },
        Case {
            name: "truncated file content",
            archive: RawTar::new().declared_only("short", 4096).raw_end(),
            expect: Expect::Refused(|e| is_invalid(e) || matches!(e, ImageError::Io { .. })),
        },
        Case {
            name: "path longer than the limit",
            archive: RawTar::new().long_file("a/".repeat(2100).as_bytes(), b"x").finish(),
            expect: Expect::Refused(is_limit),
        },
        Case {
            name: "component longer than NAME_MAX",
            archive: RawTar::new().long_file("n".repeat(300).as_bytes(), b"x").finish(),
            expect: Expect::Refused(is_limit),
        },
        Case {
            name: "deeper than the limit",
            archive: RawTar::new().long_file("d/".repeat(40).as_bytes(), b"x").finish(),
            expect: Expect::Refused(is_limit),
        },
        Case {
            name: "long-name header announcing a gigabyte",
            archive: RawTar::new().long_name_declared(b"x", 1 << 30).finish(),
            expect: Expect::Refused(is_limit),
        },
        Case {
            name: "too many entries",
            archive: {
                let mut t = RawTar::new();
                for i in 0..60 {
                    t.file(&format!("f{i}"), b"");
                }
                t.finish()
            },
            expect: Expect::Refused(is_limit),
        },
        Case {
            name: "GNU sparse entry",
            archive: {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::GNUSparse);
                h.set_path("sparse").expect("path");
                h.set_size(0);
                h.set_mode(0o644);
                RawTar::new().raw(h, &[]).finish()
            },
            expect: Expect::Refused(is_invalid),
        },
        Case {
            name: "PAX size disagreeing with the header",
            archive: RawTar::new().pax_file(&[("size", "999")], "f", b"x").finish(),
            expect: Expect::Refused(is_invalid),
        },
        Case {
            name: "whiteout with dotdot",
            archive: RawTar::new().file("../../canary/.wh.secret", b"").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "whiteout through a symlinked parent",
            archive: RawTar::new().symlink("sl", &canary_str).file("sl/.wh.secret", b"").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "opaque marker through a symlinked parent",
            archive: RawTar::new().symlink("sl", &canary_str).file("sl/.wh..wh..opq", b"").finish(),
            expect: Expect::Refused(is_unsafe),
        },
        Case {
            name: "gzip bomb",
            archive: gzip(&RawTar::new().file("zeros", &vec![0u8; 900 << 10]).finish()),
            expect: Expect::Refused(is_limit),
        },
        Case {
            name: "zstd bomb",
            archive: zstd(&RawTar::new().file("zeros", &vec![0u8; 900 << 10]).finish()),
            expect: Expect::Refused(is_limit),
        },
    ];
    // A symlink whose target points outside is harmless on disk (never
    // followed here) and resolves inside the sandbox; it is kept verbatim.
    cases.push(Case {
        name: "symlink pointing outside is kept, not followed",
        archive: RawTar::new().symlink("etc-passwd", "/etc/passwd").finish(),
        expect: Expect::Neutralised(|dest| {
            assert_eq!(std::fs::read_link(dest.join("etc-passwd")).expect("readlink"), Path::new("/etc/passwd"));
        }),
    });
    cases
}

trait RawEnd {
    fn raw_end(&self) -> Vec<u8>;
}
impl RawEnd for RawTar {
    /// The archive without its end-of-archive marker (truncated).
    fn raw_end(&self) -> Vec<u8> {
        let full = self.finish();
        full[..full.len() - 1024].to_vec()
    }
}

#[test]
fn unpack_layer_refuses_or_neutralises_every_hostile_archive() {
    let arena = Arena::new();
    let before = arena.outside();
    for (index, case) in corpus(&arena).into_iter().enumerate() {
        let dest = arena.dest(&format!("case{index}"));
        let result = unpack_layer(case.archive.as_slice(), &dest, &small_limits());
        match (&case.expect, result) {
            (Expect::Refused(accept), Err(e)) => {
                assert!(accept(&e), "{}: refused with an unexpected error: {e}", case.name)
            }
            (Expect::Refused(_), Ok(stats)) => panic!("{}: accepted: {stats:?}", case.name),
            (Expect::Neutralised(check), Ok(_)) => check(&dest),
            (Expect::Neutralised(_), Err(e)) => panic!("{}: refused: {e}", case.name),
        }
        assert_eq!(arena.outside(), before, "{}: something changed outside the store", case.name);
    }
    assert!(!Path::new("/canary").exists() && !Path::new("/pwned").exists());
}

#[test]
fn store_import_registers_nothing_for_refused_archives() {
    let arena = Arena::new();
    let store = ImageStore::open_with_limits(&arena.store(), small_limits()).expect("open store");
    let refused: Vec<Case> = corpus(&arena).into_iter().filter(|c| matches!(c.expect, Expect::Refused(_))).collect();
    let mut sources = Vec::new();
    for (index, case) in refused.iter().enumerate() {
        let path = arena.src().join(format!("case{index}.tar"));
        std::fs::write(&path, &case.archive).expect("write source");
        sources.push(path);
    }
    let before = arena.outside();
    for (case, source) in refused.iter().zip(&sources) {
        let err = match store.import("hostile", source) {
            Ok(record) => panic!("{}: imported as {record:?}", case.name),
            Err(e) => e,
        };
        assert!(!err.to_string().is_empty());
        assert!(store.get("hostile").expect("get").is_none(), "{}: registered", case.name);
        assert!(store.list().expect("list").is_empty(), "{}: listed", case.name);
        for sub in ["rootfs/sha256", "tmp", "refs", "blobs/sha256"] {
            let left: Vec<_> = std::fs::read_dir(arena.store().join(sub)).expect("readdir").collect();
            assert!(left.is_empty(), "{}: {sub} not empty after a failed import", case.name);
        }
        assert_eq!(arena.outside(), before, "{}: something changed outside the store", case.name);
    }
}

#[test]
fn hostile_oci_archive_is_refused_without_registering() {
    // An oci-archive whose outer tar tries to escape through `blobs`.
    let arena = Arena::new();
    let canary = arena.canary();
    let archive = RawTar::new()
        .file("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)
        .symlink("blobs", canary.to_str().expect("utf-8"))
        .file("blobs/sha256/aaaa", b"x")
        .finish();
    let source = arena.src().join("evil-oci.tar");
    std::fs::write(&source, archive).expect("write");
    let before = arena.outside();
    let store = ImageStore::open(&arena.store()).expect("open");
    let err = store.import("evil", &source).expect_err("must be refused");
    assert!(matches!(err, ImageError::UnsafeEntry { .. }), "unexpected error {err}");
    assert!(store.list().expect("list").is_empty());
    assert_eq!(arena.outside(), before);
}
