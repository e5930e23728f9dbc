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
        load_or_create_key(data_dir).map(RunKey)
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

    /// The token of the operator's list.
    pub fn operator_token(&self) -> String {
        self.mac("runs")
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

fn load_or_create_key(data_dir: &Path) -> std::io::Result<[u8; 32]> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let path = data_dir.join(KEY_FILE);
    let read = |path: &Path| -> std::io::Result<Option<[u8; 32]>> {
        match std::fs::read(path) {
            Ok(bytes) => <[u8; 32]>::try_from(bytes.as_slice())
                .map(Some)
                .map_err(|_| {
                    std::io::Error::other(format!(
                        "{} is not a 32-byte key; delete it to make a new one (run links change)",
                        path.display()
                    ))
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    };
    if let Some(key) = read(&path)? {
        return Ok(key);
    }
    // Several processes may share the data directory and start together: the key is
    // written whole under a name of this process's own, then linked into place, which
    // fails if another process was first. Nobody ever reads a half-written key.
    // The directory holds the key (and setup mode's credentials): only kodx's user may
    // list or enter it, whatever the umask.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)?;
    let key: [u8; 32] = rand::random();
    let tmp = data_dir.join(format!(
        ".{KEY_FILE}.{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&key)?;
        f.sync_all()?;
        std::fs::hard_link(&tmp, &path)
    })();
    let _ = std::fs::remove_file(&tmp);
    match written {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read(&path)?
            .ok_or_else(|| std::io::Error::other(format!("{} vanished", path.display()))),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_per_run_and_checked_whole() {
        let dir = tempfile::tempdir().unwrap();
        let key = load_or_create_key(dir.path()).unwrap();
        assert_eq!(load_or_create_key(dir.path()).unwrap(), key, "kept");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let key = RunKey(key);
        // A data directory kodx creates is its own alone, whatever the umask.
        let fresh = dir.path().join("new/data");
        load_or_create_key(&fresh).unwrap();
        for d in [dir.path().join("new"), fresh] {
            let mode = std::fs::metadata(&d).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", d.display());
        }
        let a = key.token("run-a");
        assert_ne!(a, key.token("run-b"));
        assert_ne!(a, key.operator_token());
        assert!(RunKey::allows(&a, Some(&a)));
        assert!(!RunKey::allows(&a, Some(&key.token("run-b"))));
        assert!(!RunKey::allows(&a, Some(&a[..a.len() - 1])));
        assert!(!RunKey::allows(&a, None));
        assert_eq!(
            key.link("https://kodx.example.com/", "run-a"),
            format!("https://kodx.example.com/runs/run-a?token={a}")
        );
    }

    /// Processes sharing a data directory start together: each gets the one key, never
    /// an error or a half-written file, and no temporary file is left behind.
    #[test]
    fn processes_starting_together_share_one_key() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
            let keys: Vec<[u8; 32]> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..8)
                    .map(|_| {
                        let barrier = barrier.clone();
                        let dir = dir.path();
                        s.spawn(move || {
                            barrier.wait();
                            load_or_create_key(dir).unwrap()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(keys.iter().all(|k| *k == keys[0]));
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, [KEY_FILE], "only the key is left");
        }
    }
}
