//! A sandbox narrowed to kodx's egress proxy after its setup (SPEC §12, "Egress by name"),
//! on the real engine, both ways a sandbox joins the network (plugged by the engine's
//! fencer, and through the engine where the fencer cannot run): the setup script has the
//! network; afterwards the shells find the proxy in `HTTPS_PROXY`, reach the gateway on the
//! proxy's port and nothing else (not another port of the gateway, not a public address),
//! trust the run's CA through `SSL_CERT_FILE`, and the sandbox's address is known for the
//! proxy to serve it by.

use std::net::Ipv4Addr;

use crate::common;
use crate::common::net::*;
use crate::common::*;
use kodx::sandbox::{EgressSpec, Engine, Sandbox};

const CA: &str = "-----BEGIN CERTIFICATE-----\nTESTCA\n-----END CERTIFICATE-----\n";

/// A listener on the gateway answering each connection with `what`.
async fn on_gateway(gateway: Ipv4Addr, what: &'static [u8]) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind((gateway, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(what).await;
        }
    });
    (port, task)
}

/// Python printing, for each `host:port`, what a connection read or why it failed.
fn connects(targets: &[String]) -> String {
    let list = targets
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "python3 -c \"import socket\nfor t in [{list}]:\n    h, p = t.rsplit(':', 1)\n    try:\n        s = socket.create_connection((h, int(p)), 3); print(t, 'read', s.recv(64).decode())\n    except Exception as e: print(t, 'failed', type(e).__name__, getattr(e, 'errno', ''))\""
    )
}

async fn narrowed(engine: &Engine, name: &str) {
    let gateway = sandbox_gateway(engine).await;
    let (proxy_port, proxy) = on_gateway(gateway, b"proxy here").await;
    let (other_port, other) = on_gateway(gateway, b"other port").await;
    let mut spec = spec(name);
    // The setup has the network: it reaches the other port.
    spec.setup_script = Some(format!(
        "{} > /tmp/setup.txt",
        connects(&[format!("{gateway}:{other_port}")])
    ));
    spec.allowed_cidrs = vec![format!("{gateway}/32").parse().unwrap()];
    spec.egress = Some(EgressSpec {
        port: proxy_port,
        ca_pem: Some(CA.to_string()),
        placeholders: vec!["NPM_TOKEN".into()],
    });
    let sb = start(engine, &spec).await;
    let addr = sb
        .egress_address()
        .expect("the sandbox's address on the network");
    assert!(sandbox_subnet(engine).await.contains_addr(addr), "{addr}");
    let targets = [
        format!("{gateway}:{proxy_port}"),
        format!("{gateway}:{other_port}"),
        "1.1.1.1:80".to_string(),
    ];
    let out = sb
        .feed_chars(
            "default",
            &format!(
                "cat /tmp/setup.txt; echo \"proxy=$HTTPS_PROXY no=$NO_PROXY token=$NPM_TOKEN\"; grep -c TESTCA \"$SSL_CERT_FILE\" \"$NODE_EXTRA_CA_CERTS\"; {}",
                connects(&targets)
            ),
            60 * SEC,
        )
        .await
        .unwrap()
        .output;
    assert!(
        out.contains(&format!("{gateway}:{other_port} read other port")),
        "the setup had the network: {out}"
    );
    assert!(
        out.contains(&format!(
            "proxy=http://{gateway}:{proxy_port} no=localhost,127.0.0.1,::1"
        )),
        "{out}"
    );
    assert!(
        out.contains("ca-bundle.pem:1") && out.contains("egress-ca.pem:1"),
        "{out}"
    );
    assert!(
        out.contains(&format!("{gateway}:{proxy_port} read proxy here")),
        "the proxy's port: {out}"
    );
    assert!(
        out.contains(&format!("{gateway}:{other_port} failed")),
        "another port of the gateway: {out}"
    );
    assert!(
        out.contains("1.1.1.1:80 failed OSError 101"),
        "a public address fails at once (no route): {out}"
    );
    sb.destroy().await.unwrap();
    proxy.abort();
    other.abort();
}

#[tokio::test]
async fn a_plugged_sandbox_reaches_only_the_proxy_after_setup() {
    let engine = common::require_engine!();
    narrowed(&engine, "egress-plugged").await;
}

#[tokio::test]
async fn a_sandbox_joined_through_the_engine_reaches_only_the_proxy_after_setup() {
    let engine = common::require_engine!();
    kodx::sandbox::net::refuse_fencer(engine.host());
    narrowed(&engine, "egress-joined").await;
}
