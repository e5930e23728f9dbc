//! The server's keys under `KODX_DATA_DIR`: made once (32 random bytes, mode 0600), shared
//! by the processes that share the directory. The run pages' key signs each run's link
//! ([`crate::serve::runpage::RunKey`]); the operator's key ([`OperatorKey`]) signs the
//! operator's links (the list of runs, `/healthz`'s details), each with an expiry, and
//! can be replaced while kodx runs (`kodx operator-link --rotate`): every process reads it
//! again when the file changes.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The operator key's file under `KODX_DATA_DIR`.
pub const OPERATOR_KEY_FILE: &str = "operator.key";
/// How long an operator link lasts unless told otherwise.
pub const DEFAULT_VALID: Duration = Duration::from_secs(24 * 3600);
/// The longest an operator link may last.
pub const MAX_VALID: Duration = Duration::from_secs(30 * 24 * 3600);

/// The operator's key, read again whenever its file is replaced.
pub struct OperatorKey {
    path: PathBuf,
    /// The key as last read, with the file's identity then.
    cached: Mutex<Option<(FileStamp, [u8; 32])>>,
}

/// What tells a replaced key file from the one read: a rotation writes a new file and
/// renames it into place (a new inode), or an operator writes one by hand (new mtime).
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    mtime_ns: i128,
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt as _;
        FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

impl OperatorKey {
    /// The operator key under `data_dir`, made (mode 0600) if there is none.
    pub fn open(data_dir: &Path) -> std::io::Result<OperatorKey> {
        let key = OperatorKey {
            path: data_dir.join(OPERATOR_KEY_FILE),
            cached: Mutex::new(None),
        };
        key.current()?;
        Ok(key)
    }

    /// The key now: the cached one while the file is the one it came from, else the file
    /// read again (made again if it was deleted).
    fn current(&self) -> std::io::Result<[u8; 32]> {
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some((stamp, key)), Ok(meta)) = (*cached, std::fs::metadata(&self.path)) {
            if stamp == FileStamp::of(&meta) {
                return Ok(key);
            }
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let key = load_or_create(dir, OPERATOR_KEY_FILE)?;
        let stamp = FileStamp::of(&std::fs::metadata(&self.path)?);
        *cached = Some((stamp, key));
        Ok(key)
    }

    /// A token valid for `valid` (at most [`MAX_VALID`]) from now, and when it expires.
    pub fn issue(&self, valid: Duration) -> std::io::Result<(String, SystemTime)> {
        let valid = valid.min(MAX_VALID);
        let expires = SystemTime::now() + valid;
        let secs = expires
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let key = self.current()?;
        Ok((
            format!("{secs}.{}", mac(&key, secs)),
            UNIX_EPOCH + Duration::from_secs(secs),
        ))
    }

    /// Whether `given` is a token of the current key that has not expired. A key file that
    /// cannot be read allows nothing.
    pub fn allows(&self, given: Option<&str>) -> bool {
        let Some((secs, tag)) = given.and_then(|g| g.split_once('.')) else {
            return false;
        };
        let Ok(secs) = secs.parse::<u64>() else {
            return false;
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if secs <= now {
            return false;
        }
        let Ok(key) = self.current() else {
            return false;
        };
        use subtle::ConstantTimeEq as _;
        bool::from(mac(&key, secs).as_bytes().ct_eq(tag.as_bytes()))
    }

    /// Replaces the key with a new one: every operator link made before stops working, in
    /// every process reading this directory, at their next request. Run links are not
    /// touched (they have their own key).
    pub fn rotate(data_dir: &Path) -> std::io::Result<()> {
        let (_, tmp) = write_new_key(data_dir, OPERATOR_KEY_FILE)?;
        // Atomic: a reader sees the old key or the new one, never half of one.
        let placed = std::fs::rename(&tmp, data_dir.join(OPERATOR_KEY_FILE));
        if placed.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        placed
    }
}

/// The MAC of an operator token expiring at `secs` (unix seconds): 128 bits, hex.
fn mac(key: &[u8; 32], secs: u64) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    mac.update(format!("operator:{secs}").as_bytes());
    hex::encode(&mac.finalize().into_bytes()[..16])
}

/// Reads the key `name` under `data_dir`, making it (mode 0600) the first time.
pub(crate) fn load_or_create(data_dir: &Path, name: &str) -> std::io::Result<[u8; 32]> {
    let path = data_dir.join(name);
    let read = |path: &Path| -> std::io::Result<Option<[u8; 32]>> {
        match std::fs::read(path) {
            Ok(bytes) => <[u8; 32]>::try_from(bytes.as_slice())
                .map(Some)
                .map_err(|_| {
                    std::io::Error::other(format!(
                        "{} is not a 32-byte key; delete it to make a new one (the links made with it stop working)",
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
    let (key, tmp) = write_new_key(data_dir, name)?;
    let written = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match written {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read(&path)?
            .ok_or_else(|| std::io::Error::other(format!("{} vanished", path.display()))),
        Err(e) => Err(e),
    }
}

/// A new random key written whole (mode 0600, synced) under a temporary name of this
/// process's own beside `name` in `data_dir`; the key and that file's path. The directory
/// holds the keys (and setup mode's credentials): it is made, if missing, for kodx's user
/// alone whatever the umask.
fn write_new_key(data_dir: &Path, name: &str) -> std::io::Result<([u8; 32], PathBuf)> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)?;
    let key: [u8; 32] = rand::random();
    let tmp = data_dir.join(format!(
        ".{name}.{}.{:016x}",
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
        f.sync_all()
    })();
    match written {
        Ok(()) => Ok((key, tmp)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_kept_private_in_a_private_directory() {
        let dir = tempfile::tempdir().unwrap();
        let key = load_or_create(dir.path(), "a.key").unwrap();
        assert_eq!(load_or_create(dir.path(), "a.key").unwrap(), key, "kept");
        assert_ne!(load_or_create(dir.path(), "b.key").unwrap(), key);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join("a.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A data directory kodx creates is its own alone, whatever the umask.
        let fresh = dir.path().join("new/data");
        load_or_create(&fresh, "a.key").unwrap();
        for d in [dir.path().join("new"), fresh] {
            let mode = std::fs::metadata(&d).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", d.display());
        }
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
                            load_or_create(dir, "run-pages.key").unwrap()
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
            assert_eq!(names, ["run-pages.key"], "only the key is left");
        }
    }

    #[test]
    fn operator_tokens_expire_and_end_with_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let key = OperatorKey::open(dir.path()).unwrap();
        let (token, expires) = key.issue(Duration::from_secs(3600)).unwrap();
        let left = expires.duration_since(SystemTime::now()).unwrap();
        assert!(left > Duration::from_secs(3590) && left <= Duration::from_secs(3600));
        assert!(key.allows(Some(&token)));
        // Checked whole: the tag, and the expiry it signs.
        let (secs, tag) = token.split_once('.').unwrap();
        let later = secs.parse::<u64>().unwrap() + 3600;
        for forged in [
            format!("{later}.{tag}"),
            format!("{secs}.{}", &tag[..tag.len() - 1]),
            format!("{secs}.{}", "0".repeat(32)),
            tag.to_string(),
            String::new(),
        ] {
            assert!(!key.allows(Some(&forged)), "{forged}");
        }
        assert!(!key.allows(None));
        // An expired token, correctly signed, is refused.
        let past = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            - 1;
        let k = key.current().unwrap();
        assert!(!key.allows(Some(&format!("{past}.{}", mac(&k, past)))));
        // No link lasts longer than MAX_VALID.
        let (_, far) = key.issue(Duration::from_secs(365 * 24 * 3600)).unwrap();
        assert!(far <= SystemTime::now() + MAX_VALID);

        // Another process rotates the key: this one refuses the old token at once and
        // allows the new key's.
        let other = OperatorKey::open(dir.path()).unwrap();
        assert!(other.allows(Some(&token)));
        OperatorKey::rotate(dir.path()).unwrap();
        assert!(!key.allows(Some(&token)));
        assert!(!other.allows(Some(&token)));
        let (fresh, _) = other.issue(DEFAULT_VALID).unwrap();
        assert!(key.allows(Some(&fresh)));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [OPERATOR_KEY_FILE], "no temporary file is left");
        // The run pages' key is another file, untouched by a rotation.
        assert!(!dir.path().join("run-pages.key").exists());
    }
}
