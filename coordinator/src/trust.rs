//! The Domain's Trust Anchor: an ephemeral CA created at start-up and held
//! only in the coordinator's memory. Only its certificate is written (0644,
//! `ca.pem` in the Domain runtime directory) so that clients can pin it; the
//! key never touches a disk, never leaves this module and dies with the
//! coordinator.
//!
//! It secures the escalation channel (SR-9): the CA signs
//! * one server certificate for the coordinator's listener
//!   ([`TrustAnchor::server_config`]: IP SAN = the listener's address,
//!   serverAuth), and
//! * one client certificate per session ([`TrustAnchor::issue_session`]:
//!   a fresh key, clientAuth, the URI SAN `lazaret://<domain>/session/<session>`
//!   and the Session ID as CN), which that session's processes present.
//!
//! The server accepts TLS 1.3 only, with the ring provider, and requires a
//! client certificate that chains to this Domain's CA and nothing else
//! ([`accept`]); [`TrustAnchor::session_of`] then names the session a
//! connection belongs to. Whether that session is registered and connected
//! is for the caller to check.

use std::fmt;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig, ServerConnection, StreamOwned};

/// The URI scheme of the SAN that names a session's Domain and Session ID.
const URI_SCHEME: &str = "lazaret://";
/// Longest Domain or Session ID accepted in a certificate.
const MAX_ID_LEN: usize = 64;
/// How long before now a certificate becomes valid (clock differences
/// between the host and the sandbox's clock do not break the handshake).
const VALID_BEFORE: Duration = Duration::from_secs(60 * 60);
/// How long a certificate stays valid: longer than any Domain is expected
/// to live without a restart (a restart makes a new CA anyway).
const VALID_FOR: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// Why the Trust Anchor could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Key or certificate generation failed.
    #[error("generating a key or certificate of the Domain CA: {0}")]
    Generate(#[from] rcgen::Error),
    /// The certificate could not be written.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A Domain or Session ID that cannot be put into a certificate.
    #[error("{what} {id:?} cannot name a certificate (1 to {MAX_ID_LEN} of A-Z a-z 0-9 . _ -)")]
    BadId {
        /// "Domain ID" or "Session ID".
        what: &'static str,
        /// The refused ID.
        id: String,
    },
    /// rustls refused the configuration (or the handshake).
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The client certificate verifier could not be built.
    #[error("building the client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The socket failed during the handshake.
    #[error("TLS handshake: {0}")]
    Handshake(std::io::Error),
    /// The handshake did not complete in time.
    #[error("TLS handshake not completed within {0:?}")]
    HandshakeTimeout(Duration),
    /// The peer closed the connection during the handshake.
    #[error("TLS handshake: the peer closed the connection")]
    HandshakeEof,
    /// The peer presented no certificate.
    #[error("the peer presented no certificate")]
    NoPeerCertificate,
    /// The peer's certificate does not chain to this Domain's CA (or is
    /// unusable for client authentication).
    #[error("the peer's certificate is not one of this Domain's: {0}")]
    NotThisDomainsCa(webpki::Error),
    /// The peer's certificate does not name exactly one session of this Domain.
    #[error("the peer's certificate does not name a session of this Domain: {0}")]
    PeerIdentity(String),
}

/// A session's client key and certificate (PEM), handed to that session's
/// processes in the sandbox. `Debug` does not show the key.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionCredentials {
    /// The client certificate, signed by the Domain CA.
    pub cert_pem: String,
    /// The certificate's private key (PKCS#8).
    pub key_pem: String,
}

impl fmt::Debug for SessionCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionCredentials").field("cert_pem", &self.cert_pem).field("key_pem", &"<redacted>").finish()
    }
}

/// A live Domain CA. `Debug` shows the Domain only.
pub struct TrustAnchor {
    domain: String,
    /// The CA's name and key, for signing; the key stays in here.
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    cert_path: PathBuf,
}

impl fmt::Debug for TrustAnchor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrustAnchor").field("domain", &self.domain).finish_non_exhaustive()
    }
}

/// Whether `id` is usable in a certificate name (and so in the URI SAN,
/// where it must not add path segments).
fn valid_id(id: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn checked_id<'a>(what: &'static str, id: &'a str) -> Result<&'a str, TrustError> {
    if valid_id(id) { Ok(id) } else { Err(TrustError::BadId { what, id: id.to_string() }) }
}

/// The URI SAN of one session.
fn session_uri(domain: &str, session: &str) -> String {
    format!("{URI_SCHEME}{domain}/session/{session}")
}

/// The rustls provider of the channel: ring, explicitly (not whatever
/// process-wide default another dependency may install).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parameters of a certificate valid from an hour ago for [`VALID_FOR`].
fn leaf_params(common_name: &str, sans: Vec<SanType>, usage: ExtendedKeyUsagePurpose) -> CertificateParams {
    let mut params = CertificateParams::default();
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - VALID_BEFORE;
    params.not_after = now + VALID_FOR;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    params
}

impl TrustAnchor {
    /// Creates a CA for `domain` and writes its certificate to `cert_path`.
    pub fn create(domain: &str, cert_path: &Path) -> Result<TrustAnchor, TrustError> {
        checked_id("Domain ID", domain)?;
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
        Ok(TrustAnchor {
            domain: domain.to_string(),
            issuer: Issuer::new(params, key),
            cert_der: cert.der().clone(),
            cert_pem,
            cert_path: cert_path.to_path_buf(),
        })
    }

    /// The CA certificate (PEM), what clients pin (`LAZARET_ESCALATE_CA`).
    pub fn ca_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A TLS server configuration for a listener on `address`: a fresh key
    /// and a server certificate for it (IP SAN `address`, serverAuth),
    /// TLS 1.3 only with the ring provider, a client certificate required
    /// and verified against this Domain's CA only, no session resumption.
    pub fn server_config(&self, address: IpAddr) -> Result<Arc<ServerConfig>, TrustError> {
        let key = KeyPair::generate()?;
        let params = leaf_params(
            &format!("Lazaret Domain {} coordinator", self.domain),
            vec![SanType::IpAddress(address)],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let cert = params.signed_by(&key, &self.issuer)?;
        let provider = provider();
        let mut roots = RootCertStore::empty();
        roots.add(self.cert_der.clone())?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build()?;
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![cert.der().clone()], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))?;
        // Stateless: every connection is a full handshake (the default
        // ticketer already issues none; no tickets, no session cache).
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(NoServerSessionStorage {});
        Ok(Arc::new(config))
    }

    /// A fresh key and client certificate for `session` (ECDSA P-256,
    /// clientAuth, URI SAN `lazaret://<domain>/session/<session>`, CN the
    /// Session ID). Session IDs are 1 to 64 of `A-Z a-z 0-9 . _ -`.
    pub fn issue_session(&self, session: &str) -> Result<SessionCredentials, TrustError> {
        let session = checked_id("Session ID", session)?;
        let uri = session_uri(&self.domain, session).try_into()?;
        self.sign_client(session, vec![SanType::URI(uri)])
    }

    /// Signs a client certificate with `sans` for a fresh key.
    fn sign_client(&self, common_name: &str, sans: Vec<SanType>) -> Result<SessionCredentials, TrustError> {
        let key = KeyPair::generate()?;
        let cert = leaf_params(common_name, sans, ExtendedKeyUsagePurpose::ClientAuth).signed_by(&key, &self.issuer)?;
        Ok(SessionCredentials { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// The Session ID named by the client certificate `peer` presented (its
    /// chain as rustls gives it, [`ServerConnection::peer_certificates`]).
    /// The end-entity certificate is verified again against this Domain's
    /// CA for client authentication (so this is safe on any chain), and
    /// must carry exactly one URI SAN, naming this Domain.
    pub fn session_of(&self, peer: &[CertificateDer<'_>]) -> Result<String, TrustError> {
        let (end_entity, intermediates) = peer.split_first().ok_or(TrustError::NoPeerCertificate)?;
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(TrustError::NotThisDomainsCa)?;
        let anchor = webpki::anchor_from_trusted_cert(&self.cert_der).map_err(TrustError::NotThisDomainsCa)?;
        cert.verify_for_usage(
            provider().signature_verification_algorithms.all,
            &[anchor],
            intermediates,
            UnixTime::now(),
            webpki::KeyUsage::client_auth(),
            None,
            None,
        )
        .map_err(TrustError::NotThisDomainsCa)?;
        let uris: Vec<&str> = cert.valid_uri_names().collect();
        let [uri] = uris.as_slice() else {
            return Err(TrustError::PeerIdentity(format!("{} URI names instead of one", uris.len())));
        };
        let identity = || TrustError::PeerIdentity(format!("unexpected URI name {uri:?}"));
        let (domain, session) = uri.strip_prefix(URI_SCHEME).and_then(|rest| rest.split_once("/session/")).ok_or_else(identity)?;
        if domain != self.domain {
            return Err(TrustError::PeerIdentity(format!("it names Domain {domain:?}")));
        }
        if !valid_id(session) {
            return Err(identity());
        }
        Ok(session.to_string())
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

/// A stream whose reads and writes can be given a timeout.
trait TimedStream: Read + Write {
    fn set_timeouts(&self, timeout: Option<Duration>) -> std::io::Result<()>;
}

impl TimedStream for TcpStream {
    fn set_timeouts(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(timeout)?;
        self.set_write_timeout(timeout)
    }
}

impl TimedStream for UnixStream {
    fn set_timeouts(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(timeout)?;
        self.set_write_timeout(timeout)
    }
}

/// Completes the server side of the TLS handshake on `tcp` within
/// `timeout` (a deadline for the whole handshake, not per read) and
/// returns the stream. The client certificate is verified by `config`
/// (one from [`TrustAnchor::server_config`]); name its session with
/// [`TrustAnchor::session_of`]. The socket is returned without timeouts:
/// the caller sets its own for what follows.
pub fn accept(
    config: &Arc<ServerConfig>,
    tcp: TcpStream,
    timeout: Duration,
) -> Result<StreamOwned<ServerConnection, TcpStream>, TrustError> {
    handshake(config, tcp, timeout)
}

fn handshake<S: TimedStream>(
    config: &Arc<ServerConfig>,
    mut stream: S,
    timeout: Duration,
) -> Result<StreamOwned<ServerConnection, S>, TrustError> {
    let deadline = Instant::now() + timeout;
    let mut connection = ServerConnection::new(config.clone())?;
    let arm = |stream: &S| {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(TrustError::HandshakeTimeout(timeout));
        }
        stream.set_timeouts(Some(remaining)).map_err(TrustError::Handshake)
    };
    let io_error = |error: std::io::Error| match error.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => TrustError::HandshakeTimeout(timeout),
        _ => TrustError::Handshake(error),
    };
    while connection.is_handshaking() {
        while connection.wants_write() {
            arm(&stream)?;
            connection.write_tls(&mut stream).map_err(io_error)?;
        }
        if !connection.is_handshaking() {
            break;
        }
        arm(&stream)?;
        if connection.read_tls(&mut stream).map_err(io_error)? == 0 {
            return Err(TrustError::HandshakeEof);
        }
        if let Err(error) = connection.process_new_packets() {
            // Tell the peer why (the alert rustls queued), as far as it listens.
            if arm(&stream).is_ok() {
                let _ = connection.write_tls(&mut stream);
            }
            return Err(TrustError::Tls(error));
        }
    }
    while connection.wants_write() {
        arm(&stream)?;
        connection.write_tls(&mut stream).map_err(io_error)?;
    }
    stream.set_timeouts(None).map_err(TrustError::Handshake)?;
    Ok(StreamOwned::new(connection, stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::ServerName;
    use rustls::pki_types::pem::PemObject;
    use rustls::{ClientConfig, ClientConnection};

    const GATEWAY: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(100, 96, 0, 1));

    fn anchor(domain: &str) -> (tempfile::TempDir, TrustAnchor) {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TrustAnchor::create(domain, &dir.path().join("ca.pem")).expect("create");
        (dir, ca)
    }

    fn client_config(
        ca_pem: &str,
        credentials: Option<&SessionCredentials>,
        version: &'static rustls::SupportedProtocolVersion,
    ) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("CA PEM")).expect("root");
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[version])
            .expect("versions")
            .with_root_certificates(roots);
        Arc::new(match credentials {
            Some(credentials) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(credentials.cert_pem.as_bytes()).expect("cert PEM")],
                    PrivateKeyDer::from_pem_slice(credentials.key_pem.as_bytes()).expect("key PEM"),
                )
                .expect("client cert"),
            None => builder.with_no_client_auth(),
        })
    }

    /// A handshake between `server` and a client with `client` over a
    /// socket pair; the server's result (with the peer's chain), and
    /// whether the client completed it and echoed a byte.
    fn run(server: &Arc<ServerConfig>, client: Arc<ClientConfig>) -> (Result<Vec<CertificateDer<'static>>, TrustError>, bool) {
        let (server_end, client_end) = UnixStream::pair().expect("socket pair");
        let client = std::thread::spawn(move || {
            client_end.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
            let connection = ClientConnection::new(client, ServerName::IpAddress(GATEWAY.into())).expect("client connection");
            let mut stream = StreamOwned::new(connection, client_end);
            let mut byte = [0u8; 1];
            stream.write_all(b"x").is_ok() && stream.flush().is_ok() && stream.read_exact(&mut byte).is_ok() && byte == *b"y"
        });
        let result = handshake(server, server_end, Duration::from_secs(10)).and_then(|mut stream| {
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).map_err(TrustError::Handshake)?;
            assert_eq!(&byte, b"x");
            stream.write_all(b"y").map_err(TrustError::Handshake)?;
            stream.flush().map_err(TrustError::Handshake)?;
            Ok(stream.conn.peer_certificates().expect("verified peer certificates").iter().map(|c| c.clone().into_owned()).collect())
        });
        (result, client.join().expect("client thread"))
    }

    #[test]
    fn creates_a_ca_certificate_and_removes_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ca.pem");
        let ca = TrustAnchor::create("d1", &path).expect("create");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{text}");
        assert_eq!(text, ca.ca_pem());
        assert_eq!(std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777, 0o644);
        ca.destroy().expect("destroy");
        assert!(!path.exists());
    }

    #[test]
    fn a_session_of_this_domain_is_accepted_and_named() {
        let (_dir, ca) = anchor("d1");
        let server = ca.server_config(GATEWAY).expect("server config");
        let credentials = ca.issue_session("s-0123456789abcdef").expect("issue");
        let (result, client_ok) = run(&server, client_config(ca.ca_pem(), Some(&credentials), &rustls::version::TLS13));
        let chain = result.expect("handshake accepted");
        assert!(client_ok, "the client completed the handshake and got its reply");
        assert_eq!(ca.session_of(&chain).expect("session"), "s-0123456789abcdef");
        // A second session gets its own key.
        let other = ca.issue_session("s-2").expect("issue");
        assert_ne!(other.key_pem, credentials.key_pem);
        assert_ne!(other.cert_pem, credentials.cert_pem);
    }

    #[test]
    fn foreign_self_made_and_missing_client_certificates_are_refused() {
        let (_dir, ca) = anchor("d1");
        let server = ca.server_config(GATEWAY).expect("server config");
        // Another Domain's session (the client trusts our server, so only
        // the server can refuse).
        let (_other_dir, other) = anchor("d2");
        let foreign = other.issue_session("s-1").expect("issue");
        // A self-made CA issuing a certificate that looks like ours, same Domain ID.
        let forger = KeyPair::generate().expect("key");
        let mut forger_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        forger_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        forger_params.distinguished_name.push(DnType::CommonName, "Lazaret Domain d1");
        forger_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        forger_params.self_signed(&forger).expect("self-signed");
        let forged_issuer = Issuer::new(forger_params, forger);
        let key = KeyPair::generate().expect("key");
        let uri = session_uri("d1", "s-1").try_into().expect("uri");
        let forged_cert = leaf_params("s-1", vec![SanType::URI(uri)], ExtendedKeyUsagePurpose::ClientAuth)
            .signed_by(&key, &forged_issuer)
            .expect("forged cert");
        let forged = SessionCredentials { cert_pem: forged_cert.pem(), key_pem: key.serialize_pem() };
        for (what, credentials) in [("another Domain's", Some(&foreign)), ("a self-made CA's", Some(&forged)), ("no", None)] {
            let (result, client_ok) = run(&server, client_config(ca.ca_pem(), credentials, &rustls::version::TLS13));
            assert!(matches!(result, Err(TrustError::Tls(_))), "{what} client certificate: {result:?}");
            assert!(!client_ok, "{what} client certificate: the client got a reply");
        }
        // session_of refuses them too, whoever calls it on an unverified chain.
        for credentials in [&foreign, &forged] {
            let der = CertificateDer::from_pem_slice(credentials.cert_pem.as_bytes()).expect("PEM");
            assert!(matches!(ca.session_of(&[der]), Err(TrustError::NotThisDomainsCa(_))));
        }
        assert!(matches!(ca.session_of(&[]), Err(TrustError::NoPeerCertificate)));
    }

    #[test]
    fn tls_1_2_is_refused() {
        let (_dir, ca) = anchor("d1");
        let server = ca.server_config(GATEWAY).expect("server config");
        let credentials = ca.issue_session("s-1").expect("issue");
        let (result, client_ok) = run(&server, client_config(ca.ca_pem(), Some(&credentials), &rustls::version::TLS12));
        assert!(matches!(result, Err(TrustError::Tls(rustls::Error::PeerIncompatible(_)))), "{result:?}");
        assert!(!client_ok);
    }

    #[test]
    fn a_certificate_naming_another_domain_or_not_exactly_one_session_is_refused() {
        let (_dir, ca) = anchor("d1");
        let der = |credentials: SessionCredentials| CertificateDer::from_pem_slice(credentials.cert_pem.as_bytes()).expect("PEM");
        let uri = |text: &str| SanType::URI(text.try_into().expect("uri"));
        let refused = |sans: Vec<SanType>| {
            let cert = der(ca.sign_client("s-1", sans).expect("sign"));
            match ca.session_of(&[cert]) {
                Err(TrustError::PeerIdentity(reason)) => reason,
                other => panic!("expected a refusal, got {other:?}"),
            }
        };
        assert!(refused(vec![uri(&session_uri("d2", "s-1"))]).contains("\"d2\""));
        assert!(refused(vec![]).contains("0 URI names"));
        assert!(refused(vec![uri(&session_uri("d1", "s-1")), uri(&session_uri("d1", "s-2"))]).contains("2 URI names"));
        refused(vec![uri("lazaret://d1/session/s-1/../s-2")]);
        refused(vec![uri("https://d1/session/s-1")]);
        let good = der(ca.sign_client("s-1", vec![uri(&session_uri("d1", "s-1"))]).expect("sign"));
        assert_eq!(ca.session_of(&[good]).expect("session"), "s-1");
    }

    #[test]
    fn ids_that_would_change_the_uri_are_refused() {
        let (_dir, ca) = anchor("0123456789abcdef0123456789abcdef");
        for session in ["", "s/1", "s 1", "../x", "s\u{e9}", &"s".repeat(65)] {
            assert!(matches!(ca.issue_session(session), Err(TrustError::BadId { .. })), "{session:?}");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(TrustAnchor::create("a/b", &dir.path().join("ca.pem")), Err(TrustError::BadId { .. })));
    }

    #[test]
    fn the_ca_key_is_in_nothing_returned() {
        let (_dir, ca) = anchor("d1");
        let ca_key_pem = ca.issuer.key().serialize_pem();
        let ca_key_body: String = ca_key_pem.lines().filter(|line| !line.starts_with("-----")).collect();
        let credentials = ca.issue_session("s-1").expect("issue");
        for text in [&credentials.cert_pem, &credentials.key_pem, &ca.ca_pem().to_string(), &format!("{credentials:?}"), &format!("{ca:?}")]
        {
            let flat: String = text.lines().collect();
            assert!(!flat.contains(&ca_key_body), "the CA key is in {text}");
        }
        assert!(!format!("{credentials:?}").contains("PRIVATE KEY"), "Debug shows the session key");
        // The server signs with a key of its own: its certificate's public
        // key is not the CA's.
        let server = ca.server_config(GATEWAY).expect("server config");
        let chain_seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (server_end, client_end) = UnixStream::pair().expect("pair");
        let client = client_config(ca.ca_pem(), Some(&credentials), &rustls::version::TLS13);
        let seen = chain_seen.clone();
        let thread = std::thread::spawn(move || {
            let connection = ClientConnection::new(client, ServerName::IpAddress(GATEWAY.into())).expect("client");
            let mut stream = StreamOwned::new(connection, client_end);
            while stream.conn.is_handshaking() {
                stream.conn.complete_io(&mut stream.sock).expect("handshake");
            }
            // The client's Finished may still be queued.
            while stream.conn.wants_write() {
                stream.conn.write_tls(&mut stream.sock).expect("finish");
            }
            let chain: Vec<CertificateDer<'static>> =
                stream.conn.peer_certificates().expect("server chain").iter().map(|c| c.clone().into_owned()).collect();
            *seen.lock().expect("lock") = chain;
        });
        handshake(&server, server_end, Duration::from_secs(10)).expect("handshake");
        thread.join().expect("client thread");
        let chain = chain_seen.lock().expect("lock").clone();
        assert_eq!(chain.len(), 1, "only the server's own certificate is sent");
        let server_cert = webpki::EndEntityCert::try_from(&chain[0]).expect("parse");
        let ca_cert = webpki::EndEntityCert::try_from(&ca.cert_der).expect("parse");
        assert_ne!(server_cert.subject_public_key_info(), ca_cert.subject_public_key_info());
        assert!(matches!(ca.session_of(&chain), Err(TrustError::NotThisDomainsCa(_))), "a serverAuth certificate is no session's");
    }

    #[test]
    fn a_silent_client_times_out() {
        let (_dir, ca) = anchor("d1");
        let server = ca.server_config(GATEWAY).expect("server config");
        let (server_end, _client_end) = UnixStream::pair().expect("pair");
        let started = Instant::now();
        let result = handshake(&server, server_end, Duration::from_millis(200));
        assert!(matches!(result, Err(TrustError::HandshakeTimeout(_))), "{result:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
