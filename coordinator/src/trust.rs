//! The Domain's Trust Anchor: an ephemeral CA created at start-up and held
//! only in the coordinator's memory. Only its certificate is written (0644,
//! `ca.pem` in the Domain runtime directory) so that clients can pin it; the
//! key never touches a disk and dies with the coordinator. Escalation will
//! use it to issue per-session client certificates for mutual TLS (a later
//! issue); today it exists so that the start-up order the model demands is
//! the real one.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// Why the Trust Anchor could not be created.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Key or certificate generation failed.
    #[error("creating the Domain CA: {0}")]
    Generate(#[from] rcgen::Error),
    /// The certificate could not be written.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// A live Domain CA.
pub struct TrustAnchor {
    /// Kept for issuing session certificates (escalation).
    _key: KeyPair,
    cert_pem: String,
    cert_path: PathBuf,
}

impl TrustAnchor {
    /// Creates a CA for `domain` and writes its certificate to `cert_path`.
    pub fn create(domain: &str, cert_path: &Path) -> Result<TrustAnchor, TrustError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.distinguished_name.push(DnType::CommonName, format!("Lazaret Domain {domain}"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        let io = |source| TrustError::Io { path: cert_path.to_path_buf(), source };
        let _ = std::fs::remove_file(cert_path);
        std::fs::write(cert_path, &cert_pem).map_err(io)?;
        std::fs::set_permissions(cert_path, std::fs::Permissions::from_mode(0o644)).map_err(io)?;
        Ok(TrustAnchor { _key: key, cert_pem, cert_path: cert_path.to_path_buf() })
    }

    /// The CA certificate (PEM).
    pub fn certificate_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Withdraws the CA: its certificate file is removed (the key goes when
    /// the last holder drops it).
    pub fn destroy(&self) -> Result<(), TrustError> {
        match std::fs::remove_file(&self.cert_path) {
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => Err(TrustError::Io { path: self.cert_path.clone(), source }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_a_ca_certificate_and_removes_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ca.pem");
        let ca = TrustAnchor::create("d1", &path).expect("create");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{text}");
        assert_eq!(text, ca.certificate_pem());
        assert_eq!(std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777, 0o644);
        ca.destroy().expect("destroy");
        assert!(!path.exists());
    }
}
