//! Egress by name (SPEC §12) against the real `kodx serve`, the real Docker engine and a
//! real upstream HTTP server: a repository's `network.allow` gives the sandbox, after its
//! setup script, kodx's egress proxy and nothing else. An allowed name reaches its server
//! through the proxy (a server on a loopback address the operator allows, as
//! `network_allow`, with the name pinned by `egress_resolve`); a name not allowed gets 403;
//! an allowed name that resolves to a private address is refused; a direct connection
//! fails at once. What was refused is in the status comment, the pull request and the run
//! page, with the line to add.

use std::net::SocketAddr;

use axum::{routing::get, Router};

use crate::common;
use crate::common::follow_up::config;
use crate::common::serve::{text, tool, usage, Options, Served, PUBLIC_URL, REPO};

/// An upstream server on 127.0.0.1 answering `hello from upstream`.
async fn upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/{*rest}", get(|| async { "hello from upstream" }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A Python script that fetches each URL (through the proxy the environment names, or
/// directly) and prints what came of it; then a file, so a code run has a change.
fn fetches(port: u16) -> String {
    format!(
        r#"python3 - <<'PY'
import os, urllib.request as u, urllib.error as e
def get(url, proxy=True):
    o = u.build_opener() if proxy else u.build_opener(u.ProxyHandler({{}}))
    try:
        r = o.open(url, timeout=5)
        return 'ok %s %s' % (r.status, r.read().decode())
    except e.HTTPError as x:
        return 'http %s' % x.code
    except Exception as x:
        return 'error %s %s' % (type(x).__name__, getattr(x, 'reason', x))
print('proxy:', 'set' if os.environ.get('HTTPS_PROXY', '').startswith('http://') else 'unset')
print('allowed:', get('http://allowed.test:{port}/hi'))
print('blocked:', get('http://blocked.test/x'))
print('private:', get('http://private.test/'))
print('direct:', get('http://1.1.1.1/', proxy=False))
PY
echo one > a.txt"#
    )
}

#[tokio::test]
async fn a_sandbox_reaches_exactly_what_network_allow_names() {
    let _engine = common::require_engine!();
    let up = upstream().await;
    let settings = "network_allow = [\"127.0.0.1/32\"]\n\
        egress_resolve = { \"allowed.test\" = [\"127.0.0.1\"], \"private.test\" = [\"10.1.2.3\"] }\n";
    let mut s = Served::start(Options {
        workers: true,
        settings: Some(settings),
        extra_env: vec![("KODX_PUBLIC_URL".into(), PUBLIC_URL.into())],
        ..Options::default()
    })
    .await;
    config(
        &s,
        &format!(
            "setup_script: echo setup done\nnetwork:\n  allow: [\"allowed.test:{}\", private.test]\n",
            up.port()
        ),
    );
    s.model
        .reply(tool(&fetches(up.port())), "tool_use", usage(1000, 10));
    s.model
        .reply(text("Fetched what I could."), "end_turn", usage(1100, 10));
    s.github.add_issue(REPO, 7, "Fetch things", "", "carol");
    s.comment(7, "alice", "/kodx code fetch the things").await;
    let status = s.finished_status(7).await;
    assert!(status.contains("✅ done"), "{status}\n{}", s.log());

    // What the sandbox saw.
    let seen = s.model.requests()[1].body.to_string();
    assert!(seen.contains("proxy: set"), "{}", s.log());
    assert!(
        seen.contains("allowed: ok 200 hello from upstream"),
        "{seen}\n{}",
        s.log()
    );
    assert!(seen.contains("blocked: http 403"), "{seen}");
    assert!(seen.contains("private: http 403"), "{seen}");
    assert!(seen.contains("direct: error URLError"), "{seen}");

    // Reported where a maintainer looks: the status comment and the pull request, with
    // the line to add; the run page.
    for (what, body) in [
        ("status comment", status.clone()),
        ("pull request", s.github.created_pulls(REPO).remove(0).body),
    ] {
        assert!(
            body.contains("**The egress proxy refused these requests.**"),
            "{what}: {body}"
        );
        assert!(
            body.contains("| `blocked.test` | 80 | 1 |") && body.contains("| `blocked.test` |\n"),
            "{what}: {body}"
        );
        assert!(
            body.contains("| `private.test` | 80 | 1 |")
                && body.contains("resolves only to private, loopback or link-local addresses"),
            "{what}: {body}"
        );
        assert!(!body.contains("allowed.test"), "{what}: {body}");
    }
    let page = s.linked_run_page(&status).await;
    assert!(
        page.contains("egress proxy refused these requests"),
        "{page}"
    );
    assert!(page.contains("<code>blocked.test</code>"), "{page}");
    s.finish().await;
}

#[tokio::test]
async fn an_operator_who_forbids_it_gets_a_sandbox_cut_after_setup() {
    let _engine = common::require_engine!();
    let up = upstream().await;
    let mut s = Served::start(Options {
        workers: true,
        settings: Some(
            "allow_repo_network = false\nnetwork_allow = [\"127.0.0.1/32\"]\n\
             egress_resolve = { \"allowed.test\" = [\"127.0.0.1\"] }\n",
        ),
        ..Options::default()
    })
    .await;
    config(
        &s,
        &format!("network:\n  allow: [\"allowed.test:{}\"]\n", up.port()),
    );
    s.model
        .reply(tool(&fetches(up.port())), "tool_use", usage(1000, 10));
    s.model.reply(text("Nothing."), "end_turn", usage(1100, 10));
    s.github.add_issue(REPO, 8, "Fetch things", "", "carol");
    s.comment(8, "alice", "/kodx ask can you fetch?").await;
    let status = s.finished_status(8).await;
    let seen = s.model.requests()[1].body.to_string();
    assert!(seen.contains("proxy: unset"), "{seen}");
    assert!(seen.contains("allowed: error URLError"), "{seen}");
    assert!(seen.contains("direct: error URLError"), "{seen}");
    assert!(
        status.contains("**`network.allow` was not used:** this kodx's operator does not allow it"),
        "{status}"
    );
    s.finish().await;
}

const SECRET: &str = "npm_REAL_v4lue_7d31";

/// A secret with `hosts:` (SPEC §12): the shells hold only the placeholder; the proxy puts
/// the value on the wire to the secret's host (a TLS server whose certificate comes from a
/// CA `kodx serve` trusts through `SSL_CERT_FILE`; the sandbox trusts the run's CA), and
/// refuses the same placeholder sent to another allowed host, which gets nothing. The value
/// is in no model request, transcript, comment or log.
#[tokio::test]
async fn a_secret_goes_on_the_wire_to_its_host_only() {
    use crate::egress_inject::{test_ca, tls_upstream};
    use base64::Engine as _;
    let _engine = common::require_engine!();
    let ca = test_ca("kodx test upstreams");
    let (secret_port, secret_seen) = tls_upstream("secret.test", &ca).await;
    let (other_port, other_seen) = tls_upstream("other.test", &ca).await;
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("upstream-roots.pem");
    std::fs::write(&roots, &ca.pem).unwrap();
    let key = [7u8; 32];
    let url = format!("sqlite://{}", dir.path().join("kodx.db").display());
    let sealed = kodx::secrets::SecretsKey::from_bytes(key)
        .seal(REPO, "NPM_TOKEN", SECRET.as_bytes())
        .unwrap();
    let db = kodx::db::Db::open(&url).await.unwrap();
    db.put_secret(REPO, "NPM_TOKEN", &sealed).await.unwrap();
    db.close().await;
    let mut s = Served::start(Options {
        workers: true,
        database_url: Some(url),
        settings: Some(
            "network_allow = [\"127.0.0.1/32\"]\n\
             egress_resolve = { \"secret.test\" = [\"127.0.0.1\"], \"other.test\" = [\"127.0.0.1\"] }\n",
        ),
        extra_env: vec![
            (
                "KODX_SECRETS_KEY".into(),
                base64::engine::general_purpose::STANDARD.encode(key),
            ),
            ("SSL_CERT_FILE".into(), roots.display().to_string()),
        ],
        ..Options::default()
    })
    .await;
    config(
        &s,
        &format!(
            "network:\n  allow: [\"other.test:{other_port}\"]\nsecrets:\n  - {{ name: NPM_TOKEN, hosts: [\"secret.test:{secret_port}\"] }}\n"
        ),
    );
    let script = format!(
        r#"echo "token=$NPM_TOKEN"; python3 - <<'PY'
import os, urllib.request as u, urllib.error as e
for url in ['https://secret.test:{secret_port}/pkg', 'https://other.test:{other_port}/pkg']:
    q = u.Request(url, headers={{'Authorization': 'Bearer ' + os.environ['NPM_TOKEN']}})
    try:
        print(url, 'ok', u.urlopen(q, timeout=10).read().decode())
    except e.HTTPError as x:
        print(url, 'http', x.code)
    except Exception as x:
        print(url, 'error', x)
PY"#
    );
    s.model.reply(tool(&script), "tool_use", usage(1000, 10));
    s.model.reply(text("Fetched."), "end_turn", usage(1100, 10));
    s.github
        .add_issue(REPO, 9, "Fetch the package", "", "carol");
    let run = s.comment(9, "alice", "/kodx ask fetch the package").await;
    let status = s.finished_status(9).await;
    let seen = s.model.requests()[1].body.to_string();
    assert!(
        seen.contains("token=kodx-secret:NPM_TOKEN"),
        "{seen}\n{}",
        s.log()
    );
    assert!(
        seen.contains(&format!(
            "https://secret.test:{secret_port}/pkg ok hello from secret.test"
        )),
        "{seen}\n{}",
        s.log()
    );
    assert!(
        seen.contains(&format!("https://other.test:{other_port}/pkg http 403")),
        "{seen}"
    );
    // The secret's host got the value; the other host got nothing.
    let got: Vec<String> = secret_seen
        .lock()
        .unwrap()
        .iter()
        .filter_map(|h| {
            h.get("authorization")
                .map(|v| v.to_str().unwrap().to_string())
        })
        .collect();
    assert_eq!(got, vec![format!("Bearer {SECRET}")]);
    assert!(
        other_seen.lock().unwrap().is_empty(),
        "other.test got a request"
    );
    // Refused and reported, with why.
    assert!(
        status.contains(&format!("| `other.test` | {other_port} | 1 |"))
            && status.contains("carried the placeholder of NPM\\_TOKEN to a host it is not for"),
        "{status}"
    );
    // The value is nowhere the model, a person or the log can see.
    for (i, r) in s.model.requests().iter().enumerate() {
        assert!(
            !r.body.to_string().contains(SECRET),
            "the secret in model request {i}"
        );
    }
    for r in s.records(&run.0, "tool_result").await {
        assert!(
            !r.to_string().contains(SECRET),
            "the secret in the transcript"
        );
    }
    assert!(!status.contains(SECRET));
    assert!(!s.log().contains(SECRET), "the secret in the server log");
    s.finish().await;
}
