//! What runs are made with: the model clients (the engines are in [`super::engines`]).

use crate::model::Provider;
use crate::program;

/// Makes the model client of a run (from the environment in production).
pub trait ProviderFactory: Send + Sync {
    fn make(&self, provider: program::ProviderKind) -> Result<Box<dyn Provider>, String>;
}

/// Anthropic and OpenAI-compatible clients from `ANTHROPIC_*` / `OPENAI_*`.
pub struct EnvProviders;

impl ProviderFactory for EnvProviders {
    fn make(&self, provider: program::ProviderKind) -> Result<Box<dyn Provider>, String> {
        Ok(match provider {
            program::ProviderKind::Anthropic => {
                Box::new(crate::providers::AnthropicClient::from_env()?)
            }
            program::ProviderKind::OpenAi => Box::new(crate::providers::OpenAiClient::from_env()?),
        })
    }
}
