//! `kodx doctor --healthz URL`, and the one-line errors doctor prints.

use std::process::ExitCode;
use std::time::Duration;

use kodx::github::USER_AGENT;

/// An error and its causes on one line (reqwest's own message is only the outermost).
pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let message = s.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = s.source();
    }
    text
}

/// `--healthz URL`: exit 0 on 200; otherwise one line saying why, exit 1.
pub(super) async fn healthz(url: &str) -> ExitCode {
    let client = match reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(10))
        .user_agent(USER_AGENT)
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            println!("unhealthy: cannot build an HTTP client: {e}");
            return ExitCode::FAILURE;
        }
    };
    match client.get(url).send().await {
        Ok(r) if r.status().as_u16() == 200 => ExitCode::SUCCESS,
        Ok(r) => {
            let status = r.status().as_u16();
            let body = r.text().await.unwrap_or_default();
            let body: String = body
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .chars()
                .take(300)
                .collect();
            println!("unhealthy: {url} answered {status}: {body}");
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("unhealthy: {url}: {}", error_chain(&e.without_url()));
            ExitCode::FAILURE
        }
    }
}
