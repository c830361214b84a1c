//! Benchmark: pull + unpack of a ~100 MB image from a loopback registry,
//! Lazaret's `registry::pull` against `skopeo copy` to an OCI layout followed
//! by unpacking its layers with `tar`.
//!
//! ```sh
//! sudo cargo run --release -p lazaret-oci --example pull_bench -- [ROUNDS] [TARBALL]
//! ```
//!
//! TARBALL (default: the cached Debian test image
//! `/var/cache/lazaret/images/bookworm-minbase-git.tar.zst`) must be a
//! zstd-compressed rootfs tar; it becomes the image's single layer. Needs
//! Debian's `docker-registry`, `skopeo`, `tar` and `zstd`. The registry runs on
//! 127.0.0.1 only and is stopped by its PID when the benchmark ends.
//! Lazaret's side also fsyncs every blob and the store before registering the
//! image; the skopeo + tar side does not.

#![forbid(unsafe_code)]

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lazaret_oci::ImageStore;
use lazaret_oci::registry::{ImageReference, NoProgress, PullOptions, pull};
use sha2::{Digest, Sha256};

type Error = Box<dyn std::error::Error>;

/// The registry process, ended by PID on drop.
struct RegistryGuard(Child);

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(3).max(1);
    let tarball = PathBuf::from(args.next().unwrap_or_else(|| "/var/cache/lazaret/images/bookworm-minbase-git.tar.zst".into()));
    for tool in ["docker-registry", "skopeo", "tar", "zstd"] {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).stdout(Stdio::null()).status()?.success();
        if !found {
            return Err(format!("`{tool}` is missing: install Debian's {tool} package").into());
        }
    }
    let work = tempfile::Builder::new().prefix("lazaret-pull-bench-").tempdir_in("/var/tmp")?;
    let layout = work.path().join("layout");
    let layer_bytes = build_layout(&layout, &tarball)?;

    let port = TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port();
    let config = work.path().join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            work.path().join("registry").display()
        ),
    )?;
    let _registry =
        RegistryGuard(Command::new("docker-registry").arg("serve").arg(&config).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?);
    let mut ready = false;
    for _ in 0..500 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if !ready {
        return Err("docker-registry did not start".into());
    }
    let host = format!("127.0.0.1:{port}");
    run(Command::new("skopeo")
        .args(["--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:bench", layout.display()))
        .arg(format!("docker://{host}/bench:bench")))?;

    let reference = ImageReference::parse(&format!("{host}/bench:bench"))?;
    let options = PullOptions { insecure: true, ..PullOptions::default() };
    let mut lazaret_times = Vec::new();
    let mut skopeo_times = Vec::new();
    for round in 0..rounds {
        let store_dir = work.path().join(format!("store-{round}"));
        let start = Instant::now();
        let store = ImageStore::open(&store_dir)?;
        pull(&store, &reference, &options, &NoProgress)?;
        lazaret_times.push(start.elapsed());
        std::fs::remove_dir_all(&store_dir)?;

        let oci_dir = work.path().join(format!("skopeo-{round}"));
        let rootfs = work.path().join(format!("rootfs-{round}"));
        let start = Instant::now();
        run(Command::new("skopeo")
            .args(["--insecure-policy", "copy", "--quiet", "--src-tls-verify=false"])
            .arg(format!("docker://{host}/bench:bench"))
            .arg(format!("oci:{}:bench", oci_dir.display())))?;
        std::fs::create_dir(&rootfs)?;
        for layer in layout_layers(&oci_dir)? {
            run(Command::new("tar").arg("--zstd").arg("-xf").arg(&layer).arg("-C").arg(&rootfs).arg("--numeric-owner"))?;
        }
        skopeo_times.push(start.elapsed());
        std::fs::remove_dir_all(&oci_dir)?;
        std::fs::remove_dir_all(&rootfs)?;
    }

    println!(
        "pull + unpack of a {:.1} MB image ({}) from a loopback registry, {rounds} rounds",
        layer_bytes as f64 / 1e6,
        tarball.display()
    );
    println!("{:<28} {:>10} {:>10} {:>10}", "method", "min s", "median s", "max s");
    for (name, times) in [("lazaret registry::pull", &mut lazaret_times), ("skopeo copy + tar -x", &mut skopeo_times)] {
        times.sort();
        println!(
            "{:<28} {:>10.2} {:>10.2} {:>10.2}",
            name,
            times[0].as_secs_f64(),
            times[times.len() / 2].as_secs_f64(),
            times[times.len() - 1].as_secs_f64()
        );
    }
    Ok(())
}

fn run(cmd: &mut Command) -> Result<(), Error> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(())
}

fn sha256_file(path: &Path) -> Result<String, Error> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
}

fn put_blob(layout: &Path, bytes: &[u8]) -> Result<(String, u64), Error> {
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
    std::fs::write(layout.join("blobs/sha256").join(&digest["sha256:".len()..]), bytes)?;
    Ok((digest, bytes.len() as u64))
}

/// Writes a one-layer OCI layout tagged `bench`; returns the layer's size.
fn build_layout(layout: &Path, tarball: &Path) -> Result<u64, Error> {
    std::fs::create_dir_all(layout.join("blobs/sha256"))?;
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let layer_digest = sha256_file(tarball)?;
    let layer_size = std::fs::metadata(tarball)?.len();
    std::fs::copy(tarball, layout.join("blobs/sha256").join(&layer_digest["sha256:".len()..]))?;
    let mut decoder = zstd::stream::read::Decoder::new(std::fs::File::open(tarball)?)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = decoder.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let diff_id = format!("sha256:{}", hex::encode(hasher.finalize()));
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::json!({
        "architecture": arch, "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    });
    let (config_digest, config_size) = put_blob(layout, config.to_string().as_bytes())?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd", "digest": layer_digest, "size": layer_size}],
    });
    let (manifest_digest, manifest_size) = put_blob(layout, manifest.to_string().as_bytes())?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_size,
            "annotations": {"org.opencontainers.image.ref.name": "bench"},
        }],
    });
    std::fs::write(layout.join("index.json"), index.to_string())?;
    Ok(layer_size)
}

/// The layer blob paths of the only image in an OCI layout written by skopeo.
fn layout_layers(layout: &Path) -> Result<Vec<PathBuf>, Error> {
    let blob = |digest: &str| layout.join("blobs/sha256").join(digest.trim_start_matches("sha256:"));
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
    let manifest_digest = index["manifests"][0]["digest"].as_str().ok_or("index.json without a manifest")?;
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(blob(manifest_digest))?)?;
    let layers = manifest["layers"].as_array().ok_or("manifest without layers")?;
    layers.iter().map(|l| l["digest"].as_str().map(blob).ok_or_else(|| Error::from("layer without a digest"))).collect()
}
