//! `kodx operator-link`: prints a link to the operator's list of runs (`/runs`), to
//! `/healthz`'s details and to what runs cost (`/usage`, as `kodx usage` prints it), valid for a while (24 h unless `--valid` says otherwise, at most
//! 30 days), made with the operator key in `KODX_DATA_DIR`. `--rotate` first replaces
//! that key: every operator link made before stops working, in every running process,
//! without a restart. Run pages' links are not touched.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use kodx::serve::config::SetupConfig;
use kodx::serve::keys::{OperatorKey, DEFAULT_VALID, MAX_VALID};

#[derive(clap::Args)]
pub struct OperatorLinkArgs {
    /// How long the link works: `24h`, `7d`, `90m` … (at most 30 days).
    #[arg(long, value_parser = parse_valid, default_value = "24h")]
    valid: Duration,
    /// Replace the operator key first: every earlier operator link stops working.
    #[arg(long)]
    rotate: bool,
}

fn parse_valid(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e}: say how long, e.g. 24h, 7d or 90m"))?;
    if d.is_zero() {
        return Err("a link valid for no time opens nothing: say e.g. 24h".into());
    }
    if d > MAX_VALID {
        return Err(format!(
            "at most {} (30 days): make a new link when it ends",
            humantime::format_duration(MAX_VALID)
        ));
    }
    Ok(d)
}

pub fn run(args: OperatorLinkArgs) -> anyhow::Result<ExitCode> {
    let config = SetupConfig::from_env()?;
    let dir = &config.data_dir;
    if args.rotate {
        OperatorKey::rotate(dir).with_context(|| {
            format!(
                "replacing the operator key in KODX_DATA_DIR={}",
                dir.display()
            )
        })?;
        eprintln!("kodx: a new operator key: every earlier operator link has stopped working");
    }
    let key = OperatorKey::open(dir)
        .with_context(|| format!("the operator key in KODX_DATA_DIR={}", dir.display()))?;
    let (token, expires) = key.issue(args.valid)?;
    let base = config
        .public_url
        .as_deref()
        .map(|u| u.trim_end_matches('/').to_string());
    let until = humantime::format_rfc3339_seconds(expires);
    match &base {
        Some(base) => {
            println!("{base}/runs?token={token}");
            println!("{base}/healthz?token={token}");
            println!("{base}/usage?token={token}");
        }
        None => {
            println!("/runs?token={token}");
            println!("/healthz?token={token}");
            println!("/usage?token={token}");
        }
    }
    eprintln!(
        "valid until {until}{}",
        if base.is_none() {
            " (paths: set KODX_PUBLIC_URL for whole addresses)"
        } else {
            ""
        }
    );
    if args.valid == DEFAULT_VALID {
        eprintln!("`--valid 7d` makes a longer one; `--rotate` ends every earlier one");
    }
    Ok(ExitCode::SUCCESS)
}
