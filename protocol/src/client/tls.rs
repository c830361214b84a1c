//! The client's TLS configuration: TLS 1.3 only, the ring provider, the
//! Domain CA as the only trust root, the session's certificate as client
//! authentication, no resumption (every request is a full handshake; the
//! coordinator issues no tickets either).

use std::sync::Arc;

use crate::escalation::{ENV_CA, ENV_CERT, ENV_KEY};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore};

/// The three PEM values from the environment.
pub struct Credentials {
    /// The Domain CA's certificate(s).
    pub ca: String,
    /// The session's client certificate (chain).
    pub cert: String,
    /// The session's PKCS#8 key.
    pub key: String,
}

/// Builds the client configuration; the error is a one-line reason.
pub fn config(creds: &Credentials) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(creds.ca.as_bytes()) {
        let cert = cert.map_err(|e| format!("{ENV_CA} is not PEM: {e}"))?;
        roots.add(cert).map_err(|e| format!("{ENV_CA} holds a bad certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{ENV_CA} holds no certificate"));
    }
    let chain = CertificateDer::pem_slice_iter(creds.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{ENV_CERT} is not PEM: {e}"))?;
    if chain.is_empty() {
        return Err(format!("{ENV_CERT} holds no certificate"));
    }
    let key = PrivatePkcs8KeyDer::from_pem_slice(creds.key.as_bytes()).map_err(|e| format!("{ENV_KEY} is not a PKCS#8 PEM key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS configuration: {e}"))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, PrivateKeyDer::Pkcs8(key))
        .map_err(|e| format!("the session certificate or key is unusable: {e}"))?;
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// A fresh Escalation Request ID: 16 bytes from the operating system's
/// randomness (ring's, through the provider), as 32 lowercase hex digits.
/// Failing to get randomness is an error, never a weaker fallback.
pub fn request_id() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| "the system has no randomness for a request ID".to_owned())?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
