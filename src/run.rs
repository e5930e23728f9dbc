//! `kodx run`: one agent run on a local directory, with the Python kodx's options (SPEC §8).

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use kodx::agent::{Agent, Outcome, Progress, Record, StopReason};
use kodx::checks::verify::{FreshSandboxes, Verifier};
use kodx::cost::{format_usd, Pricing};
use kodx::model::{Provider, Usage};
use kodx::program::{self, Defaults, DotKodxConfig, Overrides, Plan, Program};
use kodx::providers::{AnthropicClient, OpenAiClient};
use kodx::sandbox::{
    Cidr, DockerSandbox, Engine, NetworkMode, Sandbox, SandboxError, DEFAULT_MAX_DISK_BYTES,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[derive(clap::Args)]
pub struct RunArgs {
    /// Program file (YAML/TOML), or a built-in: assistant, ask, code. Default: assistant.
    program_path: Option<PathBuf>,
    /// Directory copied into the container ("" for a clean container).
    #[arg(long, default_value = ".")]
    repo_dir: String,
    /// The prompt (else --prompt-file, else standard input).
    #[arg(long, short = 'p')]
    prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Docker image [default: the program's, else $KODX_IMAGE, else python:3.12].
    #[arg(long)]
    image: Option<String>,
    /// Script run in the container before the task (bash, network on).
    #[arg(long)]
    setup_script: Option<PathBuf>,
    /// Write the final workspace here (replacing what is there).
    #[arg(long)]
    export_dir: Option<PathBuf>,
    /// Hard cost limit in USD [default: the program's, else .kodx/config.toml's, else 1.00].
    #[arg(long)]
    cost_limit: Option<f64>,
    /// Most model calls [default: the program's, else 50].
    #[arg(long)]
    max_iterations: Option<u32>,
    /// Cut the container's network after the setup script.
    #[arg(long)]
    disable_network_after_setup: bool,
    /// Keep the container after a successful setup script as a local image
    /// (`kodx-setup:…`) and start from it next time the image, the script, this checkout's
    /// path and its lockfiles are the same (the script is then skipped).
    #[arg(long)]
    setup_cache: bool,
    /// The container's network: on, setup-only (cut after the setup script), off (none,
    /// not even for setup). The host, link-local and private ranges are never reachable.
    #[arg(long, default_value = "on", value_parser = clap::builder::PossibleValuesParser::new(NetworkMode::NAMES))]
    network: String,
    /// An IPv4 range the container may reach although it is private or the host's
    /// (e.g. 10.20.0.0/16, or 192.168.1.5 for one address); repeatable.
    #[arg(long, value_name = "CIDR")]
    network_allow: Vec<Cidr>,
    /// After the setup script, the container reaches only this host, through kodx's
    /// egress proxy (`host`, `*.suffix` or an address, optional `:port`; 80 and 443
    /// without one); repeatable. What the proxy refused is printed at the end.
    #[arg(long, value_name = "HOST")]
    allow_host: Vec<String>,
    /// Print the result as JSON instead of the last message.
    #[arg(long)]
    json: bool,
    /// Write the JSON result to this file.
    #[arg(long)]
    json_output_file: Option<PathBuf>,
    /// Only the result: no progress on stderr.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Model name (overrides the program's).
    #[arg(long)]
    model: Option<String>,
    /// Wall-clock limit of the run in seconds.
    #[arg(long, default_value_t = 1800)]
    timeout: u64,
    /// Write the transcript here: one JSON object per line (request, response, tool_call,
    /// tool_result, stop), each message once; see the `kodx::transcript` docs.
    #[arg(long)]
    transcript: Option<PathBuf>,
    /// Continue the conversation of an earlier run from the transcript it wrote
    /// (`--transcript`), in a new container of --repo-dir, with this run's limits; a prompt,
    /// if given, is added to it.
    #[arg(long, value_name = "TRANSCRIPT.jsonl")]
    resume: Option<PathBuf>,
    /// Extra prices (TOML, same shape as config/pricing.toml).
    #[arg(long, env = "KODX_PRICING")]
    pricing: Option<PathBuf>,
    /// A check kodx runs in the container when the model ends its turn, as NAME=COMMAND
    /// (e.g. --check "tests=cargo test"); repeatable. A red check goes back to the model
    /// for repair (--check-repair times), as `checks:` does on GitHub.
    #[arg(long, value_name = "NAME=COMMAND", value_parser = parse_check)]
    check: Vec<kodx::checks::CheckSpec>,
    /// Passes the model gets to fix red checks (0: report only).
    #[arg(long, default_value_t = kodx::checks::DEFAULT_CHECK_REPAIR)]
    check_repair: u32,
}

fn parse_check(text: &str) -> Result<kodx::checks::CheckSpec, String> {
    kodx::checks::CheckSpec::parse_flag(text)
}

/// Progress on stderr: one line rewritten in place on a terminal, plain lines otherwise.
struct Reporter {
    quiet: bool,
    tty: bool,
    lines: Vec<String>,
}

impl Reporter {
    fn note(&mut self, line: &str) {
        self.lines.push(line.to_string());
        if self.quiet {
            return;
        }
        if self.tty {
            eprint!("\r\x1b[2K{line}\n");
        } else {
            eprintln!("{line}");
        }
    }

    fn progress(&mut self, p: &Progress) {
        if self.quiet {
            return;
        }
        let line = format!(
            "step {} · {} · {} of {} · {}s",
            p.step,
            p.action,
            format_usd(p.spent),
            format_usd(p.limit),
            p.elapsed.as_secs()
        );
        if self.tty {
            let width = 120;
            let shown: String = line.chars().take(width).collect();
            eprint!("\r\x1b[2K{shown}");
            let _ = std::io::stderr().flush();
        } else {
            eprintln!("{line}");
        }
    }

    fn done(&mut self) {
        if self.tty && !self.quiet {
            eprint!("\r\x1b[2K");
        }
    }
}

/// The conversation a transcript file holds, ready to go on with `extra` (the prompt of
/// this run, maybe empty) told after the resume note.
fn resumed_messages(path: &Path, extra: &str) -> anyhow::Result<Vec<kodx::model::Message>> {
    use kodx::transcript::{ResumeError, Resumer, MAX_RESUME_BYTES};
    use std::io::BufRead;
    let file = std::fs::File::open(path)
        .with_context(|| format!("--resume {}: cannot open it", path.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if size > MAX_RESUME_BYTES {
        bail!(
            "--resume {}: {} bytes is more than a transcript kodx reads ({} MiB)",
            path.display(),
            size,
            MAX_RESUME_BYTES >> 20
        );
    }
    let mut resumer = Resumer::default();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("--resume {}: reading it", path.display()))?;
        match resumer.push(&line) {
            Ok(()) => {}
            Err(ResumeError::Record { problem, .. }) => {
                bail!("--resume {} line {}: {problem}", path.display(), i + 1)
            }
            Err(e) => bail!("--resume {}: {e}", path.display()),
        }
    }
    resumer.finish(extra).map_err(|e| match e {
        ResumeError::NoRequest => anyhow::anyhow!(
            "--resume {}: no model request in it; pass the file `kodx run --transcript` wrote",
            path.display()
        ),
        e => anyhow::anyhow!("--resume {}: {e}", path.display()),
    })
}

fn read_prompt(args: &RunArgs) -> anyhow::Result<String> {
    let prompt = if let Some(p) = &args.prompt {
        p.clone()
    } else if let Some(f) = &args.prompt_file {
        std::fs::read_to_string(f)
            .with_context(|| format!("reading the prompt file {}", f.display()))?
    } else if !std::io::stdin().is_terminal() {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the prompt from standard input")?;
        s
    } else {
        String::new()
    };
    if prompt.trim().is_empty() && args.resume.is_none() {
        bail!("no prompt: pass --prompt \"…\", --prompt-file FILE, or pipe it on standard input");
    }
    Ok(prompt)
}

fn load_program(args: &RunArgs, repo: Option<&Path>) -> anyhow::Result<(Program, Option<f64>)> {
    let repo_config = match repo {
        Some(dir) => DotKodxConfig::load(dir)?,
        None => None,
    };
    // `ask` / `code` name the repository's own program when its .kodx/config.toml sets one
    // (as the Python kodx does), else the built-in of that name.
    let configured = |name: &str| match (name, &repo_config) {
        ("ask", Some(c)) => c.ask_program.clone(),
        ("code", Some(c)) => c.code_program.clone(),
        _ => None,
    };
    let program = match &args.program_path {
        Some(path) if !path.exists() && configured(&path.to_string_lossy()).is_some() => {
            let file = configured(&path.to_string_lossy()).expect("checked");
            Program::load(&file)?
        }
        Some(path) if !path.exists() => {
            let name = path.to_string_lossy();
            Program::builtin(&name).with_context(|| {
                format!(
                    "no program file {} (and no built-in of that name: {})",
                    path.display(),
                    Program::builtin_names().join(", ")
                )
            })?
        }
        Some(path) => Program::load(path)?,
        None => Program::builtin("assistant").expect("the built-in assistant"),
    };
    Ok((program, repo_config.and_then(|c| c.cost_limit)))
}

fn provider_for(program: &Program) -> anyhow::Result<Box<dyn Provider>> {
    Ok(match program.model.provider {
        program::ProviderKind::Anthropic => {
            Box::new(AnthropicClient::from_env().map_err(anyhow::Error::msg)?)
        }
        program::ProviderKind::OpenAi => {
            Box::new(OpenAiClient::from_env().map_err(anyhow::Error::msg)?)
        }
    })
}

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let mut out = Reporter {
        quiet: args.quiet,
        tty: std::io::stderr().is_terminal(),
        lines: Vec::new(),
    };
    // Everything a user can get wrong is checked before a container starts.
    let repo = repo_dir(&args)?;
    let prompt = read_prompt(&args)?;
    let resumed = match &args.resume {
        Some(path) => Some(resumed_messages(path, &prompt)?),
        None => None,
    };
    let (program, repo_cost_limit) = load_program(&args, repo.as_deref())?;
    let Plan {
        program,
        sandbox: mut spec,
        agent: config,
    } = plan_run(&args, repo, program, repo_cost_limit)?;
    let provider = provider_for(&program)?;
    let mut transcript = open_transcript(&args)?;

    // The model's HTTP client is made while the engine is reached and the sandbox starts.
    drop(tokio::task::spawn_blocking(
        kodx::providers::prepare_http_client,
    ));
    let engine = Engine::connect().await?;
    let egress = crate::run_egress::CliEgress::prepare(
        &engine,
        &args.allow_host,
        &args.network_allow,
        &mut spec,
    )
    .await?;

    let started = std::time::Instant::now();
    // Dead processes' containers are removed while this one starts: none of them is
    // this run's business, and the start need not wait for them.
    let (_, sandbox) = tokio::join!(
        engine.sweep_dead_owners(),
        engine.start_with_progress(&spec, |line| out.note(&format!("kodx: {line}")))
    );
    let sandbox = match sandbox {
        Ok(sb) => {
            if sb.setup_report().cache == kodx::sandbox::SetupCacheUse::Hit {
                out.note("kodx: the setup came from the setup cache (the script did not run)");
            }
            sb
        }
        Err(e @ (SandboxError::SetupFailed { .. } | SandboxError::SetupTimedOut { .. })) => {
            out.note(&format!("kodx: {e}"));
            let outcome = Outcome {
                stop_reason: StopReason::SetupFailed,
                last_message: String::new(),
                api_calls: 0,
                usage: Usage::default(),
                usd_cost: 0.0,
                cost_limit: config.cost_limit,
                duration: started.elapsed(),
                model: program.model.name.clone(),
                detail: Some(e.to_string()),
                checks: Vec::new(),
            };
            return finish(&args, &mut out, &outcome);
        }
        Err(e) => return Err(e.into()),
    };
    let registration = egress.as_ref().and_then(|e| e.register(&sandbox));
    // The checks run apart from the agent (SPEC §12): the first sandbox for them is made
    // while the agent works.
    let verifier = (!config.checks.is_empty()).then(|| FreshSandboxes::new(engine.clone(), &spec));
    // A line typed on the terminal while the run works steers it.
    let steering = crate::run_steer::TerminalSteering::start();
    if steering.is_some() {
        out.note("kodx: type a line and press Enter to steer the run at its next step");
    }
    let agent = Agent {
        provider: provider.as_ref(),
        sandbox: &sandbox,
        verifier: verifier.as_ref().map(|v| v as &dyn Verifier),
        config,
        cancel: CancellationToken::new(),
        steering: steering.as_ref().map(|s| s as &dyn kodx::agent::Steering),
    };
    let messages = resumed.unwrap_or_else(|| vec![kodx::model::Message::user_text(&prompt)]);
    let (outcome, write_error) = run_agent(&agent, messages, &mut out, transcript.as_mut()).await;
    drop(agent);
    if let Some(registration) = registration {
        for line in kodx::egress::report::plain(&registration.blocked()) {
            out.note(&line);
        }
    }
    if let Some(verifier) = verifier {
        verifier.close().await;
    }
    // What the user asked to be written (the transcript, the export) but was not: the run
    // may have ended its turn, but the exit code must not say all went well.
    let mut output_failed = false;
    if let Some(e) = write_error {
        out.note(&format!("kodx: writing the transcript failed: {e}"));
        output_failed = true;
    }
    if !export_and_destroy(&args, sandbox, &mut out).await {
        output_failed = true;
    }
    if let Some(detail) = &outcome.detail {
        out.note(&format!(
            "kodx: stopped ({}): {detail}",
            outcome.stop_reason.as_str()
        ));
    }
    let code = finish(&args, &mut out, &outcome)?;
    Ok(if output_failed {
        ExitCode::FAILURE
    } else {
        code
    })
}

/// `--repo-dir` made absolute; `None` for "" (a clean container).
fn repo_dir(args: &RunArgs) -> anyhow::Result<Option<PathBuf>> {
    if args.repo_dir.is_empty() {
        return Ok(None);
    }
    let dir = Path::new(&args.repo_dir);
    Ok(Some(dir.canonicalize().with_context(|| {
        format!("--repo-dir {}: cannot use it", dir.display())
    })?))
}

/// The plan of this run: the flags over the program over `.kodx/config.toml`'s cost limit,
/// `KODX_IMAGE` and the built-in defaults; the sandbox gets `repo` and, with
/// `--setup-cache`, a setup cache shared by the runs on the same checkout directory.
fn plan_run(
    args: &RunArgs,
    repo: Option<PathBuf>,
    program: Program,
    repo_cost_limit: Option<f64>,
) -> anyhow::Result<Plan> {
    let setup_script = match &args.setup_script {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading the setup script {}", f.display()))?,
        ),
        None => None,
    };
    let overrides = Overrides {
        model: args.model.clone(),
        image: args.image.clone(),
        setup_script,
        disable_network_after_setup: args.disable_network_after_setup.then_some(true),
        cost_limit: args.cost_limit,
        max_iterations: args.max_iterations,
        command_timeout: None,
    };
    let defaults = Defaults {
        image: std::env::var("KODX_IMAGE")
            .ok()
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| "python:3.12".to_string()),
        cost_limit: repo_cost_limit.unwrap_or(1.0),
        run_timeout: Duration::from_secs(args.timeout.max(1)),
        network: args.network.parse().map_err(anyhow::Error::msg)?,
        network_allow: args.network_allow.clone(),
        // No operator here: the program's own limit, when it sets one, is the ceiling.
        max_disk_bytes: program
            .limits
            .max_disk_bytes
            .unwrap_or(DEFAULT_MAX_DISK_BYTES),
        ..Defaults::default()
    };
    let mut pricing = Pricing::builtin();
    if let Some(file) = &args.pricing {
        pricing = pricing.merged(Pricing::from_file(file)?);
    }
    let run_id = format!("run-{:012x}", rand::random::<u64>() >> 16);
    let mut plan = Plan::new(run_id, program, &overrides, &defaults, &pricing)?;
    if args.check.len() > kodx::checks::MAX_CHECKS {
        bail!("--check: at most {} checks", kodx::checks::MAX_CHECKS);
    }
    let mut names = std::collections::HashSet::new();
    if let Some(dup) = args
        .check
        .iter()
        .find(|c| !names.insert(c.name.to_lowercase()))
    {
        bail!(
            "--check: two checks are named {:?}; names must be unique",
            dup.name
        );
    }
    plan.agent.checks = args.check.clone();
    plan.agent.check_repair = args.check_repair;
    let cost_limit = plan.agent.cost_limit;
    if !(cost_limit.is_finite() && cost_limit > 0.0) {
        bail!("--cost-limit must be a positive amount in USD, got {cost_limit}");
    }
    if args.setup_cache {
        // Shared only by runs on the same checkout directory.
        let scope = match &repo {
            Some(dir) => std::fs::canonicalize(dir)
                .unwrap_or_else(|_| dir.clone())
                .display()
                .to_string(),
            None => String::new(),
        };
        plan.sandbox.setup_cache = Some(kodx::sandbox::SetupCacheSpec::new(scope));
    }
    plan.sandbox.repo_dir = repo;
    Ok(plan)
}

/// The `--transcript` file, created (emptied) before the run starts.
fn open_transcript(args: &RunArgs) -> anyhow::Result<Option<std::io::BufWriter<std::fs::File>>> {
    let Some(path) = &args.transcript else {
        return Ok(None);
    };
    let file = std::fs::File::create(path)
        .with_context(|| format!("creating the transcript {}", path.display()))?;
    Ok(Some(std::io::BufWriter::new(file)))
}

/// Runs the agent from `messages`, showing its progress and writing each record to
/// `transcript` as one JSON line. Returns the outcome and the first write error, if any.
async fn run_agent(
    agent: &Agent<'_>,
    messages: Vec<kodx::model::Message>,
    out: &mut Reporter,
    mut transcript: Option<&mut std::io::BufWriter<std::fs::File>>,
) -> (Outcome, Option<std::io::Error>) {
    let mut write_error = None;
    let outcome = agent
        .resume(
            messages,
            |p| out.progress(p),
            |r: &Record| {
                if let Some(w) = transcript.as_mut() {
                    let line = serde_json::to_string(r).unwrap_or_default();
                    if let Err(e) = writeln!(w, "{line}") {
                        write_error.get_or_insert(e);
                    }
                }
            },
        )
        .await;
    out.done();
    if let Some(w) = transcript.as_mut() {
        if let Err(e) = w.flush() {
            write_error.get_or_insert(e);
        }
    }
    (outcome, write_error)
}

/// Exports the workspace to `--export-dir` (when given), then removes the sandbox. False
/// when the export was asked for and failed.
async fn export_and_destroy(args: &RunArgs, sandbox: DockerSandbox, out: &mut Reporter) -> bool {
    let exported = match &args.export_dir {
        Some(dir) => sandbox
            .export_workspace(dir)
            .await
            .map(|exported| (dir.clone(), exported))
            .map_err(|e| e.to_string()),
        None => Err(String::new()),
    };
    let _ = sandbox.destroy().await;
    match exported {
        Ok((dir, exported)) => {
            out.note(&format!(
                "kodx: exported the workspace ({} files) to {}",
                exported.files,
                dir.display()
            ));
            if exported.left_out_count > 0 {
                out.note(&left_out_note(&exported));
            }
            true
        }
        Err(e) if !e.is_empty() => {
            out.note(&format!("kodx: the export failed: {e}"));
            false
        }
        Err(_) => true,
    }
}

/// One line naming the ignored files an export left out for being over a size limit.
fn left_out_note(exported: &kodx::sandbox::Exported) -> String {
    let shown: Vec<String> = exported
        .left_out
        .iter()
        .map(|(path, size)| format!("{path} ({})", kodx::sandbox::archive::human(*size)))
        .collect();
    let more = exported.left_out_count - exported.left_out.len();
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "kodx: left out {} ignored file(s) over the export's size limits: {}{more}",
        exported.left_out_count,
        shown.join(", ")
    )
}

/// Prints the result (the last message, or JSON) and returns the exit code: 0 only for
/// `end_turn`.
fn finish(args: &RunArgs, out: &mut Reporter, outcome: &Outcome) -> anyhow::Result<ExitCode> {
    out.note(&format!(
        "kodx: {} · {} API calls · {} of {} · {:.1}s",
        outcome.stop_reason.as_str(),
        outcome.api_calls,
        format_usd(outcome.usd_cost),
        format_usd(outcome.cost_limit),
        outcome.duration.as_secs_f64()
    ));
    for r in kodx::checks::latest(&outcome.checks) {
        out.note(&format!(
            "kodx: check {} (attempt {}): {} in {:.1}s",
            r.name,
            r.attempt,
            r.verdict(),
            r.duration().as_secs_f64()
        ));
    }
    let checks_red = kodx::checks::all_passed(&outcome.checks) == Some(false);
    let mut result = json!({
        "api_calls": outcome.api_calls,
        "usd_cost": outcome.usd_cost,
        "last_message": outcome.last_message,
        "stderr": out.lines,
        "stop_reason": outcome.stop_reason.as_str(),
        "input_tokens": outcome.usage.input_tokens,
        "output_tokens": outcome.usage.output_tokens,
        "cache_read_tokens": outcome.usage.cache_read_tokens,
        "cache_write_tokens": outcome.usage.cache_write_tokens,
        "duration_s": outcome.duration.as_secs_f64(),
        "model": outcome.model,
    });
    if !outcome.checks.is_empty() {
        result["checks"] = serde_json::to_value(&outcome.checks)?;
    }
    if let Some(file) = &args.json_output_file {
        std::fs::write(file, serde_json::to_string_pretty(&result)? + "\n")
            .with_context(|| format!("writing {}", file.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else if !outcome.last_message.is_empty() {
        println!("{}", outcome.last_message);
    }
    // Checks still red fail the command, as they would fail CI.
    Ok(
        if outcome.stop_reason == StopReason::EndTurn && !checks_red {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}
