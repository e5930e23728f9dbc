//! Where a program becomes a run: [`Plan`] puts the overrides over the program and the
//! [`Defaults`] under it, giving the sandbox spec and the agent's settings.

use std::time::Duration;

use super::spec::{Overrides, Program};
use crate::agent::AgentConfig;
use crate::cost::{CostError, Pricing};
use crate::sandbox::{Cidr, NetworkMode, SandboxSpec, DEFAULT_MAX_DISK_BYTES};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::load::tests::{yaml, MINIMAL_YAML};

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
