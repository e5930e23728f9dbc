//! The key run-page links are made with, and the tokens made from it.

use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

const KEY_FILE: &str = "run-pages.key";

/// The key run-page links are made with.
#[derive(Clone)]
pub struct RunKey([u8; 32]);

impl RunKey {
    /// Reads the key under `data_dir`, making it (mode 0600) the first time.
    pub fn open(data_dir: &Path) -> std::io::Result<RunKey> {
        crate::serve::keys::load_or_create(data_dir, KEY_FILE).map(RunKey)
    }

    fn mac(&self, label: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(label.as_bytes());
        hex::encode(&mac.finalize().into_bytes()[..16])
    }

    /// The token of run `run_id`'s page.
    pub fn token(&self, run_id: &str) -> String {
        self.mac(&format!("run:{run_id}"))
    }

    /// The run page's address under `public_url`.
    pub fn link(&self, public_url: &str, run_id: &str) -> String {
        format!(
            "{}/runs/{run_id}?token={}",
            public_url.trim_end_matches('/'),
            self.token(run_id)
        )
    }

    pub(super) fn allows(label_token: &str, given: Option<&str>) -> bool {
        let Some(given) = given else { return false };
        // Constant time in the token's content (`subtle`); the length is not a secret.
        use subtle::ConstantTimeEq as _;
        bool::from(label_token.as_bytes().ct_eq(given.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_per_run_and_checked_whole() {
        let dir = tempfile::tempdir().unwrap();
        let key = RunKey::open(dir.path()).unwrap();
        let a = key.token("run-a");
        assert_ne!(a, key.token("run-b"));
        assert_eq!(a, RunKey::open(dir.path()).unwrap().token("run-a"), "kept");
        assert!(RunKey::allows(&a, Some(&a)));
        assert!(!RunKey::allows(&a, Some(&key.token("run-b"))));
        assert!(!RunKey::allows(&a, Some(&a[..a.len() - 1])));
        assert!(!RunKey::allows(&a, None));
        assert_eq!(
            key.link("https://kodx.example.com/", "run-a"),
            format!("https://kodx.example.com/runs/run-a?token={a}")
        );
    }
}
