//! Secrets kept by kodx for a repository (SPEC §12, "Egress by name"): `kodx secret set
//! OWNER/REPO NAME` stores a value encrypted in the database, so every process of a
//! PostgreSQL deployment can read it, and nothing but the key decrypts it.
//!
//! - The key: 32 bytes, from `KODX_SECRETS_KEY` (base64; several processes sharing one
//!   database set the same) or else the file `secrets.key` in `KODX_DATA_DIR`, made with
//!   mode 0600 the first time a secret is stored.
//! - A value is sealed with ChaCha20-Poly1305 (`ring::aead`) under a fresh random nonce, with
//!   the repository and the name as associated data: a row copied to another repository or
//!   name does not open.
//! - Each row names the key it was sealed with by the key's id (the first 8 bytes of its
//!   SHA-256, in hex): a process with another key says so and never tries to decrypt; a
//!   row that was changed fails its tag and says so. Garbage is never returned.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use secrecy::{ExposeSecret, SecretBox, SecretString};

/// The file the key is kept in, under `KODX_DATA_DIR`.
pub const KEY_FILE: &str = "secrets.key";
/// The most bytes a secret's value may have.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// The most secrets one repository may have.
pub const MAX_PER_REPO: usize = 100;

/// Why a secret could not be stored or read: a sentence an operator can act on.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("`KODX_SECRETS_KEY` is not the base64 of 32 bytes")]
    BadKeyVariable,
    #[error("{path}: {why}")]
    KeyFile { path: String, why: String },
    #[error(
        "the secret was stored under key {stored}, and this process has key {have}: give \
         every process of the deployment the same key (`KODX_SECRETS_KEY`, or the same \
         `{KEY_FILE}` in `KODX_DATA_DIR`)"
    )]
    OtherKey { stored: String, have: String },
    #[error(
        "the stored secret does not open with this key: it was changed or damaged; set it again"
    )]
    Damaged,
    #[error(
        "a secret's name is letters, digits and `_`, not starting with a digit, at most 64 \
         characters (`NPM_TOKEN`); got {0:?}"
    )]
    BadName(String),
    #[error("the value is empty")]
    Empty,
    #[error("the value is over {MAX_VALUE_BYTES} bytes")]
    TooLarge,
}

/// The key secrets are sealed with, and its id.
pub struct SecretsKey {
    key: SecretBox<[u8; 32]>,
    id: String,
}

impl SecretsKey {
    /// The key of this process: `KODX_SECRETS_KEY` when set, else `data_dir/secrets.key`,
    /// made when `create` and there is none (`Ok(None)`: no key, none made).
    pub fn load(data_dir: &Path, create: bool) -> Result<Option<SecretsKey>, SecretError> {
        if let Ok(v) = std::env::var("KODX_SECRETS_KEY") {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.trim())
                .map_err(|_| SecretError::BadKeyVariable)?;
            let key: [u8; 32] = bytes.try_into().map_err(|_| SecretError::BadKeyVariable)?;
            return Ok(Some(SecretsKey::from_bytes(key)));
        }
        let path = data_dir.join(KEY_FILE);
        let file_error = |why: String| SecretError::KeyFile {
            path: path.display().to_string(),
            why,
        };
        match std::fs::read(&path) {
            Ok(bytes) => {
                let key: [u8; 32] = bytes
                    .try_into()
                    .map_err(|_| file_error("is not a key of 32 bytes".into()))?;
                Ok(Some(SecretsKey::from_bytes(key)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                let mut key = [0u8; 32];
                SystemRandom::new()
                    .fill(&mut key)
                    .map_err(|_| file_error("no randomness for a new key".into()))?;
                write_key(&path, &key)
                    .map_err(|e| file_error(format!("cannot be written: {e}")))?;
                Ok(Some(SecretsKey::from_bytes(key)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(file_error(format!("cannot be read: {e}"))),
        }
    }

    pub fn from_bytes(key: [u8; 32]) -> SecretsKey {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(key);
        let id = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        SecretsKey {
            key: SecretBox::new(Box::new(key)),
            id,
        }
    }

    /// The key's id, stored with each secret sealed under it.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn aead(&self) -> LessSafeKey {
        LessSafeKey::new(
            UnboundKey::new(&CHACHA20_POLY1305, self.key.expose_secret())
                .expect("a 32-byte ChaCha20-Poly1305 key"),
        )
    }

    /// `value` sealed for `repo`'s secret `name`: base64 of the nonce and of the ciphertext.
    pub fn seal(&self, repo: &str, name: &str, value: &[u8]) -> Result<Sealed, SecretError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SecretError::Damaged)?;
        let mut data = value.to_vec();
        self.aead()
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(repo, name)),
                &mut data,
            )
            .map_err(|_| SecretError::Damaged)?;
        let b64 = base64::engine::general_purpose::STANDARD;
        Ok(Sealed {
            key_id: self.id.clone(),
            nonce: b64.encode(nonce),
            ciphertext: b64.encode(data),
        })
    }

    /// The value of a sealed secret, or why it cannot be had.
    pub fn open(
        &self,
        repo: &str,
        name: &str,
        sealed: &Sealed,
    ) -> Result<SecretString, SecretError> {
        if sealed.key_id != self.id {
            return Err(SecretError::OtherKey {
                stored: sealed.key_id.clone(),
                have: self.id.clone(),
            });
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let nonce: [u8; NONCE_LEN] = b64
            .decode(&sealed.nonce)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or(SecretError::Damaged)?;
        let mut data = b64
            .decode(&sealed.ciphertext)
            .map_err(|_| SecretError::Damaged)?;
        let plain = self
            .aead()
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(repo, name)),
                &mut data,
            )
            .map_err(|_| SecretError::Damaged)?;
        let text = String::from_utf8(plain.to_vec()).map_err(|_| SecretError::Damaged)?;
        Ok(SecretString::from(text))
    }
}

/// A secret as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub key_id: String,
    pub nonce: String,
    pub ciphertext: String,
}

fn aad(repo: &str, name: &str) -> Vec<u8> {
    format!("kodx-secret:v1:{}:{name}", repo.to_ascii_lowercase()).into_bytes()
}

/// Checks a secret's name: an environment variable's (`NPM_TOKEN`).
pub fn check_name(name: &str) -> Result<(), SecretError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(SecretError::BadName(name.to_string()))
    }
}

/// A value as read from standard input: one trailing newline (`\n` or `\r\n`) dropped.
pub fn value_from_input(mut input: Vec<u8>) -> Result<Vec<u8>, SecretError> {
    if input.len() > MAX_VALUE_BYTES + 2 {
        return Err(SecretError::TooLarge);
    }
    if input.ends_with(b"\n") {
        input.pop();
        if input.ends_with(b"\r") {
            input.pop();
        }
    }
    if input.is_empty() {
        return Err(SecretError::Empty);
    }
    if input.len() > MAX_VALUE_BYTES {
        return Err(SecretError::TooLarge);
    }
    Ok(input)
}

fn write_key(path: &PathBuf, key: &[u8; 32]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(key)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_key_repository_and_name() {
        let key = SecretsKey::from_bytes([7u8; 32]);
        let sealed = key.seal("acme/widgets", "NPM_TOKEN", b"s3cr3t").unwrap();
        assert!(!sealed.ciphertext.contains("s3cr3t"));
        assert_eq!(
            key.open("acme/widgets", "NPM_TOKEN", &sealed)
                .unwrap()
                .expose_secret(),
            "s3cr3t"
        );
        // Another repository or name: the tag fails, nothing is returned.
        assert!(matches!(
            key.open("acme/other", "NPM_TOKEN", &sealed),
            Err(SecretError::Damaged)
        ));
        assert!(matches!(
            key.open("acme/widgets", "OTHER", &sealed),
            Err(SecretError::Damaged)
        ));
        // Another key: said, never tried.
        let other = SecretsKey::from_bytes([8u8; 32]);
        let e = other
            .open("acme/widgets", "NPM_TOKEN", &sealed)
            .unwrap_err();
        assert!(matches!(e, SecretError::OtherKey { .. }));
        assert!(e.to_string().contains(key.id()), "{e}");
        // A changed byte fails its tag.
        let mut bytes = base64::engine::general_purpose::STANDARD
            .decode(&sealed.ciphertext)
            .unwrap();
        bytes[0] ^= 1;
        let tampered = Sealed {
            ciphertext: base64::engine::general_purpose::STANDARD.encode(bytes),
            ..sealed.clone()
        };
        assert!(matches!(
            key.open("acme/widgets", "NPM_TOKEN", &tampered),
            Err(SecretError::Damaged)
        ));
        // Two seals of one value differ (fresh nonces).
        assert_ne!(
            key.seal("acme/widgets", "NPM_TOKEN", b"s3cr3t").unwrap(),
            sealed
        );
    }

    #[test]
    fn names_and_values() {
        assert!(check_name("NPM_TOKEN").is_ok());
        assert!(check_name("_X1").is_ok());
        for bad in ["", "1X", "NPM-TOKEN", "A B", &"A".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert_eq!(value_from_input(b"abc\n".to_vec()).unwrap(), b"abc");
        assert_eq!(value_from_input(b"abc\r\n".to_vec()).unwrap(), b"abc");
        assert_eq!(value_from_input(b"abc\n\n".to_vec()).unwrap(), b"abc\n");
        assert!(matches!(
            value_from_input(b"\n".to_vec()),
            Err(SecretError::Empty)
        ));
        assert!(matches!(
            value_from_input(vec![b'a'; MAX_VALUE_BYTES + 1]),
            Err(SecretError::TooLarge)
        ));
    }

    #[test]
    fn the_key_file_is_made_once_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        // The variable would win; these tests never set it.
        if std::env::var("KODX_SECRETS_KEY").is_ok() {
            return;
        }
        assert!(SecretsKey::load(dir.path(), false).unwrap().is_none());
        let made = SecretsKey::load(dir.path(), true).unwrap().unwrap();
        let again = SecretsKey::load(dir.path(), false).unwrap().unwrap();
        assert_eq!(made.id(), again.id());
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(dir.path().join(KEY_FILE), b"short").unwrap();
        assert!(SecretsKey::load(dir.path(), false).is_err());
    }
}
