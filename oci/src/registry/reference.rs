//! Image references, normalised the way docker does.

use std::fmt;
use std::str::FromStr;

use super::RegistryError;

/// A parsed image reference such as `debian`, `ghcr.io/org/tool:1.2` or
/// `registry:5000/app@sha256:...`.
///
/// Normalisation follows docker: no registry means `docker.io`, a one-part
/// Docker Hub repository gets `library/`, no tag and no digest means
/// `:latest`. [`ImageReference::store_name`] (the full normalised form, e.g.
/// `docker.io/library/debian:latest`) is the name the image gets in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageReference {
    inner: oci_client::Reference,
}

impl ImageReference {
    /// Parses `input` (docker syntax).
    pub fn parse(input: &str) -> Result<ImageReference, RegistryError> {
        let invalid = |reason: String| RegistryError::InvalidReference { reference: input.to_string(), reason };
        if input.is_empty() || input.len() > 255 {
            return Err(invalid("must be 1 to 255 characters long".into()));
        }
        let inner = oci_client::Reference::from_str(input).map_err(|e| invalid(e.to_string()))?;
        // Docker's grammar: lowercase path components of [a-z0-9._-].
        let repository = inner.repository();
        if repository.is_empty() || !repository.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b)) {
            return Err(invalid(format!("repository {repository:?} must be lowercase letters, digits and ._-/")));
        }
        if let Some(digest) = inner.digest()
            && crate::layout::sha256_hex(digest).is_err()
        {
            return Err(invalid(format!("digest {digest:?} is not sha256:<64 lowercase hex digits>")));
        }
        // The full form is the image's name in the store, which holds at
        // most 255 characters: a bare name of 240 grows past that with
        // `docker.io/library/` and `:latest`.
        let whole = inner.whole();
        if whole.len() > 255 {
            return Err(invalid(format!("its full form {whole:?} is longer than 255 characters")));
        }
        Ok(ImageReference { inner })
    }

    /// Whether `input` names its registry explicitly (first path component
    /// with a `.` or `:`, or `localhost`), as opposed to a bare name like
    /// `debian` or `debian-bookworm` that could equally be a local image.
    pub fn names_registry(input: &str) -> bool {
        match input.split_once('/') {
            Some((first, _)) => first.contains('.') || first.contains(':') || first == "localhost",
            None => false,
        }
    }

    /// The full normalised reference: the image's name in the store.
    pub fn store_name(&self) -> String {
        self.inner.whole()
    }

    /// The registry host (and port) as written, e.g. `docker.io` or `127.0.0.1:5000`.
    pub fn registry(&self) -> &str {
        self.inner.registry()
    }

    /// The repository, e.g. `library/debian`.
    pub fn repository(&self) -> &str {
        self.inner.repository()
    }

    /// The tag, if any.
    pub fn tag(&self) -> Option<&str> {
        self.inner.tag()
    }

    /// The digest (`sha256:...`), if the reference pins one.
    pub fn digest(&self) -> Option<&str> {
        self.inner.digest()
    }

    /// The same repository, pinned to `digest`.
    pub(crate) fn with_digest(&self, digest: &str) -> oci_client::Reference {
        self.inner.clone_with_digest(digest.to_string())
    }

    pub(crate) fn inner(&self) -> &oci_client::Reference {
        &self.inner
    }
}

impl FromStr for ImageReference {
    type Err = RegistryError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ImageReference::parse(s)
    }
}

impl fmt::Display for ImageReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.store_name())
    }
}

/// An OCI platform (`os/architecture[/variant]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// Operating system, e.g. `linux`.
    pub os: String,
    /// OCI architecture name, e.g. `amd64`, `arm64`.
    pub architecture: String,
    /// Variant, e.g. `v8`; `None` matches any.
    pub variant: Option<String>,
}

impl Platform {
    /// `linux/<this machine's architecture>`.
    pub fn host() -> Platform {
        Platform { os: "linux".into(), architecture: crate::layout::host_architecture().into(), variant: None }
    }

    /// Parses `os/arch` or `os/arch/variant`.
    pub fn parse(input: &str) -> Result<Platform, RegistryError> {
        let parts: Vec<&str> = input.split('/').collect();
        let valid = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        match parts.as_slice() {
            [os, arch] if valid(os) && valid(arch) => Ok(Platform { os: os.to_string(), architecture: arch.to_string(), variant: None }),
            [os, arch, variant] if valid(os) && valid(arch) && valid(variant) => {
                Ok(Platform { os: os.to_string(), architecture: arch.to_string(), variant: Some(variant.to_string()) })
            }
            _ => Err(RegistryError::InvalidPlatform(input.to_string())),
        }
    }

    pub(crate) fn matches(&self, other: &crate::layout::Platform) -> bool {
        other.os == self.os
            && other.architecture == self.architecture
            && match (&self.variant, &other.variant) {
                (Some(wanted), Some(got)) => wanted == got,
                (Some(_), None) => false,
                (None, _) => true,
            }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_whose_full_form_is_too_long_for_the_store_is_refused() {
        // Found by fuzz target oci_manifest: 236 characters parse, but
        // `docker.io/library/` + `:latest` make 261, which does not.
        let long = "a".repeat(236);
        let error = ImageReference::parse(&long).expect_err("too long once normalised");
        assert!(error.to_string().contains("longer than 255 characters"), "{error}");
        let fits = "a".repeat(255 - "docker.io/library/:latest".len());
        let parsed = ImageReference::parse(&fits).expect("fits");
        assert_eq!(ImageReference::parse(&parsed.store_name()).expect("parses again"), parsed);
    }

    #[test]
    fn references_are_normalised_like_docker() -> Result<(), RegistryError> {
        let cases = [
            ("debian", "docker.io/library/debian:latest"),
            ("debian:trixie", "docker.io/library/debian:trixie"),
            ("library/debian:trixie", "docker.io/library/debian:trixie"),
            ("ghcr.io/org/tool:1.2", "ghcr.io/org/tool:1.2"),
            ("127.0.0.1:5000/app", "127.0.0.1:5000/app:latest"),
            ("localhost/app:v1", "localhost/app:v1"),
        ];
        for (input, expected) in cases {
            assert_eq!(ImageReference::parse(input)?.store_name(), expected, "{input}");
        }
        let digest = format!("sha256:{}", "a".repeat(64));
        let pinned = ImageReference::parse(&format!("127.0.0.1:5000/app@{digest}"))?;
        assert_eq!(pinned.digest(), Some(digest.as_str()));
        assert_eq!(pinned.tag(), None);
        assert_eq!(pinned.registry(), "127.0.0.1:5000");
        assert_eq!(pinned.repository(), "app");
        Ok(())
    }

    #[test]
    fn bad_references_are_refused() {
        for bad in ["", "UPPER/case", "a b", "app@sha256:short", "x@md5:abc"] {
            assert!(ImageReference::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn only_explicit_registries_count_as_registry_names() {
        assert!(ImageReference::names_registry("docker.io/library/debian:trixie"));
        assert!(ImageReference::names_registry("127.0.0.1:5000/app"));
        assert!(ImageReference::names_registry("localhost/app"));
        assert!(!ImageReference::names_registry("debian-bookworm"));
        assert!(!ImageReference::names_registry("debian:bookworm"));
        assert!(!ImageReference::names_registry("library/debian"));
    }

    #[test]
    fn platforms_parse() -> Result<(), RegistryError> {
        assert_eq!(Platform::parse("linux/arm64/v8")?.to_string(), "linux/arm64/v8");
        assert_eq!(Platform::parse("linux/amd64")?.variant, None);
        assert!(Platform::parse("linux").is_err());
        assert!(Platform::parse("linux/amd64/v8/x").is_err());
        Ok(())
    }
}
