//! Image store: every source kind, whiteouts across layers, digest
//! verification, sharing and garbage collection.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{Arena, Layout, RawTar, gzip, host_arch, ino, require_root, sha256, tar_dir, zstd};
use lazaret_oci::{ImageError, ImageStore, SourceKind, UnpackLimits, unpack_layer};

/// A small rootfs tarball: dirs, files with owners and setuid, symlink, hard link.
fn rootfs_tar() -> Vec<u8> {
    RawTar::new()
        .dir("./")
        .dir("bin/")
        .file_owned("bin/su", b"#!/bin/sh\n", 0o4755, 0, 0)
        .dir("etc/")
        .file("etc/os-release", b"ID=test\n")
        .file_owned("home-file", b"mine", 0o600, 1234, 4321)
        .symlink("etc/localtime", "/usr/share/zoneinfo/UTC")
        .hardlink("bin/su-again", "bin/su")
        .finish()
}

fn check_rootfs(root: &Path) {
    assert_eq!(std::fs::read(root.join("etc/os-release")).expect("read"), b"ID=test\n");
    let su = std::fs::symlink_metadata(root.join("bin/su")).expect("lstat su");
    assert_eq!(su.permissions().mode() & 0o7777, 0o4755, "setuid bit kept");
    let home = std::fs::symlink_metadata(root.join("home-file")).expect("lstat");
    assert_eq!((home.uid(), home.gid()), (1234, 4321), "ownership preserved (tests run as root)");
    assert_eq!(home.permissions().mode() & 0o7777, 0o600);
    assert_eq!(std::fs::read_link(root.join("etc/localtime")).expect("readlink"), Path::new("/usr/share/zoneinfo/UTC"));
    assert_eq!(ino(&root.join("bin/su")), ino(&root.join("bin/su-again")), "hard link kept");
    let root_mode = std::fs::metadata(root).expect("stat root").permissions().mode() & 0o777;
    assert_eq!(root_mode, 0o755, "the rootfs root must be traversable by the agent");
}

#[test]
fn tar_gzip_and_zstd_sources_share_one_rootfs() {
    require_root();
    let arena = Arena::new();
    let tar = rootfs_tar();
    let sources = [
        ("plain", arena.src().join("rootfs.tar"), tar.clone()),
        ("gz", arena.src().join("rootfs.tar.gz"), gzip(&tar)),
        ("zst", arena.src().join("rootfs.tar.zst"), zstd(&tar)),
    ];
    let store = ImageStore::open(&arena.store()).expect("open");
    let mut records = Vec::new();
    for (name, path, bytes) in &sources {
        std::fs::write(path, bytes).expect("write source");
        let record = store.import(name, path).expect("import");
        assert_eq!(record.source_kind, SourceKind::RootfsTar);
        assert_eq!(record.digest, sha256(&tar), "digest is the diff_id of the uncompressed tar");
        assert_eq!(record.size, 10 + 8 + 4, "hard link counted once");
        check_rootfs(&record.rootfs);
        records.push(record);
    }
    assert!(records.windows(2).all(|w| w[0].rootfs == w[1].rootfs), "same content, one rootfs");
    let names: Vec<String> = store.list().expect("list").into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["gz", "plain", "zst"]);

    store.remove("plain").expect("rm plain");
    store.remove("gz").expect("rm gz");
    assert!(records[0].rootfs.is_dir(), "still referenced by zst");
    store.remove("zst").expect("rm zst");
    assert!(!records[0].rootfs.exists(), "unreferenced rootfs collected");
    assert!(store.list().expect("list").is_empty());
    assert!(matches!(store.remove("zst"), Err(ImageError::NotFound(_))));
}

#[test]
fn rootfs_directory_import_copies_without_following_symlinks() {
    require_root();
    let arena = Arena::new();
    let tree = arena.src().join("tree");
    std::fs::create_dir(&tree).expect("mkdir");
    // Build the tree by unpacking the fixture tarball (gives owners and modes).
    unpack_layer(rootfs_tar().as_slice(), &tree, &UnpackLimits::default()).expect("fixture");
    // A symlink pointing at the canary must be copied as a symlink.
    std::os::unix::fs::symlink(arena.canary(), tree.join("to-canary")).expect("symlink");
    let before = arena.outside();
    let store = ImageStore::open(&arena.store()).expect("open");
    let record = store.import("from-dir", &tree).expect("import dir");
    assert_eq!(record.source_kind, SourceKind::RootfsDir);
    check_rootfs(&record.rootfs);
    let link = record.rootfs.join("to-canary");
    assert!(std::fs::symlink_metadata(&link).expect("lstat").file_type().is_symlink());
    assert_eq!(std::fs::read_link(&link).expect("readlink"), arena.canary());
    assert_eq!(arena.outside(), before);
    // A source that contains the store is refused instead of copied into itself.
    let overlapping = store.import("overlap", arena.dir.path()).expect_err("overlap");
    assert!(matches!(overlapping, ImageError::BadSource { .. }), "{overlapping}");
    // Importing the same tree again gives the same digest (deterministic stream).
    let again = store.import("from-dir-2", &tree).expect("import again");
    assert_eq!(again.digest, record.digest);
    assert_eq!(again.rootfs, record.rootfs);
}

#[test]
fn whiteouts_and_opaque_directories_apply_across_layers() {
    let arena = Arena::new();
    let dest = arena.dest("layers");
    let lower = RawTar::new()
        .file("a/old", b"1")
        .file("a/sub/old", b"2")
        .file("b/gone", b"3")
        .file("b/kept", b"4")
        .file("c/tree/deep", b"5")
        .file("d/file", b"6")
        .finish();
    // The upper layer writes a/sub/new *before* the opaque marker of a/.
    let upper = RawTar::new()
        .file("a/sub/new", b"7")
        .file("a/.wh..wh..opq", b"")
        .file("a/top", b"8")
        .file("b/.wh.gone", b"")
        .file(".wh.c", b"")
        .file("d/.wh.missing", b"")
        .file("d/new-dir/.wh..wh..opq", b"")
        .finish();
    let limits = UnpackLimits::default();
    unpack_layer(lower.as_slice(), &dest, &limits).expect("lower");
    let stats = unpack_layer(upper.as_slice(), &dest, &limits).expect("upper");
    assert_eq!(stats.whiteouts, 5);
    assert!(!dest.join("a/old").exists(), "opaque hides lower a/old");
    assert!(!dest.join("a/sub/old").exists(), "opaque hides lower a/sub/old");
    assert_eq!(std::fs::read(dest.join("a/sub/new")).expect("read"), b"7", "same-layer entry kept");
    assert_eq!(std::fs::read(dest.join("a/top")).expect("read"), b"8");
    assert!(!dest.join("b/gone").exists());
    assert!(dest.join("b/kept").exists());
    assert!(!dest.join("c").exists(), "whiteout of a whole directory");
    assert!(dest.join("d/file").exists());
    assert!(dest.join("d/new-dir").is_dir());
    for marker in ["a/.wh..wh..opq", "b/.wh.gone", ".wh.c", "d/.wh.missing"] {
        assert!(!dest.join(marker).exists(), "{marker} materialised");
    }
}

fn image_config() -> serde_json::Value {
    serde_json::json!({
        "Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"],
        "Cmd": ["bash"],
        "Entrypoint": ["/entry"],
        "WorkingDir": "/work",
        "User": "1000:1000"
    })
}

fn two_layers() -> Vec<Vec<u8>> {
    vec![rootfs_tar(), RawTar::new().file("etc/.wh.os-release", b"").file("etc/added", b"layer2").finish()]
}

#[test]
fn oci_layout_and_oci_archive_import_the_same_image() {
    let arena = Arena::new();
    let layout = Layout::new(&arena.src().join("layout"));
    let (desc, built) = layout.image(&two_layers(), host_arch(), image_config());
    layout.index(&[desc]);
    let store = ImageStore::open(&arena.store()).expect("open");

    let record = store.import("docker.io/library/test:1", &layout.dir).expect("import layout");
    assert_eq!(record.source_kind, SourceKind::OciLayout);
    assert_eq!(record.digest, built.manifest_digest);
    assert_eq!(record.config.env, ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"]);
    assert_eq!(record.config.cmd, ["bash"]);
    assert_eq!(record.config.entrypoint, ["/entry"]);
    assert_eq!(record.config.working_dir.as_deref(), Some("/work"));
    assert_eq!(record.config.user.as_deref(), Some("1000:1000"));
    assert!(!record.rootfs.join("etc/os-release").exists(), "whiteout applied");
    assert_eq!(std::fs::read(record.rootfs.join("etc/added")).expect("read"), b"layer2");
    assert!(record.rootfs.join("bin/su").is_file());
    let mut expected_blobs = vec![built.manifest_digest.clone(), built.config_digest.clone()];
    expected_blobs.extend(built.layer_digests.iter().cloned());
    assert_eq!(record.blobs, expected_blobs);
    for blob in &expected_blobs {
        let hex = blob.trim_start_matches("sha256:");
        let stored = std::fs::read(arena.store().join("blobs/sha256").join(hex)).expect("blob stored");
        assert_eq!(&sha256(&stored), blob);
    }

    let archive = arena.src().join("image.oci.tar");
    std::fs::write(&archive, tar_dir(&layout.dir)).expect("write archive");
    let from_archive = store.import("archived", &archive).expect("import oci-archive");
    assert_eq!(from_archive.source_kind, SourceKind::OciArchive);
    assert_eq!(from_archive.digest, record.digest);
    assert_eq!(from_archive.rootfs, record.rootfs);

    store.remove("docker.io/library/test:1").expect("rm");
    store.remove("archived").expect("rm");
    for sub in ["blobs/sha256", "rootfs/sha256", "refs", "tmp"] {
        let left: Vec<_> = std::fs::read_dir(arena.store().join(sub)).expect("readdir").collect();
        assert!(left.is_empty(), "{sub} not empty after removing every image");
    }
}

#[test]
fn multi_platform_index_picks_this_machine() {
    let arena = Arena::new();
    let layout = Layout::new(&arena.src().join("layout"));
    let other = if host_arch() == "arm64" { "amd64" } else { "arm64" };
    let (other_desc, _) = layout.image(&[RawTar::new().file("which", b"other").finish()], other, serde_json::json!({}));
    let (host_desc, host) = layout.image(&[RawTar::new().file("which", b"host").finish()], host_arch(), serde_json::json!({}));
    layout.index(&[other_desc.clone(), host_desc]);
    let store = ImageStore::open(&arena.store()).expect("open");
    let record = store.import("multi", &layout.dir).expect("import");
    assert_eq!(record.digest, host.manifest_digest);
    assert_eq!(std::fs::read(record.rootfs.join("which")).expect("read"), b"host");

    // An index with only a foreign platform's image is refused.
    layout.index(&[other_desc.clone(), other_desc]);
    let err = store.import("foreign", &layout.dir).expect_err("no matching platform");
    assert!(matches!(err, ImageError::InvalidImage(_)), "{err}");
}

#[test]
fn corrupted_blobs_are_refused_and_nothing_is_registered() {
    let arena = Arena::new();
    let layout = Layout::new(&arena.src().join("layout"));
    let (desc, built) = layout.image(&two_layers(), host_arch(), image_config());
    layout.index(&[desc]);
    let layer = layout.dir.join("blobs/sha256").join(built.layer_digests[1].trim_start_matches("sha256:"));
    let mut bytes = std::fs::read(&layer).expect("read layer");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&layer, bytes).expect("corrupt layer");
    let store = ImageStore::open(&arena.store()).expect("open");
    let err = store.import("corrupt", &layout.dir).expect_err("must fail");
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert!(store.get("corrupt").expect("get").is_none());
    assert!(std::fs::read_dir(arena.store().join("rootfs/sha256")).expect("readdir").next().is_none());
    assert!(std::fs::read_dir(arena.store().join("tmp")).expect("readdir").next().is_none());
}

#[test]
fn diff_id_mismatch_is_refused() {
    let arena = Arena::new();
    let layout = Layout::new(&arena.src().join("layout"));
    let (desc, built) = layout.image(&two_layers(), host_arch(), image_config());
    // Rewrite the config with a wrong diff_id and re-point the manifest at it.
    let config = serde_json::json!({
        "architecture": host_arch(), "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [sha256(b"not the layer"), sha256(&two_layers()[1])]}
    });
    let config_bytes = serde_json::to_vec(&config).expect("json");
    let config_digest = layout.blob(&config_bytes);
    let manifest_path = layout.dir.join("blobs/sha256").join(built.manifest_digest.trim_start_matches("sha256:"));
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest_path).expect("read")).expect("json");
    manifest["config"]["digest"] = config_digest.into();
    manifest["config"]["size"] = config_bytes.len().into();
    let manifest_bytes = serde_json::to_vec(&manifest).expect("json");
    let mut desc = desc;
    desc["digest"] = layout.blob(&manifest_bytes).into();
    desc["size"] = manifest_bytes.len().into();
    layout.index(&[desc]);
    let store = ImageStore::open(&arena.store()).expect("open");
    let err = store.import("bad-diff-id", &layout.dir).expect_err("must fail");
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert!(store.list().expect("list").is_empty());
}

#[test]
fn reimport_replaces_and_collects_the_old_rootfs() {
    let arena = Arena::new();
    let first = arena.src().join("first.tar");
    let second = arena.src().join("second.tar");
    std::fs::write(&first, RawTar::new().file("v", b"1").finish()).expect("write");
    std::fs::write(&second, RawTar::new().file("v", b"2").finish()).expect("write");
    let store = ImageStore::open(&arena.store()).expect("open");
    let old = store.import("img", &first).expect("first");
    let new = store.import("img", &second).expect("second");
    assert_ne!(old.rootfs, new.rootfs);
    assert!(!old.rootfs.exists(), "replaced rootfs collected");
    assert_eq!(store.get("img").expect("get").expect("present").digest, new.digest);
    assert_eq!(store.list().expect("list").len(), 1);
}

#[test]
fn open_cleans_stale_work_and_bad_sources_are_explained() {
    let arena = Arena::new();
    let store = ImageStore::open(&arena.store()).expect("open");
    let stale = arena.store().join("tmp/import-stale");
    std::fs::create_dir_all(stale.join("rootfs/etc")).expect("mkdir");
    std::fs::write(stale.join("rootfs/etc/x"), b"x").expect("write");
    drop(store);
    let store = ImageStore::open(&arena.store()).expect("reopen");
    assert!(!stale.exists(), "stale work removed by open");
    let mode = std::fs::metadata(arena.store()).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);

    let missing = store.import("x", &arena.src().join("nope.tar")).expect_err("missing");
    assert!(matches!(missing, ImageError::BadSource { .. }), "{missing}");
    let not_tar = arena.src().join("notes.txt");
    std::fs::write(&not_tar, b"hello, this is not an archive at all").expect("write");
    let err = store.import("x", &not_tar).expect_err("not a tar");
    assert!(matches!(err, ImageError::BadSource { .. } | ImageError::InvalidArchive(_)), "{err}");
    let empty = arena.src().join("empty.tar");
    std::fs::write(&empty, RawTar::new().finish()).expect("write");
    assert!(matches!(store.import("x", &empty), Err(ImageError::BadSource { .. })));
    assert!(matches!(store.import("../evil", &empty), Err(ImageError::InvalidName { .. })));
    assert!(store.get("never-imported").expect("get").is_none());
    assert!(store.list().expect("list").is_empty());
}

#[test]
fn unpack_stats_report_blob_digest_and_diff_id() {
    require_root();
    let arena = Arena::new();
    let tar = rootfs_tar();
    for (compressed, kind) in [
        (tar.clone(), lazaret_oci::Compression::None),
        (gzip(&tar), lazaret_oci::Compression::Gzip),
        (zstd(&tar), lazaret_oci::Compression::Zstd),
    ] {
        let dest = arena.dest(&format!("{kind:?}"));
        let stats = unpack_layer(compressed.as_slice(), &dest, &UnpackLimits::default()).expect("unpack");
        assert_eq!(stats.compression, kind);
        assert_eq!(stats.compressed_digest, sha256(&compressed));
        assert_eq!(stats.diff_id, sha256(&tar));
        assert_eq!(stats.compressed_bytes, compressed.len() as u64);
        assert_eq!(stats.uncompressed_bytes, tar.len() as u64);
        assert_eq!((stats.files, stats.directories, stats.symlinks, stats.hardlinks), (3, 3, 1, 1));
        assert_eq!(stats.file_bytes, 10 + 8 + 4);
        check_rootfs(&dest);
    }
}
