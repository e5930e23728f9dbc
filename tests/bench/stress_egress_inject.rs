//! Stress figure of secrets injected on the wire (issue 39), for
//! `bash bench/stress.sh egress_inject`: the real egress proxy with a run's CA, in this
//! bench process, on loopback, in front of a TLS upstream (its certificate from a test CA
//! the proxy trusts). 500 sandbox clients each open a `CONNECT` tunnel, their own TLS
//! (trusting only the run's CA, so the proxy terminates it), send one request carrying the
//! placeholder and keep the tunnel open; then one tunnel sends 200 requests one after the
//! other. Printed: the process's resident memory (VmRSS) before and with the 500 tunnels
//! open (each holds two TLS sessions in the proxy, and the bench's own client and server
//! sessions are in the same process), against the target (kodx under 150 MB); the median
//! time to open a tunnel and get its first answer (CONNECT, two TLS handshakes, one
//! request); the median time of a request on an open tunnel.
//!
//!     cargo test --release --test bench -- --ignored --nocapture stress_egress_inject::

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use kodx::egress::{AllowList, EgressProxy, Injection, Injector, Policy, Resolver, RunCa};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::stats::median;

const TUNNELS: usize = 500;
const REQUESTS: usize = 200;
const VALUE: &str = "npm_bench_v4lue";

fn rss_kb() -> u64 {
    crate::stats::vm_rss_kb(None)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS upstream for `secret.test` counting the requests that carried the real value.
async fn upstream(got_value: Arc<AtomicUsize>) -> (u16, rustls::RootCertStore) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["secret.test".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, got) = (acceptor.clone(), got_value.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let real = req
                        .headers()
                        .get("authorization")
                        .is_some_and(|v| v.as_bytes() == format!("Bearer {VALUE}").as_bytes());
                    if real {
                        got.fetch_add(1, Ordering::Relaxed);
                    }
                    async {
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from("ok"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    (port, roots)
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// A sandbox client's tunnel: CONNECT, its TLS (trusting `client`'s roots), HTTP/1.1.
async fn open(proxy: SocketAddr, port: u16, client: Arc<rustls::ClientConfig>) -> Sender {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    let target = format!("secret.test:{port}");
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 256];
    let n = s.read(&mut head).await.unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 200"));
    let tls = tokio_rustls::TlsConnector::from(client)
        .connect(ServerName::try_from("secret.test").unwrap(), s)
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

async fn ask(sender: &mut Sender, port: u16) {
    let req = hyper::Request::get("/pkg")
        .header("host", format!("secret.test:{port}"))
        .header("authorization", "Bearer kodx-secret:NPM_TOKEN")
        .body(Empty::new())
        .unwrap();
    // The connection takes the next request once it is done with the last one.
    sender.ready().await.unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn injected_secrets_under_load() {
    let got = Arc::new(AtomicUsize::new(0));
    let (port, roots) = upstream(got.clone()).await;
    let local: IpAddr = "127.0.0.1".parse().unwrap();
    let hosts = HashMap::from([("secret.test".to_string(), vec![local])]);
    let proxy = EgressProxy::start("127.0.0.1:0".parse().unwrap(), Resolver::Hosts(hosts), 4096)
        .await
        .unwrap();
    let run_ca = RunCa::new("bench").unwrap();
    let mut trust = rustls::RootCertStore::empty();
    trust.add(run_ca.cert_der().clone()).unwrap();
    let injection = Injection {
        name: "NPM_TOKEN".into(),
        value: VALUE.into(),
        hosts: AllowList::parse([format!("secret.test:{port}").as_str()]).unwrap(),
    };
    let _sandbox = proxy.register(
        local,
        Policy {
            allow: AllowList::default(),
            operator: vec!["127.0.0.0/8".parse().unwrap()],
            inject: Some(Arc::new(Injector::new(run_ca, vec![injection], roots))),
        },
    );
    let mut client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(trust)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    let client = Arc::new(client);

    let before = rss_kb();
    let mut open_ms = Vec::new();
    let mut tunnels = Vec::new();
    for _ in 0..TUNNELS {
        let started = Instant::now();
        let mut sender = open(proxy.addr(), port, client.clone()).await;
        ask(&mut sender, port).await;
        open_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        tunnels.push(sender);
    }
    let with_tunnels = rss_kb();
    let mut request_ms = Vec::new();
    for _ in 0..REQUESTS {
        let started = Instant::now();
        ask(&mut tunnels[0], port).await;
        request_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let delivered = got.load(Ordering::Relaxed);
    println!(
        "\nsecrets injected on the wire: {TUNNELS} intercepted tunnels held open, then {REQUESTS} requests on one ({delivered} arrived with the value)"
    );
    println!(
        "  RSS before {} MB, with the tunnels open {} MB (target: kodx under 150 MB: {})",
        before / 1024,
        with_tunnels / 1024,
        if with_tunnels < 150 * 1024 {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "  opening a tunnel and its first answer: median {:.2} ms; a request on an open tunnel: median {:.2} ms",
        median(open_ms),
        median(request_ms)
    );
    assert_eq!(delivered, TUNNELS + REQUESTS);
    assert!(with_tunnels < 150 * 1024, "RSS over the target");
}
