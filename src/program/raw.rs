//! The file shapes as written (every key optional, unknown keys refused), and the checks
//! that turn a raw program into a [`Program`].

use serde::Deserialize;

use super::error::ProgramError;
use super::spec::{DockerSpec, Limits, ModelSpec, Parameters, Program, ProviderKind};

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with the sections model, prompt, parameters, docker, limits"
)]
pub(super) struct RawProgram {
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
pub(super) struct RawDotKodxConfig {
    /// Which kodx/llmproc versions wrote the file; informational.
    #[serde(rename = "version")]
    _version: Option<toml::Table>,
    pub(super) global: Option<RawGlobal>,
    pub(super) ask: Option<RawCommand>,
    pub(super) code: Option<RawCommand>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table with the key cost_limit")]
pub(super) struct RawGlobal {
    pub(super) cost_limit: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table with the key program")]
pub(super) struct RawCommand {
    pub(super) program: Option<String>,
}

impl RawProgram {
    pub(super) fn into_program(self, file: &str) -> Result<Program, ProgramError> {
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

pub(super) fn check_cost_limit(cost: f64, key: &str, file: &str) -> Result<(), ProgramError> {
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
