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

mod error;
mod load;
mod parse;
mod plan;
mod raw;
mod spec;

pub use error::ProgramError;
pub use load::DotKodxConfig;
pub(crate) use parse::{
    parse_unknown_field, split_yaml_error, yaml_kind, yaml_path_error, SchemaError,
};
pub use plan::{Defaults, Plan};
pub use spec::{
    DockerSpec, Format, Limits, ModelSpec, Overrides, Parameters, Program, ProviderKind,
};
