//! `lazaret image ...`: registry pulls with progress, login, inspect, garbage
//! collection, and [`ensure_image`] for the automatic pull on first run.
//!
//! Naming: an image is stored under the name the user wrote when it was
//! imported (`lazaret image import NAME ...`), and under the full normalised
//! reference when pulled (`debian:trixie` is stored as
//! `docker.io/library/debian:trixie`). A profile's `image` is looked up as
//! written, then as its normalised reference; it is pulled automatically only
//! when it names a registry explicitly (`docker.io/library/debian:trixie`,
//! `registry.example:5000/app`), so a typo in a local image name never makes
//! Lazaret contact Docker Hub.
//!
//! Credentials, first match wins: `--authfile FILE`, Lazaret's own file
//! [`lazaret_auth_file`] (written by `lazaret image login`, mode 0600), then
//! docker's `config.json` (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json` of the developer). Extra CA certificates for a
//! registry `HOST[:PORT]`: every `*.crt` in `/etc/docker/certs.d/HOST[:PORT]/`
//! and `~/.config/lazaret/certs.d/HOST[:PORT]/`, plus `--ca-cert FILE`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use lazaret_oci::registry::Credentials;
use lazaret_oci::registry::{self, ImageReference, Platform, PullOptions, RegistryError};
pub use lazaret_oci::registry::{LayerInfo, NoProgress, PullProgress};
use lazaret_oci::{GcStats, ImageError, ImageRecord};

use crate::config::{Config, Profile};
use crate::context::{Context, ContextError};
use crate::identity::{Developer, IdentityError};

/// Why an image command failed. Each message names the cause and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ImagesError {
    /// Configuration, storage root or store problems.
    #[error(transparent)]
    Context(#[from] ContextError),
    /// The developer could not be determined.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The store refused an operation.
    #[error(transparent)]
    Store(#[from] ImageError),
    /// The pull or login failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The profile's image is absent and is not a registry reference.
    #[error(
        "image {image:?} of profile {profile:?} is not in the image store; import it with `lazaret image import {image} SOURCE`, or pull it with `lazaret image pull REF` and set `image` to the full reference (e.g. docker.io/library/debian:trixie) so it is pulled automatically"
    )]
    Missing {
        /// The profile.
        profile: String,
        /// The image as written in the profile.
        image: String,
    },
    /// A CA certificate file could not be read.
    #[error("cannot read CA certificate {path}: {source}; check the --ca-cert path")]
    CaCert {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file in the developer's home is not safe to write as root.
    #[error("refusing to write {path}: {reason}")]
    UnsafePath {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// What `lazaret image pull` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct PullRequest {
    /// The reference as the user wrote it (`debian`, `host:5000/app@sha256:...`).
    pub reference: String,
    /// `os/arch[/variant]`; `None` is `linux/<this machine>`.
    pub platform: Option<String>,
    /// Allow plain HTTP to this registry.
    pub insecure: bool,
    /// Extra CA certificates (PEM files) to trust.
    pub ca_certs: Vec<PathBuf>,
    /// A credentials file in docker's format, searched before the default ones.
    pub authfile: Option<PathBuf>,
}

/// Lazaret's credentials file: `<home>/.config/lazaret/registry-auth.json`.
pub fn lazaret_auth_file(developer: &Developer) -> PathBuf {
    developer.home.join(".config/lazaret/registry-auth.json")
}

/// Docker's config file: `$DOCKER_CONFIG/config.json`, else `<home>/.docker/config.json`.
pub fn docker_config_file(developer: &Developer) -> PathBuf {
    match std::env::var_os("DOCKER_CONFIG").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("config.json"),
        None => developer.home.join(".docker/config.json"),
    }
}

/// Credentials for `registry` (`host[:port]` as in the reference), searched in
/// `authfile`, then Lazaret's file, then docker's config. Only files owned by
/// the developer are read (Lazaret runs as root: a symlink to someone else's
/// credentials must not lend them to the developer).
pub fn credentials_for(developer: &Developer, registry: &str, authfile: Option<&Path>) -> Result<Option<Credentials>, ImagesError> {
    let mut files: Vec<PathBuf> = authfile.map(Path::to_path_buf).into_iter().collect();
    files.push(lazaret_auth_file(developer));
    files.push(docker_config_file(developer));
    for file in files {
        let Some(bytes) = read_developer_file(developer, &file)? else {
            continue;
        };
        if let Some(found) = registry::credentials_from_json(&bytes, registry, &file)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// Reads `file` if it exists, refusing one the developer does not own.
fn read_developer_file(developer: &Developer, file: &Path) -> Result<Option<Vec<u8>>, ImagesError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let unsafe_path = |reason: String| ImagesError::UnsafePath { path: file.to_path_buf(), reason };
    let mut opened = match std::fs::File::open(file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unsafe_path(format!("cannot open it: {e}"))),
    };
    let meta = opened.metadata().map_err(|e| unsafe_path(e.to_string()))?;
    if !meta.is_file() {
        return Err(unsafe_path("not a regular file".into()));
    }
    if meta.uid() != developer.uid {
        return Err(unsafe_path(format!(
            "it is owned by uid {}, not by you (uid {}); credentials files must be your own",
            meta.uid(),
            developer.uid
        )));
    }
    let mut bytes = Vec::new();
    Read::read_to_end(&mut Read::take(&mut opened, 1 << 20), &mut bytes).map_err(|e| unsafe_path(e.to_string()))?;
    Ok(Some(bytes))
}

/// Pulls `request.reference` into the store, telling `progress` how it goes
/// ([`LineProgress`] for logs; the CLI draws bars on a terminal).
pub fn pull(config: &Config, request: &PullRequest, progress: &dyn PullProgress) -> Result<ImageRecord, ImagesError> {
    let developer = Developer::from_process()?;
    let reference = ImageReference::parse(&request.reference)?;
    let mut options = PullOptions {
        insecure: request.insecure,
        credentials: credentials_for(&developer, reference.registry(), request.authfile.as_deref())?,
        ..PullOptions::default()
    };
    if let Some(platform) = &request.platform {
        options.platform = Platform::parse(platform)?;
    }
    options.extra_ca_pem = ca_certificates(&developer, reference.registry(), &request.ca_certs)?;
    let store = Context::image_store(config)?;
    Ok(registry::pull(&store, &reference, &options, progress)?)
}

/// The profile's image: from the store if there, else pulled when the profile
/// names it by a registry reference (see the module documentation).
///
/// Call it from `lazaret run` in place of `Context::image()`:
/// `let image = images::ensure_image(&ctx.config, &ctx.profile)?;`
pub fn ensure_image(config: &Config, profile: &Profile) -> Result<ImageRecord, ImagesError> {
    let store = Context::image_store(config)?;
    if let Some(found) = store.get(&profile.image)? {
        return Ok(found);
    }
    let missing = || ImagesError::Missing { profile: profile.name.clone(), image: profile.image.clone() };
    let Ok(reference) = ImageReference::parse(&profile.image) else {
        return Err(missing());
    };
    if let Some(found) = store.get(&reference.store_name())? {
        return Ok(found);
    }
    if !ImageReference::names_registry(&profile.image) {
        return Err(missing());
    }
    eprintln!("lazaret: image {} is not in the store; pulling it", reference);
    pull(config, &PullRequest { reference: profile.image.clone(), ..PullRequest::default() }, &LineProgress::default())
}

/// Saves credentials for `registry` in `authfile` or Lazaret's own file (mode
/// 0600, owned by the developer). They are not checked against the registry
/// here; the next pull uses them. Returns the file written.
pub fn login(registry_host: &str, credentials: &Credentials, authfile: Option<&Path>) -> Result<PathBuf, ImagesError> {
    let developer = Developer::from_process()?;
    // Validate the host the way a reference's registry part is validated.
    let probe = ImageReference::parse(&format!("{registry_host}/probe"))?;
    if probe.registry() != registry_host {
        return Err(
            RegistryError::InvalidReference { reference: registry_host.to_string(), reason: "not a registry host[:port]".into() }.into()
        );
    }
    let file = match authfile {
        Some(f) => {
            check_developer_target(&developer, f)?;
            f.to_path_buf()
        }
        None => {
            let file = lazaret_auth_file(&developer);
            prepare_private_dirs(&developer, &file)?;
            file
        }
    };
    registry::save_credentials(&file, registry_host, credentials)?;
    // Under sudo the developer owns their credentials file.
    std::os::unix::fs::chown(&file, Some(developer.uid), Some(developer.gid))
        .map_err(|e| ImagesError::UnsafePath { path: file.clone(), reason: format!("cannot hand it to uid {}: {e}", developer.uid) })?;
    Ok(file)
}

/// An explicit `--authfile` is written as root: its directory must be the
/// developer's, and an existing file must be theirs and not a symlink.
fn check_developer_target(developer: &Developer, file: &Path) -> Result<(), ImagesError> {
    use std::os::unix::fs::MetadataExt;
    let unsafe_path = |reason: String| ImagesError::UnsafePath { path: file.to_path_buf(), reason };
    let parent = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = std::fs::symlink_metadata(parent).map_err(|e| unsafe_path(format!("its directory: {e}")))?;
    if !dir.is_dir() || dir.uid() != developer.uid {
        return Err(unsafe_path(format!("its directory must be a directory you own (uid {})", developer.uid)));
    }
    match std::fs::symlink_metadata(file) {
        Ok(meta) if meta.file_type().is_symlink() || meta.uid() != developer.uid => {
            Err(unsafe_path("it exists and is a symbolic link or not yours".into()))
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(unsafe_path(e.to_string())),
    }
}

/// A JSON description of image `name` (as stored, or as its normalised reference).
pub fn inspect(config: &Config, name: &str) -> Result<serde_json::Value, ImagesError> {
    let store = Context::image_store(config)?;
    let record = match store.get(name)? {
        Some(r) => Some(r),
        None => match ImageReference::parse(name) {
            Ok(reference) => store.get(&reference.store_name())?,
            Err(_) => None,
        },
    };
    let record = record.ok_or_else(|| ImageError::NotFound(name.to_string()))?;
    Ok(serde_json::json!({
        "name": record.name,
        "digest": record.digest,
        "size": record.size,
        "created": record.created,
        "source": record.source_kind,
        "rootfs": record.rootfs,
        "diff_ids": record.diff_ids,
        "blobs": record.blobs,
        "config": {
            "env": record.config.env,
            "cmd": record.config.cmd,
            "entrypoint": record.config.entrypoint,
            "working_dir": record.config.working_dir,
            "user": record.config.user,
        },
    }))
}

/// Removes every blob and rootfs no image references, and interrupted work.
pub fn gc(config: &Config) -> Result<GcStats, ImagesError> {
    Ok(Context::image_store(config)?.gc()?)
}

/// Reads the CA certificates for `registry`: certs.d directories plus `extra`.
fn ca_certificates(developer: &Developer, registry: &str, extra: &[PathBuf]) -> Result<Vec<Vec<u8>>, ImagesError> {
    let mut pems = Vec::new();
    for dir in [PathBuf::from("/etc/docker/certs.d").join(registry), developer.home.join(".config/lazaret/certs.d").join(registry)] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> =
            entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "crt")).collect();
        files.sort();
        for file in files {
            pems.push(std::fs::read(&file).map_err(|source| ImagesError::CaCert { path: file, source })?);
        }
    }
    for file in extra {
        pems.push(std::fs::read(file).map_err(|source| ImagesError::CaCert { path: file.clone(), source })?);
    }
    Ok(pems)
}

/// Creates the parent directories of `file` under the developer's home (mode
/// 0700, owned by the developer), refusing symlinked components so that root
/// never writes through a link the developer planted.
fn prepare_private_dirs(developer: &Developer, file: &Path) -> Result<(), ImagesError> {
    let unsafe_path = |reason: String| ImagesError::UnsafePath { path: file.to_path_buf(), reason };
    let relative = file.strip_prefix(&developer.home).map_err(|_| unsafe_path("not under the developer's home".into()))?;
    let mut current = developer.home.clone();
    let components: Vec<_> = relative.components().collect();
    for (i, component) in components.iter().enumerate() {
        current.push(component);
        let last = i + 1 == components.len();
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(unsafe_path(format!("{} is a symbolic link", current.display())));
            }
            Ok(meta) if !last && !meta.is_dir() => {
                return Err(unsafe_path(format!("{} is not a directory", current.display())));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !last => {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&current)
                    .map_err(|e| unsafe_path(format!("creating {}: {e}", current.display())))?;
                let _ = std::os::unix::fs::chown(&current, Some(developer.uid), Some(developer.gid));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(unsafe_path(e.to_string())),
        }
    }
    Ok(())
}

/// A digest shortened to 12 hex digits; anything else unchanged.
pub fn short(digest: &str) -> &str {
    match digest.strip_prefix("sha256:") {
        Some(hex) => hex.get(..12).unwrap_or(hex),
        None => digest,
    }
}

/// Bytes in MiB, for progress lines.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Quiet, line-based progress on stderr, for logs and for output that is
/// not a terminal: one line per layer at start, every 25 %, and when done.
/// (The progress bars of a terminal are the CLI's.)
#[derive(Default)]
pub struct LineProgress {
    reported_quarter: RefCell<BTreeMap<String, u64>>,
}

impl PullProgress for LineProgress {
    fn resolved(&self, reference: &str, digest: &str, layers: &[LayerInfo]) {
        let cached = layers.iter().filter(|l| l.cached).count();
        let total: u64 = layers.iter().filter(|l| !l.cached).map(|l| l.size).sum();
        eprintln!(
            "pull {reference}: manifest {digest}, {} layers ({cached} already stored), {:.1} MiB to download",
            layers.len(),
            mib(total)
        );
    }
    fn layer_progress(&self, digest: &str, done: u64, total: u64) {
        let quarter = (done * 4).checked_div(total).unwrap_or(4);
        let mut seen = self.reported_quarter.borrow_mut();
        let last = seen.entry(digest.to_string()).or_insert(0);
        if quarter > *last && quarter < 4 {
            *last = quarter;
            eprintln!("layer {}: {}%", short(digest), quarter * 25);
        }
    }
    fn retrying(&self, what: &str, attempt: u32, delay: Duration, reason: &str) {
        eprintln!("retry {} (attempt {attempt}) in {:.1}s: {reason}", short(what), delay.as_secs_f64());
    }
    fn layer_done(&self, digest: &str) {
        eprintln!("layer {}: done", short(digest));
    }
    fn unpacking(&self) {
        eprintln!("unpacking");
    }
}
