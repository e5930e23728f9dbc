//! Secrets injected on the wire by kodx's egress proxy (SPEC §12, "Egress by name"), on
//! loopback: the real proxy with a run's CA, real TLS servers with certificates from a test
//! CA the proxy trusts as its upstream roots, plain HTTP servers, and `reqwest` as the
//! sandbox's client (trusting only the run's CA, through the proxy). The client sends the
//! placeholder; only the secret's own host receives the value; the same placeholder to
//! another host is refused and recorded and that host gets nothing; an upstream with a
//! certificate the roots do not vouch for is a 502 saying so; without an injector a
//! `CONNECT` is still a raw tunnel.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::HeaderMap;
use hyper_util::rt::TokioIo;
use kodx::egress::{AllowList, EgressProxy, Injection, Injector, Policy, Resolver, RunCa};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

const VALUE: &str = "npm_REAL_v4lue_8f2c";
const PLACEHOLDER: &str = "Bearer kodx-secret:NPM_TOKEN";

pub(crate) type Seen = Arc<Mutex<Vec<HeaderMap>>>;

/// A CA for the test's upstream servers.
pub(crate) struct TestCa {
    pub(crate) pem: String,
    der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

pub(crate) fn test_ca(name: &str) -> TestCa {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    TestCa {
        pem: cert.pem(),
        der: cert.der().clone(),
        issuer: Issuer::new(params, key),
    }
}

/// A TLS server for `name` (certificate signed by `ca`) on 127.0.0.1 that keeps every
/// request's headers and answers `hello from <name> <path>`.
pub(crate) async fn tls_upstream(name: &'static str, ca: &TestCa) -> (u16, Seen) {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &ca.issuer)
        .unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
    .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let keep = seen.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, keep) = (acceptor.clone(), keep.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), recorder(name, keep))
                    .await;
            });
        }
    });
    (port, seen)
}

/// A plain HTTP server on 127.0.0.1 that keeps every request's headers.
async fn plain_upstream(name: &'static str) -> (u16, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let keep = seen.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let keep = keep.clone();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), recorder(name, keep))
                    .await;
            });
        }
    });
    (port, seen)
}

fn recorder(
    name: &'static str,
    keep: Seen,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = hyper::Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        keep.lock().unwrap().push(req.headers().clone());
        let body = format!("hello from {name} {}", req.uri().path());
        async move { Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(body)))) }
    })
}

/// The sandbox's client: everything through the proxy, trusting only `roots`.
fn client(proxy: SocketAddr, roots: &[&str]) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{proxy}")).unwrap())
        .tls_certs_only(
            roots
                .iter()
                .map(|pem| reqwest::Certificate::from_pem(pem.as_bytes()).unwrap()),
        )
        .build()
        .unwrap()
}

/// A proxy that resolves every name given to 127.0.0.1, and a sandbox at 127.0.0.1 whose
/// operator opened 127.0.0.0/8.
async fn proxy_for(
    names: &[&str],
    allow: &[String],
    inject: Option<Arc<Injector>>,
) -> (EgressProxy, kodx::egress::Registration) {
    let local: IpAddr = "127.0.0.1".parse().unwrap();
    let hosts: HashMap<String, Vec<IpAddr>> =
        names.iter().map(|n| (n.to_string(), vec![local])).collect();
    let proxy = EgressProxy::start("127.0.0.1:0".parse().unwrap(), Resolver::Hosts(hosts), 64)
        .await
        .unwrap();
    let sandbox = proxy.register(
        local,
        Policy {
            allow: AllowList::parse(allow.iter().map(String::as_str)).unwrap(),
            operator: vec!["127.0.0.0/8".parse().unwrap()],
            inject,
        },
    );
    (proxy, sandbox)
}

fn roots(ca: &TestCa) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der.clone()).unwrap();
    roots
}

fn authorizations(seen: &Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|h| {
            h.get("authorization")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default()
        })
        .collect()
}

#[tokio::test]
async fn a_secret_reaches_its_own_host_only() {
    let upstream_ca = test_ca("upstream test CA");
    let (secret_tls, secret_seen) = tls_upstream("secret.test", &upstream_ca).await;
    let (other_tls, other_seen) = tls_upstream("other.test", &upstream_ca).await;
    let (secret_plain, secret_plain_seen) = plain_upstream("secret.test").await;
    let (other_plain, other_plain_seen) = plain_upstream("plain.test").await;

    let run_ca = RunCa::new("r1").unwrap();
    let run_pem = run_ca.cert_pem().to_string();
    let injection = Injection {
        name: "NPM_TOKEN".into(),
        value: VALUE.into(),
        // Not in network.allow: the secret's hosts are reachable by naming them here.
        hosts: AllowList::parse([
            format!("secret.test:{secret_tls}").as_str(),
            format!("secret.test:{secret_plain}").as_str(),
        ])
        .unwrap(),
    };
    let injector = Arc::new(Injector::new(run_ca, vec![injection], roots(&upstream_ca)));
    let (proxy, sandbox) = proxy_for(
        &["secret.test", "other.test", "plain.test"],
        &[
            format!("other.test:{other_tls}"),
            format!("plain.test:{other_plain}"),
        ],
        Some(injector),
    )
    .await;
    let http = client(proxy.addr(), &[&run_pem]);
    let mut answers = Vec::new();

    // Over TLS to the secret's host: the server gets the value, the client its answer.
    let r = http
        .get(format!("https://secret.test:{secret_tls}/pkg"))
        .header("authorization", PLACEHOLDER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    assert_eq!(body, "hello from secret.test /pkg");
    answers.push(body);
    assert_eq!(authorizations(&secret_seen), [format!("Bearer {VALUE}")]);

    // The same placeholder to another allowed TLS host: refused, and it got nothing.
    let r = http
        .get(format!("https://other.test:{other_tls}/steal"))
        .header("authorization", PLACEHOLDER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("carried the placeholder of NPM_TOKEN to a host it is not for"),
        "{body}"
    );
    answers.push(body);
    assert!(other_seen.lock().unwrap().is_empty());
    // Without a placeholder, the same host answers through the terminated tunnel.
    let r = http
        .get(format!("https://other.test:{other_tls}/clean"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "hello from other.test /clean");
    assert_eq!(authorizations(&other_seen), [String::new()]);

    // Plain HTTP: to another allowed host refused, to the secret's host replaced.
    let r = http
        .get(format!("http://plain.test:{other_plain}/steal"))
        .header("authorization", PLACEHOLDER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    answers.push(r.text().await.unwrap());
    assert!(other_plain_seen.lock().unwrap().is_empty());
    let r = http
        .get(format!("http://secret.test:{secret_plain}/plain"))
        .header("authorization", PLACEHOLDER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "hello from secret.test /plain");
    assert_eq!(
        authorizations(&secret_plain_seen),
        [format!("Bearer {VALUE}")]
    );

    let blocked: Vec<(String, u16, u64, String, Option<String>)> = sandbox
        .blocked()
        .into_iter()
        .map(|b| (b.host, b.port, b.count, b.why, b.suggestion))
        .collect();
    let why = "carried the placeholder of NPM_TOKEN to a host it is not for".to_string();
    assert_eq!(
        blocked,
        vec![
            ("other.test".into(), other_tls, 1, why.clone(), None),
            ("plain.test".into(), other_plain, 1, why, None),
        ]
    );
    for a in &answers {
        assert!(!a.contains(VALUE), "{a}");
    }
}

#[tokio::test]
async fn an_upstream_the_roots_do_not_vouch_for_is_a_502() {
    let trusted = test_ca("upstream test CA");
    let stranger = test_ca("a CA nobody trusts");
    let (port, seen) = tls_upstream("secret.test", &stranger).await;
    let run_ca = RunCa::new("r2").unwrap();
    let run_pem = run_ca.cert_pem().to_string();
    let injection = Injection {
        name: "NPM_TOKEN".into(),
        value: VALUE.into(),
        hosts: AllowList::parse([format!("secret.test:{port}").as_str()]).unwrap(),
    };
    let injector = Arc::new(Injector::new(run_ca, vec![injection], roots(&trusted)));
    let (proxy, _sandbox) = proxy_for(&["secret.test"], &[], Some(injector)).await;
    let r = client(proxy.addr(), &[&run_pem])
        .get(format!("https://secret.test:{port}/pkg"))
        .header("authorization", PLACEHOLDER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("invalid peer certificate: UnknownIssuer"),
        "{body}"
    );
    assert!(!body.contains(VALUE));
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn without_an_injector_connect_stays_a_raw_tunnel() {
    let upstream_ca = test_ca("upstream test CA");
    let (port, seen) = tls_upstream("secret.test", &upstream_ca).await;
    let (proxy, _sandbox) =
        proxy_for(&["secret.test"], &[format!("secret.test:{port}")], None).await;
    let url = format!("https://secret.test:{port}/raw");
    // A client trusting only the upstream's CA gets through: it saw the upstream's own
    // certificate, and the placeholder reaches the server untouched.
    let r = client(proxy.addr(), &[&upstream_ca.pem])
        .get(&url)
        .header("authorization", PLACEHOLDER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "hello from secret.test /raw");
    assert_eq!(authorizations(&seen), [PLACEHOLDER.to_string()]);
    // A client trusting only a run's CA does not: nobody terminated its TLS.
    let run_ca = RunCa::new("r3").unwrap();
    let e = client(proxy.addr(), &[run_ca.cert_pem()])
        .get(&url)
        .send()
        .await
        .unwrap_err();
    assert!(e.is_connect(), "{e:?}");
}
