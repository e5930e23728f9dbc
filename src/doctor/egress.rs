//! `kodx doctor`'s check of the egress proxy on one engine (SPEC §12, "Egress by name"):
//! whether kodx can listen on the engine's sandbox network (it can only on the engine's
//! host), and whether a sandbox narrowed to the proxy reaches it (a host firewall may drop
//! what the bridge sends to the host). The sandbox asks the proxy for a name nobody allows
//! with kodx's own helper, so the image needs no HTTP client: a `403` from the proxy is
//! the proof.

use std::net::IpAddr;
use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecResults};
use futures_util::StreamExt as _;
use kodx::egress::{Policy, Proxies, Resolver};
use kodx::sandbox::{EgressSpec, Engine, Sandbox, SandboxSpec};

/// The check's line, as the report prints it.
pub(super) enum Line {
    Ok(String),
    Note(String),
    Warn(String),
    /// What is wrong, and what to do.
    Fail(String, &'static str),
}

pub(super) async fn check(engine: &Engine, image: &str) -> Line {
    let network =
        match kodx::sandbox::net::ensure_network(engine.docker(), kodx::sandbox::net::NETWORK_NAME)
            .await
        {
            Ok(n) => n,
            Err(e) => return Line::Warn(format!("egress proxy: the sandboxes' network: {e}")),
        };
    let proxies = Proxies::new(Resolver::System, 4);
    let proxy = match proxies.on(engine.host(), network.gateway).await {
        Ok(p) => p,
        Err(why) => {
            return Line::Note(format!(
                "egress proxy: {why}; on this engine a repository's network.allow is not \
                 used (its sandboxes are cut from the network after setup, and the status \
                 comment says why)"
            ))
        }
    };
    let addr = proxy.addr();
    if engine.docker().inspect_image(image).await.is_err() {
        return Line::Note(format!(
            "egress proxy: kodx can listen on {} (the sandboxes' gateway); not tried from a \
             sandbox, as the image {image} is not present",
            network.gateway
        ));
    }
    let mut spec = SandboxSpec::new(format!("doctor-{:08x}", rand::random::<u32>()), image);
    spec.egress = Some(EgressSpec {
        port: addr.port(),
        ca_pem: None,
        placeholders: Vec::new(),
    });
    let sandbox = match engine.start(&spec).await {
        Ok(s) => s,
        Err(e) => return Line::Warn(format!("egress proxy: a sandbox to try it from: {e}")),
    };
    let registered = sandbox
        .egress_address()
        .map(|ip| proxy.register(IpAddr::V4(ip), Policy::default()));
    let probe = vec![
        kodx::sandbox::net::SANDBOX_HELPER_PATH.to_string(),
        "probe".to_string(),
        format!("{:08x}", u32::from(network.gateway)),
        addr.port().to_string(),
    ];
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        exec(engine, sandbox.container_id(), probe),
    )
    .await
    .unwrap_or_else(|_| Err("no answer within 20 s".to_string()));
    drop(registered);
    let _ = sandbox.destroy().await;
    match answer {
        Ok(output) if output.contains(" 403") => Line::Ok(format!(
            "egress proxy: a sandbox reaches it on the sandboxes' gateway ({} here; it \
             refused a name nobody allows with 403), so a repository's network.allow works \
             on this engine",
            network.gateway
        )),
        Ok(output) => Line::Fail(
            format!(
                "egress proxy: a sandbox narrowed to it at {addr} did not get its answer: {}",
                output.trim()
            ),
            "let TCP from the sandboxes' bridge reach this host (a firewall's INPUT chain), \
             or set allow_repo_network = false",
        ),
        Err(e) => Line::Warn(format!(
            "egress proxy: trying it from a sandbox failed: {e}"
        )),
    }
}

/// What `args` printed, run in container `id` as an engine exec of its own (kodx's helper
/// needs no shell in the image).
async fn exec(engine: &Engine, id: &str, args: Vec<String>) -> Result<String, String> {
    let docker = engine.docker();
    let made = docker
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(args),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    if let StartExecResults::Attached { mut output, .. } = docker
        .start_exec(&made.id, None)
        .await
        .map_err(|e| e.to_string())?
    {
        while let Some(Ok(chunk)) = output.next().await {
            if text.len() < 4096 {
                text.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
            }
        }
    }
    Ok(text)
}
