//! Registry pulls (issue 7) against a real registry on 127.0.0.1: by tag and
//! digest, platform selection, gzip and zstd layers, auth, TLS, refusal of
//! corrupt or missing content with nothing registered, a pull killed half-way
//! and resumed, and a pulled image running in `lazaret run`.

use std::fs;
use std::path::PathBuf;
use std::process::Output;

use lazaret_tests::registry::*;
use lazaret_tests::*;

/// The OCI name of this machine's architecture.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn other_arch() -> &'static str {
    if host_arch() == "arm64" { "amd64" } else { "arm64" }
}

fn assert_ok(out: &Output, what: &str) {
    assert!(out.status.success(), "{what} failed ({}): {}{}", out.status, text(&out.stdout), text(&out.stderr));
}

fn assert_refused(out: &Output, what: &str, expected: &str) -> String {
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{what} unexpectedly succeeded: {}", text(&out.stdout));
    assert!(stderr.contains(expected), "{what}: expected {expected:?} in the error, got: {stderr}");
    stderr
}

/// A layout with tag `v1`: two layers, the first gzip, the second zstd.
fn small_image(scratch: &Scratch) -> (LayoutBuilder, Desc) {
    let mut layout = LayoutBuilder::new(&scratch.path.join("layout"));
    let gz = layout.layer(&[("etc/hello", b"hello from gzip\n"), ("shared/one", b"1\n")], LayerCompression::Gzip);
    let zst = layout.layer(&[("etc/zstd-marker", b"hello from zstd\n")], LayerCompression::Zstd);
    let manifest = layout.image(host_arch(), &[gz, zst]);
    layout.tag("v1", &manifest);
    (layout, manifest)
}

#[test]
fn pulls_by_tag_and_by_digest_with_gzip_and_zstd_layers() {
    let registry = Registry::start(RegistryMode::PlainHttp);
    let scratch = Scratch::new("tag");
    let (layout, manifest) = small_image(&scratch);
    registry.push(&layout.dir, "v1", "team/small");
    let store = PullStore::new("unused");

    let reference = format!("{}/team/small:v1", registry.host());
    let out = store.lazaret(["image", "pull", "--insecure", reference.as_str()]);
    assert_ok(&out, "pull by tag");
    assert!(store.names().contains(&reference), "{reference} not listed: {:?}", store.names());
    assert_eq!(store.read_rootfs_file(&reference, "etc/hello"), "hello from gzip\n");
    assert_eq!(store.read_rootfs_file(&reference, "etc/zstd-marker"), "hello from zstd\n");
    let info = store.inspect(&reference);
    assert_eq!(info["digest"], manifest.digest.as_str(), "the image digest is the manifest's");
    assert_eq!(info["source"], "registry");
    assert_eq!(info["config"]["cmd"][0], "/bin/sh");
    // The stored manifest kept one gzip and one zstd layer (no recompression on the way).
    let manifest_blob = store.root.join("images/blobs/sha256").join(manifest.digest.trim_start_matches("sha256:"));
    let stored: serde_json::Value = serde_json::from_slice(&fs::read(&manifest_blob).expect("manifest blob")).expect("manifest JSON");
    let types: Vec<&str> = stored["layers"].as_array().expect("layers").iter().filter_map(|l| l["mediaType"].as_str()).collect();
    assert_eq!(types, ["application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.oci.image.layer.v1.tar+zstd"]);

    let pinned = format!("{}/team/small@{}", registry.host(), manifest.digest);
    let out = store.lazaret(["image", "pull", "--insecure", pinned.as_str()]);
    assert_ok(&out, "pull by digest");
    assert_eq!(store.inspect(&pinned)["digest"], manifest.digest.as_str());
    // Both names share every blob: 2 layers + config + manifest, stored once.
    assert_eq!(store.entries("blobs/sha256").len(), 4, "blobs: {:?}", store.entries("blobs/sha256"));
    assert_eq!(store.entries("rootfs/sha256").len(), 1);
}

#[test]
fn plain_http_needs_insecure() {
    let registry = Registry::start(RegistryMode::PlainHttp);
    let scratch = Scratch::new("http");
    let (layout, _) = small_image(&scratch);
    registry.push(&layout.dir, "v1", "small");
    let store = PullStore::new("unused");
    let reference = format!("{}/small:v1", registry.host());
    let out = store.lazaret(["image", "pull", reference.as_str()]);
    assert_refused(&out, "pull over HTTP without --insecure", "--insecure");
    assert!(store.names().is_empty());
}

#[test]
fn an_index_with_two_platforms_gives_the_asked_one() {
    let registry = Registry::start(RegistryMode::PlainHttp);
    let scratch = Scratch::new("index");
    let mut layout = LayoutBuilder::new(&scratch.path.join("layout"));
    let native = layout.layer(&[("platform", host_arch().as_bytes())], LayerCompression::Gzip);
    let foreign = layout.layer(&[("platform", other_arch().as_bytes())], LayerCompression::Gzip);
    let native = layout.image(host_arch(), &[native]);
    let foreign = layout.image(other_arch(), &[foreign]);
    let index = layout.index(&[(foreign.clone(), other_arch()), (native.clone(), host_arch())]);
    layout.tag("multi", &index);
    registry.push(&layout.dir, "multi", "multi");
    let store = PullStore::new("unused");
    let reference = format!("{}/multi:multi", registry.host());

    assert_ok(&store.lazaret(["image", "pull", "--insecure", reference.as_str()]), "default platform");
    assert_eq!(store.read_rootfs_file(&reference, "platform"), host_arch());
    assert_eq!(store.inspect(&reference)["digest"], native.digest.as_str());

    let wanted = format!("linux/{}", other_arch());
    assert_ok(&store.lazaret(["image", "pull", "--insecure", "--platform", wanted.as_str(), reference.as_str()]), "--platform");
    assert_eq!(store.read_rootfs_file(&reference, "platform"), other_arch());
    assert_eq!(store.inspect(&reference)["digest"], foreign.digest.as_str());

    let out = store.lazaret(["image", "pull", "--insecure", "--platform", "linux/s390x", reference.as_str()]);
    let err = assert_refused(&out, "absent platform", "has no manifest for linux/s390x");
    assert!(err.contains(&format!("linux/{}", host_arch())), "available platforms not listed: {err}");
}

#[test]
fn tls_and_htpasswd_auth() {
    let registry = Registry::start(RegistryMode::TlsWithAuth { user: "alice".into(), password: "s3cret-pw".into() });
    let scratch = Scratch::new("auth");
    let (layout, _) = small_image(&scratch);
    registry.push(&layout.dir, "v1", "private/app");
    let ca = registry.ca.as_ref().expect("TLS registry has a CA").ca_cert.clone();
    let ca = ca.to_string_lossy().into_owned();
    let store = PullStore::new("unused");
    let reference = format!("{}/private/app:v1", registry.host());

    // The test CA is not trusted by default.
    let out = store.lazaret(["image", "pull", reference.as_str()]);
    assert_refused(&out, "pull with an untrusted CA", "TLS connection");

    // No credentials: a clear unauthorised error, nothing registered.
    let out = store.lazaret(["image", "pull", "--ca-cert", ca.as_str(), reference.as_str()]);
    let err = assert_refused(&out, "pull without credentials", "unauthorised");
    assert!(err.contains("lazaret image login"), "no remedy in: {err}");
    assert!(store.names().is_empty());

    // Wrong credentials from a docker config.json: refused too.
    let docker_dir = scratch.path.join("docker");
    fs::create_dir_all(&docker_dir).expect("docker dir");
    let write_docker_config = |creds: &str| {
        let config = serde_json::json!({"auths": {registry.host(): {"auth": base64(creds)}}});
        fs::write(docker_dir.join("config.json"), config.to_string()).expect("docker config");
    };
    write_docker_config("alice:wrong");
    let mut cmd = store.command(["image", "pull", "--ca-cert", ca.as_str(), reference.as_str()]);
    cmd.env("DOCKER_CONFIG", &docker_dir);
    let out = wait_output(cmd.spawn().expect("lazaret"));
    assert_refused(&out, "pull with wrong credentials", "unauthorised");

    // The right credentials in docker's config.json: success.
    write_docker_config("alice:s3cret-pw");
    let mut cmd = store.command(["image", "pull", "--ca-cert", ca.as_str(), reference.as_str()]);
    cmd.env("DOCKER_CONFIG", &docker_dir);
    let out = wait_output(cmd.spawn().expect("lazaret"));
    assert_ok(&out, "pull with docker config credentials");
    assert_eq!(store.read_rootfs_file(&reference, "etc/hello"), "hello from gzip\n");

    // `lazaret image login` writes a 0600 file that a later pull uses.
    assert_ok(&store.lazaret(["image", "rm", reference.as_str()]), "rm");
    fs::create_dir_all(scratch.path.join("auth")).expect("auth dir");
    let authfile = scratch.path.join("auth/registry-auth.json");
    let mut login = store.command(["image", "login", registry.host().as_str(), "-u", "alice", "--password-stdin", "--authfile"]);
    login.arg(&authfile).stdin(std::process::Stdio::piped());
    let mut child = login.spawn().expect("lazaret login");
    send(child.stdin.as_mut().expect("stdin"), b"s3cret-pw\n");
    drop(child.stdin.take());
    assert_ok(&wait_output(child), "login");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::metadata(&authfile).expect("auth file").mode() & 0o777, 0o600);
    let mut cmd = store.command(["image", "pull", "--ca-cert", ca.as_str(), "--authfile"]);
    cmd.arg(&authfile).arg(&reference);
    assert_ok(&wait_output(cmd.spawn().expect("lazaret")), "pull with login credentials");
}

/// Pushes the small image as `repo:v1` and returns (manifest, gzip layer digest).
fn pushed_small(registry: &Registry, scratch: &Scratch, repo: &str) -> (Desc, String) {
    let (layout, manifest) = small_image(scratch);
    registry.push(&layout.dir, "v1", repo);
    let blob = fs::read(layout.dir.join("blobs/sha256").join(manifest.digest.trim_start_matches("sha256:"))).expect("manifest");
    let parsed: serde_json::Value = serde_json::from_slice(&blob).expect("manifest JSON");
    let layer = parsed["layers"][0]["digest"].as_str().expect("layer digest").to_string();
    (manifest, layer)
}

fn assert_nothing_registered_and_gc_empties(store: &PullStore) {
    assert!(store.names().is_empty(), "registered: {:?}", store.names());
    assert!(store.entries("refs").is_empty(), "refs: {:?}", store.entries("refs"));
    assert_ok(&store.lazaret(["image", "gc"]), "gc");
    assert!(store.entries("blobs/sha256").is_empty(), "stray blobs: {:?}", store.entries("blobs/sha256"));
    assert!(store.entries("rootfs/sha256").is_empty());
    assert!(store.entries("tmp").is_empty(), "tmp: {:?}", store.entries("tmp"));
}

#[test]
fn a_blob_that_does_not_match_its_digest_is_refused() {
    let registry = Registry::start(RegistryMode::PlainHttp);
    let scratch = Scratch::new("corrupt");
    let (_, layer) = pushed_small(&registry, &scratch, "corrupt");
    let data = registry.blob_data(&layer);
    let mut bytes = fs::read(&data).expect("registry blob");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff; // same size, different content
    fs::write(&data, bytes).expect("corrupting the blob");
    let store = PullStore::new("unused");
    let reference = format!("{}/corrupt:v1", registry.host());
    let out = store.lazaret(["image", "pull", "--insecure", reference.as_str()]);
    assert_refused(&out, "corrupt layer", "does not match its digest");
    assert_nothing_registered_and_gc_empties(&store);
}

#[test]
fn a_missing_blob_is_refused() {
    let registry = Registry::start(RegistryMode::PlainHttp);
    let scratch = Scratch::new("missing");
    let (_, layer) = pushed_small(&registry, &scratch, "missing");
    fs::remove_file(registry.blob_data(&layer)).expect("removing the blob");
    let store = PullStore::new("unused");
    let reference = format!("{}/missing:v1", registry.host());
    let out = store.lazaret(["image", "pull", "--insecure", reference.as_str()]);
    assert_refused(&out, "missing layer", &format!("has no blob {layer}"));
    assert_nothing_registered_and_gc_empties(&store);
}

#[test]
fn an_unknown_manifest_is_refused() {
    let registry = Registry::start(RegistryMode::PlainHttp);
    let scratch = Scratch::new("unknown");
    pushed_small(&registry, &scratch, "known");
    let store = PullStore::new("unused");
    for reference in [format!("{}/known:nope", registry.host()), format!("{}/unknown:v1", registry.host())] {
        let out = store.lazaret(["image", "pull", "--insecure", reference.as_str()]);
        assert_refused(&out, &reference, "not found in registry");
    }
    assert_nothing_registered_and_gc_empties(&store);
}

#[test]
fn a_pull_killed_half_way_is_completed_by_the_next_one() {
    let registry = Registry::start(RegistryMode::PlainHttp);
    let scratch = Scratch::new("kill");
    let mut layout = LayoutBuilder::new(&scratch.path.join("layout"));
    let random = scratch.path.join("random.bin");
    run_ok(
        std::process::Command::new("head").args(["-c", "8388608", "/dev/urandom"]).stdout(fs::File::create(&random).expect("random file")),
    );
    let big = fs::read(&random).expect("random bytes");
    let small = layout.layer(&[("etc/small", b"small\n")], LayerCompression::Gzip);
    let large = layout.layer(&[("big.bin", big.as_slice())], LayerCompression::Zstd);
    let manifest = layout.image(host_arch(), &[small, large]);
    layout.tag("v1", &manifest);
    registry.push(&layout.dir, "v1", "big");

    // Everything passes through a proxy that holds the transfer after 1 MiB.
    let proxy = StallingProxy::start(registry.port, 1 << 20);
    let store = PullStore::new("unused");
    let reference = format!("127.0.0.1:{}/big:v1", proxy.port);
    let mut child = store.command(["image", "pull", "--insecure", reference.as_str()]).spawn().expect("lazaret pull");
    // Wait (bounded by the command limit) until the proxy holds the
    // transfer and part of a layer is on disk, then kill the pull.
    let mut polls = 0u32;
    while !proxy.is_stalling() || store.partial_downloads().is_empty() {
        assert!(child.try_wait().expect("try_wait").is_none(), "the pull ended before the proxy stalled it");
        polls += 1;
        assert!(polls < 6000, "the pull never reached the stall point");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("killing the pull");
    let _ = child.wait();
    // Checked before any other lazaret command: opening the store cleans tmp/.
    assert!(!store.entries("tmp").is_empty(), "the killed pull left no work behind (was it really half-way?)");
    assert!(store.entries("refs").is_empty(), "a killed pull registered an image");
    assert!(store.names().is_empty(), "a killed pull registered an image");

    proxy.release();
    let out = store.lazaret(["image", "pull", "--insecure", reference.as_str()]);
    assert_ok(&out, "second pull");
    assert_eq!(store.read_rootfs_file(&reference, "etc/small"), "small\n");
    let rootfs = PathBuf::from(store.inspect(&reference)["rootfs"].as_str().expect("rootfs").to_string());
    assert_eq!(fs::read(rootfs.join("big.bin")).expect("big.bin"), big);

    assert_ok(&store.lazaret(["image", "gc"]), "gc");
    let info = store.inspect(&reference);
    let mut referenced: Vec<String> = info["blobs"]
        .as_array()
        .expect("blobs")
        .iter()
        .filter_map(|b| b.as_str())
        .map(|d| d.trim_start_matches("sha256:").to_string())
        .collect();
    referenced.sort();
    assert_eq!(store.entries("blobs/sha256"), referenced, "stray blobs after gc");
    assert!(store.entries("tmp").is_empty(), "tmp not cleaned: {:?}", store.entries("tmp"));
}

#[test]
fn the_pulled_image_runs() {
    let registry = Registry::start(RegistryMode::PlainHttp);
    let scratch = Scratch::new("run");
    let mut layout = LayoutBuilder::new(&scratch.path.join("layout"));
    let tools = layout.host_tools_layer(LayerCompression::Zstd);
    let marker = layout.layer(&[("etc/pulled-marker", b"pulled from the registry\n")], LayerCompression::Gzip);
    let manifest = layout.image(host_arch(), &[tools, marker]);
    layout.tag("v1", &manifest);
    registry.push(&layout.dir, "v1", "lazaret/tools");

    let reference = format!("{}/lazaret/tools:v1", registry.host());
    let store = PullStore::new(&reference);
    assert_ok(&store.lazaret(["image", "pull", "--insecure", "--quiet", reference.as_str()]), "pull");

    // Run it like any other profile image, in a test network namespace.
    let mut env = TestEnv::new();
    store.write_config(&reference, Some(&env.runtime_dir));
    env.config = store.config.clone();
    let out = env.run(["run", "test", "--", "sh", "-c", "cat /etc/pulled-marker; echo from-registry=$FROM_REGISTRY_TEST"]);
    assert_eq!(text(&out.stdout), "pulled from the registry\nfrom-registry=1\n", "stderr: {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    env.assert_nothing_left();
}

/// A profile naming a registry reference that is not in the store yet is
/// pulled by `lazaret run` itself (over HTTPS, trusting the registry's CA
/// from the developer's `~/.config/lazaret/certs.d/HOST:PORT/`), then runs.
/// The registry serves inside a lab network namespace, where the
/// coordinator runs, so nothing outside namespaces the test made is used.
#[test]
fn run_pulls_a_missing_registry_image_itself() {
    let lab = netlab::NetLab::new();
    let registry = Registry::start_in(RegistryMode::Tls, Some(lab.host.clone()));
    let scratch = Scratch::new("autopull");
    let mut layout = LayoutBuilder::new(&scratch.path.join("layout"));
    let tools = layout.host_tools_layer(LayerCompression::Zstd);
    let marker = layout.layer(&[("etc/pulled-marker", b"auto-pulled\n")], LayerCompression::Gzip);
    let manifest = layout.image(host_arch(), &[tools, marker]);
    layout.tag("v1", &manifest);
    registry.push(&layout.dir, "v1", "lazaret/auto");
    let reference = format!("{}/lazaret/auto:v1", registry.host());

    // The developer (root here) trusts the test CA for this host:port only.
    let certs = PathBuf::from(format!("/root/.config/lazaret/certs.d/{}", registry.host()));
    fs::create_dir_all(&certs).expect("certs.d");
    let _trust = RemoveDirOnDrop(certs.clone());
    let ca = registry.ca.as_ref().expect("TLS registry has a CA");
    fs::copy(&ca.ca_cert, certs.join("ca.crt")).expect("installing the test CA");

    let store = PullStore::new(&reference);
    let mut env = TestEnv::new();
    store.write_config(&reference, Some(&env.runtime_dir));
    env.config = store.config.clone();
    env.netns = Some(lab.host.clone());
    assert!(store.names().is_empty(), "the image must not be in the store before the run");
    let out = env.run(["run", "test", "--", "cat", "/etc/pulled-marker"]);
    assert_eq!(text(&out.stdout), "auto-pulled\n", "stderr: {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("pulling it"), "stderr: {}", text(&out.stderr));
    assert_eq!(store.names(), vec![reference.clone()], "the pulled image is registered under its reference");
    env.assert_nothing_left();
}

struct RemoveDirOnDrop(PathBuf);

impl Drop for RemoveDirOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
