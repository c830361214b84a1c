//! Registry harness for the pull tests: a real registry (Debian's
//! `docker-registry`, the CNCF distribution server) on a 127.0.0.1 port,
//! with TLS from a test CA and htpasswd auth or plain HTTP; test images built
//! as OCI layouts from small file sets and pushed with Debian's `skopeo`; a
//! private image store per test; and a proxy that can stall a transfer so a
//! pull can be killed half-way deterministically.
//!
//! Only loopback is ever contacted. Every process started here is ended by
//! its PID in a `Drop` guard, and every directory removed.

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::{lazaret_bin, random_suffix, require_root, text, wait_output};

/// Parent of the per-test stores (root-owned, not group/world-writable, as
/// a Storage Root's ancestors must be).
pub const REGISTRY_TEST_ROOT: &str = "/var/cache/lazaret/test-registry";

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// Fails the test unless `binary` is installed, naming its Debian package.
pub fn require_binary(binary: &str, package: &str) {
    let found = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(binary).is_file())).unwrap_or(false);
    assert!(found, "`{binary}` not found: install the Debian package `{package}` (scripts/setup.sh does)");
}

/// Runs a command to completion, failing the test with its output on error.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}{}", text(&out.stdout), text(&out.stderr));
    out
}

/// `sha256:<hex>` of a file, via coreutils' `sha256sum`.
pub fn sha256_file(path: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(path));
    let hex = text(&out.stdout).split_whitespace().next().unwrap_or_default().to_string();
    assert_eq!(hex.len(), 64, "sha256sum output for {}", path.display());
    format!("sha256:{hex}")
}

/// A scratch directory removed on drop.
pub struct Scratch {
    /// The directory.
    pub path: PathBuf,
}

impl Scratch {
    /// A fresh directory `/tmp/lazaret-reg-<random>` (mode 0755).
    pub fn new(tag: &str) -> Scratch {
        let path = PathBuf::from(format!("/tmp/lazaret-reg-{tag}-{}", random_suffix()));
        fs::create_dir_all(&path).expect("scratch dir");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod scratch");
        Scratch { path }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// A test CA and a server certificate for 127.0.0.1, made with `openssl`.
pub struct TestCa {
    /// Directory holding only `ca.crt` (skopeo's `--dest-cert-dir` layout).
    pub dir: PathBuf,
    /// The CA certificate (PEM).
    pub ca_cert: PathBuf,
    /// The server certificate (PEM).
    pub server_cert: PathBuf,
    /// The server key (PEM).
    pub server_key: PathBuf,
}

impl TestCa {
    /// Generates the CA and server certificate in `dir`.
    pub fn generate(dir: &Path) -> TestCa {
        require_binary("openssl", "openssl");
        fs::create_dir_all(dir).expect("ca dir");
        let p = |name: &str| dir.join(name);
        run_ok(
            Command::new("openssl")
                .args([
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=lazaret test CA",
                ])
                .arg("-keyout")
                .arg(p("ca.key"))
                .arg("-out")
                .arg(p("ca.crt"))
                .args(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]),
        );
        run_ok(
            Command::new("openssl")
                .args(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=127.0.0.1"])
                .arg("-keyout")
                .arg(p("server.key"))
                .arg("-out")
                .arg(p("server.csr")),
        );
        fs::write(
            p("ext.cnf"),
            "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n",
        )
        .expect("ext.cnf");
        run_ok(
            Command::new("openssl")
                .args(["x509", "-req", "-days", "2"])
                .arg("-in")
                .arg(p("server.csr"))
                .arg("-CA")
                .arg(p("ca.crt"))
                .arg("-CAkey")
                .arg(p("ca.key"))
                .arg("-CAcreateserial")
                .arg("-out")
                .arg(p("server.crt"))
                .arg("-extfile")
                .arg(p("ext.cnf")),
        );
        // skopeo reads every *.key in a cert dir as a client key: the trust
        // directory holds the CA certificate alone.
        let trust = dir.join("trust");
        fs::create_dir_all(&trust).expect("trust dir");
        fs::copy(p("ca.crt"), trust.join("ca.crt")).expect("copying the CA certificate");
        TestCa { dir: trust, ca_cert: p("ca.crt"), server_cert: p("server.crt"), server_key: p("server.key") }
    }
}

/// How a [`Registry`] is served.
pub enum RegistryMode {
    /// Plain HTTP, no auth.
    PlainHttp,
    /// TLS from a test CA, no auth.
    Tls,
    /// TLS from a test CA and htpasswd (bcrypt) auth for one user.
    TlsWithAuth {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
}

/// A running `docker-registry` on 127.0.0.1, stopped (by PID) on drop.
pub struct Registry {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Configuration, storage, logs.
    pub scratch: Scratch,
    /// The CA, when serving TLS.
    pub ca: Option<TestCa>,
    /// `user:password`, when auth is on.
    pub creds: Option<String>,
    /// The network namespace it serves in (its 127.0.0.1), if not ours.
    pub netns: Option<PathBuf>,
}

impl Registry {
    /// Starts a registry in `mode` and waits until it accepts connections.
    pub fn start(mode: RegistryMode) -> Registry {
        Registry::start_in(mode, None)
    }

    /// [`Registry::start`] on the loopback of the network namespace at
    /// `netns` (e.g. a `NetLab` host, so that a coordinator running there
    /// can pull from it).
    pub fn start_in(mode: RegistryMode, netns: Option<PathBuf>) -> Registry {
        require_root();
        require_binary("docker-registry", "docker-registry");
        require_binary("skopeo", "skopeo");
        let scratch = Scratch::new("registry");
        let dir = scratch.path.clone();
        let port = free_port();
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("data").display()
        );
        let (ca, creds) = match mode {
            RegistryMode::PlainHttp => (None, None),
            RegistryMode::Tls => {
                let ca = TestCa::generate(&dir.join("ca"));
                yaml.push_str(&format!("  tls:\n    certificate: {}\n    key: {}\n", ca.server_cert.display(), ca.server_key.display()));
                (Some(ca), None)
            }
            RegistryMode::TlsWithAuth { user, password } => {
                require_binary("htpasswd", "apache2-utils");
                let ca = TestCa::generate(&dir.join("ca"));
                let out = run_ok(Command::new("htpasswd").args(["-Bbn", &user, &password]));
                fs::write(dir.join("htpasswd"), &out.stdout).expect("htpasswd file");
                yaml.push_str(&format!(
                    "  tls:\n    certificate: {}\n    key: {}\nauth:\n  htpasswd:\n    realm: lazaret-test\n    path: {}\n",
                    ca.server_cert.display(),
                    ca.server_key.display(),
                    dir.join("htpasswd").display()
                ));
                (Some(ca), Some(format!("{user}:{password}")))
            }
        };
        fs::write(dir.join("config.yml"), yaml).expect("registry config");
        let log = fs::File::create(dir.join("registry.log")).expect("registry log");
        let child = in_netns(netns.as_deref(), "docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("starting docker-registry");
        let mut registry = Registry { child, port, scratch, ca, creds, netns };
        registry.wait_ready();
        registry
    }

    fn wait_ready(&mut self) {
        for _ in 0..500 {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("docker-registry exited ({status}): {}", self.log());
            }
            let listening = match &self.netns {
                None => TcpStream::connect(("127.0.0.1", self.port)).is_ok(),
                Some(_) => in_netns(self.netns.as_deref(), "bash")
                    .args(["-c", &format!("exec 3<>/dev/tcp/127.0.0.1/{}", self.port)])
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success()),
            };
            if listening {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("docker-registry did not listen on 127.0.0.1:{}: {}", self.port, self.log());
    }

    /// The registry's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.scratch.path.join("registry.log")).unwrap_or_default()
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Where the registry keeps blob `digest` on disk.
    pub fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.scratch.path.join("data/docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data")
    }

    /// Pushes tag `tag` of `layout` (all platforms) as `<host>/<repository>:<tag>` with skopeo.
    pub fn push(&self, layout: &Path, tag: &str, repository: &str) {
        let mut cmd = in_netns(self.netns.as_deref(), "skopeo");
        cmd.args(["--insecure-policy", "copy", "--all", "--quiet"]);
        match &self.ca {
            Some(ca) => {
                cmd.arg("--dest-cert-dir").arg(&ca.dir);
            }
            None => {
                cmd.arg("--dest-tls-verify=false");
            }
        }
        if let Some(creds) = &self.creds {
            cmd.arg("--dest-creds").arg(creds);
        }
        cmd.arg(format!("oci:{}:{tag}", layout.display())).arg(format!("docker://{}/{repository}:{tag}", self.host()));
        run_ok(&mut cmd);
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// `program`, run in the network namespace at `netns` when given.
fn in_netns(netns: Option<&Path>, program: &str) -> Command {
    match netns {
        None => Command::new(program),
        Some(path) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", path.display())).arg("--").arg(program);
            c
        }
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("binding a probe port");
    listener.local_addr().expect("probe port").port()
}

/// Layer compression for [`LayoutBuilder`].
#[derive(Clone, Copy, Debug)]
pub enum LayerCompression {
    /// `tar+gzip`.
    Gzip,
    /// `tar+zstd`.
    Zstd,
}

/// A content descriptor in a test layout.
#[derive(Clone, Debug)]
pub struct Desc {
    /// Media type.
    pub media_type: String,
    /// `sha256:...`.
    pub digest: String,
    /// Bytes.
    pub size: u64,
}

impl Desc {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({"mediaType": self.media_type, "digest": self.digest, "size": self.size})
    }
}

/// Builds an OCI image layout on disk from small file sets.
pub struct LayoutBuilder {
    /// The layout directory.
    pub dir: PathBuf,
    work: PathBuf,
    tags: Vec<serde_json::Value>,
}

impl LayoutBuilder {
    /// An empty layout at `dir` (scratch files go to `dir`.work).
    pub fn new(dir: &Path) -> LayoutBuilder {
        fs::create_dir_all(dir.join("blobs/sha256")).expect("layout dir");
        fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("oci-layout");
        let work = dir.with_extension("work");
        fs::create_dir_all(&work).expect("layout work dir");
        LayoutBuilder { dir: dir.to_path_buf(), work, tags: Vec::new() }
    }

    /// Moves `file` into the blob store and returns its digest and size.
    fn add_blob_file(&self, file: &Path) -> (String, u64) {
        let digest = sha256_file(file);
        let size = fs::metadata(file).expect("blob size").len();
        fs::rename(file, self.dir.join("blobs/sha256").join(digest.trim_start_matches("sha256:"))).expect("storing blob");
        (digest, size)
    }

    fn add_blob_bytes(&self, bytes: &[u8], media_type: &str) -> Desc {
        let temp = self.work.join(format!("blob-{}", random_suffix()));
        fs::write(&temp, bytes).expect("writing blob");
        let (digest, size) = self.add_blob_file(&temp);
        Desc { media_type: media_type.into(), digest, size }
    }

    /// A layer holding `files` (path, content), compressed as asked.
    /// Returns (layer descriptor, diff_id).
    pub fn layer(&self, files: &[(&str, &[u8])], compression: LayerCompression) -> (Desc, String) {
        let root = self.work.join(format!("layer-{}", random_suffix()));
        for (path, content) in files {
            let target = root.join(path);
            fs::create_dir_all(target.parent().expect("file parent")).expect("layer dirs");
            fs::write(&target, content).expect("layer file");
        }
        let tar = root.with_extension("tar");
        run_ok(
            Command::new("tar")
                .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-C"])
                .arg(&root)
                .arg("-cf")
                .arg(&tar)
                .arg("."),
        );
        self.compressed_layer(&tar, compression)
    }

    /// A layer from an uncompressed tar file (consumed).
    pub fn compressed_layer(&self, tar: &Path, compression: LayerCompression) -> (Desc, String) {
        let diff_id = sha256_file(tar);
        let (program, args, media_type): (&str, &[&str], &str) = match compression {
            LayerCompression::Gzip => ("gzip", &["-n", "-1", "-c"], "application/vnd.oci.image.layer.v1.tar+gzip"),
            LayerCompression::Zstd => ("zstd", &["-q", "-3", "-c"], "application/vnd.oci.image.layer.v1.tar+zstd"),
        };
        let compressed = tar.with_extension("compressed");
        let out = fs::File::create(&compressed).expect("compressed layer");
        let status = Command::new(program).args(args).arg(tar).stdout(out).status().expect("compressing a layer");
        assert!(status.success(), "{program} failed");
        let _ = fs::remove_file(tar);
        let (digest, size) = self.add_blob_file(&compressed);
        (Desc { media_type: media_type.into(), digest, size }, diff_id)
    }

    /// A small runnable layer made from this host's `dash` (as `/bin/sh`)
    /// and `cat` with the shared libraries `ldd` lists, plus `/etc/passwd`.
    pub fn host_tools_layer(&self, compression: LayerCompression) -> (Desc, String) {
        let root = self.work.join(format!("tools-{}", random_suffix()));
        let mut files: Vec<(PathBuf, PathBuf)> = Vec::new(); // (source, path in image)
        for (binary, inside) in [("/bin/dash", "bin/sh"), ("/bin/cat", "bin/cat")] {
            files.push((PathBuf::from(binary), PathBuf::from(inside)));
            let out = run_ok(Command::new("ldd").arg(binary));
            for lib in text(&out.stdout).split_whitespace().filter(|w| w.starts_with('/')) {
                files.push((PathBuf::from(lib), PathBuf::from(lib.trim_start_matches('/'))));
            }
        }
        for (source, inside) in files {
            let target = root.join(inside);
            fs::create_dir_all(target.parent().expect("parent")).expect("tools dirs");
            fs::copy(&source, &target).unwrap_or_else(|e| panic!("copying {}: {e}", source.display()));
            fs::set_permissions(&target, fs::Permissions::from_mode(0o755)).expect("chmod tool");
        }
        fs::create_dir_all(root.join("etc")).expect("etc");
        fs::create_dir_all(root.join("tmp")).expect("tmp");
        fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("passwd");
        fs::write(root.join("etc/group"), "root:x:0:\n").expect("group");
        let tar = root.with_extension("tar");
        run_ok(
            Command::new("tar")
                .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-C"])
                .arg(&root)
                .arg("-cf")
                .arg(&tar)
                .arg("."),
        );
        self.compressed_layer(&tar, compression)
    }

    /// A layer that is an already zstd-compressed tarball (copied in).
    pub fn zstd_tarball_layer(&self, tarball: &Path) -> (Desc, String) {
        let diff = run_ok(Command::new("sh").arg("-c").arg("zstd -dc \"$0\" | sha256sum").arg(tarball));
        let diff_id = format!("sha256:{}", text(&diff.stdout).split_whitespace().next().unwrap_or_default());
        let copy = self.work.join(format!("tarball-{}", random_suffix()));
        fs::copy(tarball, &copy).expect("copying the tarball");
        let (digest, size) = self.add_blob_file(&copy);
        (Desc { media_type: "application/vnd.oci.image.layer.v1.tar+zstd".into(), digest, size }, diff_id)
    }

    /// An image manifest for `arch` over `layers`; returns its descriptor.
    pub fn image(&self, arch: &str, layers: &[(Desc, String)]) -> Desc {
        let config = serde_json::json!({
            "architecture": arch,
            "os": "linux",
            "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "FROM_REGISTRY_TEST=1"], "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.1.clone()).collect::<Vec<_>>()},
        });
        let config = self.add_blob_bytes(config.to_string().as_bytes(), OCI_CONFIG);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config.json(),
            "layers": layers.iter().map(|l| l.0.json()).collect::<Vec<_>>(),
        });
        self.add_blob_bytes(manifest.to_string().as_bytes(), OCI_MANIFEST)
    }

    /// An image index over `(descriptor, architecture)` entries.
    pub fn index(&self, entries: &[(Desc, &str)]) -> Desc {
        let manifests: Vec<serde_json::Value> = entries
            .iter()
            .map(|(d, arch)| {
                let mut v = d.json();
                v["platform"] = serde_json::json!({"os": "linux", "architecture": arch});
                v
            })
            .collect();
        let index = serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests});
        self.add_blob_bytes(index.to_string().as_bytes(), OCI_INDEX)
    }

    /// Names `desc` `tag` in `index.json` (rewritten).
    pub fn tag(&mut self, tag: &str, desc: &Desc) {
        let mut entry = desc.json();
        entry["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": tag});
        self.tags.push(entry);
        let index = serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": self.tags});
        fs::write(self.dir.join("index.json"), index.to_string()).expect("index.json");
    }
}

/// A private image store (Storage Root) and a configuration naming it; the
/// `lazaret` commands run in this (the host's) network namespace because the
/// registry listens on its loopback. Removed on drop.
pub struct PullStore {
    /// The Storage Root.
    pub root: PathBuf,
    /// The configuration file.
    pub config: PathBuf,
    /// Environment added to every command (e.g. `DOCKER_CONFIG`).
    pub env: Vec<(String, String)>,
}

impl PullStore {
    /// A new, empty store with a configuration whose profile `test` uses `image`.
    pub fn new(image: &str) -> PullStore {
        require_root();
        fs::create_dir_all(REGISTRY_TEST_ROOT).expect("registry test root");
        fs::set_permissions(REGISTRY_TEST_ROOT, fs::Permissions::from_mode(0o755)).expect("chmod");
        let base = Path::new(REGISTRY_TEST_ROOT).join(random_suffix());
        fs::create_dir_all(&base).expect("store base");
        let root = base.join("storage");
        let config = base.join("config.toml");
        let store = PullStore { root, config, env: Vec::new() };
        store.write_config(image, None);
        store
    }

    /// Rewrites the configuration: profile `test` with `image`, and a
    /// runtime directory when given.
    pub fn write_config(&self, image: &str, runtime_dir: Option<&Path>) {
        let runtime = runtime_dir.map(|d| format!("runtime_dir = \"{}\"\n", d.display())).unwrap_or_default();
        let text = format!(
            "storage_root = \"{}\"\n{runtime}\n[profiles.test]\nimage = \"{image}\"\ncommand = [\"/bin/sh\"]\nuser = \"root\"\n",
            self.root.display()
        );
        fs::write(&self.config, text).expect("config");
        fs::set_permissions(&self.config, fs::Permissions::from_mode(0o644)).expect("chmod config");
    }

    /// A `lazaret --config <this> ARGS` command (host network namespace).
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = Command::new(lazaret_bin());
        cmd.arg("--config").arg(&self.config).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // No developer credentials leak in unless a test puts them there.
        cmd.env("DOCKER_CONFIG", self.root.with_file_name("no-docker-config"));
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs `lazaret ARGS` to completion.
    pub fn lazaret<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        wait_output(self.command(args).spawn().expect("spawning lazaret"))
    }

    /// `lazaret image inspect NAME` as JSON, failing the test if absent.
    pub fn inspect(&self, name: &str) -> serde_json::Value {
        let out = self.lazaret(["image", "inspect", name]);
        assert!(out.status.success(), "inspect {name}: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("inspect JSON")
    }

    /// The image names `lazaret image ls` prints.
    pub fn names(&self) -> Vec<String> {
        let out = self.lazaret(["image", "ls"]);
        assert!(out.status.success(), "image ls: {}", text(&out.stderr));
        text(&out.stdout).lines().skip(1).filter_map(|l| l.split_whitespace().next().map(String::from)).collect()
    }

    /// Files in a store subdirectory (e.g. `blobs/sha256`, `refs`, `tmp`), sorted.
    pub fn entries(&self, sub: &str) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.root.join("images").join(sub))
            .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Files anywhere below the store's `tmp/` with a non-zero size.
    pub fn partial_downloads(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut stack = vec![self.root.join("images/tmp")];
        while let Some(dir) = stack.pop() {
            for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
                let Ok(meta) = e.metadata() else { continue };
                if meta.is_dir() {
                    stack.push(e.path());
                } else if meta.len() > 0 {
                    found.push(e.path());
                }
            }
        }
        found
    }

    /// Reads a file of the pulled image's root filesystem.
    pub fn read_rootfs_file(&self, name: &str, path: &str) -> String {
        let info = self.inspect(name);
        let rootfs = PathBuf::from(info["rootfs"].as_str().expect("rootfs path"));
        fs::read_to_string(rootfs.join(path)).unwrap_or_else(|e| panic!("reading {path} in {name}: {e}"))
    }
}

impl Drop for PullStore {
    fn drop(&mut self) {
        if let Some(base) = self.root.parent() {
            let _ = fs::remove_dir_all(base);
        }
    }
}

/// A TCP proxy on 127.0.0.1 in front of a registry that forwards at most
/// `limit` bytes from server to client (all connections together), then
/// holds every transfer until [`StallingProxy::release`]. Threads end when
/// their connections close; the proxy stops accepting on drop.
pub struct StallingProxy {
    /// Its port on 127.0.0.1.
    pub port: u16,
    gate: Arc<(Mutex<Gate>, Condvar)>,
    stop: Arc<AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

struct Gate {
    remaining: u64,
    released: bool,
}

impl StallingProxy {
    /// Starts a proxy to `127.0.0.1:<upstream>` that stalls after `limit` bytes.
    pub fn start(upstream: u16, limit: u64) -> StallingProxy {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("proxy bind");
        let port = listener.local_addr().expect("proxy addr").port();
        listener.set_nonblocking(true).expect("nonblocking listener");
        let gate = Arc::new((Mutex::new(Gate { remaining: limit, released: false }), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (gate2, stop2) = (gate.clone(), stop.clone());
        let acceptor = std::thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                        let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                            (Ok(c), Ok(s)) => (c, s),
                            _ => continue,
                        };
                        std::thread::spawn(move || pipe(client, server, None));
                        let gate3 = gate2.clone();
                        std::thread::spawn(move || pipe(s2, c2, Some(gate3)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        StallingProxy { port, gate, stop, acceptor: Some(acceptor) }
    }

    /// Lets every held and future transfer through.
    pub fn release(&self) {
        let (lock, cv) = &*self.gate;
        if let Ok(mut g) = lock.lock() {
            g.released = true;
        }
        cv.notify_all();
    }

    /// Whether the byte budget is used up (a transfer is being held).
    pub fn is_stalling(&self) -> bool {
        self.gate.0.lock().map(|g| g.remaining == 0 && !g.released).unwrap_or(false)
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.release();
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream, gate: Option<Arc<(Mutex<Gate>, Condvar)>>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut offset = 0;
        while offset < n {
            let allowed = match &gate {
                None => n - offset,
                Some(gate) => {
                    let (lock, cv) = &**gate;
                    let Ok(mut g) = lock.lock() else { return };
                    while !g.released && g.remaining == 0 {
                        g = match cv.wait(g) {
                            Ok(g) => g,
                            Err(_) => return,
                        };
                    }
                    if g.released {
                        n - offset
                    } else {
                        let take = (n - offset).min(usize::try_from(g.remaining).unwrap_or(usize::MAX));
                        g.remaining -= take as u64;
                        take
                    }
                }
            };
            if to.write_all(&buf[offset..offset + allowed]).is_err() {
                let _ = from.shutdown(Shutdown::Both);
                return;
            }
            offset += allowed;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Base64 of `text` (for docker's `auth` field), via coreutils' `base64`.
pub fn base64(text: &str) -> String {
    let mut child = Command::new("base64").arg("-w0").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("base64");
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("base64 input");
    let out = child.wait_with_output().expect("base64 output");
    text_trim(&out.stdout)
}

fn text_trim(bytes: &[u8]) -> String {
    text(bytes).trim().to_string()
}
