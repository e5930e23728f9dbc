//! The webhook endpoint of the real `kodx serve` (SPEC §3, §10): signatures, limits, status
//! codes, the durable queue and duplicate deliveries, `/healthz` and `/metrics`.

use crate::common;
use crate::common::serve::{
    delivery_id, issue_comment, sign, IssueComment, Options, Served, SECRET,
};
use serde_json::json;

async fn served() -> Served {
    Served::start(Options::default()).await
}

fn ask(s: &Served, comment_id: u64) -> serde_json::Value {
    issue_comment(&IssueComment {
        clone_url: &s.clone_url,
        comment_id,
        body: "/kodx ask why?",
        ..IssueComment::default()
    })
}

#[tokio::test]
async fn signatures_are_checked_before_anything_else() {
    let s = served().await;
    let body = ask(&s, 1).to_string().into_bytes();
    // Missing, malformed, wrong, sha1 only, signed with another secret: 401.
    let cases: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        ("malformed", Some("sha256=zz".into())),
        (
            "no prefix",
            Some(
                sign(SECRET, &body)
                    .trim_start_matches("sha256=")
                    .to_string(),
            ),
        ),
        ("wrong secret", Some(sign("another secret", &body))),
        (
            "sha1 only",
            Some("sha1=0123456789abcdef0123456789abcdef01234567".into()),
        ),
    ];
    for (what, sig) in cases {
        let (status, answer) = s
            .post_raw(
                "issue_comment",
                Some(&delivery_id()),
                sig.as_deref(),
                body.clone(),
            )
            .await;
        assert_eq!(status, 401, "{what}: {answer}");
        assert!(answer["error"].is_string(), "{what}: {answer}");
    }
    // The body is signed, not re-serialised JSON: one changed byte fails.
    let sig = sign(SECRET, &body);
    let mut changed = body.clone();
    let at = changed.len() - 2;
    changed[at] ^= 1;
    let (status, _) = s
        .post_raw("issue_comment", Some(&delivery_id()), Some(&sig), changed)
        .await;
    assert_eq!(status, 401);
    // Nothing was queued or sent to GitHub.
    let (_, metrics) = s.get("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "kodx_webhooks_total{event=\"issue_comment\",result=\"unauthorized\"} 6"),
        "{metrics}"
    );
    assert!(s.github.requests().is_empty());
}

#[tokio::test]
async fn status_codes_of_the_table() {
    let s = served().await;
    // Over 25 MiB: 413, whatever the signature.
    let big = vec![b' '; 25 * 1024 * 1024 + 1];
    let sig = sign(SECRET, &big);
    let (status, _) = s
        .post_raw("issue_comment", Some(&delivery_id()), Some(&sig), big)
        .await;
    assert_eq!(status, 413);
    // Signed but not JSON: 400 with a one-line reason.
    let body = b"{not json".to_vec();
    let (status, answer) = s
        .post_raw(
            "issue_comment",
            Some(&delivery_id()),
            Some(&sign(SECRET, &body)),
            body,
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(answer["error"], "the body is not valid JSON");
    // JSON missing fields this event needs: 400 naming the field.
    let (status, answer) = s
        .deliver(
            "issue_comment",
            &delivery_id(),
            &json!({"action": "created", "issue": {}}),
        )
        .await;
    assert_eq!(status, 400);
    let reason = answer["error"].as_str().unwrap();
    // One line saying why.
    insta::assert_snapshot!(reason, @"not a `issue_comment` payload kodx can read: missing field `number` at line 1 column 30");
    // No delivery id: 400.
    let body = ask(&s, 2).to_string().into_bytes();
    let (status, answer) = s
        .post_raw("issue_comment", None, Some(&sign(SECRET, &body)), body)
        .await;
    assert_eq!(status, 400, "{answer}");
    // Other events, ping, edits, no command, bot authors: 200 with the reason.
    let (status, answer) = s
        .deliver("release", &delivery_id(), &json!({"action": "published"}))
        .await;
    assert_eq!(status, 200, "{answer}");
    insta::assert_snapshot!(answer["ignored"].as_str().unwrap(), @"kodx does not act on `release` events");
    let (status, answer) = s
        .deliver(
            "ping",
            &delivery_id(),
            &json!({"zen": "Keep it logically awesome."}),
        )
        .await;
    assert_eq!((status, answer), (200, json!({"ignored": "ping"})));
    let mut edited = ask(&s, 3);
    edited["action"] = json!("edited");
    let (status, answer) = s.deliver("issue_comment", &delivery_id(), &edited).await;
    assert_eq!(status, 200, "{answer}");
    let plain = issue_comment(&IssueComment {
        clone_url: &s.clone_url,
        comment_id: 4,
        body: "no command here, `/kodx ask` in code",
        ..IssueComment::default()
    });
    let (status, answer) = s.deliver("issue_comment", &delivery_id(), &plain).await;
    assert_eq!(
        (status, answer),
        (200, json!({"ignored": "no /kodx command"}))
    );
    let bot = issue_comment(&IssueComment {
        clone_url: &s.clone_url,
        comment_id: 5,
        author: "kodx[bot]",
        user_type: "Bot",
        body: "/kodx ask loop?",
        ..IssueComment::default()
    });
    let (status, answer) = s.deliver("issue_comment", &delivery_id(), &bot).await;
    assert_eq!(status, 200);
    insta::assert_snapshot!(answer["ignored"].as_str().unwrap(), @"the comment was written by a bot");
}

#[tokio::test]
async fn a_command_is_queued_durably_once_per_delivery() {
    let s = served().await;
    let id = delivery_id();
    let (status, answer) = s.deliver("issue_comment", &id, &ask(&s, 10)).await;
    assert_eq!(status, 202, "{answer}");
    let run_id = answer["run_id"].as_str().unwrap().to_string();
    assert_eq!(run_id.len(), 12);
    // GitHub redelivers: answered 200, nothing new.
    let (status, answer) = s.deliver("issue_comment", &id, &ask(&s, 10)).await;
    assert_eq!(status, 200);
    insta::assert_snapshot!(answer["ignored"].as_str().unwrap(), @"duplicate delivery (this X-GitHub-Delivery was handled before)");
    // The run is in the SQLite file, written before the 202 (workers are off here).
    let db = kodx::db::Db::open(&format!(
        "sqlite://{}",
        s.dir.path().join("kodx.db").display()
    ))
    .await
    .unwrap();
    let run = db
        .get_run(&run_id)
        .await
        .unwrap()
        .expect("the run is stored");
    assert_eq!(
        run.request.job,
        kodx::job::Job::Ask {
            question: "why?".into()
        }
    );
    assert_eq!(run.request.author, "alice");
    assert_eq!(run.request.repo, "acme/widgets");
    assert_eq!(run.request.trigger, kodx::job::Trigger::IssueComment(10));
    assert_eq!(db.counts().await.unwrap().queued, 1);
    let (_, metrics) = s.get("/metrics").await;
    for line in [
        "kodx_webhooks_total{event=\"issue_comment\",result=\"queued\"} 1",
        "kodx_webhooks_total{event=\"issue_comment\",result=\"duplicate\"} 1",
        "kodx_runs_queued 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn concurrent_redeliveries_queue_one_run() {
    let s = served().await;
    let id = delivery_id();
    let body = ask(&s, 11);
    let answers =
        futures_util::future::join_all((0..16).map(|_| s.deliver("issue_comment", &id, &body)))
            .await;
    let queued = answers.iter().filter(|(st, _)| *st == 202).count();
    let dup = answers.iter().filter(|(st, _)| *st == 200).count();
    assert_eq!((queued, dup), (1, 15), "{answers:?}");
}

/// A signed body replayed under a new `X-GitHub-Delivery` (anyone who saw one delivery can
/// resend it) starts no second run: the comment is the trigger, and it is unique in the
/// queue.
#[tokio::test]
async fn a_replayed_body_under_a_new_delivery_id_starts_no_second_run() {
    let s = served().await;
    let body = ask(&s, 12);
    let (status, answer) = s.deliver("issue_comment", &delivery_id(), &body).await;
    assert_eq!(status, 202, "{answer}");
    let run_id = answer["run_id"].as_str().unwrap().to_string();
    let (status, answer) = s.deliver("issue_comment", &delivery_id(), &body).await;
    assert_eq!(status, 200, "{answer}");
    let reason = answer["ignored"].as_str().unwrap_or_default();
    common::serve::redactions(&[&run_id], &[]).bind(|| insta::assert_snapshot!(reason, @"duplicate command (this comment or issue already started run [run])"));
    // Several replays at once (one group-commit batch) queue nothing either, and a new
    // comment in the same batch is queued.
    let ids: Vec<String> = (0..8).map(|_| delivery_id()).collect();
    let replays =
        futures_util::future::join_all(ids.iter().map(|id| s.deliver("issue_comment", id, &body)));
    let (other, other_id) = (ask(&s, 13), delivery_id());
    let fresh = s.deliver("issue_comment", &other_id, &other);
    let (replays, (fresh_status, fresh_answer)) = tokio::join!(replays, fresh);
    assert!(replays.iter().all(|(st, _)| *st == 200), "{replays:?}");
    assert_eq!(fresh_status, 202, "{fresh_answer}");
    let db = kodx::db::Db::open(&format!(
        "sqlite://{}",
        s.dir.path().join("kodx.db").display()
    ))
    .await
    .unwrap();
    assert_eq!(db.counts().await.unwrap().queued, 2);
    let (_, metrics) = s.get("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "kodx_webhooks_total{event=\"issue_comment\",result=\"replayed\"} 9"),
        "{metrics}"
    );
}

#[tokio::test]
async fn installation_events_are_recorded() {
    let s = served().await;
    let payload = json!({
        "action": "created",
        "installation": {"id": 991, "account": {"login": "octo-org", "id": 1, "type": "Organization"}},
        "repositories": [], "sender": {"login": "octocat", "id": 1, "type": "User"}
    });
    let (status, answer) = s.deliver("installation", &delivery_id(), &payload).await;
    assert_eq!(status, 200, "{answer}");
    let db = kodx::db::Db::open(&format!(
        "sqlite://{}",
        s.dir.path().join("kodx.db").display()
    ))
    .await
    .unwrap();
    let inst = db.installation(991).await.unwrap().expect("recorded");
    assert_eq!(inst.account, "octo-org");
}

#[tokio::test]
async fn healthz_names_what_is_wrong_and_metrics_are_prometheus_text() {
    // A Docker host that does not answer: /healthz is 503 and says docker.
    let s = Served::start(Options {
        extra_env: vec![("DOCKER_HOST".into(), "tcp://127.0.0.1:9".into())],
        ..Options::default()
    })
    .await;
    // To anyone: the status alone, nothing of the engine's address or error.
    let (status, body) = s.get("/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        json!({"status": "unavailable"})
    );
    // With the operator's link: what is wrong.
    let (status, body) = s.get(&s.operator_health_path().await).await;
    assert_eq!(status, 503, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "unavailable");
    assert_eq!(v["database"], "ok");
    assert_ne!(v["docker"], "ok");
    let (status, _) = s
        .deliver("ping", &delivery_id(), &json!({"zen": "z"}))
        .await;
    assert_eq!(status, 200);
    let (status, text) = s.get("/metrics").await;
    assert_eq!(status, 200);
    // Families with labels appear once they have a value (runs and model latency after
    // the first run: tests/it/serve_ask.rs).
    for name in [
        "# TYPE kodx_webhooks counter",
        "kodx_webhooks_total{event=\"ping\",result=\"ignored\"} 1",
        "# TYPE kodx_runs_active gauge",
        "# TYPE kodx_runs_queued gauge",
        "# TYPE kodx_spend_usd counter",
        "# TYPE kodx_run_duration_seconds histogram",
    ] {
        assert!(text.lines().any(|l| l == name), "missing {name} in\n{text}");
    }
}

#[tokio::test]
async fn healthz_is_ok_with_database_and_docker() {
    let _engine = common::require_engine!();
    let s = served().await;
    let (status, body) = s.get("/healthz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, r#"{"status":"ok"}"#);
    // The details, for the operator's token as a bearer token.
    let token = s.operator_health_path().await;
    let token = token.split("token=").nth(1).unwrap();
    let resp = reqwest::Client::new()
        .get(format!("{}/healthz", s.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&health["database"], &health["docker"]),
        (&json!("ok"), &json!("ok"))
    );
    // Without an `[[engines]]` list: the one engine DOCKER_HOST names, called `local`.
    let engines = health["engines"].as_array().expect("engines");
    assert_eq!(engines.len(), 1, "{body}");
    assert_eq!(engines[0]["name"], "local");
    assert_eq!(engines[0]["up"], true);
    assert_eq!(engines[0]["runs"], 0);
    assert!(engines[0].get("error").is_none(), "{body}");
}

#[tokio::test]
async fn sigterm_stops_the_server_cleanly() {
    let s = served().await;
    let status = s.stop().await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn bad_configuration_is_one_clear_line() {
    // Half an App (no App at all starts setup mode instead: tests/it/serve_setup.rs).
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kodx"))
        .arg("serve")
        .env("APP_ID", "1")
        .env_remove("PRIVATE_KEY")
        .env_remove("PRIVATE_KEY_PATH")
        .env_remove("WEBHOOK_SECRET")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(err, @"kodx serve: kodx serve needs PRIVATE_KEY or PRIVATE_KEY_PATH (the App's private key, downloaded from its settings), and WEBHOOK_SECRET (the secret set in the App's webhook settings) (or none of the App's variables, to set the App up in the browser)"));
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kodx"))
        .arg("serve")
        .env("APP_ID", "1")
        .env("PRIVATE_KEY", "not a key")
        .env("WEBHOOK_SECRET", "x")
        .env("PORT", "0")
        .env("HOST", "127.0.0.1")
        .env(
            "DATABASE_URL",
            format!("sqlite://{}/kodx.db", dir.path().display()),
        )
        .env("KODX_CONFIG", dir.path().join("missing.toml"))
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(err, @"kodx serve: KODX_CONFIG: cannot read [tmp] No such file or directory (os error 2)"));
}
