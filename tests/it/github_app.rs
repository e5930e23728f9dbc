//! The GitHub App client against the fake GitHub on loopback: real JWT verification, the
//! token cache, every REST call kodx makes, pagination, retries, rate limits, Enterprise
//! base URLs. Every test ends with `assert_clean`: the fake refused nothing as malformed,
//! every request identified itself, and no token ever travelled in a body or URL.

use crate::common;
use crate::common::fake_github;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_github::{
    FakeBase, FakeGitHub, FakeHead, FakePull, FakeThread, FakeThreadState, TEST_APP_KEY,
};
use kodx::github::{
    GitHubApp, GitHubError, NewPull, Permission, PullRef, Reaction, ReactionTarget, RepoName,
    RequestPolicy, TokenScope, TOKEN_REFRESH_MARGIN,
};
use secrecy::ExposeSecret;

const APP_ID: u64 = 4242;
const INST: u64 = 77;
const REPO: &str = "acme/widgets";

/// The test App key in PKCS#8 (`BEGIN PRIVATE KEY`), the other format a key may come in.
const TEST_APP_KEY_PKCS8: &str = "-----BEGIN PRIVATE KEY-----\n\
MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQCP/LXG1C5h2WuM\n\
X8ZoBrb1YJdemzYYKok6pFIVirXOgL8ibYI7VAi4kxRmlRGYXQUbzMkp1Gjt/Oar\n\
bh+GtgDBDRzbmbn9P/7SqzXbU8eOcvs9qUodyTkcjGGC/PA88FRyXgW/GpN5Cr0h\n\
+bp8BxvyCjdxofhDJFQPUBitK8/5uSkV4IoLQwSLNDkwpM2LGKDpNfTh6eFCFP7t\n\
2evBtpJVlZAK2MeeszIm5C8kt8mVJIPww6wSS+p8PWouW/Zk/J4pOF3CNmKnJ5cv\n\
n6o83MUUMTIW5LhJPA6qerYavAMzV+N3CT00iRKOz8GzFO8U1PSsZSiNkztRhItI\n\
swvUmzQhAgMBAAECggEAIPvKFT2yUVJpt1qSO+671xp1GmQyQFdwH6mYLxybGK63\n\
+hY9ZMNTixqQLA6eXPmEC9H9y/H/RnMuURt1J9oF8rNDBtAggbG4+T/korU+q7RN\n\
ttqSop+fkFldFhFEpCUGpztAFD6thScPW9rV3AcR4QBzonlwwkquYeKegH7ekcz/\n\
cdYc3I4NUXzzot0I2yFFPA0Bum0YomFfWokiNE313kGdBAoCAlI6NMASI/8kzW9+\n\
cOtnnvlxb2eTOhai2DiGeQZ68DLRZsPtQG6uKbZJp3PRYMMFh0MPf6DezSjE7X1u\n\
gIMGo/ufSOBSg2mzU2q1h/X+w/mtoCRoB2zODwVsRQKBgQDDQH4zOZ9Ubyh0SZ9C\n\
HJkwuicALH8dAaxAm5ni+/ylrPot2gBlOxPI3U36ZYYNvjutVkoXleTNmKWZEpyV\n\
fm83MaM9tgSHeP/9g/DmTHuXh1CvczeqVgoOL/0OlbVOmS9bMY4usSHT3hPx3Q0X\n\
LzawqZA9+w8ZiCp52i1cCyC25QKBgQC8yQ8HAfMefemNRdq6J/JRFoU/DqmfyBsg\n\
YaGkHUyVPcENKoOkiq06MsDgb3zRYRl7UgKUq9uefPbgTahIUWy/jnpd3xq8aZjj\n\
7lUOedIp5I0cbErQ9ULpxkkktkAWvL4WqYrYKvmLL7pVn5aCsrIRghZc6XL2hiLJ\n\
SoclGJ0YjQKBgEdMuckC9cfjf6ZXbCy8PMSqdat+lDyHa9t79soIss3dSM6NmS9e\n\
T28+QUd642UJXsmBhTTvq8nYQECRp1SAAyTon2/dk/HUocZ18/ZlX4yKAVDQhjdR\n\
jAJ6S7KTwM2e6sgmZIFwdaXkpuvfiPQ6bYI9qUq4716ndrtgjMfb2GpxAoGARLJF\n\
LZ+gAHCBFE9fEG6I1skDI7cKMoJ2nInqb/XZcFVQcqIN1UpBTvQ5C3KGUQqsYxus\n\
pL0E5d9DVsvreKVolSwbix0sdXNXl1mayfG6cFQipT0i3HbjKn5lD17iY2O7KDP5\n\
uj+pHuT3QUEZW+X6tjRIPvcURnD5J5ZfJziVseECgYEAmSdrg8ZNfX2aIyxf4Jm9\n\
6sFH+/BAo8w7KWkBCLS1Y7/Tf97VM8Nwwb+Q/92sDMrep4LtpBf/w+wj5ESbB9I9\n\
Ay+aH9uzmPmGlYJsb3sX2sjJ/DLbVxz4Er71nCuxRBzPBdYlIFnxBzOMyw3OsN2R\n\
iqEtg7rLcbQskW7RYAvfiUU=\n\
-----END PRIVATE KEY-----";

/// A key that is not the App's.
const OTHER_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----\n\
MIIEpQIBAAKCAQEAxGtd03lPGiy4GodVrI5wVeIEM6wsT2dJsW2tGTBI1g7yoI41\n\
ShJQM5yJpzu30kQ3b2cmMqp8PAcAalLILK9ms99yCzfLSimBot/iNXs9JOea0cnn\n\
ZJVcDAvSImvoK4nfvld7dJqBjpj0doysTztem+xnvOnGD06KYYZSFnP16WCNy9U8\n\
iaVOfKXnaJoNwc0WTj9mV/nzAVmbDXIXyKWM99idTIA+mBk7x0i0BrPg0MIenC9W\n\
ox+6KNXEAgl9JHi8e+33DUyIXxJrNTLeLvgh1yB9tjweg5UaPZIouvj19RjqxDSU\n\
yNhu2k4o4nyP8PHbLj5kLPcQJBsZlMBl99dFeQIDAQABAoIBAAgJk7COX3oE9/Cf\n\
9pXFy1t8UOszYanLInUX9ZQZCXX27R88SnpyNuVxw6E7/JjmUTVmDWZX2xcSu0Xe\n\
htHrSILWQyKp4Q/zFFqvmiBRn24l6wwoHKedRAO7LRla/Ihhjy4JAuSB2QjWgfRi\n\
678fQQ8U1Kbikwf30QpOFohULO0kg7XA7+PBLq/67cxNeVMKvfCJBWL1yY+/umLO\n\
+mOMgxcwojV+Z96oqHy9togVOpIkhU928ayXVbRGaXBfngwDgIr1eDwcCK8qKww+\n\
9qds9IGA3TvHhFO2L/zC52T7e2oCm96SxO+BvNVXktUfL2/PfDiCDiZEF6Jjci+l\n\
lXwJo30CgYEA5QePacdYXx1mf9zqPA+aNjfWdKMTXWLiXz4apNL6ze7bhbaHgBey\n\
eQBqwqOF2MlhTI95v+a3xy0HXPuFJOE6AmOB93L36HgYlKBs3JHbQ838rMzMc7WZ\n\
S9VAIsE9JG3ZgYhd3/DWEKvuN0+CdIasApBoN5R4WeiF+CLrjonBmjUCgYEA24y5\n\
jg6jSMFAC89v/fC3/wOVjirfbEHp2CuFcSSwxVDxsb3c7jm16DsL7btP8+YmPINL\n\
Tf32Xwiuqlhkd/2aLBovytqGkeX82Uk9V0adk/BVK4+0Jk7gjqs/j5F0kUK0hzb0\n\
/YKgp+qbZgplU7aNiJ8ljt1xGC01SBjcWLH4BrUCgYEAzbBOgmd/3FxhM7BJxYsV\n\
ql/XgIT83T/zoin6b9DzYoOEL8BQTR/7L2TKfOezS5EAi2vHoispHf44wK87UnXc\n\
TUzk6kEcmHFTUhgJ7MYpr+mNZfvAGqMbe9mXch8uNEtbrlO0S2zWM77VgGMt/Ez+\n\
qobash/rPoPv3XwvJaJed4kCgYEA1Qz5n6YKw/ZsXUmehxHKq5hh0AVArMBF2bVa\n\
GBKfy8qh0HbLZw3vvX1XNQp5KtijMEPEltmk9FHrlXiTfnFF5BhBWpu2zOwe8wiE\n\
kyX+kmo9bDlWe3o9pZT+6CYhtTjDERe+pCfYGTqsNFhQPe0/6V1ux/WR4wEz3FPr\n\
t9J0OqUCgYEAjzODbiyiDwjuMvw1bRVtD3F5ng6RKMEPT62S6c6JOC06e59/9H2B\n\
lUa97vYlRY2MrapNxQHdh2AQCTx8Fyy1AWHo2iDvMB7oIuVI40ZoAyOa62He6Rom\n\
qdrQ6PBErI398Pzz1vRW8CaOoarQGGCNstXKZsTEyKh9gHXsT5AXxMo=\n\
-----END RSA PRIVATE KEY-----";

async fn setup() -> (FakeGitHub, GitHubApp, RepoName) {
    setup_with_prefix("").await
}

async fn setup_with_prefix(prefix: &str) -> (FakeGitHub, GitHubApp, RepoName) {
    let fake = FakeGitHub::start_with_prefix(APP_ID, prefix).await;
    fake.add_installation(INST, "acme");
    fake.add_repo(
        INST,
        REPO,
        "main",
        "https://github.com/acme/widgets.git",
        false,
    );
    let app = GitHubApp::new(&fake.url(), APP_ID, TEST_APP_KEY).unwrap();
    (fake, app, RepoName::parse(REPO).unwrap())
}

/// What every test ends with: nothing refused as malformed, every request sent kodx's
/// headers, and no issued token anywhere but in an `Authorization` header.
fn assert_clean(fake: &FakeGitHub) {
    assert_eq!(
        fake.refused(),
        Vec::<String>::new(),
        "the fake refused requests"
    );
    let tokens = fake.issued_tokens();
    for r in fake.requests() {
        let agents: Vec<_> = r
            .headers
            .get_all("user-agent")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        assert!(
            agents.iter().any(|a| a == "kodx"),
            "{} {}: {agents:?}",
            r.method,
            r.path
        );
        assert_eq!(
            r.headers
                .get("x-github-api-version")
                .map(|v| v.to_str().unwrap()),
            Some("2022-11-28"),
            "{} {}",
            r.method,
            r.path
        );
        let accept: Vec<_> = r.headers.get_all("accept").iter().collect();
        assert_eq!(
            accept.len(),
            1,
            "{} {}: one Accept: {accept:?}",
            r.method,
            r.path
        );
        for t in &tokens {
            assert!(
                !r.body.contains(t.as_str()),
                "token in a body: {} {}",
                r.method,
                r.path
            );
            assert!(
                !r.path.contains(t.as_str())
                    && !r.query.clone().unwrap_or_default().contains(t.as_str())
            );
        }
    }
}

fn paths(fake: &FakeGitHub, method: &str, prefix: &str) -> Vec<String> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method == method && r.path.starts_with(prefix))
        .map(|r| match r.query {
            Some(q) => format!("{}?{q}", r.path),
            None => r.path,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The App: JWT, app info
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn app_jwt_is_accepted_by_real_verification() {
    let (fake, app, _) = setup().await;
    let info = app.app_info().await.unwrap();
    assert_eq!(info.id, APP_ID);
    assert_eq!(info.slug, "kodx");
    assert_eq!(info.bot_login(), "kodx[bot]");
    let req = &fake.requests()[0];
    assert_eq!((req.method.as_str(), req.path.as_str()), ("GET", "/app"));
    let auth = req.authorization.clone().unwrap();
    assert!(auth.starts_with("Bearer ey"), "{auth}");
    assert_eq!(
        req.headers.get("accept").unwrap(),
        "application/vnd.github+json"
    );
    assert!(fake.unauthorized().is_empty());
    assert_clean(&fake);
}

#[tokio::test]
async fn both_key_formats_and_probot_literal_newlines_are_accepted() {
    let (fake, _, _) = setup().await;
    let one_line = TEST_APP_KEY.trim().replace('\n', "\\n");
    for key in [TEST_APP_KEY_PKCS8, one_line.as_str()] {
        let app = GitHubApp::new(&fake.url(), APP_ID, key).unwrap();
        assert_eq!(app.app_info().await.unwrap().id, APP_ID);
    }
    assert!(fake.unauthorized().is_empty(), "{:?}", fake.unauthorized());
    assert_clean(&fake);
}

#[tokio::test]
async fn jwt_signed_with_another_key_or_for_another_app_is_refused() {
    let (fake, _, _) = setup().await;
    let impostor = GitHubApp::new(&fake.url(), APP_ID, OTHER_KEY).unwrap();
    let err = impostor.app_info().await.unwrap_err();
    assert!(matches!(err, GitHubError::Unauthorized { .. }), "{err}");
    let err = impostor.installation(INST).await.unwrap_err();
    assert!(matches!(err, GitHubError::Unauthorized { .. }), "{err}");
    let wrong_app = GitHubApp::new(&fake.url(), APP_ID + 1, TEST_APP_KEY).unwrap();
    let err = wrong_app.app_info().await.unwrap_err();
    assert!(matches!(err, GitHubError::Unauthorized { .. }), "{err}");
    let why = fake.unauthorized();
    assert_eq!(why.len(), 3, "{why:?}");
    insta::assert_snapshot!(why.join("\n"), @r#"
    GET /app: JWT rejected: InvalidSignature
    POST /app/installations/77/access_tokens: JWT rejected: InvalidSignature
    GET /app: iss "4243" is not the App id
    "#);
    assert!(fake.issued_tokens().is_empty());
    assert_clean(&fake);
}

// ---------------------------------------------------------------------------------------
// Installation tokens: cache, refresh, concurrency
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn token_is_minted_once_and_reused() {
    let (fake, app, repo) = setup().await;
    fake.add_issue(REPO, 1, "Bug", "It breaks", "alice");
    let a = app.installation(INST).await.unwrap();
    a.issue(&repo, 1).await.unwrap();
    let b = app.installation(INST).await.unwrap();
    b.issue(&repo, 1).await.unwrap();
    let issued = fake.issued_tokens();
    assert_eq!(issued.len(), 1);
    assert_eq!(a.token().expose_secret(), issued[0]);
    assert_eq!(b.token().expose_secret(), issued[0]);
    assert!(a.valid_for(Duration::from_secs(50 * 60)));
    assert_eq!(
        paths(&fake, "POST", "/app/installations"),
        vec![format!("/app/installations/{INST}/access_tokens")]
    );
    for r in fake
        .requests()
        .iter()
        .filter(|r| r.path.starts_with("/repos/"))
    {
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("Bearer {}", issued[0]).as_str())
        );
    }
    assert_clean(&fake);
}

#[tokio::test]
async fn token_is_refreshed_when_near_expiry() {
    let (fake, app, repo) = setup().await;
    fake.add_issue(REPO, 1, "Bug", "", "alice");
    // Good for three seconds beyond the refresh margin.
    fake.set_token_lifetime(TOKEN_REFRESH_MARGIN + Duration::from_secs(3));
    let first = app.installation(INST).await.unwrap();
    let again = app.installation(INST).await.unwrap();
    assert_eq!(
        first.token().expose_secret(),
        again.token().expose_secret(),
        "still outside the margin: reused"
    );
    // The App's clock, not the test, moves past the three seconds.
    app.clock().advance(Duration::from_millis(3500));
    let fresh = app.installation(INST).await.unwrap();
    assert_ne!(
        first.token().expose_secret(),
        fresh.token().expose_secret(),
        "inside the margin: minted anew"
    );
    assert_eq!(fake.issued_tokens().len(), 2);
    fresh.issue(&repo, 1).await.unwrap();
    assert_clean(&fake);
}

#[tokio::test]
async fn concurrent_callers_share_one_mint() {
    let (fake, app, _) = setup().await;
    fake.add_installation(INST + 1, "other");
    // Slow the mint down so the callers really overlap.
    fake.fail_next("/app/installations/77/", 502, 1);
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { app.installation(INST).await.unwrap() })
        })
        .collect();
    let other = tokio::spawn({
        let app = app.clone();
        async move { app.installation(INST + 1).await.unwrap() }
    });
    let mut tokens = Vec::new();
    for c in calls {
        tokens.push(c.await.unwrap().token().expose_secret().to_string());
    }
    let other = other.await.unwrap();
    assert!(tokens.iter().all(|t| *t == tokens[0]));
    assert_ne!(other.token().expose_secret(), tokens[0]);
    assert_eq!(fake.issued_tokens().len(), 2, "one per installation");
    assert_clean(&fake);
}

#[tokio::test]
async fn unknown_installation_is_not_found() {
    let (fake, app, _) = setup().await;
    let err = app.installation(999).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_clean(&fake);
}

#[tokio::test]
async fn revoked_token_is_unauthorized_and_forgetting_it_mints_anew() {
    let (fake, app, repo) = setup().await;
    fake.add_issue(REPO, 1, "Bug", "", "alice");
    let inst = app.installation(INST).await.unwrap();
    fake.revoke_tokens();
    let err = inst.issue(&repo, 1).await.unwrap_err();
    match &err {
        GitHubError::Unauthorized { message, .. } => assert_eq!(message, "Bad credentials"),
        other => panic!("{other}"),
    }
    assert!(!err.to_string().contains(inst.token().expose_secret()));
    app.forget_installation(INST).await;
    let inst = app.installation(INST).await.unwrap();
    assert_eq!(inst.issue(&repo, 1).await.unwrap().title, "Bug");
    assert_eq!(fake.issued_tokens().len(), 2);
    assert_clean(&fake);
}

#[tokio::test]
async fn tokens_never_show_in_debug_or_errors() {
    let (fake, app, _) = setup().await;
    let inst = app.installation(INST).await.unwrap();
    let token = inst.token().expose_secret().to_string();
    assert!(token.starts_with("ghs_"));
    // A `secrecy::SecretString`: its Debug redacts, and it has no Display at all.
    let shown = format!("{:?}", inst.token());
    insta::assert_snapshot!(shown, @"SecretBox<str>([REDACTED])");
    assert!(!format!("{inst:?}").contains(&token));
    assert!(!format!("{app:?}").contains(&token));
    let other: RepoName = "acme/secret".parse().unwrap();
    let err = inst.issue(&other, 1).await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains(&token));
    assert_clean(&fake);
}

#[tokio::test]
async fn repository_of_another_installation_is_not_found() {
    let (fake, app, _) = setup().await;
    fake.add_installation(INST + 1, "globex");
    fake.add_repo(
        INST + 1,
        "globex/app",
        "main",
        "https://github.com/globex/app.git",
        true,
    );
    fake.add_issue("globex/app", 1, "Theirs", "", "bob");
    let inst = app.installation(INST).await.unwrap();
    let err = inst
        .issue(&"globex/app".parse().unwrap(), 1)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_clean(&fake);
}

// ---------------------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn permission_levels() {
    let (fake, app, repo) = setup().await;
    let cases = [
        ("ada", "admin", Permission::Admin),
        ("max", "maintain", Permission::Maintain),
        ("wes", "write", Permission::Write),
        ("tri", "triage", Permission::Triage),
        ("rea", "read", Permission::Read),
        ("nob", "none", Permission::None),
        ("dependabot[bot]", "write", Permission::Write),
    ];
    for (user, role, _) in cases {
        fake.set_permission(REPO, user, role);
    }
    let inst = app.installation(INST).await.unwrap();
    for (user, _, want) in cases {
        assert_eq!(inst.permission(&repo, user).await.unwrap(), want, "{user}");
    }
    assert_eq!(
        inst.permission(&repo, "stranger").await.unwrap(),
        Permission::None,
        "404 means no permission"
    );
    insta::assert_snapshot!(paths(&fake, "GET", "/repos/acme/widgets/collaborators/").join("\n"), @"
    /repos/acme/widgets/collaborators/ada/permission
    /repos/acme/widgets/collaborators/max/permission
    /repos/acme/widgets/collaborators/wes/permission
    /repos/acme/widgets/collaborators/tri/permission
    /repos/acme/widgets/collaborators/rea/permission
    /repos/acme/widgets/collaborators/nob/permission
    /repos/acme/widgets/collaborators/dependabot%5Bbot%5D/permission
    /repos/acme/widgets/collaborators/stranger/permission
    ");
    assert_clean(&fake);
}

#[tokio::test]
async fn file_on_default_branch() {
    let (fake, app, repo) = setup().await;
    let config = "image: python:3.12\nsetup_script: |\n  pip install -r requirements.txt\n\
                  # a long line so the base64 wraps several times — ünïcödé ✓\n"
        .repeat(3);
    fake.set_file(REPO, ".github/kodx.yml", &config);
    fake.set_file(REPO, ".github/workflows/ci.yml", "on: push\n");
    fake.set_file(REPO, "empty.txt", "");
    fake.set_file_bytes(REPO, "logo.png", &[0x89, b'P', b'N', b'G', 0xff, 0xfe]);
    let inst = app.installation(INST).await.unwrap();
    assert_eq!(
        inst.file_at(&repo, ".github/kodx.yml", None)
            .await
            .unwrap()
            .as_deref(),
        Some(config.as_str())
    );
    assert_eq!(
        inst.file_at(&repo, "empty.txt", None)
            .await
            .unwrap()
            .as_deref(),
        Some("")
    );
    assert_eq!(inst.file_at(&repo, "nope.yml", None).await.unwrap(), None);
    let err = inst
        .file_at(&repo, ".github/workflows", None)
        .await
        .unwrap_err();
    insta::assert_snapshot!(err, @"GET /repos/acme/widgets/contents/.github/workflows: unexpected answer from GitHub: this path is a directory, not a file");
    let err = inst.file_at(&repo, "logo.png", None).await.unwrap_err();
    insta::assert_snapshot!(err, @"GET /repos/acme/widgets/contents/logo.png: unexpected answer from GitHub: the file is not UTF-8 text");
    assert_clean(&fake);
}

#[tokio::test]
async fn issue_and_pull_request_as_issue() {
    let (fake, app, repo) = setup().await;
    fake.add_issue(REPO, 3, "Add --json", "", "alice");
    fake.add_pull(
        REPO,
        4,
        "Fix it",
        "Closes #3",
        "bob",
        FakeHead {
            ref_name: "fix".into(),
            sha: "a".repeat(40),
            repo: Some(REPO.into()),
            clone_url: "https://github.com/acme/widgets.git".into(),
        },
        FakeBase {
            ref_name: "main".into(),
            sha: "b".repeat(40),
        },
        "diff --git a/x b/x\n",
    );
    let inst = app.installation(INST).await.unwrap();
    let issue = inst.issue(&repo, 3).await.unwrap();
    assert_eq!(
        (
            issue.number,
            issue.title.as_str(),
            issue.body.as_str(),
            issue.author.as_str()
        ),
        (3, "Add --json", "", "alice")
    );
    assert!(!issue.is_pull_request);
    assert_eq!(issue.state, "open");
    let pr = inst.issue(&repo, 4).await.unwrap();
    assert!(pr.is_pull_request);
    assert_eq!(pr.body, "Closes #3");
    assert!(inst.issue(&repo, 5).await.unwrap_err().is_not_found());
    assert_clean(&fake);
}

#[tokio::test]
async fn pull_requests_head_base_fork_and_diff_cut() {
    let (fake, app, repo) = setup().await;
    let head = |repo: Option<&str>| FakeHead {
        ref_name: "feature".into(),
        sha: "1".repeat(40),
        repo: repo.map(str::to_string),
        clone_url: format!("https://github.com/{}.git", repo.unwrap_or("ghost/gone")),
    };
    let base = FakeBase {
        ref_name: "main".into(),
        sha: "2".repeat(40),
    };
    let diff = "diff --git a/é.txt b/é.txt\n+ünïcödé\n".repeat(50);
    fake.add_pull(
        REPO,
        10,
        "Same repo",
        "",
        "alice",
        head(Some(REPO)),
        base.clone(),
        &diff,
    );
    fake.add_pull(
        REPO,
        11,
        "From a fork",
        "b",
        "eve",
        head(Some("eve/widgets")),
        base.clone(),
        "",
    );
    fake.add_pull(REPO, 12, "Deleted fork", "c", "mal", head(None), base, "");
    let inst = app.installation(INST).await.unwrap();

    let pr = inst.pull_request(&repo, 10).await.unwrap();
    assert_eq!(pr.title, "Same repo");
    assert_eq!(pr.body, "");
    assert_eq!(pr.author, "alice");
    assert_eq!(
        (pr.head.ref_name.as_str(), pr.head.sha.as_str()),
        ("feature", "1".repeat(40).as_str())
    );
    let head_repo = pr.head.repo.clone().unwrap();
    assert_eq!(head_repo.name, repo);
    assert_eq!(head_repo.clone_url, "https://github.com/acme/widgets.git");
    assert_eq!(
        (pr.base.ref_name.as_str(), pr.base.sha.as_str()),
        ("main", "2".repeat(40).as_str())
    );
    assert_eq!(pr.base.repo.name, repo);
    assert!(!pr.is_fork);

    let fork = inst.pull_request(&repo, 11).await.unwrap();
    assert!(fork.is_fork);
    assert_eq!(fork.head.repo.unwrap().name.to_string(), "eve/widgets");
    let gone = inst.pull_request(&repo, 12).await.unwrap();
    assert!(gone.is_fork);
    assert_eq!(gone.head.repo, None);
    assert!(inst
        .pull_request(&repo, 13)
        .await
        .unwrap_err()
        .is_not_found());

    assert_eq!(
        inst.pull_request_diff(&repo, 10, 1 << 20).await.unwrap(),
        diff
    );
    // The first line is 29 bytes; byte 31 falls inside the two-byte "ü" after the "+".
    let cut = inst.pull_request_diff(&repo, 10, 31).await.unwrap();
    assert_eq!(
        cut,
        format!(
            "{}\n[diff cut: 30 of {} bytes shown]\n",
            &diff[..30],
            diff.len()
        )
    );
    let diff_req = fake
        .requests()
        .into_iter()
        .rfind(|r| r.path == "/repos/acme/widgets/pulls/10")
        .unwrap();
    assert_eq!(
        diff_req.headers.get("accept").unwrap(),
        "application/vnd.github.diff"
    );
    assert_clean(&fake);
}

// ---------------------------------------------------------------------------------------
// Comments and reactions
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn comments_create_update_and_list_with_pagination() {
    let (fake, app, repo) = setup().await;
    fake.add_issue(REPO, 7, "Long thread", "body", "alice");
    for i in 0..250 {
        let bot = i % 50 == 0;
        let author = if bot { "other-bot[bot]" } else { "alice" };
        fake.add_comment(REPO, 7, author, &format!("comment {i}"), bot);
    }
    let inst = app.installation(INST).await.unwrap();

    let last = inst.issue_comments(&repo, 7, 10).await.unwrap();
    let bodies: Vec<_> = last.iter().map(|c| c.body.as_str()).collect();
    let want: Vec<_> = (240..250).map(|i| format!("comment {i}")).collect();
    assert_eq!(bodies, want, "the ten most recent, oldest first");
    assert_eq!(
        paths(&fake, "GET", "/repos/acme/widgets/issues/7/comments"),
        vec![
            "/repos/acme/widgets/issues/7/comments?per_page=100&page=1",
            "/repos/acme/widgets/issues/7/comments?per_page=100&page=3",
        ],
        "first page for the Link header, then the last page only"
    );
    let c = &last[0];
    assert_eq!((c.author.as_str(), c.author_is_bot), ("alice", false));
    assert!(c.created_at.ends_with('Z'), "{}", c.created_at);
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(c.html_url, @"http://127.0.0.1:[port]/acme/widgets/issues/7#issuecomment-[hex]"));

    let many = inst.issue_comments(&repo, 7, 120).await.unwrap();
    assert_eq!(many.len(), 120);
    assert_eq!(many[0].body, "comment 130");
    assert!(many[120 - 100].author_is_bot, "comment 150 is a bot's");
    assert_eq!(
        inst.issue_comments(&repo, 7, 1000).await.unwrap().len(),
        250
    );
    assert!(inst.issue_comments(&repo, 7, 0).await.unwrap().is_empty());

    let posted = inst
        .create_comment(&repo, 7, "<!-- kodx:{\"run\":\"r1\"} -->\n⏳ queued")
        .await
        .unwrap();
    assert!(posted
        .html_url
        .ends_with(&format!("#issuecomment-{}", posted.id)));
    inst.update_comment(&repo, posted.id, "<!-- kodx:{\"run\":\"r1\"} -->\n✅ done")
        .await
        .unwrap();
    let stored = fake.comments(REPO, 7);
    assert_eq!(stored.len(), 251);
    let mine = stored.last().unwrap();
    assert_eq!(
        (mine.id, mine.user.as_str(), mine.is_bot),
        (posted.id, "kodx[bot]", true)
    );
    assert!(mine.body.ends_with("✅ done"));
    assert_eq!(mine.edits.len(), 1);

    // After a restart: find the status comment by its metadata (it is on page 3).
    let found = inst
        .find_comment(&repo, 7, |c| {
            c.author_is_bot && c.body.contains("\"run\":\"r1\"")
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.id, posted.id);
    assert_eq!(found.author, "kodx[bot]");
    assert!(inst
        .find_comment(&repo, 7, |c| c.body == "nowhere")
        .await
        .unwrap()
        .is_none());

    let newest = inst.issue_comments(&repo, 7, 1).await.unwrap();
    assert_eq!(newest[0].id, posted.id);
    assert!(inst
        .update_comment(&repo, 1, "x")
        .await
        .unwrap_err()
        .is_not_found());
    assert_clean(&fake);
}

#[tokio::test]
async fn a_short_thread_is_one_request() {
    let (fake, app, repo) = setup().await;
    fake.add_issue(REPO, 2, "Short", "", "alice");
    fake.add_comment(REPO, 2, "alice", "/kodx ask why?", false);
    let inst = app.installation(INST).await.unwrap();
    let c = inst.issue_comments(&repo, 2, 20).await.unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].body, "/kodx ask why?");
    assert_eq!(
        paths(&fake, "GET", "/repos/acme/widgets/issues/2/comments").len(),
        1
    );
    assert!(inst
        .issue_comments(&repo, 99, 5)
        .await
        .unwrap_err()
        .is_not_found());
    assert_clean(&fake);
}

#[tokio::test]
async fn reactions_on_comments_review_comments_and_issues() {
    let (fake, app, repo) = setup().await;
    fake.add_pull(
        REPO,
        5,
        "PR",
        "",
        "alice",
        FakeHead {
            ref_name: "f".into(),
            sha: "3".repeat(40),
            repo: Some(REPO.into()),
            clone_url: "https://github.com/acme/widgets.git".into(),
        },
        FakeBase {
            ref_name: "main".into(),
            sha: "4".repeat(40),
        },
        "",
    );
    let comment = fake.add_comment(REPO, 5, "alice", "/kodx code fix", false);
    let review = fake.add_review_comment(REPO, 5, "alice", "/kodx ask about this line");
    let inst = app.installation(INST).await.unwrap();
    inst.react(&repo, ReactionTarget::IssueComment(comment), Reaction::Eyes)
        .await
        .unwrap();
    // The same reaction again: GitHub answers 200, still a success.
    inst.react(&repo, ReactionTarget::IssueComment(comment), Reaction::Eyes)
        .await
        .unwrap();
    inst.react(
        &repo,
        ReactionTarget::ReviewComment(review),
        Reaction::Confused,
    )
    .await
    .unwrap();
    inst.react(&repo, ReactionTarget::Issue(5), Reaction::Rocket)
        .await
        .unwrap();
    inst.react(
        &repo,
        ReactionTarget::IssueComment(comment),
        Reaction::PlusOne,
    )
    .await
    .unwrap();
    let err = inst
        .react(&repo, ReactionTarget::IssueComment(123), Reaction::Eyes)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let by = "kodx[bot]".to_string();
    assert_eq!(
        fake.reactions(),
        vec![
            (
                format!("{REPO}/issues/comments/{comment}"),
                "eyes".into(),
                by.clone()
            ),
            (
                format!("{REPO}/pulls/comments/{review}"),
                "confused".into(),
                by.clone()
            ),
            (format!("{REPO}/issues/5"), "rocket".into(), by.clone()),
            (format!("{REPO}/issues/comments/{comment}"), "+1".into(), by),
        ]
    );
    assert_clean(&fake);
}

// ---------------------------------------------------------------------------------------
// Transport: Enterprise, retries, rate limits
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn enterprise_base_url_keeps_its_prefix() {
    let (fake, app, repo) = setup_with_prefix("/api/v3").await;
    assert!(fake.url().ends_with("/api/v3"));
    fake.add_issue(REPO, 1, "On GHES", "", "alice");
    assert_eq!(app.app_info().await.unwrap().id, APP_ID);
    let inst = app.installation(INST).await.unwrap();
    assert_eq!(inst.issue(&repo, 1).await.unwrap().title, "On GHES");
    inst.create_comment(&repo, 1, "hello").await.unwrap();
    let requests = fake.requests();
    assert_eq!(requests.len(), 4);
    assert!(
        requests.iter().all(|r| r.path.starts_with("/api/v3/")),
        "{:?}",
        requests.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    // A trailing slash on the base changes nothing.
    let app = GitHubApp::new(&format!("{}/", fake.url()), APP_ID, TEST_APP_KEY).unwrap();
    assert_eq!(app.app_info().await.unwrap().id, APP_ID);
    assert_clean(&fake);
}

#[tokio::test]
async fn gateway_errors_are_retried_then_succeed() {
    let (fake, app, repo) = setup().await;
    fake.add_issue(REPO, 1, "Flaky", "", "alice");
    fake.fail_next("/app/installations/", 503, 1);
    fake.fail_next("/repos/acme/widgets/issues/1", 502, 2);
    let inst = app.installation(INST).await.unwrap();
    assert_eq!(inst.issue(&repo, 1).await.unwrap().title, "Flaky");
    assert_eq!(paths(&fake, "POST", "/app/installations/").len(), 2);
    assert_eq!(paths(&fake, "GET", "/repos/acme/widgets/issues/1").len(), 3);
    // A comment POST answered 504 once is sent again and lands once.
    fake.fail_next("/repos/acme/widgets/issues/1/comments", 504, 1);
    inst.create_comment(&repo, 1, "after a 504").await.unwrap();
    assert_eq!(fake.comments(REPO, 1).len(), 1);
    assert_clean(&fake);
}

#[tokio::test]
async fn persistent_gateway_errors_give_up_and_other_errors_are_not_retried() {
    let (fake, app, repo) = setup().await;
    fake.add_issue(REPO, 1, "Down", "", "alice");
    let inst = app.installation(INST).await.unwrap();
    fake.fail_next("/repos/acme/widgets/issues/1", 502, 10);
    let started = Instant::now();
    let err = inst.issue(&repo, 1).await.unwrap_err();
    assert!(
        matches!(err, GitHubError::Http { status: 502, .. }),
        "{err}"
    );
    assert_eq!(paths(&fake, "GET", "/repos/acme/widgets/issues/1").len(), 4);
    assert!(started.elapsed() < Duration::from_secs(15));
    fake.fail_next("/repos/acme/widgets/issues/2", 500, 1);
    fake.add_issue(REPO, 2, "x", "", "alice");
    let err = inst.issue(&repo, 2).await.unwrap_err();
    assert!(
        matches!(err, GitHubError::Http { status: 500, .. }),
        "{err}"
    );
    assert_eq!(paths(&fake, "GET", "/repos/acme/widgets/issues/2").len(), 1);
    assert_clean(&fake);
}

#[tokio::test]
async fn a_near_rate_limit_reset_is_waited_a_far_one_is_returned() {
    let (fake, app, repo) = setup().await;
    fake.add_issue(REPO, 1, "Busy", "", "alice");
    let inst = app.installation(INST).await.unwrap();
    fake.set_rate_limited(Some(Duration::from_secs(3600)));
    let started = Instant::now();
    let err = inst.issue(&repo, 1).await.unwrap_err();
    match err {
        GitHubError::RateLimited { reset_in, .. } => {
            assert!(reset_in > Duration::from_secs(3500), "{reset_in:?}")
        }
        other => panic!("{other}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "returned at once"
    );
    fake.set_rate_limited(Some(Duration::from_secs(1)));
    let started = Instant::now();
    assert_eq!(inst.issue(&repo, 1).await.unwrap().title, "Busy");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "waited for the reset"
    );
    assert_clean(&fake);
}

#[tokio::test]
async fn an_unreachable_github_is_a_network_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let policy = kodx::github::RequestPolicy {
        base_delay: Duration::from_millis(10),
        ..Default::default()
    };
    let app = GitHubApp::with_policy(&url, APP_ID, TEST_APP_KEY, policy).unwrap();
    let err = app.installation(INST).await.unwrap_err();
    assert!(matches!(err, GitHubError::Network { .. }), "{err}");
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(err, @"POST /app/installations/77/access_tokens: cannot reach GitHub: Service Error: client error (Connect)"));
}

// ---------------------------------------------------------------------------------------
// The fake itself: it refuses what GitHub would refuse
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn the_fake_refuses_malformed_requests() {
    let (fake, app, _) = setup().await;
    fake.add_issue(REPO, 1, "t", "", "alice");
    let comment = fake.add_comment(REPO, 1, "alice", "hi", false);
    let token = app
        .installation(INST)
        .await
        .unwrap()
        .token()
        .expose_secret()
        .to_string();
    let http = reqwest::Client::new();
    let send = |method: reqwest::Method, path: &str, body: &str| {
        http.request(method, format!("{}{path}", fake.url()))
            .header("user-agent", "kodx")
            .header("authorization", format!("token {token}"))
            .body(body.to_string())
            .send()
    };
    let status = |r: reqwest::Response| r.status().as_u16();
    let post = reqwest::Method::POST;
    assert_eq!(
        status(
            send(
                post.clone(),
                "/repos/acme/widgets/issues/1/comments",
                "{\"bdy\":\"x\"}"
            )
            .await
            .unwrap()
        ),
        422
    );
    assert_eq!(
        status(
            send(
                post.clone(),
                "/repos/acme/widgets/issues/1/comments",
                "{\"body\":7}"
            )
            .await
            .unwrap()
        ),
        422
    );
    assert_eq!(
        status(
            send(
                post.clone(),
                "/repos/acme/widgets/issues/1/comments",
                "not json"
            )
            .await
            .unwrap()
        ),
        400
    );
    let reactions = format!("/repos/acme/widgets/issues/comments/{comment}/reactions");
    assert_eq!(
        status(
            send(post.clone(), &reactions, "{\"content\":\"thumbsup\"}")
                .await
                .unwrap()
        ),
        422
    );
    assert_eq!(
        status(
            send(
                reqwest::Method::DELETE,
                "/repos/acme/widgets/issues/1/comments",
                ""
            )
            .await
            .unwrap()
        ),
        404
    );
    assert_eq!(
        status(
            send(reqwest::Method::GET, "/repos/acme/widgets/branches", "")
                .await
                .unwrap()
        ),
        404
    );
    assert_eq!(fake.refused().len(), 6, "{:?}", fake.refused());
    // No User-Agent: GitHub's 403.
    let r = reqwest::Client::builder()
        .build()
        .unwrap()
        .get(format!("{}/repos/acme/widgets", fake.url()))
        .header("authorization", format!("token {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(fake.refused().len(), 7);
    // Bad or missing credentials are 401s, not malformed requests.
    let r = http
        .get(format!("{}/repos/acme/widgets/issues/1", fake.url()))
        .header("user-agent", "kodx")
        .header("authorization", "token ghs_notissued")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["message"], "Bad credentials");
    assert!(body["documentation_url"].is_string());
    assert_eq!(fake.refused().len(), 7);
    assert_eq!(fake.comments(REPO, 1).len(), 1, "nothing was posted");
    assert!(fake.reactions().is_empty());
}

#[tokio::test]
async fn concurrent_installation_clients_are_send_and_shared() {
    let (fake, app, repo) = setup().await;
    fake.add_issue(REPO, 1, "t", "", "alice");
    let app = Arc::new(app);
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (app, repo) = (app.clone(), repo.clone());
        tasks.push(tokio::spawn(async move {
            let inst = app.installation(INST).await.unwrap();
            inst.create_comment(&repo, 1, &format!("parallel {i}"))
                .await
                .unwrap()
                .id
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5);
    assert_eq!(fake.issued_tokens().len(), 1);
    assert_clean(&fake);
}

// ---------------------------------------------------------------------------------------
// Pull requests kodx opens, the bot's identity, user ids
// ---------------------------------------------------------------------------------------

const BRANCH: &str = "kodx/issue-7-1a2b3c4d";

fn new_pull(head: &str) -> NewPull {
    NewPull {
        title: "Fix the widget".into(),
        head: head.into(),
        base: "main".into(),
        body: "Closes #7".into(),
        draft: true,
    }
}

/// The fake knows `main` and `BRANCH`, each at its own commit.
fn with_branches(fake: &FakeGitHub) {
    fake.set_branch_sha(|repo, branch| {
        assert_eq!(repo, REPO);
        match branch {
            "main" => Some("a".repeat(40)),
            BRANCH => Some("b".repeat(40)),
            _ => None,
        }
    });
}

/// Retries without the default half-second backoff.
fn fast_app(fake: &FakeGitHub) -> GitHubApp {
    let policy = RequestPolicy {
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        ..Default::default()
    };
    GitHubApp::with_policy(&fake.url(), APP_ID, TEST_APP_KEY, policy).unwrap()
}

#[tokio::test]
async fn create_pull_opens_one_numbered_after_the_issues() {
    let (fake, app, repo) = setup().await;
    with_branches(&fake);
    fake.add_issue(REPO, 1, "One", "", "alice");
    fake.add_issue(REPO, 7, "Seven", "", "alice");
    let inst = app.installation(INST).await.unwrap();
    let pr = inst.create_pull(&repo, &new_pull(BRANCH)).await.unwrap();
    assert_eq!(
        pr,
        PullRef {
            number: 8,
            html_url: format!("{}/{REPO}/pull/8", fake.root()),
            head_ref: BRANCH.into(),
        }
    );
    // What was sent: GitHub's fields, and no maintainer_can_modify on a same-repo head.
    let posts: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/repos/acme/widgets/pulls")
        .collect();
    assert_eq!(posts.len(), 1);
    let sent: serde_json::Value = serde_json::from_str(&posts[0].body).unwrap();
    assert_eq!(
        sent,
        serde_json::json!({
            "title": "Fix the widget", "head": BRANCH, "base": "main",
            "body": "Closes #7", "draft": true,
        })
    );
    assert_eq!(
        fake.created_pulls(REPO),
        vec![FakePull {
            number: 8,
            title: "Fix the widget".into(),
            head: BRANCH.into(),
            base: "main".into(),
            body: "Closes #7".into(),
            draft: true,
            edits: vec![],
        }]
    );
    // It is an issue too (so the status comment can go on it) and a pull request.
    let issue = inst.issue(&repo, 8).await.unwrap();
    assert!(issue.is_pull_request);
    assert_eq!(issue.author, "kodx[bot]");
    inst.create_comment(&repo, 8, "done").await.unwrap();
    assert_eq!(fake.comments(REPO, 8).len(), 1);
    let info = inst.pull_request(&repo, 8).await.unwrap();
    assert!(!info.is_fork);
    assert_eq!(info.head.sha, "b".repeat(40));
    assert_eq!(info.base.sha, "a".repeat(40));
    assert_eq!(info.head.repo.unwrap().clone_url, info.base.repo.clone_url);
    // The next issue number is after the pull request.
    let second = "kodx/issue-8-ffff0000";
    fake.set_branch_exists(|_, _| true);
    let pr = inst.create_pull(&repo, &new_pull(second)).await.unwrap();
    assert_eq!(pr.number, 9);
    assert_clean(&fake);
}

#[tokio::test]
async fn an_open_pull_from_the_same_head_is_pull_exists_and_found() {
    let (fake, app, repo) = setup().await;
    with_branches(&fake);
    let inst = app.installation(INST).await.unwrap();
    let first = inst.create_pull(&repo, &new_pull(BRANCH)).await.unwrap();
    assert_eq!(first.number, 1);
    let err = inst
        .create_pull(&repo, &new_pull(BRANCH))
        .await
        .unwrap_err();
    match &err {
        GitHubError::PullExists { head, .. } => assert_eq!(head, &format!("acme:{BRANCH}")),
        other => panic!("{other}"),
    }
    assert_eq!(err.status(), Some(422));
    assert_eq!(fake.created_pulls(REPO).len(), 1);

    assert_eq!(
        inst.find_open_pull(&repo, BRANCH).await.unwrap(),
        Some(first.clone())
    );
    let lists = paths(&fake, "GET", "/repos/acme/widgets/pulls");
    assert_eq!(
        lists,
        vec!["/repos/acme/widgets/pulls?state=open&head=acme%3Akodx%2Fissue-7-1a2b3c4d"]
    );
    assert_eq!(
        inst.find_open_pull(&repo, "kodx/other").await.unwrap(),
        None
    );
    // A pull request by someone else from a fork with the same branch name is not ours.
    fake.add_pull(
        REPO,
        50,
        "Fork",
        "",
        "eve",
        FakeHead {
            ref_name: "kodx/other".into(),
            sha: "c".repeat(40),
            repo: Some("eve/widgets".into()),
            clone_url: "https://github.com/eve/widgets.git".into(),
        },
        FakeBase {
            ref_name: "main".into(),
            sha: "a".repeat(40),
        },
        "",
    );
    assert_eq!(
        inst.find_open_pull(&repo, "kodx/other").await.unwrap(),
        None
    );
    // Once closed it is no longer open, and a new one may be opened from the same head.
    fake.close_pull(REPO, first.number);
    assert_eq!(inst.find_open_pull(&repo, BRANCH).await.unwrap(), None);
    let again = inst.create_pull(&repo, &new_pull(BRANCH)).await.unwrap();
    assert_eq!(again.number, 51);
    assert_eq!(
        inst.find_open_pull(&repo, BRANCH).await.unwrap(),
        Some(again)
    );
    assert_clean(&fake);
}

#[tokio::test]
async fn a_missing_branch_or_no_commits_is_a_422_with_githubs_words() {
    let (fake, app, repo) = setup().await;
    with_branches(&fake);
    let inst = app.installation(INST).await.unwrap();
    let err = inst
        .create_pull(&repo, &new_pull("kodx/never-pushed"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, GitHubError::Http { status: 422, .. }),
        "{err}"
    );
    // A head at the base's commit.
    fake.set_branch_sha(|_, _| Some("a".repeat(40)));
    let err = inst
        .create_pull(&repo, &new_pull(BRANCH))
        .await
        .unwrap_err();
    assert!(matches!(err, GitHubError::NoCommits { .. }), "{err}");
    insta::assert_snapshot!(err, @"POST /repos/acme/widgets/pulls: GitHub answered 422: Validation Failed (No commits between main and kodx/issue-7-1a2b3c4d)");
    assert!(fake.created_pulls(REPO).is_empty());
    assert_eq!(
        paths(&fake, "POST", "/repos/acme/widgets/pulls").len(),
        2,
        "422s are not retried"
    );
    assert_clean(&fake);
}

#[tokio::test]
async fn update_pull_body_edits_the_description() {
    let (fake, app, repo) = setup().await;
    with_branches(&fake);
    let inst = app.installation(INST).await.unwrap();
    let pr = inst.create_pull(&repo, &new_pull(BRANCH)).await.unwrap();
    inst.update_pull(&repo, pr.number, None, "Closes #7\n\ncost: $0.0123")
        .await
        .unwrap();
    inst.update_pull(&repo, pr.number, None, "Closes #7\n\ncost: $0.0456")
        .await
        .unwrap();
    let created = &fake.created_pulls(REPO)[0];
    assert_eq!(
        created.edits,
        vec!["Closes #7\n\ncost: $0.0123", "Closes #7\n\ncost: $0.0456"]
    );
    assert_eq!(created.title, "Fix the widget");
    assert_eq!(
        inst.pull_request(&repo, pr.number).await.unwrap().body,
        "Closes #7\n\ncost: $0.0456"
    );
    let err = inst.update_pull(&repo, 99, None, "x").await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_clean(&fake);
}

#[tokio::test]
async fn bot_identity_is_looked_up_once_with_its_noreply_address() {
    let (fake, app, _) = setup_with_prefix("/api/v3").await;
    fake.set_slug("kodx-dev");
    fake.set_bot_user_id(41_898_282);
    let inst = app.installation(INST).await.unwrap();
    let (a, b) = tokio::join!(app.bot_identity(&inst), app.bot_identity(&inst));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.login, "kodx-dev[bot]");
    assert_eq!(a.id, 41_898_282);
    assert_eq!(
        a.noreply_email,
        "41898282+kodx-dev[bot]@users.noreply.github.com"
    );
    assert_eq!(a, b);
    assert_eq!(app.bot_identity(&inst).await.unwrap(), a);
    assert_eq!(
        paths(&fake, "GET", "/api/v3/users/"),
        vec!["/api/v3/users/kodx-dev%5Bbot%5D"],
        "one lookup for three calls"
    );
    assert_eq!(paths(&fake, "GET", "/api/v3/app").len(), 1);
    // The user lookup carries the installation token, not the App's JWT.
    let lookup = fake
        .requests()
        .into_iter()
        .find(|r| r.path.starts_with("/api/v3/users/"))
        .unwrap();
    assert_eq!(
        lookup.authorization,
        Some(format!("Bearer {}", inst.token().expose_secret()))
    );
    assert!(fake.unauthorized().is_empty(), "{:?}", fake.unauthorized());
    assert_clean(&fake);
}

#[tokio::test]
async fn user_ids_for_co_author_trailers() {
    let (fake, app, _) = setup().await;
    fake.add_user("Alice-Dev", 583_231);
    let inst = app.installation(INST).await.unwrap();
    assert_eq!(inst.user_id("Alice-Dev").await.unwrap(), 583_231);
    assert_eq!(inst.user_id("alice-dev").await.unwrap(), 583_231);
    let err = inst.user_id("nobody-here").await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(inst.user_id("").await.unwrap_err().is_not_found());
    assert_eq!(
        kodx::github::noreply_email("Alice-Dev", 583_231),
        "583231+Alice-Dev@users.noreply.github.com"
    );
    // The bot has an id even when the test did not choose one.
    let bot = app.bot_identity(&inst).await.unwrap();
    assert_eq!(inst.user_id("kodx[bot]").await.unwrap(), bot.id);
    assert_clean(&fake);
}

#[tokio::test]
async fn a_create_pull_answered_502_after_github_opened_it_is_not_sent_again() {
    let (fake, _, repo) = setup().await;
    with_branches(&fake);
    let app = fast_app(&fake);
    let inst = app.installation(INST).await.unwrap();
    fake.fail_after_next("/repos/acme/widgets/pulls", 502);
    let pr = inst.create_pull(&repo, &new_pull(BRANCH)).await.unwrap();
    assert_eq!(pr.number, 1);
    assert_eq!(pr.head_ref, BRANCH);
    assert_eq!(fake.created_pulls(REPO).len(), 1);
    assert_eq!(paths(&fake, "POST", "/repos/acme/widgets/pulls").len(), 1);
    assert_eq!(paths(&fake, "GET", "/repos/acme/widgets/pulls").len(), 1);

    // A 503 before GitHub did anything: looked up, not found, sent again, opened once.
    let other = "kodx/issue-9-00000000";
    fake.set_branch_exists(|_, _| true);
    fake.fail_next("/repos/acme/widgets/pulls", 503, 1);
    let pr = inst.create_pull(&repo, &new_pull(other)).await.unwrap();
    assert_eq!(pr.number, 2);
    assert_eq!(fake.created_pulls(REPO).len(), 2);
    assert_eq!(paths(&fake, "POST", "/repos/acme/widgets/pulls").len(), 3);
    assert_eq!(paths(&fake, "GET", "/repos/acme/widgets/pulls").len(), 2);

    // GitHub down for good, the look-up failing too (after its own retries): whether the
    // POST opened anything cannot be told, so it is not sent again.
    let third = "kodx/issue-10-00000000";
    fake.fail_next("/repos/acme/widgets/pulls", 502, 5);
    let err = inst.create_pull(&repo, &new_pull(third)).await.unwrap_err();
    assert!(
        matches!(err, GitHubError::Http { status: 502, .. }),
        "{err}"
    );
    assert_eq!(fake.created_pulls(REPO).len(), 2);
    assert_eq!(paths(&fake, "POST", "/repos/acme/widgets/pulls").len(), 4);
    assert_eq!(paths(&fake, "GET", "/repos/acme/widgets/pulls").len(), 6);
    assert_clean(&fake);
}

#[tokio::test]
async fn the_fake_refuses_malformed_pull_requests() {
    let (fake, app, repo) = setup().await;
    let inst = app.installation(INST).await.unwrap();
    let token = inst.token().expose_secret().to_string();
    let http = reqwest::Client::new();
    let send = |method: reqwest::Method, path: &str, body: &str| {
        http.request(method, format!("{}{path}", fake.url()))
            .header("user-agent", "kodx")
            .header("authorization", format!("token {token}"))
            .body(body.to_string())
            .send()
    };
    let pulls = "/repos/acme/widgets/pulls";
    let post = reqwest::Method::POST;
    for (body, status) in [
        (r#"{"title":"t","base":"main"}"#, 422),
        (r#"{"title":7,"head":"b","base":"main"}"#, 422),
        (
            r#"{"title":"t","head":"b","base":"main","draft":"yes"}"#,
            422,
        ),
        (
            r#"{"title":"t","head":"b","base":"main","labels":["x"]}"#,
            422,
        ),
        (
            r#"{"title":"t","head":"b","base":"main","maintainer_can_modify":true}"#,
            422,
        ),
        ("[]", 400),
    ] {
        let r = send(post.clone(), pulls, body).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{body}");
    }
    assert_eq!(fake.refused().len(), 6, "{:?}", fake.refused());
    assert!(fake.created_pulls(REPO).is_empty());

    // A `head` without `owner:` is ignored by GitHub (every pull request comes back): the
    // answer is GitHub's, the request is recorded as a kodx bug.
    let pr = inst.create_pull(&repo, &new_pull(BRANCH)).await.unwrap();
    let r = send(
        reqwest::Method::GET,
        &format!("{pulls}?state=open&head={BRANCH}"),
        "",
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let listed: serde_json::Value = r.json().await.unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(fake.refused().len(), 7, "{:?}", fake.refused());
    insta::assert_snapshot!(fake.refused()[6], @r#"GET /repos/acme/widgets/pulls: head="kodx/issue-7-1a2b3c4d" has no `owner:` prefix"#);
    let r = send(reqwest::Method::GET, &format!("{pulls}?state=merged"), "")
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let r = send(
        reqwest::Method::PATCH,
        &format!("{pulls}/{}", pr.number),
        r#"{"body":7}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    assert_eq!(fake.refused().len(), 9, "{:?}", fake.refused());
    assert!(fake.created_pulls(REPO)[0].edits.is_empty());
    // Unknown users are 404s, not malformed requests; a bad token is a 401.
    let r = send(reqwest::Method::GET, "/users/nobody", "")
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let r = http
        .get(format!("{}/users/kodx%5Bbot%5D", fake.url()))
        .header("user-agent", "kodx")
        .header("authorization", "token ghs_notissued")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(fake.refused().len(), 9);
}

// ---------------------------------------------------------------------------------------
// Scoped tokens
// ---------------------------------------------------------------------------------------

use crate::common::git_server;

/// The git server asks the fake GitHub what each token was minted for.
fn scoped_git(fake: &FakeGitHub) -> git_server::GitServer {
    use fake_github::GitVerdict;
    use git_server::Verdict;
    let fake = fake.clone();
    git_server::GitServer::start(Arc::new(move |t, u| {
        match fake.git_access(t, &u.repo, u.push) {
            GitVerdict::Allow => Verdict::Allow,
            GitVerdict::Unauthorized => Verdict::Unauthorized,
            GitVerdict::Forbidden => Verdict::Forbidden,
            GitVerdict::NotFound => Verdict::NotFound,
        }
    }))
}

fn perms(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn tokens_are_minted_for_one_repository_and_the_permissions_a_run_uses() {
    let (fake, app, repo) = setup().await;
    let read = TokenScope::read(&repo, false);
    let write = TokenScope::write(&repo);
    let a = app.installation_for(INST, &read).await.unwrap();
    let again = app.installation_for(INST, &read).await.unwrap();
    assert_eq!(
        a.token().expose_secret(),
        again.token().expose_secret(),
        "cached per scope"
    );
    let review = app
        .installation_for(INST, &TokenScope::read(&repo, true))
        .await
        .unwrap();
    let w = app.installation_for(INST, &write).await.unwrap();
    assert_ne!(a.token().expose_secret(), w.token().expose_secret());
    assert_ne!(a.token().expose_secret(), review.token().expose_secret());
    let grants = fake.token_grants();
    assert_eq!(grants.len(), 3, "{grants:#?}");
    for g in &grants {
        assert_eq!(g.installation, INST);
        assert_eq!(g.repositories, Some(vec!["widgets".to_string()]));
    }
    assert_eq!(
        grants[0].permissions,
        Some(perms(&[
            ("contents", "read"),
            ("issues", "write"),
            ("pull_requests", "read"),
            ("metadata", "read"),
        ]))
    );
    assert_eq!(
        grants[1].permissions.as_ref().unwrap()["pull_requests"],
        "write",
        "a reaction on a review comment needs pull_requests: write"
    );
    assert_eq!(
        grants[2].permissions,
        Some(perms(&[
            ("contents", "write"),
            ("issues", "write"),
            ("pull_requests", "write"),
            ("metadata", "read"),
        ]))
    );
    // Forgetting the installation drops every scope's token.
    app.forget_installation(INST).await;
    let fresh = app.installation_for(INST, &read).await.unwrap();
    assert_ne!(fresh.token().expose_secret(), a.token().expose_secret());
    let fresh_w = app.installation_for(INST, &write).await.unwrap();
    assert_ne!(fresh_w.token().expose_secret(), w.token().expose_secret());
    assert_eq!(fake.token_grants().len(), 5);
    assert_clean(&fake);
}

#[tokio::test]
async fn a_scoped_token_reaches_only_its_repository_and_permissions() {
    let (fake, app, repo) = setup().await;
    fake.add_repo(
        INST,
        "acme/secrets",
        "main",
        "https://github.com/acme/secrets.git",
        true,
    );
    fake.add_issue("acme/secrets", 1, "Private", "keys", "bob");
    fake.add_issue(REPO, 2, "Ours", "", "bob");
    let other: RepoName = "acme/secrets".parse().unwrap();
    let read = app
        .installation_for(INST, &TokenScope::read(&repo, false))
        .await
        .unwrap();
    // Its own repository: reads and comments.
    assert_eq!(read.issue(&repo, 2).await.unwrap().title, "Ours");
    read.create_comment(&repo, 2, "hi").await.unwrap();
    // Another repository of the same installation: not found.
    let err = read.issue(&other, 1).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    // A read token opens no pull request.
    let pull = NewPull {
        title: "t".into(),
        head: "kodx/x".into(),
        base: "main".into(),
        body: "b".into(),
        draft: false,
    };
    let err = read.create_pull(&repo, &pull).await.unwrap_err();
    assert_eq!(err.status(), Some(403), "{err}");
    // The unscoped token (every repository) still reads the other one: the scope did it.
    let all = app.installation(INST).await.unwrap();
    assert_eq!(all.issue(&other, 1).await.unwrap().title, "Private");
    let forbidden = fake.forbidden();
    assert_eq!(forbidden.len(), 2, "{forbidden:#?}");
    insta::assert_snapshot!(forbidden.join("\n"), @r#"
    GET /repos/acme/secrets/issues/1: token not minted for acme/secrets
    POST /repos/acme/widgets/pulls: token lacks [("pull_requests", "write")]
    "#);
    assert_clean(&fake);
}

#[tokio::test]
async fn a_repository_outside_the_installation_gets_no_token() {
    let (fake, app, _) = setup().await;
    fake.add_installation(INST + 1, "globex");
    fake.add_repo(
        INST + 1,
        "globex/app",
        "main",
        "https://github.com/globex/app.git",
        true,
    );
    let theirs: RepoName = "globex/app".parse().unwrap();
    let err = app
        .installation_for(INST, &TokenScope::write(&theirs))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert_eq!(err.status(), Some(422), "{text}");
    crate::common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(text, @"POST /app/installations/77/access_tokens (for app: contents write, issues write, pull requests write): GitHub answered 422: There is at least one repository that does not exist or is not accessible to the parent installation."));
    assert!(fake.issued_tokens().is_empty());
    assert_clean(&fake);
}

#[tokio::test]
async fn git_lets_a_read_token_clone_but_not_push_and_no_token_cross_repositories() {
    if !git_server::git_available() {
        eprintln!("SKIPPED: no git");
        return;
    }
    let (fake, app, repo) = setup().await;
    let git = scoped_git(&fake);
    let url = git.create_repo(REPO, "main", &[("a.txt", b"a\n", 0o644)]);
    let other_url = git.create_repo("acme/secrets", "main", &[("key", b"k\n", 0o644)]);
    fake.add_repo(INST, "acme/secrets", "main", &other_url, true);
    let read = app
        .installation_for(INST, &TokenScope::read(&repo, false))
        .await
        .unwrap();
    let write = app
        .installation_for(INST, &TokenScope::write(&repo))
        .await
        .unwrap();
    let (read_token, write_token) = (
        read.token().expose_secret().to_string(),
        write.token().expose_secret().to_string(),
    );
    let dir = tempfile::tempdir().unwrap();
    let result = tokio::task::spawn_blocking({
        let dir = dir.path().to_path_buf();
        move || {
            use kodx::git::{self, Checkout};
            let dest = dir.join("clone");
            git::clone(&url, &read_token, &dest, &Checkout::DefaultBranch, None)
                .expect("a read token clones");
            std::fs::write(dest.join("b.txt"), "b\n").unwrap();
            let pushed_read = git::push(&dest, &url, &read_token, "HEAD", "kodx/read", false);
            let pushed_write = git::push(&dest, &url, &write_token, "HEAD", "kodx/write", false);
            let cross = git::clone(
                &other_url,
                &write_token,
                &dir.join("other"),
                &Checkout::DefaultBranch,
                None,
            );
            (pushed_read, pushed_write, cross)
        }
    })
    .await
    .unwrap();
    let (pushed_read, pushed_write, cross) = result;
    let err = pushed_read.expect_err("a read token cannot push");
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(err, @"the git server refused the installation token: check that the app is installed on the repository and has the contents permission (write, to push)"));
    pushed_write.expect("a write token pushes");
    assert!(git.branch_sha(REPO, "kodx/write").is_some());
    assert!(git.branch_sha(REPO, "kodx/read").is_none());
    let err = cross.expect_err("a token for widgets cannot clone secrets");
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(err, @"the git server has no such repository (HTTP 404): check the clone URL and that the app is installed on the repository"));
    let forbidden = fake.forbidden();
    insta::assert_snapshot!(forbidden.join("\n"), @r#"
    git push acme/widgets: token lacks [("contents", "write")]
    git acme/secrets: token not minted for it
    "#);
    assert_clean(&fake);
}

/// Branches, trees and blobs as GitHub serves them, from a real repository: a branch's
/// tip, `None` for a tag or an unknown name; a commit's whole tree with modes and sizes;
/// a blob read no further than asked; a file at a ref other than the default branch.
#[tokio::test]
async fn branches_trees_and_bounded_blobs() {
    let (fake, app, repo) = setup().await;
    let git = git_server::GitServer::start(git_server::accept_tokens(&[]));
    git.create_repo(
        REPO,
        "main",
        &[
            ("AGENTS.md", b"main rules\n", 0o644),
            ("CLAUDE.md", b"AGENTS.md", 0o120000),
            ("src/AGENTS.md", b"src rules\n", 0o644),
        ],
    );
    let big = "0123456789abcdef".repeat(64 * 1024); // 1 MiB
    let release = git.commit_on_branch(
        REPO,
        "release/1.x",
        &[
            ("AGENTS.md", big.as_bytes(), 0o644),
            (".github/kodx.yml", b"pr: { draft: true }\n", 0o644),
        ],
        "release",
    );
    git.commit(REPO, "refs/tags/v1", Some(&release), &[], "tagged");
    let bare = git.bare_path(REPO);
    fake.set_git_dir(move |_| Some(bare.clone()));
    let inst = app.installation(INST).await.unwrap();

    assert_eq!(
        inst.branch_sha(&repo, "release/1.x").await.unwrap(),
        Some(release.clone())
    );
    assert_eq!(inst.branch_sha(&repo, "v1").await.unwrap(), None);
    assert_eq!(inst.branch_sha(&repo, "nope").await.unwrap(), None);

    let tree = inst.tree(&repo, &release).await.unwrap().unwrap();
    assert!(!tree.truncated);
    let entry = |p: &str| tree.entries.iter().find(|e| e.path == p).unwrap().clone();
    assert!(entry("CLAUDE.md").is_link());
    assert!(entry("src/AGENTS.md").is_file());
    assert_eq!(entry("src").mode, "040000");
    let agents = entry("AGENTS.md");
    assert_eq!(agents.size, Some(big.len() as u64));
    assert_eq!(inst.tree(&repo, &"0".repeat(40)).await.unwrap(), None);

    let (head, more) = inst.blob_head(&repo, &agents.sha, 32 * 1024).await.unwrap();
    assert_eq!(head, big.as_bytes()[..32 * 1024]);
    assert!(more);
    let (link, more) = inst
        .blob_head(&repo, &entry("CLAUDE.md").sha, 4096)
        .await
        .unwrap();
    assert_eq!((link.as_slice(), more), (&b"AGENTS.md"[..], false));

    assert_eq!(
        inst.file_at(&repo, ".github/kodx.yml", Some(&release))
            .await
            .unwrap()
            .as_deref(),
        Some("pr: { draft: true }\n")
    );
    assert_eq!(
        inst.file_at(&repo, ".github/kodx.yml", Some("main"))
            .await
            .unwrap(),
        None
    );
    assert_clean(&fake);
}

// ---------------------------------------------------------------------------------------
// GraphQL: review threads (the fake validates every document against GitHub's schema)
// ---------------------------------------------------------------------------------------

/// Pull request 5 of `REPO`, for review threads.
fn with_review_pull(fake: &FakeGitHub) {
    fake.add_pull(
        REPO,
        5,
        "Review me",
        "",
        "bob",
        FakeHead {
            ref_name: "feature".into(),
            sha: "a".repeat(40),
            repo: Some(REPO.into()),
            clone_url: "https://github.com/acme/widgets.git".into(),
        },
        FakeBase {
            ref_name: "main".into(),
            sha: "b".repeat(40),
        },
        "diff --git a/x b/x\n",
    );
}

fn said(author: &str, body: &str) -> (String, bool, String) {
    (
        author.to_string(),
        author.ends_with("[bot]"),
        body.to_string(),
    )
}

#[tokio::test]
async fn review_threads_are_read_over_every_page_and_bounded() {
    let (fake, app, repo) = setup().await;
    with_review_pull(&fake);
    fake.add_issue(REPO, 6, "Other", "", "bob");
    // 130 threads, every tenth resolved: 117 unresolved, over three pages of 50.
    let mut ids = Vec::new();
    for i in 0..130 {
        let comments = match i {
            // A long conversation: 300 comments, the last one 20 KB.
            1 => (0..300)
                .map(|c| {
                    let body = if c == 299 {
                        "é".repeat(10_000)
                    } else {
                        format!("comment {c}")
                    };
                    said(if c % 2 == 0 { "alice" } else { "kodx[bot]" }, &body)
                })
                .collect(),
            2 => vec![said("ghost", "from a deleted account")],
            _ => vec![said("alice", &format!("thread {i}"))],
        };
        let id = fake.add_review_thread(
            REPO,
            5,
            FakeThread {
                path: format!("src/f{i}.rs"),
                line: (i != 3).then_some(i + 10),
                original_line: Some(i + 10),
                outdated: i == 3,
                resolved: i % 10 == 0,
                diff_hunk: format!("@@ -1,2 +1,2 @@\n-old {i}\n+new {i}"),
                comments,
                ..Default::default()
            },
        );
        ids.push(id);
    }
    let inst = app.installation(INST).await.unwrap();
    let got = inst.unresolved_review_threads(&repo, 5).await.unwrap();
    assert_eq!(got.threads.len(), 100);
    assert_eq!(got.left_out, 17);
    assert_eq!(fake.graphql_calls(), vec!["ReviewThreads"; 3]);
    let unresolved: Vec<&String> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 10 != 0)
        .map(|(_, id)| id)
        .collect();
    let got_ids: Vec<&String> = got.threads.iter().map(|t| &t.id).collect();
    assert_eq!(got_ids, unresolved[..100], "oldest first, resolved skipped");

    let long = &got.threads[0];
    assert_eq!(
        (long.path.as_str(), long.comments_total),
        ("src/f1.rs", 300)
    );
    assert_eq!(
        long.comments.len(),
        21,
        "the opening comment and the last 20"
    );
    assert_eq!(long.comments[0].body, "comment 0");
    assert_eq!(long.comments[1].body, "comment 280");
    let last = long.comments.last().unwrap();
    assert_eq!(
        (last.author.as_str(), last.author_is_bot),
        ("kodx[bot]", true)
    );
    assert!(last.body.len() < 8 * 1024 + 100, "{}", last.body.len());
    assert!(
        last.body
            .ends_with("[comment cut: 8192 of 20000 bytes shown]"),
        "{}",
        &last.body[last.body.len() - 60..]
    );
    assert!(long.viewer_can_reply && long.viewer_can_resolve);
    assert_eq!(long.diff_hunk, "@@ -1,2 +1,2 @@\n-old 1\n+new 1");
    assert!(long.comments[0]
        .url
        .starts_with("https://github.com/acme/widgets/pull/5#discussion_r"));

    let ghost = &got.threads[1];
    assert_eq!(ghost.comments[0].author, "ghost");
    assert!(!ghost.comments[0].author_is_bot);
    let outdated = &got.threads[2];
    assert!(outdated.is_outdated);
    assert_eq!((outdated.line, outdated.original_line), (None, Some(13)));

    // A pull request without threads, and one that does not exist.
    with_review_pull_numbered(&fake, 7);
    let none = inst.unresolved_review_threads(&repo, 7).await.unwrap();
    assert_eq!((none.threads.len(), none.left_out), (0, 0));
    let err = inst.unresolved_review_threads(&repo, 6).await.unwrap_err();
    assert!(err.is_not_found(), "an issue is no pull request: {err}");
    assert_clean(&fake);
}

fn with_review_pull_numbered(fake: &FakeGitHub, number: u64) {
    fake.add_pull(
        REPO,
        number,
        "Another",
        "",
        "bob",
        FakeHead {
            ref_name: format!("feature-{number}"),
            sha: "c".repeat(40),
            repo: Some(REPO.into()),
            clone_url: "https://github.com/acme/widgets.git".into(),
        },
        FakeBase {
            ref_name: "main".into(),
            sha: "b".repeat(40),
        },
        "",
    );
}

#[tokio::test]
async fn replying_and_resolving_round_trip_and_a_refusal_is_forbidden() {
    let (fake, app, repo) = setup().await;
    with_review_pull(&fake);
    let open = |can_resolve: bool| FakeThread {
        can_resolve,
        comments: vec![said("alice", "Please rename this.")],
        ..Default::default()
    };
    let fixed = fake.add_review_thread(REPO, 5, open(true));
    let locked = fake.add_review_thread(REPO, 5, open(false));
    let inst = app.installation(INST).await.unwrap();

    let url = inst
        .reply_to_review_thread(&fixed, "Renamed in 1a2b3c.")
        .await
        .unwrap();
    assert!(
        url.starts_with("https://github.com/acme/widgets/pull/5#discussion_r"),
        "{url}"
    );
    inst.resolve_review_thread(&fixed).await.unwrap();
    assert_eq!(
        fake.thread(&fixed),
        FakeThreadState {
            resolved: true,
            replies: vec!["Renamed in 1a2b3c.".into()],
        }
    );

    // The thread the App may not resolve: the reply goes in, resolving is refused.
    inst.reply_to_review_thread(&locked, "Done.").await.unwrap();
    let err = inst.resolve_review_thread(&locked).await.unwrap_err();
    let GitHubError::Forbidden { message, .. } = &err else {
        panic!("{err}")
    };
    insta::assert_snapshot!(message, @"FORBIDDEN: Resource not accessible by integration");
    assert!(!fake.thread(&locked).resolved);
    let left = inst.unresolved_review_threads(&repo, 5).await.unwrap();
    assert_eq!(left.threads.len(), 1);
    let t = &left.threads[0];
    assert_eq!(t.id, locked);
    assert!(!t.viewer_can_resolve);
    let bodies: Vec<(&str, bool, &str)> = t
        .comments
        .iter()
        .map(|c| (c.author.as_str(), c.author_is_bot, c.body.as_str()))
        .collect();
    assert_eq!(
        bodies,
        vec![
            ("alice", false, "Please rename this."),
            ("kodx[bot]", true, "Done.")
        ]
    );

    // Unknown ids are GitHub's NOT_FOUND.
    let err = inst.resolve_review_thread("PRRT_424242").await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = inst
        .reply_to_review_thread("MDQ6VXNlcjE=", "x")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");

    // A token that may only read pull requests reads threads, may not reply.
    let read = app
        .installation_for(INST, &TokenScope::read(&repo, false))
        .await
        .unwrap();
    let seen = read.unresolved_review_threads(&repo, 5).await.unwrap();
    assert!(!seen.threads[0].viewer_can_reply);
    let err = read
        .reply_to_review_thread(&locked, "no")
        .await
        .unwrap_err();
    assert!(matches!(err, GitHubError::Forbidden { .. }), "{err}");
    assert_eq!(fake.thread(&locked).replies, vec!["Done."]);
    let forbidden = fake.forbidden();
    assert_eq!(forbidden.len(), 2, "{forbidden:#?}");
    insta::assert_snapshot!(forbidden.join("\n"), @r#"
    POST /graphql: resolveReviewThread PRRT_1000004: viewerCanResolve is false
    POST /graphql: token lacks [("pull_requests", "write")]
    "#);

    // markPullRequestReadyForReview goes through the same layer.
    inst.mark_ready_for_review("PR_5").await.unwrap();
    let err = inst.mark_ready_for_review("PR_404").await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_eq!(
        fake.graphql_calls(),
        [
            "ReplyToReviewThread",
            "ResolveReviewThread",
            "ReplyToReviewThread",
            "ResolveReviewThread",
            "ReviewThreads",
            "ResolveReviewThread",
            "ReplyToReviewThread",
            "ReviewThreads",
            "ReplyToReviewThread",
            "MarkReadyForReview",
            "MarkReadyForReview",
        ]
    );
    assert_clean(&fake);
}

#[tokio::test]
async fn a_graphql_rate_limit_is_waited_out_or_returned_as_rests() {
    let (fake, app, repo) = setup().await;
    with_review_pull(&fake);
    let id = fake.add_review_thread(REPO, 5, FakeThread::default());
    let inst = app.installation(INST).await.unwrap();
    fake.rate_limit_graphql_once();
    let started = Instant::now();
    let got = inst.unresolved_review_threads(&repo, 5).await.unwrap();
    assert_eq!(got.threads[0].id, id);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "waited for the reset: {:?}",
        started.elapsed()
    );
    assert_eq!(fake.graphql_calls(), ["ReviewThreads", "ReviewThreads"]);

    // A policy that waits for no rate limit returns it at once, with the time to the reset.
    let impatient = RequestPolicy {
        max_rate_limit_wait: Duration::ZERO,
        ..Default::default()
    };
    let app = GitHubApp::with_policy(&fake.url(), APP_ID, TEST_APP_KEY, impatient).unwrap();
    let inst = app.installation(INST).await.unwrap();
    fake.rate_limit_graphql_once();
    let started = Instant::now();
    let err = inst.resolve_review_thread(&id).await.unwrap_err();
    match &err {
        GitHubError::RateLimited { reset_in, what } => {
            assert!(*reset_in <= Duration::from_secs(3), "{reset_in:?}");
            insta::assert_snapshot!(what, @"POST graphql resolveReviewThread");
        }
        other => panic!("{other}"),
    }
    assert!(started.elapsed() < Duration::from_millis(500));
    assert!(!fake.thread(&id).resolved, "GitHub ran nothing");
    inst.resolve_review_thread(&id).await.unwrap();
    assert!(fake.thread(&id).resolved);
    assert_clean(&fake);
}

/// The fake's validation is real: a document GitHub would refuse is refused (and recorded),
/// and a valid one is answered with exactly what it asked for.
#[tokio::test]
async fn the_fake_checks_graphql_against_githubs_schema() {
    let (fake, app, _) = setup().await;
    with_review_pull(&fake);
    let token = app
        .installation(INST)
        .await
        .unwrap()
        .token()
        .expose_secret()
        .to_string();
    let http = reqwest::Client::new();
    let post = |body: serde_json::Value| {
        let request = http
            .post(format!("{}/graphql", fake.url()))
            .header("user-agent", "kodx")
            .header("x-github-api-version", "2022-11-28")
            .header("accept", "application/vnd.github+json")
            .header("authorization", format!("token {token}"))
            .json(&body);
        async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200);
            r.json::<serde_json::Value>().await.unwrap()
        }
    };
    let pull = "repository(owner: \"acme\", name: \"widgets\") { pullRequest(number: 5)";

    // A misspelled field.
    let answer = post(serde_json::json!({
        "query": format!("query {{ {pull} {{ reviewThreadz(first: 1) {{ totalCount }} }} }} }}"),
    }))
    .await;
    assert!(answer.get("data").is_none(), "{answer}");
    let errors = answer["errors"].as_array().unwrap();
    let error = errors
        .iter()
        .find(|e| e["message"].as_str().unwrap().contains("reviewThreadz"))
        .unwrap_or_else(|| panic!("{answer}"));
    assert!(error["locations"][0]["line"].is_u64(), "{answer}");
    // A variable of the wrong type.
    let answer = post(serde_json::json!({
        "query": "query($n: Int!) { repository(owner: \"acme\", name: \"widgets\") { pullRequest(number: $n) { id } } }",
        "variables": { "n": "five" },
    }))
    .await;
    assert!(answer["errors"][0]["message"].is_string(), "{answer}");
    assert!(answer.get("data").is_none(), "{answer}");
    // Valid for GitHub but beyond its page limit, or a field the fake does not implement.
    let answer = post(serde_json::json!({
        "query": format!("{{ {pull} {{ reviewThreads(first: 101) {{ totalCount }} }} }} }}"),
    }))
    .await;
    assert_eq!(
        answer["errors"][0]["type"], "EXCESSIVE_PAGINATION",
        "{answer}"
    );
    let answer = post(serde_json::json!({
        "query": "{ repository(owner: \"acme\", name: \"widgets\") { stargazerCount } }",
    }))
    .await;
    insta::assert_snapshot!(answer["errors"][0]["message"].as_str().unwrap(), @"the fake GitHub does not implement `Repository.stargazerCount` (fake_github_graphql.rs)");
    let refused = fake.refused();
    assert_eq!(refused.len(), 4, "{refused:#?}");
    insta::assert_snapshot!(refused[0], @"POST /graphql: invalid GraphQL: interface, union and object types must have a subselection set; type `PullRequest` does not have a field `reviewThreadz`");

    // A valid document: only what it asked for, under its aliases.
    let answer = post(serde_json::json!({
        "query": format!("query Q($n: Int!) {{ r: repository(owner: \"acme\", name: \"widgets\") {{ \
                          pr: pullRequest(number: $n) {{ isDraft t: reviewThreads(last: 5) {{ n: totalCount }} }} }} }}"),
        "variables": { "n": 5 },
        "operationName": "Q",
    }))
    .await;
    assert_eq!(
        answer,
        serde_json::json!({ "data": { "r": { "pr": { "isDraft": false, "t": { "n": 0 } } } } })
    );
    let answer = post(serde_json::json!({
        "query": "{ repository(owner: \"acme\", name: \"gadgets\") { pullRequest(number: 5) { id } } }",
    }))
    .await;
    assert_eq!(
        answer["data"]["repository"],
        serde_json::Value::Null,
        "{answer}"
    );
    assert_eq!(answer["errors"][0]["type"], "NOT_FOUND", "{answer}");
    assert_eq!(answer["errors"][0]["path"][0], "repository", "{answer}");
    assert_eq!(fake.refused().len(), 4, "valid documents are not refused");
}

#[tokio::test]
async fn a_reply_whose_answer_was_lost_is_not_sent_again_a_read_is_retried() {
    let (fake, _, repo) = setup().await;
    with_review_pull(&fake);
    let id = fake.add_review_thread(REPO, 5, FakeThread::default());
    let inst = fast_app(&fake).installation(INST).await.unwrap();
    fake.fail_after_next("/graphql", 502);
    let err = inst.reply_to_review_thread(&id, "Once.").await.unwrap_err();
    assert!(
        matches!(err, GitHubError::Http { status: 502, .. }),
        "{err}"
    );
    assert_eq!(fake.thread(&id).replies, ["Once."]);
    fake.fail_next("/graphql", 502, 1);
    let got = inst.unresolved_review_threads(&repo, 5).await.unwrap();
    assert_eq!(got.threads[0].comments.len(), 1);
    assert_eq!(
        fake.graphql_calls(),
        ["ReplyToReviewThread", "ReviewThreads"]
    );
    assert_clean(&fake);
}
