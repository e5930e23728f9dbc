//! Program files: which model runs, with which system prompt, parameters, sandbox and limits.
//!
//! A program file is YAML or TOML in the shape of the Python kodx (llmproc's format):
//! `model` {`name`, `provider`, `max_iterations`}, `prompt` {`system` or `system_prompt`},
//! `parameters` {`max_tokens`, `temperature`, `top_p`, `top_k`, `stop_sequences`}, `docker`
//! {`image`, `setup_script`, `disable_network_after_setup`} and kodx's own `limits`
//! {`cost_limit`, `max_iterations`, `command_timeout`}. Unknown keys are refused with the
//! file, the key and the line, so a typo never silently falls back to a default.
//!
//! The built-in programs (`assistant`, `ask`, `code`) are the files in `prompts/`, compiled
//! in. [`DotKodxConfig`] reads the Python kodx's repository-level `.kodx/config.toml`.
//!
//! Precedence (flag > program file > built-in default): [`Plan::new`] applies the overrides
//! (the command line's, or for `kodx serve` the repository's) over a program and fills what
//! both leave unset from [`Defaults`], giving the sandbox spec and the agent's settings of
//! one run. `kodx run` and `kodx serve` both go through it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::agent::AgentConfig;
use crate::cost::{CostError, Pricing};
use crate::sandbox::{Cidr, NetworkMode, SandboxSpec, DEFAULT_MAX_DISK_BYTES};

/// A program: everything a run needs besides the user's prompt and the workspace.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// `assistant` / `ask` / `code` for the built-ins, else the file's path as given.
    pub name: String,
    pub model: ModelSpec,
    pub system_prompt: String,
    pub parameters: Parameters,
    pub docker: DockerSpec,
    pub limits: Limits,
}

/// The `model` section.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub name: String,
    pub provider: ProviderKind,
    /// Where the Python kodx keeps its iteration limit; see [`Program::max_iterations`].
    pub max_iterations: Option<u32>,
}

/// Which API family serves the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// The Anthropic Messages API.
    Anthropic,
    /// Any OpenAI-compatible Chat Completions API.
    OpenAi,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 2] = [ProviderKind::Anthropic, ProviderKind::OpenAi];

    /// The name used in program files: `anthropic` or `openai`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::OpenAi => "openai",
        }
    }

    /// The provider a model name clearly belongs to: `claude…` is Anthropic's; `gpt-…`,
    /// `o1…`, `o3…`, `o4…` are OpenAI's. Anything else (a local model, a proxy's alias) is
    /// `None`: the name alone does not tell.
    pub fn infer(model_name: &str) -> Option<ProviderKind> {
        let name = model_name.trim().to_ascii_lowercase();
        if name.starts_with("claude") {
            Some(ProviderKind::Anthropic)
        } else if ["gpt-", "o1", "o3", "o4"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
        {
            Some(ProviderKind::OpenAi)
        } else {
            None
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ProviderKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProviderKind::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown provider {s:?} (expected one of: anthropic, openai)"))
    }
}

/// Checked while the scalar is read, so the YAML parser can point at its line.
impl<'de> Deserialize<'de> for ProviderKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ProviderKind;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, anthropic or openai")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ProviderKind, E> {
                s.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

/// The `parameters` section: sampling settings passed to the model API.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with the keys max_tokens, temperature, top_p, top_k, stop_sequences"
)]
pub struct Parameters {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    #[serde(default)]
    pub stop_sequences: Vec<String>,
}

/// The `docker` section. Unset fields fall back to the caller's defaults.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with the keys image, setup_script, disable_network_after_setup"
)]
pub struct DockerSpec {
    pub image: Option<String>,
    /// The script's text (not a path), run as `bash /tmp/setup.sh` before the model starts.
    pub setup_script: Option<String>,
    pub disable_network_after_setup: Option<bool>,
}

/// The `limits` section (kodx's own; the Python kodx had only `--cost-limit`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with the keys cost_limit, max_iterations, command_timeout, max_disk_bytes"
)]
pub struct Limits {
    /// USD per run.
    pub cost_limit: Option<f64>,
    pub max_iterations: Option<u32>,
    /// Seconds; the default yield time of `feed_chars`.
    pub command_timeout: Option<u64>,
    /// Bytes the sandbox may write to its own filesystem (`kodx serve` keeps the server's
    /// `max_disk_bytes` as the ceiling).
    pub max_disk_bytes: Option<u64>,
}

/// The syntax of a program file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Toml,
}

impl Format {
    /// `.yaml`/`.yml` → YAML, `.toml` → TOML (any case); anything else → `None`.
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "yaml" | "yml" => Some(Format::Yaml),
            "toml" => Some(Format::Toml),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Yaml => "YAML",
            Format::Toml => "TOML",
        })
    }
}

/// Why a program file or `.kodx/config.toml` could not be used. Every variant names the
/// file; the messages are meant to be shown to the user as they are.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("{}: cannot read: {source}", .path.display())]
    Read { path: PathBuf, source: io::Error },

    #[error("{file}: invalid {format}{}: {message}", at_line(*.line))]
    Syntax {
        file: String,
        format: Format,
        line: Option<usize>,
        message: String,
    },

    #[error("{file}: unknown key \"{key}\"{} (expected one of: {})", at_line(*.line), .expected.join(", "))]
    UnknownKey {
        file: String,
        /// Dotted path, e.g. `model.nmae`.
        key: String,
        line: Option<usize>,
        expected: Vec<String>,
    },

    #[error("{file}: missing required key \"{key}\" ({hint})")]
    MissingKey {
        file: String,
        key: String,
        hint: &'static str,
    },

    #[error("{file}: invalid value for \"{key}\"{}: {message}", at_line(*.line))]
    InvalidValue {
        file: String,
        key: String,
        line: Option<usize>,
        message: String,
    },

    /// A problem not tied to one key (e.g. the file is a list, not a mapping).
    #[error("{file}{}: {message}", at_line(*.line))]
    Invalid {
        file: String,
        line: Option<usize>,
        message: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

/// Command-line values that replace the program's. `None` keeps the program's value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// A model name; the provider follows it when the name clearly belongs to the other
    /// family (see [`ProviderKind::infer`]).
    pub model: Option<String>,
    pub image: Option<String>,
    /// The script's text (the caller reads `--setup-script FILE`).
    pub setup_script: Option<String>,
    pub disable_network_after_setup: Option<bool>,
    pub cost_limit: Option<f64>,
    pub max_iterations: Option<u32>,
    /// Seconds.
    pub command_timeout: Option<u64>,
}

const BUILTINS: [(&str, &str); 3] = [
    ("assistant", include_str!("../prompts/assistant.yaml")),
    ("ask", include_str!("../prompts/ask.yaml")),
    ("code", include_str!("../prompts/code.yaml")),
];

const BUILTIN_NAMES: &[&str] = &["assistant", "ask", "code"];

impl Program {
    /// Reads a program file. The extension picks the syntax (`.yaml`/`.yml`, `.toml`); with
    /// any other extension YAML is tried, then TOML.
    pub fn load(path: &Path) -> Result<Program, ProgramError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProgramError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let source = path.display().to_string();
        match Format::from_path(path) {
            Some(format) => Program::parse(&text, &source, format),
            None => Program::parse_any(&text, &source),
        }
    }

    /// Parses a program from text; `source` names it in errors and becomes its name.
    pub fn parse(text: &str, source: &str, format: Format) -> Result<Program, ProgramError> {
        let raw: RawProgram = match format {
            Format::Yaml => from_yaml(text, source)?,
            Format::Toml => from_toml(text, source)?,
        };
        raw.into_program(source)
    }

    /// YAML first; if that fails, TOML. When both fail, the error shown is TOML's only if
    /// the text is well-formed TOML but not a YAML mapping (so it was meant as TOML).
    fn parse_any(text: &str, source: &str) -> Result<Program, ProgramError> {
        let yaml_err = match Program::parse(text, source, Format::Yaml) {
            Ok(program) => return Ok(program),
            Err(e) => e,
        };
        let toml_err = match Program::parse(text, source, Format::Toml) {
            Ok(program) => return Ok(program),
            Err(e) => e,
        };
        let yaml_mapping = serde_norway::from_str::<serde_norway::Value>(text)
            .map(|v| v.is_mapping())
            .unwrap_or(false);
        let toml_table = toml::from_str::<toml::Table>(text).is_ok();
        if !yaml_mapping && toml_table {
            Err(toml_err)
        } else {
            Err(yaml_err)
        }
    }

    /// A built-in program (`assistant`, `ask`, `code`), compiled from `prompts/`.
    pub fn builtin(name: &str) -> Option<Program> {
        let (name, text) = BUILTINS.iter().find(|(n, _)| *n == name)?;
        let mut program = Program::parse(text, &format!("prompts/{name}.yaml"), Format::Yaml)
            .unwrap_or_else(|e| panic!("built-in program {name:?} is invalid: {e}"));
        program.name = name.to_string();
        Some(program)
    }

    pub fn builtin_names() -> &'static [&'static str] {
        BUILTIN_NAMES
    }

    /// The iteration limit: `limits.max_iterations`, else `model.max_iterations` (where the
    /// Python kodx puts it), else `None` (the caller's default).
    pub fn max_iterations(&self) -> Option<u32> {
        self.limits.max_iterations.or(self.model.max_iterations)
    }

    /// Applies command-line values over the program's: each `Some` replaces.
    pub fn with_overrides(mut self, o: &Overrides) -> Program {
        if let Some(model) = &o.model {
            if let Some(provider) = ProviderKind::infer(model) {
                self.model.provider = provider;
            }
            self.model.name = model.clone();
        }
        if let Some(image) = &o.image {
            self.docker.image = Some(image.clone());
        }
        if let Some(script) = &o.setup_script {
            self.docker.setup_script = Some(script.clone());
        }
        if let Some(disable) = o.disable_network_after_setup {
            self.docker.disable_network_after_setup = Some(disable);
        }
        if let Some(cost) = o.cost_limit {
            self.limits.cost_limit = Some(cost);
        }
        if let Some(n) = o.max_iterations {
            self.limits.max_iterations = Some(n);
        }
        if let Some(secs) = o.command_timeout {
            self.limits.command_timeout = Some(secs);
        }
        self
    }
}

/// The Python kodx's repository-level `.kodx/config.toml` (written by its `kodx init`):
/// `[version]` (informational, any keys), `[global] cost_limit`, `[ask] program`,
/// `[code] program`. Program paths are resolved against the repository root; an empty
/// path counts as unset.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DotKodxConfig {
    pub cost_limit: Option<f64>,
    pub ask_program: Option<PathBuf>,
    pub code_program: Option<PathBuf>,
}

impl DotKodxConfig {
    /// Reads `<repo_root>/.kodx/config.toml`; `Ok(None)` when there is none.
    pub fn load(repo_root: &Path) -> Result<Option<DotKodxConfig>, ProgramError> {
        let path = repo_root.join(".kodx").join("config.toml");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ProgramError::Read { path, source }),
        };
        let file = path.display().to_string();
        let raw: RawDotKodxConfig = from_toml(&text, &file)?;
        if let Some(cost) = raw.global.as_ref().and_then(|g| g.cost_limit) {
            check_cost_limit(cost, "global.cost_limit", &file)?;
        }
        let program = |section: Option<RawCommand>| {
            section
                .and_then(|s| s.program)
                .filter(|p| !p.trim().is_empty())
                .map(|p| repo_root.join(p))
        };
        Ok(Some(DotKodxConfig {
            cost_limit: raw.global.and_then(|g| g.cost_limit),
            ask_program: program(raw.ask),
            code_program: program(raw.code),
        }))
    }
}

/// What a program leaves unset, from the layer below it: the server's settings for
/// `kodx serve`; the environment and the built-in defaults for `kodx run`.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    pub image: String,
    /// USD per run.
    pub cost_limit: f64,
    pub max_iterations: u32,
    /// The longest one `feed_chars` waits.
    pub command_timeout: Duration,
    /// Wall clock of the whole run (the program has no say in it).
    pub run_timeout: Duration,
    /// The sandbox's network: the stricter of this and what the program asks applies.
    pub network: NetworkMode,
    /// Ranges the network fence lets through (the operator's, or `--network-allow`).
    pub network_allow: Vec<Cidr>,
    /// The most a sandbox may write; a program may ask for less, never more.
    pub max_disk_bytes: u64,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            image: "python:3.12".into(),
            cost_limit: 1.0,
            max_iterations: 50,
            command_timeout: Duration::from_secs(30),
            run_timeout: Duration::from_secs(30 * 60),
            network: NetworkMode::On,
            network_allow: Vec::new(),
            max_disk_bytes: DEFAULT_MAX_DISK_BYTES,
        }
    }
}

/// How one run is set up from its program: the sandbox and the agent's settings. The one
/// place where a program becomes a run, for `kodx run` and `kodx serve` alike.
///
/// Precedence: `overrides` > the program > `defaults`. `kodx run` passes its flags as
/// overrides and `.kodx/config.toml`, `KODX_IMAGE` and the built-in values as defaults;
/// `kodx serve` passes the repository's `.github/kodx.yml` (already held to the server's
/// maxima and the monthly budget) as overrides and its settings as defaults.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The program with the overrides applied (its model names the provider and price).
    pub program: Program,
    /// Everything but `repo_dir`, which the caller sets.
    pub sandbox: SandboxSpec,
    pub agent: AgentConfig,
}

impl Plan {
    /// The plan of run `run_id` (which also names its container). Fails only when the
    /// model has no price, since its cost cap could not be kept.
    pub fn new(
        run_id: impl Into<String>,
        program: Program,
        overrides: &Overrides,
        defaults: &Defaults,
        pricing: &Pricing,
    ) -> Result<Plan, CostError> {
        let program = program.with_overrides(overrides);
        let price = pricing.price(&program.model.name)?;
        let command_timeout = program
            .limits
            .command_timeout
            .map(Duration::from_secs)
            .unwrap_or(defaults.command_timeout);

        let image = program
            .docker
            .image
            .clone()
            .unwrap_or_else(|| defaults.image.clone());
        let mut sandbox = SandboxSpec::new(run_id, image);
        sandbox.setup_script = program.docker.setup_script.clone();
        // The stricter of the settings' network and what the program asks.
        defaults.network.apply(
            &mut sandbox,
            program.docker.disable_network_after_setup.unwrap_or(false),
        );
        sandbox.allowed_cidrs = defaults.network_allow.clone();
        sandbox.max_disk_bytes = Some(
            program
                .limits
                .max_disk_bytes
                .map_or(defaults.max_disk_bytes, |m| m.min(defaults.max_disk_bytes)),
        );
        // A setup script gets at least as long as one command may take.
        sandbox.setup_timeout = sandbox.setup_timeout.max(command_timeout);

        let mut agent = AgentConfig::new(
            program.model.name.clone(),
            program.system_prompt.clone(),
            price,
        );
        agent.cost_limit = program.limits.cost_limit.unwrap_or(defaults.cost_limit);
        agent.max_iterations = program.max_iterations().unwrap_or(defaults.max_iterations);
        agent.command_timeout = command_timeout;
        agent.timeout = defaults.run_timeout;
        if let Some(m) = program.parameters.max_tokens {
            agent.max_tokens = m;
        }
        agent.temperature = program.parameters.temperature;
        Ok(Plan {
            program,
            sandbox,
            agent,
        })
    }
}

// ---- the file shapes, as written ----

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with the sections model, prompt, parameters, docker, limits"
)]
struct RawProgram {
    model: Option<RawModel>,
    prompt: Option<RawPrompt>,
    parameters: Option<Parameters>,
    docker: Option<DockerSpec>,
    limits: Option<Limits>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with the keys name, provider, max_iterations"
)]
struct RawModel {
    name: Option<String>,
    provider: Option<ProviderKind>,
    max_iterations: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with the key system")]
struct RawPrompt {
    /// llmproc also spells it `system_prompt`.
    #[serde(alias = "system_prompt")]
    system: Option<String>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table with the sections version, global, ask, code"
)]
struct RawDotKodxConfig {
    /// Which kodx/llmproc versions wrote the file; informational.
    #[serde(rename = "version")]
    _version: Option<toml::Table>,
    global: Option<RawGlobal>,
    ask: Option<RawCommand>,
    code: Option<RawCommand>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table with the key cost_limit")]
struct RawGlobal {
    cost_limit: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table with the key program")]
struct RawCommand {
    program: Option<String>,
}

impl RawProgram {
    fn into_program(self, file: &str) -> Result<Program, ProgramError> {
        let missing = |key: &str, hint: &'static str| ProgramError::MissingKey {
            file: file.to_string(),
            key: key.to_string(),
            hint,
        };
        let model = self.model.unwrap_or(RawModel {
            name: None,
            provider: None,
            max_iterations: None,
        });
        let name = model
            .name
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| missing("model.name", "the model to use, e.g. claude-sonnet-4-5"))?;
        let provider = match model.provider.or_else(|| ProviderKind::infer(&name)) {
            Some(p) => p,
            None => {
                return Err(missing(
                    "model.provider",
                    "anthropic or openai; the model name does not tell which",
                ))
            }
        };
        let system_prompt = self
            .prompt
            .and_then(|p| p.system)
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| {
                missing(
                    "prompt.system",
                    "the system prompt; llmproc's prompt.system_prompt is accepted too",
                )
            })?;
        let parameters = self.parameters.unwrap_or_default();
        let limits = self.limits.unwrap_or_default();

        let positive = |value: Option<u64>, key: &str| match value {
            Some(0) => Err(ProgramError::InvalidValue {
                file: file.to_string(),
                key: key.to_string(),
                line: None,
                message: "must be greater than 0".to_string(),
            }),
            _ => Ok(()),
        };
        positive(model.max_iterations.map(u64::from), "model.max_iterations")?;
        positive(
            parameters.max_tokens.map(u64::from),
            "parameters.max_tokens",
        )?;
        positive(
            limits.max_iterations.map(u64::from),
            "limits.max_iterations",
        )?;
        positive(limits.command_timeout, "limits.command_timeout")?;
        positive(limits.max_disk_bytes, "limits.max_disk_bytes")?;
        if let Some(cost) = limits.cost_limit {
            check_cost_limit(cost, "limits.cost_limit", file)?;
        }

        Ok(Program {
            name: file.to_string(),
            model: ModelSpec {
                name,
                provider,
                max_iterations: model.max_iterations,
            },
            system_prompt,
            parameters,
            docker: self.docker.unwrap_or_default(),
            limits,
        })
    }
}

fn check_cost_limit(cost: f64, key: &str, file: &str) -> Result<(), ProgramError> {
    if cost.is_finite() && cost > 0.0 {
        Ok(())
    } else {
        Err(ProgramError::InvalidValue {
            file: file.to_string(),
            key: key.to_string(),
            line: None,
            message: format!("must be a positive amount of USD, got {cost}"),
        })
    }
}

// ---- turning the parsers' errors into ProgramError ----

/// A typed-deserialization error, taken apart: the dotted key path it is about (if known),
/// the message without path or location, and the 1-based line.
pub(crate) struct SchemaError {
    pub(crate) path: Option<String>,
    pub(crate) message: String,
    pub(crate) line: Option<usize>,
}

impl SchemaError {
    fn into_error(self, file: &str) -> ProgramError {
        let file = file.to_string();
        if let Some((key, expected)) = parse_unknown_field(&self.message) {
            let key = match self.path {
                Some(section) => format!("{section}.{key}"),
                None => key,
            };
            return ProgramError::UnknownKey {
                file,
                key,
                line: self.line,
                expected,
            };
        }
        match self.path {
            Some(key) => ProgramError::InvalidValue {
                file,
                key,
                line: self.line,
                message: self.message,
            },
            None => ProgramError::Invalid {
                file,
                line: self.line,
                message: self.message,
            },
        }
    }
}

/// serde's "unknown field `x`, expected one of `a`, `b`" (or "expected `a` or `b`", or
/// "there are no fields") → (`x`, [`a`, `b`]).
pub(crate) fn parse_unknown_field(message: &str) -> Option<(String, Vec<String>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (key, rest) = rest.split_once('`')?;
    let expected = rest
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    Some((key.to_string(), expected))
}

/// serde_norway renders errors as "[path: ]message[ at line L column C]"; split that up.
pub(crate) fn split_yaml_error(e: &serde_norway::Error) -> SchemaError {
    let mut message = e.to_string();
    if let Some(loc) = e.location() {
        let suffix = format!(" at line {} column {}", loc.line(), loc.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = stripped.to_string();
        }
    }
    let mut path = None;
    if let Some((prefix, rest)) = message.split_once(": ") {
        let is_path = !prefix.is_empty()
            && prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.[]".contains(c));
        if is_path {
            path = Some(prefix.to_string());
            message = rest.to_string();
        }
    }
    SchemaError {
        path,
        message,
        line: e.location().map(|l| l.line()),
    }
}

fn from_yaml<T: DeserializeOwned>(text: &str, file: &str) -> Result<T, ProgramError> {
    let value: serde_norway::Value = serde_norway::from_str(text).map_err(|e| {
        let parts = split_yaml_error(&e);
        ProgramError::Syntax {
            file: file.to_string(),
            format: Format::Yaml,
            line: parts.line,
            message: parts.message,
        }
    })?;
    // An empty file (or only comments) is an empty mapping, as in TOML.
    let text = match value {
        serde_norway::Value::Null => "{}",
        serde_norway::Value::Mapping(_) => text,
        other => {
            return Err(ProgramError::Invalid {
                file: file.to_string(),
                line: Some(1),
                message: format!(
                    "expected a mapping of sections (model, prompt, parameters, docker, limits), found {}",
                    yaml_kind(&other)
                ),
            })
        }
    };
    serde_norway::from_str(text).map_err(|e| split_yaml_error(&e).into_error(file))
}

pub(crate) fn yaml_kind(value: &serde_norway::Value) -> &'static str {
    use serde_norway::Value;
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

fn from_toml<T: DeserializeOwned>(text: &str, file: &str) -> Result<T, ProgramError> {
    let start_of = |e: &toml::de::Error| e.span().map(|span| span.start.min(text.len()));
    let line_of = |start: usize| text[..start].matches('\n').count() + 1;
    let table: toml::Table = toml::from_str(text).map_err(|e| ProgramError::Syntax {
        file: file.to_string(),
        format: Format::Toml,
        line: start_of(&e).map(line_of),
        message: e.message().trim_end().to_string(),
    })?;
    toml::from_str(text).map_err(|e| {
        let message = e.message().trim_end().to_string();
        let start = start_of(&e);
        let path = start.and_then(|start| {
            toml_error_path::<T>(&table, text, start, &message)
                .or_else(|| toml_key_before(text, start))
        });
        SchemaError {
            path,
            line: start.map(line_of),
            message,
        }
        .into_error(file)
    })
}

/// toml's errors carry a span but not the key path. The same table deserialized through
/// serde_norway fails the same way and names the path; it is used when it fits the span
/// (the same unknown key, or a key on the line the span is on).
fn toml_error_path<T: DeserializeOwned>(
    table: &toml::Table,
    text: &str,
    start: usize,
    message: &str,
) -> Option<String> {
    let yaml = serde_norway::to_string(table).ok()?;
    let e = serde_norway::from_str::<T>(&yaml).err()?;
    let parts = split_yaml_error(&e);
    match parse_unknown_field(message) {
        Some((key, _)) => {
            let (yaml_key, _) = parse_unknown_field(&parts.message)?;
            (yaml_key == key).then_some(parts.path).flatten()
        }
        None => {
            let path = parts.path?;
            let last = path.rsplit('.').next()?;
            let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
            let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
            text[line_start..line_end].contains(last).then_some(path)
        }
    }
}

/// The key a TOML value at `start` belongs to, read from the text: the key before the last
/// `=` on its line, under the last `[table]` header above it.
fn toml_key_before(text: &str, start: usize) -> Option<String> {
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let before = &text[line_start..start];
    let lhs = before[..before.rfind('=')?].trim_end();
    let key_start = lhs
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || "_-.\"'".contains(c)))
        .map_or(0, |i| i + 1);
    let key = lhs[key_start..].replace(['"', '\''], "");
    if key.is_empty() {
        return None;
    }
    let header = text[..line_start].lines().rev().find_map(|line| {
        let line = line.trim();
        let inner = line.strip_prefix('[')?.trim_start_matches('[');
        Some(inner[..inner.find(']')?].trim().replace(['"', '\''], ""))
    });
    Some(match header {
        Some(table) if !lhs.contains('{') => format!("{table}.{key}"),
        _ => key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example_program_text() -> String {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/python-kodx-program.yaml");
        std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "the Python kodx example program is missing at {}: {e}",
                path.display()
            )
        })
    }

    fn yaml(text: &str) -> Result<Program, ProgramError> {
        Program::parse(text, "my.yaml", Format::Yaml)
    }

    fn toml_program(text: &str) -> Result<Program, ProgramError> {
        Program::parse(text, "my.toml", Format::Toml)
    }

    const MINIMAL_YAML: &str =
        "model:\n  name: claude-sonnet-4-5\n  provider: anthropic\nprompt:\n  system: be brief\n";

    const EXAMPLE_AS_TOML: &str = r#"
[model]
name = "claude-sonnet-4-20250514"
provider = "anthropic"
max_iterations = 100

[parameters]
max_tokens = 20000
temperature = 0.1

[docker]
image = "python:3.11"
setup_script = """
pip install -q pytest
"""
disable_network_after_setup = false

[prompt]
system = """
You are a careful software engineer working inside a Docker container.
The repository is at /workspace/repo. Use the shell tools to inspect,
change and test the code, then summarise what you did.
"""
"#;

    #[test]
    fn python_example_program_loads_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kodx-code-program.yaml");
        std::fs::write(&path, example_program_text()).unwrap();
        let p = Program::load(&path).unwrap();
        assert_eq!(p.name, path.display().to_string());
        assert_eq!(p.model.name, "claude-sonnet-4-20250514");
        assert_eq!(p.model.provider, ProviderKind::Anthropic);
        assert_eq!(p.model.max_iterations, Some(100));
        assert_eq!(p.max_iterations(), Some(100));
        assert_eq!(p.parameters.max_tokens, Some(20000));
        assert_eq!(p.parameters.temperature, Some(0.1));
        assert_eq!(p.parameters.top_p, None);
        assert!(p.parameters.stop_sequences.is_empty());
        assert_eq!(p.docker.image.as_deref(), Some("python:3.11"));
        assert_eq!(
            p.docker.setup_script.as_deref(),
            Some("pip install -q pytest\n")
        );
        assert_eq!(p.docker.disable_network_after_setup, Some(false));
        assert_eq!(
            p.system_prompt,
            "You are a careful software engineer working inside a Docker container.\n\
             The repository is at /workspace/repo. Use the shell tools to inspect,\n\
             change and test the code, then summarise what you did.\n"
        );
        assert_eq!(p.limits, Limits::default());
    }

    #[test]
    fn same_program_in_toml_loads_equal() {
        let from_yaml = yaml(&example_program_text()).unwrap();
        let from_toml = toml_program(EXAMPLE_AS_TOML).unwrap();
        assert_eq!(
            Program {
                name: "my.yaml".into(),
                ..from_toml
            },
            from_yaml
        );
    }

    #[test]
    fn extension_picks_the_format_and_others_try_both() {
        let dir = tempfile::tempdir().unwrap();
        let toml_path = dir.path().join("p.TOML");
        std::fs::write(&toml_path, EXAMPLE_AS_TOML).unwrap();
        assert_eq!(Format::from_path(&toml_path), Some(Format::Toml));
        let from_toml = Program::load(&toml_path).unwrap();

        let other = dir.path().join("program.txt");
        std::fs::write(&other, EXAMPLE_AS_TOML).unwrap();
        let guessed = Program::load(&other).unwrap();
        assert_eq!(guessed.model, from_toml.model);
        assert_eq!(guessed.system_prompt, from_toml.system_prompt);

        std::fs::write(&other, example_program_text()).unwrap();
        assert_eq!(Program::load(&other).unwrap().model, from_toml.model);

        // Broken TOML without a known extension reports TOML's error.
        std::fs::write(&other, "[model]\nname = \"x\"\nnmae = 1\n").unwrap();
        let err = Program::load(&other).unwrap_err().to_string();
        assert!(
            err.contains("unknown key \"model.nmae\" at line 3"),
            "{err}"
        );
    }

    #[test]
    fn python_repo_config_loads_unchanged() {
        let example =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/python-kodx-config.toml");
        let text = std::fs::read_to_string(&example)
            .unwrap_or_else(|e| panic!("missing {}: {e}", example.display()));
        let repo = tempfile::tempdir().unwrap();
        std::fs::create_dir(repo.path().join(".kodx")).unwrap();
        std::fs::write(repo.path().join(".kodx/config.toml"), text).unwrap();
        let config = DotKodxConfig::load(repo.path()).unwrap().unwrap();
        assert_eq!(
            config,
            DotKodxConfig {
                cost_limit: None,
                ask_program: Some(repo.path().join(".kodx/ask.yaml")),
                code_program: Some(repo.path().join(".kodx/code.yaml")),
            }
        );
    }

    #[test]
    fn repo_config_variants() {
        let repo = tempfile::tempdir().unwrap();
        assert_eq!(DotKodxConfig::load(repo.path()).unwrap(), None);

        std::fs::create_dir(repo.path().join(".kodx")).unwrap();
        let path = repo.path().join(".kodx/config.toml");
        // No [version], a cost limit, an empty program path.
        std::fs::write(&path, "[global]\ncost_limit = 1\n[ask]\nprogram = \"\"\n").unwrap();
        let config = DotKodxConfig::load(repo.path()).unwrap().unwrap();
        assert_eq!(config.cost_limit, Some(1.0));
        assert_eq!(config.ask_program, None);
        assert_eq!(config.code_program, None);

        std::fs::write(
            &path,
            "[global]\ncost_limit = 1.0\n\n[code]\nprogramm = \"x\"\n",
        )
        .unwrap();
        let err = DotKodxConfig::load(repo.path()).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(
            err.contains("unknown key \"code.programm\" at line 5 (expected one of: program)"),
            "{err}"
        );

        std::fs::write(&path, "[global]\ncost_limit = -2\n").unwrap();
        let err = DotKodxConfig::load(repo.path()).unwrap_err().to_string();
        assert!(err.contains("\"global.cost_limit\""), "{err}");
    }

    #[test]
    fn every_builtin_parses_and_describes_both_tools() {
        assert_eq!(Program::builtin_names(), ["assistant", "ask", "code"]);
        for name in Program::builtin_names() {
            let p = Program::builtin(name).unwrap();
            assert_eq!(p.name, *name);
            assert_eq!(p.model.name, "claude-sonnet-4-5");
            assert_eq!(p.model.provider, ProviderKind::Anthropic);
            assert_eq!(p.parameters.max_tokens, Some(8192));
            let temperature = if *name == "assistant" { 0.7 } else { 0.2 };
            assert_eq!(p.parameters.temperature, Some(temperature));
            assert_eq!(p.docker, DockerSpec::default(), "{name}");
            for needle in ["create_new_shell", "feed_chars", "/workspace/repo"] {
                assert!(p.system_prompt.contains(needle), "{name} lacks {needle}");
            }
            let lines = p.system_prompt.lines().count();
            assert!((20..=50).contains(&lines), "{name}: {lines} lines");
        }
        assert!(Program::builtin("nope").is_none());
        let code = Program::builtin("code").unwrap().system_prompt;
        assert!(code.contains("commit"), "code must say not to commit");
    }

    #[test]
    fn unknown_top_level_key_names_key_file_and_line() {
        let text = format!("{MINIMAL_YAML}docker:\n  image: x\npromt:\n  system: y\n");
        let err = yaml(&text).unwrap_err().to_string();
        assert_eq!(
            err,
            "my.yaml: unknown key \"promt\" at line 8 (expected one of: model, prompt, parameters, docker, limits)"
        );
    }

    #[test]
    fn unknown_nested_key_names_path_file_and_line() {
        let err = yaml("model:\n  nmae: claude-sonnet-4-5\n").unwrap_err();
        assert!(
            matches!(&err, ProgramError::UnknownKey { key, line: Some(2), .. } if key == "model.nmae")
        );
        assert_eq!(
            err.to_string(),
            "my.yaml: unknown key \"model.nmae\" at line 2 (expected one of: name, provider, max_iterations)"
        );

        let err = toml_program("[model]\nname = \"claude-sonnet-4-5\"\nnmae = 1\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "my.toml: unknown key \"model.nmae\" at line 3 (expected one of: name, provider, max_iterations)"
        );

        let err = toml_program("promt = 1\n").unwrap_err().to_string();
        assert!(
            err.starts_with("my.toml: unknown key \"promt\" at line 1"),
            "{err}"
        );

        for (section, text) in [
            (
                "parameters.top_q",
                format!("{MINIMAL_YAML}parameters:\n  top_q: 1\n"),
            ),
            (
                "docker.imgae",
                format!("{MINIMAL_YAML}docker:\n  imgae: x\n"),
            ),
            ("limits.cost", format!("{MINIMAL_YAML}limits:\n  cost: 1\n")),
            ("prompt.user", format!("{MINIMAL_YAML}  user: hi\n")),
        ] {
            let err = yaml(&text).unwrap_err().to_string();
            assert!(
                err.contains(&format!("unknown key \"{section}\" at line ")),
                "{err}"
            );
        }
    }

    #[test]
    fn missing_required_keys() {
        let err = yaml("model:\n  name: claude-sonnet-4-5\n").unwrap_err();
        assert!(matches!(&err, ProgramError::MissingKey { key, .. } if key == "prompt.system"));
        assert!(err
            .to_string()
            .starts_with("my.yaml: missing required key \"prompt.system\""));

        let err = yaml("prompt:\n  system: hi\n").unwrap_err().to_string();
        assert!(err.contains("missing required key \"model.name\""), "{err}");

        let err = yaml("").unwrap_err().to_string();
        assert!(err.contains("missing required key \"model.name\""), "{err}");

        let err = yaml("model:\n  name: llama3\nprompt:\n  system: hi\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("missing required key \"model.provider\""),
            "{err}"
        );
    }

    #[test]
    fn system_prompt_alias_and_optional_sections() {
        let p = yaml("model:\n  name: gpt-4.1\nprompt:\n  system_prompt: hi\ndocker:\nparameters:\n  top_p: 0.9\n  top_k: 40\n  stop_sequences: [END]\nlimits:\n  cost_limit: 0.5\n  max_iterations: 7\n  command_timeout: 60\n  max_disk_bytes: 1073741824\n")
            .unwrap();
        assert_eq!(p.system_prompt, "hi");
        assert_eq!(
            p.model.provider,
            ProviderKind::OpenAi,
            "inferred from the name"
        );
        assert_eq!(p.docker, DockerSpec::default());
        assert_eq!(p.parameters.top_p, Some(0.9));
        assert_eq!(p.parameters.top_k, Some(40));
        assert_eq!(p.parameters.stop_sequences, ["END"]);
        assert_eq!(p.limits.cost_limit, Some(0.5));
        assert_eq!(p.max_iterations(), Some(7));
        assert_eq!(p.limits.command_timeout, Some(60));
        assert_eq!(p.limits.max_disk_bytes, Some(1 << 30));
        let err = yaml("model:\n  name: x\n  provider: openai\nprompt:\n  system: a\nlimits:\n  max_disk_bytes: 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("limits.max_disk_bytes"), "{err}");

        let both =
            "model:\n  name: x\n  provider: openai\nprompt:\n  system: a\n  system_prompt: b\n";
        assert!(yaml(both).is_err());
    }

    #[test]
    fn limits_max_iterations_wins_over_the_model_section() {
        let text = format!("{MINIMAL_YAML}limits:\n  max_iterations: 5\n").replace(
            "provider: anthropic",
            "provider: anthropic\n  max_iterations: 100",
        );
        assert_eq!(yaml(&text).unwrap().max_iterations(), Some(5));
        assert_eq!(yaml(MINIMAL_YAML).unwrap().max_iterations(), None);
    }

    #[test]
    fn bad_provider_lists_the_valid_ones() {
        let err = yaml("model:\n  name: x\n  provider: gemini\nprompt:\n  system: hi\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "my.yaml: invalid value for \"model.provider\" at line 3: unknown provider \"gemini\" (expected one of: anthropic, openai)"
        );
        let err = toml_program("[model]\nname = \"x\"\nprovider = \"gemini\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"model.provider\" at line 3"), "{err}");
        assert!(err.contains("expected one of: anthropic, openai"), "{err}");
        assert_eq!("OpenAI".parse::<ProviderKind>(), Ok(ProviderKind::OpenAi));
    }

    #[test]
    fn wrong_type_names_the_key() {
        let text = format!("{MINIMAL_YAML}parameters:\n  max_tokens: lots\n");
        let err = yaml(&text).unwrap_err();
        assert!(
            matches!(&err, ProgramError::InvalidValue { key, line: Some(7), .. } if key == "parameters.max_tokens")
        );
        assert!(err.to_string().contains("string \"lots\""), "{err}");

        let err = toml_program(
            "[model]\nname = \"x\"\nprovider = \"openai\"\n[parameters]\nmax_tokens = \"lots\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("my.toml: invalid value for \"parameters.max_tokens\" at line 5:"),
            "{err}"
        );

        // serde_norway would take 3 as a string: the key comes from the text.
        let err = toml_program("[model] # the model\nname = 3\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("my.toml: invalid value for \"model.name\" at line 2:"),
            "{err}"
        );

        let err = toml_program("model = { name = \"x\", provider = 3 }\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"model.provider\" at line 1"), "{err}");

        let err = yaml("model: [1]\n").unwrap_err().to_string();
        assert!(err.contains("\"model\" at line 1"), "{err}");
        assert!(
            err.contains("expected a mapping with the keys name"),
            "{err}"
        );

        let err = yaml("- model\n").unwrap_err().to_string();
        assert!(err.contains("expected a mapping of sections"), "{err}");

        let err = yaml(&format!("{MINIMAL_YAML}limits:\n  cost_limit: 0\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"limits.cost_limit\""), "{err}");
        let err = yaml(&format!("{MINIMAL_YAML}parameters:\n  max_tokens: 0\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"parameters.max_tokens\": must be greater than 0"),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_name_format_and_line() {
        let err = yaml("model:\n  name: a: b\n").unwrap_err();
        assert!(
            matches!(
                &err,
                ProgramError::Syntax {
                    format: Format::Yaml,
                    line: Some(2),
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("my.yaml: invalid YAML at line 2: "),
            "{err}"
        );

        let err = toml_program("[model\n").unwrap_err().to_string();
        assert!(
            err.starts_with("my.toml: invalid TOML at line 1: "),
            "{err}"
        );
    }

    #[test]
    fn unreadable_path_names_path_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.yaml");
        let err = Program::load(&missing).unwrap_err();
        assert!(
            matches!(&err, ProgramError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound)
        );
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("{}: cannot read: ", missing.display())),
            "{text}"
        );
        assert!(text.contains("No such file"), "{text}");

        let err = Program::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
    }

    #[test]
    fn overrides_replace_each_field() {
        let base = yaml(&example_program_text()).unwrap();
        assert_eq!(base.clone().with_overrides(&Overrides::default()), base);

        let o = Overrides {
            model: Some("claude-opus-4-1".into()),
            image: Some("rust:1".into()),
            setup_script: Some("cargo fetch\n".into()),
            disable_network_after_setup: Some(true),
            cost_limit: Some(0.25),
            max_iterations: Some(3),
            command_timeout: Some(90),
        };
        let p = base.clone().with_overrides(&o);
        assert_eq!(p.model.name, "claude-opus-4-1");
        assert_eq!(p.model.provider, ProviderKind::Anthropic);
        assert_eq!(p.docker.image.as_deref(), Some("rust:1"));
        assert_eq!(p.docker.setup_script.as_deref(), Some("cargo fetch\n"));
        assert_eq!(p.docker.disable_network_after_setup, Some(true));
        assert_eq!(p.limits.cost_limit, Some(0.25));
        assert_eq!(
            p.max_iterations(),
            Some(3),
            "the flag beats model.max_iterations"
        );
        assert_eq!(p.limits.command_timeout, Some(90));
        assert_eq!(p.system_prompt, base.system_prompt);
        assert_eq!(p.parameters, base.parameters);

        // Each field alone touches only itself.
        let only_image = base.clone().with_overrides(&Overrides {
            image: Some("node:22".into()),
            ..Overrides::default()
        });
        assert_eq!(
            only_image,
            Program {
                docker: DockerSpec {
                    image: Some("node:22".into()),
                    ..base.docker.clone()
                },
                ..base.clone()
            }
        );
    }

    #[test]
    fn model_override_infers_the_provider_only_when_clear() {
        let base = yaml(MINIMAL_YAML).unwrap();
        let with = |model: &str| {
            base.clone().with_overrides(&Overrides {
                model: Some(model.into()),
                ..Overrides::default()
            })
        };
        for (model, provider) in [
            ("gpt-4.1", ProviderKind::OpenAi),
            ("o1", ProviderKind::OpenAi),
            ("o3-mini", ProviderKind::OpenAi),
            ("o4-mini", ProviderKind::OpenAi),
            ("claude-3-7-sonnet-20250219", ProviderKind::Anthropic),
            ("qwen2.5-coder", ProviderKind::Anthropic), // unknown family: kept
        ] {
            let p = with(model);
            assert_eq!(p.model.name, model);
            assert_eq!(p.model.provider, provider, "{model}");
        }
        let openai = with("gpt-4o");
        let back = openai.clone().with_overrides(&Overrides {
            model: Some("llama3.1".into()),
            ..Overrides::default()
        });
        assert_eq!(
            back.model.provider,
            ProviderKind::OpenAi,
            "kept when unclear"
        );
        assert_eq!(
            openai
                .with_overrides(&Overrides {
                    model: Some("claude-sonnet-4-5".into()),
                    ..Overrides::default()
                })
                .model
                .provider,
            ProviderKind::Anthropic
        );
    }

    #[test]
    fn plan_takes_overrides_then_the_program_then_the_defaults() {
        let pricing = Pricing::builtin();
        let program = yaml(&format!(
            "{MINIMAL_YAML}limits:\n  command_timeout: 5\n  cost_limit: 0.5\ndocker:\n  image: prog:1\n  setup_script: make\nparameters:\n  max_tokens: 777\n"
        ))
        .unwrap();
        let defaults = Defaults {
            image: "server:1".into(),
            cost_limit: 3.0,
            max_iterations: 7,
            command_timeout: Duration::from_secs(30),
            run_timeout: Duration::from_secs(99),
            ..Defaults::default()
        };
        let plan = Plan::new(
            "r1",
            program.clone(),
            &Overrides::default(),
            &defaults,
            &pricing,
        )
        .unwrap();
        assert_eq!(plan.sandbox.run_id, "r1");
        assert_eq!(plan.sandbox.image, "prog:1");
        assert_eq!(plan.sandbox.setup_script.as_deref(), Some("make"));
        assert_eq!(plan.sandbox.setup_timeout, Duration::from_secs(600));
        assert_eq!(plan.agent.command_timeout, Duration::from_secs(5));
        assert_eq!(plan.agent.cost_limit, 0.5);
        assert_eq!(plan.agent.max_iterations, 7);
        assert_eq!(plan.agent.max_tokens, 777);
        assert_eq!(plan.agent.timeout, Duration::from_secs(99));
        assert_eq!(plan.agent.model, "claude-sonnet-4-5");

        let overrides = Overrides {
            image: Some("flag:1".into()),
            cost_limit: Some(0.25),
            command_timeout: Some(900),
            max_iterations: Some(3),
            ..Overrides::default()
        };
        let plan = Plan::new("r2", program, &overrides, &defaults, &pricing).unwrap();
        assert_eq!(plan.sandbox.image, "flag:1");
        assert_eq!(plan.agent.cost_limit, 0.25);
        assert_eq!(plan.agent.max_iterations, 3);
        assert_eq!(plan.agent.command_timeout, Duration::from_secs(900));
        assert_eq!(
            plan.sandbox.setup_timeout,
            Duration::from_secs(900),
            "a setup script may take as long as one command"
        );

        // What the program leaves unset comes from the defaults.
        let bare = yaml(MINIMAL_YAML).unwrap();
        let plan = Plan::new("r3", bare, &Overrides::default(), &defaults, &pricing).unwrap();
        assert_eq!(plan.sandbox.image, "server:1");
        assert_eq!(plan.agent.cost_limit, 3.0);
        assert_eq!(plan.agent.command_timeout, Duration::from_secs(30));
    }

    #[test]
    fn plan_refuses_a_model_without_a_price() {
        let program = yaml(MINIMAL_YAML).unwrap();
        let overrides = Overrides {
            model: Some("claude-unknown-9".into()),
            ..Overrides::default()
        };
        let e = Plan::new(
            "r",
            program,
            &overrides,
            &Defaults::default(),
            &Pricing::builtin(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("claude-unknown-9"), "{e}");
    }
}
