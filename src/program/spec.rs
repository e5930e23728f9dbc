//! What a program holds once read: the model, the prompt, the sampling parameters, the
//! sandbox and the limits, and the command-line values that replace them.

use std::fmt;
use std::path::Path;

use serde::Deserialize;

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

impl Program {
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
