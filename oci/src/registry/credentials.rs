//! Registry credentials: docker's `config.json` and Lazaret's own file.
//!
//! Both use docker's format: `{"auths": {"<registry>": {"auth": base64("user:password")}}}`
//! (a `username`/`password` pair is accepted too). Docker Hub's key may be
//! `https://index.docker.io/v1/`, `index.docker.io` or `docker.io`.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use base64::Engine;
use serde::{Deserialize, Serialize};

use super::RegistryError;

/// A user name and password (or token) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password or access token.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).field("password", &"<redacted>").finish()
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct AuthFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    /// Keys we do not use (credHelpers, ...), kept when rewriting our file.
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct AuthEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    auth: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    password: Option<String>,
}

/// The keys under which `registry` may appear in an `auths` map.
fn candidate_keys(registry: &str) -> Vec<String> {
    let mut keys = vec![
        registry.to_string(),
        format!("https://{registry}"),
        format!("http://{registry}"),
        format!("https://{registry}/v1/"),
        format!("https://{registry}/v2/"),
    ];
    if matches!(registry, "docker.io" | "index.docker.io" | "registry-1.docker.io") {
        keys.extend(["https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io"].map(String::from));
    }
    keys
}

/// Looks up credentials for `registry` in an auth file in docker's format.
/// A missing file is `Ok(None)`; an unreadable or malformed one is an error
/// naming the file.
pub fn credentials_from_file(file: &Path, registry: &str) -> Result<Option<Credentials>, RegistryError> {
    let bad = |reason: String| RegistryError::CredentialsFile { path: file.to_path_buf(), reason };
    let bytes = match std::fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(e.to_string())),
    };
    credentials_from_json(&bytes, registry, file)
}

/// Like [`credentials_from_file`], on the file's content already read
/// (`file` only names it in errors).
pub fn credentials_from_json(bytes: &[u8], registry: &str, file: &Path) -> Result<Option<Credentials>, RegistryError> {
    let bad = |reason: String| RegistryError::CredentialsFile { path: file.to_path_buf(), reason };
    let parsed: AuthFile = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    for key in candidate_keys(registry) {
        let Some(entry) = parsed.auths.get(&key) else {
            continue;
        };
        if let Some(encoded) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|e| bad(format!("auths.{key:?}.auth is not base64: {e}")))?;
            let text = String::from_utf8(decoded).map_err(|_| bad(format!("auths.{key:?}.auth is not UTF-8")))?;
            let (username, password) = text.split_once(':').ok_or_else(|| bad(format!("auths.{key:?}.auth is not user:password")))?;
            return Ok(Some(Credentials { username: username.to_string(), password: password.to_string() }));
        }
        if let (Some(username), Some(password)) = (&entry.username, &entry.password) {
            return Ok(Some(Credentials { username: username.clone(), password: password.clone() }));
        }
    }
    Ok(None)
}

/// Stores credentials for `registry` in `file` (docker's format), creating
/// it with mode 0600 and its parent directory with mode 0700 when missing.
/// Other entries are kept. The file is replaced atomically.
pub fn save_credentials(file: &Path, registry: &str, credentials: &Credentials) -> Result<(), RegistryError> {
    let bad = |reason: String| RegistryError::CredentialsFile { path: file.to_path_buf(), reason };
    if credentials.username.contains(':') {
        return Err(bad("the user name must not contain ':'".into()));
    }
    let mut parsed: AuthFile = match std::fs::read(file) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => AuthFile::default(),
        Err(e) => return Err(bad(e.to_string())),
    };
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", credentials.username, credentials.password));
    parsed.auths.insert(registry.to_string(), AuthEntry { auth: Some(encoded), ..AuthEntry::default() });
    let json = serde_json::to_vec_pretty(&parsed).map_err(|e| bad(e.to_string()))?;
    let parent = file.parent().ok_or_else(|| bad("has no parent directory".into()))?;
    if !parent.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| bad(format!("creating {}: {e}", parent.display())))?;
    }
    let temp = parent.join(format!(
        ".{}.tmp-{}",
        file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&temp)?;
        out.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        out.write_all(&json)?;
        out.sync_all()?;
        std::fs::rename(&temp, file)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        bad(e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_auth_is_decoded() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("config.json");
        std::fs::write(
            &file,
            r#"{"auths":{"https://index.docker.io/v1/":{"auth":"YWxpY2U6czNjcjN0"},
               "reg.example:5000":{"username":"bob","password":"pw"}},"credsStore":"x"}"#,
        )?;
        let hub = credentials_from_file(&file, "docker.io")?;
        assert_eq!(hub.map(|c| (c.username, c.password)), Some(("alice".into(), "s3cr3t".into())));
        let other = credentials_from_file(&file, "reg.example:5000")?;
        assert_eq!(other.map(|c| c.username), Some("bob".into()));
        assert!(credentials_from_file(&file, "ghcr.io")?.is_none());
        assert!(credentials_from_file(&dir.path().join("absent"), "ghcr.io")?.is_none());
        Ok(())
    }

    #[test]
    fn saved_credentials_round_trip_with_mode_0600() -> Result<(), Box<dyn std::error::Error>> {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("sub/registry-auth.json");
        let creds = Credentials { username: "u".into(), password: "p:w".into() };
        save_credentials(&file, "127.0.0.1:5000", &creds)?;
        save_credentials(&file, "ghcr.io", &creds)?;
        assert_eq!(std::fs::metadata(&file)?.mode() & 0o777, 0o600);
        assert_eq!(credentials_from_file(&file, "127.0.0.1:5000")?, Some(creds.clone()));
        assert_eq!(credentials_from_file(&file, "ghcr.io")?, Some(creds));
        std::fs::write(&file, "not json")?;
        assert!(credentials_from_file(&file, "ghcr.io").is_err());
        Ok(())
    }
}
