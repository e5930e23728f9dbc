//! What runs are made with: the model clients and the Docker engine.

use crate::model::Provider;
use crate::program;
use crate::sandbox::{Engine, SandboxError};

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

/// The Docker engine, connected on first use (the server starts without one and says so in
/// `/healthz`).
#[derive(Default)]
pub struct EngineSlot {
    engine: tokio::sync::Mutex<Option<Engine>>,
    /// The installation's id: labels its containers, names its clones.
    instance: Option<String>,
}

impl EngineSlot {
    /// The engine of installation `instance` ([`crate::db::Db::instance_id`]): its
    /// containers carry the id, and those an earlier process of it left are its orphans.
    pub fn for_instance(instance: impl Into<String>) -> EngineSlot {
        EngineSlot {
            engine: Default::default(),
            instance: Some(instance.into()),
        }
    }

    pub fn instance(&self) -> Option<&str> {
        self.instance.as_deref()
    }

    pub async fn get(&self) -> Result<Engine, SandboxError> {
        let mut slot = self.engine.lock().await;
        if let Some(e) = slot.as_ref() {
            return Ok(e.clone());
        }
        let mut engine = Engine::connect().await?;
        if let Some(instance) = &self.instance {
            engine = engine.with_instance(instance.clone());
        }
        *slot = Some(engine.clone());
        Ok(engine)
    }

    pub async fn ping(&self) -> Result<(), String> {
        let engine = self.get().await.map_err(|e| e.to_string())?;
        engine.docker().ping().await.map(|_| ()).map_err(|e| {
            format!(
                "the Docker engine at {} does not answer: {e}",
                engine.host()
            )
        })
    }
}
