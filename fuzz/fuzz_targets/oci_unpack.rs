//! oci/src/unpack.rs: a layer built from fuzzer-chosen entries (any type,
//! name, link target, mode, whiteouts, optionally gzip-compressed) unpacked
//! over a lower layer that holds symlinks pointing outside the destination.
//! Whatever the archive, succeeded or refused: nothing outside the
//! destination is created, changed or hard-linked, and nothing is created
//! through a symlink.
#![no_main]

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use arbitrary::{Arbitrary, Unstructured};
use lazaret_oci::{UnpackLimits, unpack_layer};
use libfuzzer_sys::fuzz_target;

/// Link targets: the lower layer's escapes, their absolute forms, and names
/// inside the destination (single components come from the fuzzer).
const TARGETS: [&str; 8] = ["../outside", "../outside/sentinel", "link_out", "abs_out/sentinel", "dir/link_up", "dir", "dir/file", "."];

#[derive(Debug, Arbitrary)]
enum Kind {
    File,
    Dir,
    Symlink,
    HardLink,
    Fifo,
    CharDevice,
    Sparse,
    Unknown(u8),
}

#[derive(Debug, Arbitrary)]
struct Entry {
    kind: Kind,
    name: Vec<u8>,
    /// Index into TARGETS, or (past its end) a single component of `own_target`.
    target: u8,
    own_target: Vec<u8>,
    mode: u16,
    content: Vec<u8>,
}

fn name_bytes(entry: &Entry) -> Vec<u8> {
    // Names mix the fuzzer's bytes with the interesting prefixes.
    let mut name = entry.name.clone();
    name.truncate(99);
    name
}

fn target_bytes(entry: &Entry, outside: &Path) -> Vec<u8> {
    let index = usize::from(entry.target);
    if index < TARGETS.len() {
        return TARGETS[index].as_bytes().to_vec();
    }
    if index == TARGETS.len() {
        return outside.join("sentinel").as_os_str().as_encoded_bytes().to_vec();
    }
    let own: Vec<u8> = entry.own_target.iter().copied().filter(|&b| b != b'/' && b != 0).take(99).collect();
    if own == b".." { b"x".to_vec() } else { own }
}

fn archive(entries: &[Entry], outside: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        let name = name_bytes(entry);
        let target = target_bytes(entry, outside);
        {
            let gnu = header.as_gnu_mut().expect("gnu header");
            gnu.name[..name.len()].copy_from_slice(&name);
            let t = &target[..target.len().min(99)];
            gnu.linkname[..t.len()].copy_from_slice(t);
        }
        let (kind, content): (tar::EntryType, &[u8]) = match entry.kind {
            Kind::File => (tar::EntryType::Regular, &entry.content),
            Kind::Dir => (tar::EntryType::Directory, &[]),
            Kind::Symlink => (tar::EntryType::Symlink, &[]),
            Kind::HardLink => (tar::EntryType::Link, &[]),
            Kind::Fifo => (tar::EntryType::Fifo, &[]),
            Kind::CharDevice => (tar::EntryType::Char, &[]),
            Kind::Sparse => (tar::EntryType::GNUSparse, &entry.content),
            Kind::Unknown(b) => (tar::EntryType::new(b), &entry.content),
        };
        header.set_entry_type(kind);
        header.set_mode(u32::from(entry.mode) & 0o7777);
        header.set_size(content.len() as u64);
        header.set_uid(u64::from(entry.mode) % 3 * 1000);
        header.set_gid(u64::from(entry.mode) % 5 * 1000);
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(content);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// Every directory under `root` made writable and searchable again, so the
/// scratch tree can be removed (the archive may set mode 000).
fn loosen(root: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(root) else { return };
    if meta.is_dir() {
        let _ = std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700));
        if let Ok(entries) = std::fs::read_dir(root) {
            for entry in entries.flatten() {
                loosen(&entry.path());
            }
        }
    }
}

/// Every inode under `root`, not following symlinks.
fn inodes(root: &Path, out: &mut Vec<(u64, u64)>) {
    let Ok(meta) = std::fs::symlink_metadata(root) else { return };
    out.push((meta.dev(), meta.ino()));
    if meta.is_dir() {
        if let Ok(entries) = std::fs::read_dir(root) {
            for entry in entries.flatten() {
                inodes(&entry.path(), out);
            }
        }
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(gzip) = bool::arbitrary(&mut u) else { return };
    let Ok(entries) = Vec::<Entry>::arbitrary(&mut u) else { return };
    if entries.len() > 32 {
        return;
    }
    let scratch = tempfile::tempdir().expect("tempdir");
    let root = scratch.path().join("root");
    let outside = scratch.path().join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::write(outside.join("sentinel"), b"sentinel").expect("write");
    std::fs::create_dir_all(root.join("dir")).expect("mkdir");
    std::fs::write(root.join("dir/file"), b"lower").expect("write");
    std::os::unix::fs::symlink("../outside", root.join("link_out")).expect("symlink");
    std::os::unix::fs::symlink(&outside, root.join("abs_out")).expect("symlink");
    std::os::unix::fs::symlink("../../outside", root.join("dir/link_up")).expect("symlink");
    let sentinel = std::fs::metadata(outside.join("sentinel")).expect("stat");
    let outside_before = std::fs::metadata(&outside).expect("stat");

    let mut tar = archive(&entries, &outside);
    if gzip {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(&tar).expect("gzip");
        tar = encoder.finish().expect("gzip");
    }
    let limits = UnpackLimits { max_total_bytes: 1 << 20, max_entries: 64, ..UnpackLimits::default() };
    let _ = unpack_layer(tar.as_slice(), &root, &limits);

    assert_eq!(listing(scratch.path()), ["outside", "root"], "something was created beside the destination");
    assert_eq!(listing(&outside), ["sentinel"], "something was created outside the destination");
    let after = std::fs::symlink_metadata(outside.join("sentinel")).expect("stat");
    assert!(after.is_file() && after.ino() == sentinel.ino(), "the sentinel was replaced");
    assert_eq!(after.nlink(), 1, "the sentinel was hard-linked");
    assert_eq!(after.mode(), sentinel.mode(), "the sentinel's mode changed");
    assert_eq!((after.uid(), after.gid()), (sentinel.uid(), sentinel.gid()), "the sentinel's owner changed");
    assert_eq!(std::fs::read(outside.join("sentinel")).expect("read"), b"sentinel", "the sentinel was written");
    let outside_meta = std::fs::symlink_metadata(&outside).expect("stat");
    assert!(outside_meta.is_dir());
    assert_eq!(outside_meta.mode(), outside_before.mode(), "the outside directory's mode changed");
    assert_eq!((outside_meta.uid(), outside_meta.gid()), (outside_before.uid(), outside_before.gid()), "the outside directory's owner changed");
    let mut seen = Vec::new();
    inodes(&root, &mut seen);
    assert!(!seen.contains(&(after.dev(), after.ino())), "the sentinel is linked into the destination");
    loosen(&root);
});
