//! `setup_only` secrets (SPEC §12, "Egress by name"): the real `kodx serve`, the real Docker
//! engine, a secret stored sealed in the database under the deployment's key
//! (`KODX_SECRETS_KEY`). The setup script gets it, and leaves a daemon running with it; the
//! model then lists every variable of its shell and of every process in the sandbox: the
//! value is in none of it, nor in the transcript, any model request or the status comment,
//! while the setup's hash of it shows the setup had it. A secret the config names but
//! nobody set is named in the status comment, and the run goes on.

use base64::Engine as _;
use sha2::Digest as _;

use crate::common;
use crate::common::follow_up::config;
use crate::common::serve::{text, tool, usage, Options, Served, REPO};

const VALUE: &str = "pg-pass-Zq81-very-secret";

#[tokio::test]
async fn a_setup_only_secret_reaches_the_setup_script_and_nothing_else() {
    let _engine = common::require_engine!();
    let key = [5u8; 32];
    // Stored before the server starts, as `kodx secret set` would.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("kodx.db").display());
    let sealed = kodx::secrets::SecretsKey::from_bytes(key)
        .seal(REPO, "TEST_DB_PASSWORD", VALUE.as_bytes())
        .unwrap();
    let db = kodx::db::Db::open(&url).await.unwrap();
    db.put_secret(REPO, "TEST_DB_PASSWORD", &sealed)
        .await
        .unwrap();
    db.close().await;
    let mut s = Served::start(Options {
        workers: true,
        database_url: Some(url),
        extra_env: vec![(
            "KODX_SECRETS_KEY".into(),
            base64::engine::general_purpose::STANDARD.encode(key),
        )],
        ..Options::default()
    })
    .await;
    config(
        &s,
        "setup_script: |\n  printf %s \"$TEST_DB_PASSWORD\" | sha256sum > /tmp/setup-saw\n  nohup sleep 600 >/dev/null 2>&1 &\n  echo \"setup done\"\nsecrets:\n  - { name: TEST_DB_PASSWORD, setup_only: true }\n  - { name: NOT_SET, setup_only: true }\n",
    );
    s.model.reply(
        tool("env; for p in /proc/[0-9]*; do tr '\\000' '\\n' < $p/environ 2>/dev/null; done; cat /tmp/setup-saw"),
        "tool_use",
        usage(1000, 10),
    );
    s.model.reply(
        text("The environment is clean."),
        "end_turn",
        usage(1100, 10),
    );
    s.github
        .add_issue(REPO, 9, "Check the environment", "", "carol");
    let run = s
        .comment(9, "alice", "/kodx ask what is in the environment?")
        .await;
    let status = s.finished_status(9).await;
    assert!(status.contains("### ✅"), "{status}\n{}", s.log());

    // The setup had it: its hash is in what the model was shown.
    let hash = format!("{:x}", sha2::Sha256::digest(VALUE.as_bytes()));
    let requests: Vec<String> = s
        .model
        .requests()
        .iter()
        .map(|r| r.body.to_string())
        .collect();
    assert!(
        requests.iter().any(|r| r.contains(&hash)),
        "the setup's hash of the secret is in a request"
    );
    // Nothing else had it: not the shell's environment, not any process's.
    for (i, r) in requests.iter().enumerate() {
        assert!(!r.contains(VALUE), "the secret in model request {i}");
    }
    let transcript = s.records(&run.0, "tool_result").await;
    assert!(!transcript.is_empty());
    for r in &transcript {
        assert!(
            !r.to_string().contains(VALUE),
            "the secret in the transcript"
        );
    }
    assert!(!status.contains(VALUE));
    assert!(!s.log().contains(VALUE), "the secret in the server log");
    // The one nobody set is named, with what to do.
    assert!(
        status.contains("**Secrets the run did not get:**"),
        "{status}"
    );
    assert!(status.contains("- `NOT_SET`: not set"), "{status}");
    assert!(
        status.contains("kodx secret set acme/widgets NAME"),
        "{status}"
    );
    s.finish().await;
}
