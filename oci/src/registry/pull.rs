//! The pull itself.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, RegistryOperation};
use sha2::{Digest, Sha256};

use super::{Credentials, ImageReference, Platform, RegistryError};
use crate::ImageStore;
use crate::layout::{
    Descriptor, INDEX_TYPES, Index, MANIFEST_TYPES, MAX_JSON_BYTES, Manifest, check_config_type, layer_type_supported, parse_config,
    parse_json,
};
use crate::store::{ImageRecord, PullSession};

/// How to pull.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// Which manifest of a multi-platform image to take (default: `linux/<host>`).
    pub platform: Platform,
    /// Speak plain HTTP to the registry (only when the user asked for it).
    pub insecure: bool,
    /// Extra trusted CA certificates (PEM), e.g. a private registry's CA.
    pub extra_ca_pem: Vec<Vec<u8>>,
    /// Credentials; `None` means anonymous (with Docker Hub's token flow).
    pub credentials: Option<Credentials>,
    /// Layers downloaded at the same time (at least 1).
    pub parallel_downloads: usize,
    /// Attempts per request after the first one, for transient failures.
    pub retries: u32,
    /// First back-off delay; doubled after each failed attempt.
    pub backoff: Duration,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            platform: Platform::host(),
            insecure: false,
            extra_ca_pem: Vec::new(),
            credentials: None,
            parallel_downloads: 4,
            retries: 4,
            backoff: Duration::from_millis(500),
        }
    }
}

/// One layer of the image being pulled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerInfo {
    /// Blob digest.
    pub digest: String,
    /// Compressed size in bytes.
    pub size: u64,
    /// Whether the store already had it (nothing to download).
    pub cached: bool,
}

/// Receives progress events; called from the pulling thread.
pub trait PullProgress {
    /// The manifest is resolved: the image digest and its layers are known.
    fn resolved(&self, reference: &str, manifest_digest: &str, layers: &[LayerInfo]);
    /// `done` of `total` bytes of layer `digest` are downloaded.
    fn layer_progress(&self, digest: &str, done: u64, total: u64);
    /// A download attempt failed and will be retried after `delay`.
    fn retrying(&self, digest: &str, attempt: u32, delay: Duration, reason: &str);
    /// Layer `digest` is downloaded and verified.
    fn layer_done(&self, digest: &str);
    /// All blobs are here; unpacking starts.
    fn unpacking(&self);
}

/// Progress nobody is shown (`--quiet`, benchmarks).
pub struct NoProgress;

impl PullProgress for NoProgress {
    fn resolved(&self, _: &str, _: &str, _: &[LayerInfo]) {}
    fn layer_progress(&self, _: &str, _: u64, _: u64) {}
    fn retrying(&self, _: &str, _: u32, _: Duration, _: &str) {}
    fn layer_done(&self, _: &str) {}
    fn unpacking(&self) {}
}

/// Pulls `reference` into `store` under [`ImageReference::store_name`]. On
/// any failure nothing is registered; verified blobs already fetched stay in
/// the store (the next pull reuses them, [`ImageStore::gc`] removes them).
pub fn pull(
    store: &ImageStore,
    reference: &ImageReference,
    options: &PullOptions,
    progress: &dyn PullProgress,
) -> Result<ImageRecord, RegistryError> {
    super::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| crate::ImageError::io("starting the download runtime", e))?;
    let puller = Puller::new(reference, options)?;
    let session = store.begin_pull()?;
    let (manifest_digest, manifest, config) = runtime.block_on(puller.fetch_all(&session, progress))?;
    drop(runtime);
    progress.unpacking();
    Ok(session.commit(&reference.store_name(), &manifest_digest, &manifest, config)?)
}

struct Puller<'a> {
    reference: &'a ImageReference,
    options: &'a PullOptions,
    client: Client,
    auth: RegistryAuth,
}

/// Accept headers for manifests: indexes and image manifests, OCI and Docker.
const ACCEPTED: [&str; 4] = [INDEX_TYPES[0], INDEX_TYPES[1], MANIFEST_TYPES[0], MANIFEST_TYPES[1]];

impl<'a> Puller<'a> {
    fn new(reference: &'a ImageReference, options: &'a PullOptions) -> Result<Puller<'a>, RegistryError> {
        let config = ClientConfig {
            protocol: if options.insecure {
                ClientProtocol::HttpsExcept(vec![reference.inner().resolve_registry().to_string()])
            } else {
                ClientProtocol::Https
            },
            extra_root_certificates: options
                .extra_ca_pem
                .iter()
                .map(|pem| Certificate { encoding: CertificateEncoding::Pem, data: pem.clone() })
                .collect(),
            platform_resolver: None,
            connect_timeout: Some(Duration::from_secs(15)),
            read_timeout: Some(Duration::from_secs(60)),
            max_concurrent_download: options.parallel_downloads.max(1),
            user_agent: concat!("lazaret/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        };
        let client = Client::try_from(config).map_err(|e| RegistryError::Tls {
            registry: reference.registry().to_string(),
            detail: format!("cannot set up the HTTP client: {e}"),
        })?;
        let auth = match &options.credentials {
            Some(c) => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
            None => RegistryAuth::Anonymous,
        };
        Ok(Puller { reference, options, client, auth })
    }

    fn registry(&self) -> String {
        self.reference.registry().to_string()
    }

    /// Retries `attempt` on transient errors with exponential back-off.
    async fn with_retries<T, F, Fut>(&self, what: &str, progress: &dyn PullProgress, mut attempt: F) -> Result<T, RegistryError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, RegistryError>>,
    {
        let mut delay = self.options.backoff;
        let mut tries = 0u32;
        loop {
            match attempt().await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_transient() && tries < self.options.retries => {
                    tries += 1;
                    progress.retrying(what, tries, delay, &e.to_string());
                    tokio::time::sleep(delay).await;
                    delay = delay.saturating_mul(2);
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn fetch_all(
        &self,
        session: &PullSession<'_>,
        progress: &dyn PullProgress,
    ) -> Result<(String, Manifest, crate::layout::ImageConfigFile), RegistryError> {
        self.with_retries("authentication", progress, || async {
            self.client
                .auth(self.reference.inner(), &self.auth, RegistryOperation::Pull)
                .await
                .map(|_| ())
                .map_err(|e| self.map_error(e, None))
        })
        .await?;
        let (manifest_digest, manifest_bytes, manifest) = self.resolve_manifest(progress).await?;
        check_config_type(&manifest)?;
        if manifest.layers.is_empty() {
            return Err(crate::ImageError::InvalidImage("the image has no layers".into()).into());
        }
        for layer in &manifest.layers {
            if !layer_type_supported(&layer.media_type) {
                return Err(crate::ImageError::InvalidImage(format!("unsupported layer media type {:?}", layer.media_type)).into());
            }
        }
        // Config: small, read whole, verified, then checked for the platform.
        let config_bytes = if session.has_blob(&manifest.config.digest)? {
            let mut data = Vec::new();
            session
                .open_blob(&manifest.config.digest)?
                .take(MAX_JSON_BYTES)
                .read_to_end(&mut data)
                .map_err(|e| crate::ImageError::io("reading the image config", e))?;
            data
        } else {
            let data = self.with_retries(&manifest.config.digest, progress, || self.fetch_small_blob(&manifest.config)).await?;
            session.store_bytes(&manifest.config.digest, &data)?;
            data
        };
        let config = parse_config(&manifest, &config_bytes, &self.options.platform.architecture)?;

        let mut seen = HashSet::new();
        let mut layers = Vec::new();
        for layer in &manifest.layers {
            if seen.insert(layer.digest.clone()) {
                layers.push(LayerInfo { digest: layer.digest.clone(), size: layer.size, cached: session.has_blob(&layer.digest)? });
            }
        }
        let total: u64 = layers.iter().map(|l| l.size).sum();
        if total > session.max_image_bytes() {
            return Err(crate::ImageError::LimitExceeded(format!(
                "the image's layers total {total} bytes (limit {})",
                session.max_image_bytes()
            ))
            .into());
        }
        progress.resolved(&self.reference.store_name(), &manifest_digest, &layers);
        let missing: Vec<&Descriptor> =
            manifest.layers.iter().filter(|l| layers.iter().any(|i| i.digest == l.digest && !i.cached)).collect();
        let mut downloads = futures_util::stream::iter(
            missing
                .into_iter()
                .map(|layer| self.with_retries(&layer.digest, progress, move || self.download_layer(session, layer, progress))),
        )
        .buffer_unordered(self.options.parallel_downloads.max(1));
        // The first failure ends the pull; dropping the stream cancels the rest.
        while let Some(result) = downloads.next().await {
            result?;
        }
        drop(downloads);
        // The manifest goes in last, after everything it names.
        session.store_bytes(&manifest_digest, &manifest_bytes)?;
        Ok((manifest_digest, manifest, config))
    }

    /// Fetches the manifest for the reference, following an index to the
    /// entry for the wanted platform; every document is checked against its
    /// digest (and size, when a descriptor announced one).
    async fn resolve_manifest(&self, progress: &dyn PullProgress) -> Result<(String, Vec<u8>, Manifest), RegistryError> {
        let (mut bytes, mut digest) =
            self.with_retries("manifest", progress, || self.fetch_manifest(self.reference.inner().clone(), None)).await?;
        for _depth in 0..4 {
            let media_type = document_media_type(&bytes);
            if INDEX_TYPES.contains(&media_type.as_str()) {
                let index: Index = parse_json(&bytes, &digest)?;
                let chosen = self.choose_platform(&index)?;
                let pinned = self.reference.with_digest(&chosen.digest);
                (bytes, digest) = self.with_retries("manifest", progress, || self.fetch_manifest(pinned.clone(), Some(&chosen))).await?;
                continue;
            }
            if !MANIFEST_TYPES.contains(&media_type.as_str()) {
                return Err(self.protocol(format!("unsupported manifest media type {media_type:?}")));
            }
            let manifest: Manifest = parse_json(&bytes, &digest)?;
            return Ok((digest, bytes, manifest));
        }
        Err(self.protocol("image indexes nested too deeply".into()))
    }

    fn choose_platform(&self, index: &Index) -> Result<Descriptor, RegistryError> {
        let wanted = &self.options.platform;
        if let Some(found) = index.manifests.iter().find(|d| d.platform.as_ref().is_some_and(|p| wanted.matches(p))) {
            return Ok(found.clone());
        }
        let available: Vec<String> = index
            .manifests
            .iter()
            .filter_map(|d| d.platform.as_ref())
            .filter(|p| p.os != "unknown") // attestation manifests
            .map(|p| match &p.variant {
                Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
                None => format!("{}/{}", p.os, p.architecture),
            })
            .collect();
        Err(RegistryError::WrongPlatform {
            reference: self.reference.store_name(),
            wanted: wanted.to_string(),
            available: if available.is_empty() { "none".into() } else { available.join(", ") },
        })
    }

    async fn fetch_manifest(
        &self,
        reference: oci_client::Reference,
        expected: Option<&Descriptor>,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        let (body, _reported) =
            self.client.pull_manifest_raw(&reference, &self.auth, &ACCEPTED).await.map_err(|e| self.map_error(e, None))?;
        if body.len() as u64 > MAX_JSON_BYTES {
            return Err(self.protocol(format!("manifest is larger than {MAX_JSON_BYTES} bytes")));
        }
        let actual = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
        let pinned = expected.map(|d| d.digest.clone()).or_else(|| reference.digest().map(str::to_string));
        if let Some(pinned) = pinned
            && pinned != actual
        {
            return Err(self.mismatch("manifest", &pinned, &actual));
        }
        if let Some(desc) = expected
            && desc.size != body.len() as u64
        {
            return Err(self.mismatch(&format!("size of manifest {}", desc.digest), &desc.size.to_string(), &body.len().to_string()));
        }
        Ok((body.to_vec(), actual))
    }

    async fn fetch_small_blob(&self, desc: &Descriptor) -> Result<Vec<u8>, RegistryError> {
        if desc.size > MAX_JSON_BYTES {
            return Err(self.protocol(format!("config {} is {} bytes", desc.digest, desc.size)));
        }
        let mut data = Vec::new();
        self.client
            .pull_blob(self.reference.inner(), &oci_descriptor(desc), &mut data)
            .await
            .map_err(|e| self.map_error(e, Some(&desc.digest)))?;
        let actual = format!("sha256:{}", hex::encode(Sha256::digest(&data)));
        if actual != desc.digest {
            return Err(self.mismatch("image config", &desc.digest, &actual));
        }
        if data.len() as u64 != desc.size {
            return Err(self.mismatch(&format!("size of {}", desc.digest), &desc.size.to_string(), &data.len().to_string()));
        }
        Ok(data)
    }

    /// Streams one layer into a private temp file, hashing and counting as
    /// it goes, and publishes it only when size and digest both match.
    async fn download_layer(&self, session: &PullSession<'_>, desc: &Descriptor, progress: &dyn PullProgress) -> Result<(), RegistryError> {
        if session.has_blob(&desc.digest)? {
            progress.layer_done(&desc.digest);
            return Ok(());
        }
        let mut stream = self
            .client
            .pull_blob_stream(self.reference.inner(), &oci_descriptor(desc))
            .await
            .map_err(|e| self.map_error(e, Some(&desc.digest)))?;
        let (temp, mut file) = session.create_temp()?;
        let cleanup = TempGuard(&temp);
        let mut hasher = Sha256::new();
        let mut done = 0u64;
        let mut last_report = 0u64;
        let mut transfer_error = None;
        loop {
            match stream.stream.try_next().await {
                Ok(Some(chunk)) => {
                    done += chunk.len() as u64;
                    if done > desc.size {
                        return Err(self.mismatch(
                            &format!("size of layer {}", desc.digest),
                            &desc.size.to_string(),
                            &format!("more than {}", desc.size),
                        ));
                    }
                    hasher.update(&chunk);
                    file.write_all(&chunk).map_err(|e| crate::ImageError::io(format!("writing {}", temp.display()), e))?;
                    if done - last_report >= 1 << 20 || done == desc.size {
                        progress.layer_progress(&desc.digest, done, desc.size);
                        last_report = done;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // oci-client's own verification fails at the very end;
                    // our hash below gives the authoritative verdict then.
                    transfer_error = Some(e.to_string());
                    break;
                }
            }
        }
        if done != desc.size {
            if let Some(e) = transfer_error {
                return Err(self.protocol(format!("transfer of {} broke off: {e}", desc.digest)));
            }
            return Err(self.mismatch(&format!("size of layer {}", desc.digest), &desc.size.to_string(), &done.to_string()));
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != desc.digest {
            return Err(self.mismatch("layer", &desc.digest, &actual));
        }
        if let Some(e) = transfer_error {
            return Err(self.protocol(format!("transfer {e}")));
        }
        session.publish(file, &temp, &desc.digest)?;
        cleanup.disarm();
        progress.layer_done(&desc.digest);
        Ok(())
    }

    fn mismatch(&self, what: &str, expected: &str, actual: &str) -> RegistryError {
        RegistryError::DigestMismatch {
            registry: self.registry(),
            what: what.to_string(),
            expected: expected.to_string(),
            actual: actual.to_string(),
        }
    }

    fn protocol(&self, detail: String) -> RegistryError {
        RegistryError::Protocol { registry: self.registry(), reference: self.reference.store_name(), detail }
    }

    /// Turns an oci-client error into one with a reason and a remedy.
    fn map_error(&self, error: OciDistributionError, blob: Option<&str>) -> RegistryError {
        let registry = self.registry();
        let reference = self.reference.store_name();
        let not_found = || match blob {
            Some(digest) => {
                RegistryError::BlobMissing { reference: reference.clone(), registry: registry.clone(), digest: digest.to_string() }
            }
            None => RegistryError::NotFound { reference: reference.clone(), registry: registry.clone() },
        };
        match error {
            OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_) => {
                RegistryError::Unauthorized { registry, reference }
            }
            OciDistributionError::ImageManifestNotFoundError(_) => not_found(),
            OciDistributionError::RegistryError { envelope, .. } => {
                let code = envelope.errors.first().map(|e| &e.code);
                match code {
                    Some(
                        OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::NotFound | OciErrorCode::BlobUnknown,
                    ) => not_found(),
                    Some(OciErrorCode::Unauthorized | OciErrorCode::Denied) => RegistryError::Unauthorized { registry, reference },
                    Some(OciErrorCode::Toomanyrequests) => RegistryError::RateLimited { registry },
                    _ => self.protocol(envelope.to_string()),
                }
            }
            OciDistributionError::ServerError { code, message, .. } => match code {
                404 => not_found(),
                401 | 403 => RegistryError::Unauthorized { registry, reference },
                429 => RegistryError::RateLimited { registry },
                _ => self.protocol(format!("HTTP {code}: {}", one_line(&message))),
            },
            OciDistributionError::RequestError(e) => {
                let detail = error_chain(&e);
                let lower = detail.to_lowercase();
                if lower.contains("certificate")
                    || lower.contains("tls")
                    || lower.contains("handshake")
                    || lower.contains("invalidcontenttype")
                    || lower.contains("corrupt message")
                {
                    RegistryError::Tls { registry, detail }
                } else if e.is_connect() || e.is_timeout() {
                    RegistryError::Offline { registry, detail }
                } else {
                    self.protocol(format!("transfer failed: {detail}"))
                }
            }
            OciDistributionError::DigestError(e) => RegistryError::DigestMismatch {
                registry,
                what: "manifest".into(),
                expected: "the digest the registry reported".into(),
                actual: e.to_string(),
            },
            other => self.protocol(one_line(&other.to_string())),
        }
    }
}

fn oci_descriptor(desc: &Descriptor) -> OciDescriptor {
    OciDescriptor {
        media_type: desc.media_type.clone(),
        digest: desc.digest.clone(),
        size: i64::try_from(desc.size).unwrap_or(i64::MAX),
        ..OciDescriptor::default()
    }
}

/// The `mediaType` of a manifest document, inferred from its shape when the
/// field is absent (allowed for OCI indexes and manifests).
pub(super) fn document_media_type(bytes: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(rename = "mediaType", default)]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
        #[serde(default)]
        layers: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Probe>(bytes) {
        Ok(Probe { media_type: Some(t), .. }) => t,
        Ok(Probe { manifests: Some(_), .. }) => INDEX_TYPES[0].to_string(),
        Ok(Probe { layers: Some(_), .. }) => MANIFEST_TYPES[0].to_string(),
        _ => "unknown".into(),
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    one_line(&text)
}

fn one_line(text: &str) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.len() > 300 {
        let cut = (0..=300).rev().find(|i| flat.is_char_boundary(*i)).unwrap_or(0);
        format!("{}...", &flat[..cut])
    } else {
        flat
    }
}

/// Removes a temp download unless it was published.
struct TempGuard<'p>(&'p std::path::Path);

impl TempGuard<'_> {
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for TempGuard<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_are_read_or_inferred() {
        let oci_index = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
        assert_eq!(document_media_type(oci_index), INDEX_TYPES[0]);
        let docker_list = br#"{"mediaType":"application/vnd.docker.distribution.manifest.list.v2+json","manifests":[]}"#;
        assert_eq!(document_media_type(docker_list), INDEX_TYPES[1]);
        assert_eq!(document_media_type(br#"{"schemaVersion":2,"manifests":[]}"#), INDEX_TYPES[0]);
        assert_eq!(document_media_type(br#"{"schemaVersion":2,"config":{},"layers":[]}"#), MANIFEST_TYPES[0]);
        assert_eq!(document_media_type(b"not json"), "unknown");
    }

    #[test]
    fn platform_matching_honours_variants() -> Result<(), RegistryError> {
        let entry = |arch: &str, variant: Option<&str>| crate::layout::Platform {
            architecture: arch.into(),
            os: "linux".into(),
            variant: variant.map(String::from),
        };
        let arm = Platform::parse("linux/arm64")?;
        assert!(arm.matches(&entry("arm64", Some("v8"))));
        assert!(arm.matches(&entry("arm64", None)));
        assert!(!arm.matches(&entry("amd64", None)));
        let v7 = Platform::parse("linux/arm/v7")?;
        assert!(v7.matches(&entry("arm", Some("v7"))));
        assert!(!v7.matches(&entry("arm", Some("v6"))));
        assert!(!v7.matches(&entry("arm", None)));
        Ok(())
    }

    #[test]
    fn error_text_is_one_bounded_line() {
        assert_eq!(one_line("a\n  b\tc"), "a b c");
        let long = one_line(&"é".repeat(400));
        assert!(long.len() <= 303 && long.ends_with("..."));
    }
}
