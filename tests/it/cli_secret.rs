//! `kodx secret set|list|rm` (SPEC §12): the real binary on a real SQLite file (and on
//! PostgreSQL when `KODX_TEST_POSTGRES_URL` is set). A value goes in through standard input,
//! is stored sealed (its bytes are nowhere in the database file), is never printed, and a
//! process with another key is told so instead of storing a second key's secrets.

use std::io::Write as _;
use std::process::{Command, Stdio};

struct Out {
    stdout: String,
    stderr: String,
    code: Option<i32>,
}

fn kodx(dir: &std::path::Path, db: &str, env: &[(&str, &str)], args: &[&str], stdin: &[u8]) -> Out {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kodx"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KODX_DATA_DIR", dir)
        .env("DATABASE_URL", db)
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kodx runs");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    Out {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        code: out.status.code(),
    }
}

async fn databases(dir: &std::path::Path) -> Vec<String> {
    kodx::db::test_databases::each_backend(dir).await
}

#[tokio::test]
async fn secrets_are_stored_sealed_listed_by_name_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let value = "npm_VeryS3cretValue-4242";
    for db in databases(dir.path()).await {
        let data = tempfile::tempdir().unwrap();
        let d = data.path();
        let set = kodx(
            d,
            &db,
            &[],
            &["secret", "set", "Acme/Widgets", "NPM_TOKEN"],
            format!("{value}\n").as_bytes(),
        );
        assert_eq!(set.code, Some(0), "{}", set.stderr);
        assert!(
            set.stdout
                .starts_with("stored NPM_TOKEN for acme/widgets (24 bytes, sealed under key "),
            "{}",
            set.stdout
        );
        assert!(!set.stdout.contains(value) && !set.stderr.contains(value));
        let key = std::fs::read(d.join("secrets.key")).unwrap();
        assert_eq!(key.len(), 32);
        let other = kodx(
            d,
            &db,
            &[],
            &["secret", "set", "acme/widgets", "DB_PASSWORD"],
            b"pw\n",
        );
        assert_eq!(other.code, Some(0), "{}", other.stderr);

        // Listed by name, never by value.
        let list = kodx(d, &db, &[], &["secret", "list", "acme/widgets"], b"");
        assert_eq!(list.code, Some(0), "{}", list.stderr);
        let names: Vec<&str> = list
            .stdout
            .lines()
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(names, ["DB_PASSWORD", "NPM_TOKEN"]);
        assert!(!list.stdout.contains(value) && !list.stdout.contains("pw\n"));

        // The value's bytes are nowhere in a SQLite file.
        if let Some(path) = db.strip_prefix("sqlite://") {
            let file = path.split('?').next().unwrap();
            let bytes = std::fs::read(file).unwrap();
            assert!(
                !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
                "plaintext in the database"
            );
        }

        // Another key: told, and nothing stored under it.
        let wrong = base64_of(&[9u8; 32]);
        let refused = kodx(
            d,
            &db,
            &[("KODX_SECRETS_KEY", &wrong)],
            &["secret", "set", "acme/widgets", "OTHER"],
            b"x\n",
        );
        assert_eq!(refused.code, Some(1));
        assert!(
            refused
                .stderr
                .contains("this database's secrets are under key"),
            "{}",
            refused.stderr
        );
        let listed = kodx(
            d,
            &db,
            &[("KODX_SECRETS_KEY", &wrong)],
            &["secret", "list", "acme/widgets"],
            b"",
        );
        assert!(
            listed.stdout.contains("which this process does not have"),
            "{}",
            listed.stdout
        );
        // The same key given in the variable is the deployment's key.
        let same = kodx(
            d,
            &db,
            &[("KODX_SECRETS_KEY", &base64_of(&key))],
            &["secret", "set", "acme/widgets", "THIRD"],
            b"3\n",
        );
        assert_eq!(same.code, Some(0), "{}", same.stderr);

        // Bad input: a clear message, nothing stored.
        for (args, input, says) in [
            (
                ["secret", "set", "acme/widgets", "npm-token"],
                &b"x"[..],
                "a secret's name is letters",
            ),
            (
                ["secret", "set", "acme/widgets", "EMPTY"],
                &b"\n"[..],
                "the value is empty",
            ),
            (
                ["secret", "set", "not-a-repo", "X"],
                &b"x"[..],
                "OWNER/REPO",
            ),
        ] {
            let out = kodx(d, &db, &[], &args, input);
            assert_eq!(out.code, Some(1), "{args:?}");
            assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        }

        let rm = kodx(
            d,
            &db,
            &[],
            &["secret", "rm", "acme/widgets", "NPM_TOKEN"],
            b"",
        );
        assert_eq!(rm.code, Some(0), "{}", rm.stderr);
        let again = kodx(
            d,
            &db,
            &[],
            &["secret", "rm", "acme/widgets", "NPM_TOKEN"],
            b"",
        );
        assert_eq!(again.code, Some(1));
        assert!(
            again.stderr.contains("has no secret NPM_TOKEN"),
            "{}",
            again.stderr
        );
    }
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
