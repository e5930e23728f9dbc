//! A repository's `.github/kodx.yml` (SPEC §2): what a repository may choose for its runs.
//!
//! Every key is optional and an empty file means all defaults. The file is strict: an
//! unknown key or a bad value refuses the run with a message naming the file, the line and
//! the problem. Limits are clamped to the server's maxima: a repository can lower them
//! freely and raise them only up to the maximum.

mod secrets;
mod values;

use serde::Deserialize;
use values::{
    BranchPrefix, IntegerVisitor, Iterations, KeyFiles, StrVisitor, TemplateName, Text, Usd,
    UsdOrZero,
};

use crate::checks::CheckSpec;

use crate::program::{
    parse_unknown_field, split_yaml_error, yaml_kind, yaml_path_error, SchemaError,
};

/// Default cost limit of a `/kodx code` run, in USD (SPEC §7).
pub const DEFAULT_CODE_COST_LIMIT: f64 = 2.00;
/// Default cost limit of a `/kodx ask` run, in USD (SPEC §7).
pub const DEFAULT_ASK_COST_LIMIT: f64 = 1.00;
/// Default number of agent iterations per run.
pub const DEFAULT_MAX_ITERATIONS: u32 = 50;
/// Default prefix of the branches kodx pushes.
pub const DEFAULT_BRANCH_PREFIX: &str = "kodx/";
pub use secrets::{SecretSpec, MAX_SECRETS};
pub use values::MAX_BRANCH_PREFIX_LEN;

/// The settings of `.github/kodx.yml`. `None` means "not set here": a lower-precedence
/// source (server config, built-in default) decides.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RepoConfig {
    pub image: Option<String>,
    pub setup_script: Option<String>,
    pub disable_network_after_setup: Option<bool>,
    /// `setup_cache: false` turns the setup cache off for the repository.
    pub setup_cache: Option<bool>,
    /// Files the setup depends on besides the default lockfiles and manifests: paths or
    /// patterns (`*`, `?` within one component) relative to the root.
    pub setup_cache_key_files: Vec<String>,
    pub model: Option<String>,
    pub cost_limit: CostLimits,
    pub max_iterations: Option<u32>,
    pub ask_permission: AskPermission,
    pub pr: PrConfig,
    /// The repository's own checks, run by kodx after the model ends its turn.
    pub checks: Vec<CheckSpec>,
    /// Passes the model gets to fix red checks (`None`: the default, 2).
    pub check_repair: Option<u32>,
    /// Globs of the files the checks depend on, besides `.github/` and the files their
    /// commands name (SPEC §12; `None`: [`crate::checks::guard::DEFAULT_GUARD`]).
    pub checks_guard: Option<Vec<String>>,
    /// Repair runs a pull request kodx opened gets when its CI fails (`None`: 0, off).
    pub ci_repair: Option<u32>,
    /// `ci_rerun: 0` turns off re-running failed GitHub Actions jobs once before a repair
    /// (`None`: 1, on).
    pub ci_rerun: Option<u32>,
    /// `reviews.resolve`: which threads `/kodx address-reviews` resolves.
    pub resolve_threads: ResolveThreads,
    /// `triggers.label`: the label that starts `/kodx code` on an issue.
    pub trigger_label: Option<String>,
    /// `confirm_above_usd`: a run whose estimate (or, without history, its cap) is above
    /// this waits for a writer's `/kodx go` (SPEC §12).
    pub confirm_above_usd: Option<f64>,
    /// `secrets:`: the secrets kodx keeps for the repository that its runs use.
    pub secrets: Vec<SecretSpec>,
    /// `network.allow`: after the setup script the sandbox reaches only kodx's egress
    /// proxy, which lets these hosts through (`None`: not set).
    pub network_allow: Option<crate::egress::AllowList>,
}

/// `reviews.resolve`: `none` (reply only, the default) or `fixed` (also resolve the threads
/// a run reports fixed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ResolveThreads {
    #[default]
    None,
    Fixed,
}

impl<'de> Deserialize<'de> for ResolveThreads {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor("none or fixed", |s| match s {
            "none" => Ok(ResolveThreads::None),
            "fixed" => Ok(ResolveThreads::Fixed),
            other => Err(format!(
                "must be none or fixed, got \"{}\"",
                other.escape_default()
            )),
        }))
    }
}

/// `cost_limit: { code, ask }`, USD per run; each positive and finite when set.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CostLimits {
    pub code: Option<f64>,
    pub ask: Option<f64>,
}

/// Who may run `/kodx ask` (SPEC §4): write and up (default), or anyone with read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AskPermission {
    #[default]
    Write,
    Read,
}

/// `pr: { draft, branch_prefix, on_limit }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrConfig {
    /// Open pull requests as drafts.
    pub draft: bool,
    /// Prefix of the branches kodx creates, e.g. `kodx/`.
    pub branch_prefix: String,
    /// What a code run stopped by its cost, step or time limit does with its changes.
    pub on_limit: OnLimit,
    /// Which of several pull request templates (`PULL_REQUEST_TEMPLATE/NAME.md`) the body
    /// follows.
    pub template: Option<String>,
    /// What a change whose checks stay red becomes.
    pub on_red: OnRed,
    /// A push to the base that leaves one of kodx's pull requests conflicted starts a merge
    /// run that resolves it (SPEC §12, "Mergeable pull requests").
    pub keep_mergeable: bool,
}

/// `pr.on_red`: what a code run whose checks stay red delivers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnRed {
    /// A draft pull request saying which checks fail (on a pull request: the commit,
    /// pushed as usual).
    #[default]
    Draft,
    /// The pull request as if the checks had passed (the table still says they did not).
    Open,
    /// Nothing pushed.
    Discard,
}

impl OnRed {
    pub fn as_str(self) -> &'static str {
        match self {
            OnRed::Draft => "draft",
            OnRed::Open => "open",
            OnRed::Discard => "discard",
        }
    }
}

impl<'de> Deserialize<'de> for OnRed {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor(
            "\"draft\", \"open\" or \"discard\"",
            |s| match s {
                "draft" => Ok(OnRed::Draft),
                "open" => Ok(OnRed::Open),
                "discard" => Ok(OnRed::Discard),
                other => Err(format!(
                    "must be \"draft\", \"open\" or \"discard\", got \"{}\"",
                    other.escape_default()
                )),
            },
        ))
    }
}

impl Default for PrConfig {
    fn default() -> Self {
        PrConfig {
            draft: false,
            branch_prefix: DEFAULT_BRANCH_PREFIX.to_string(),
            on_limit: OnLimit::Draft,
            template: None,
            on_red: OnRed::Draft,
            keep_mergeable: false,
        }
    }
}

/// `pr.on_limit`: what a code run stopped by a limit delivers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnLimit {
    /// On an issue, a draft pull request saying the work is incomplete; on a pull request,
    /// a commit on its branch saying so.
    #[default]
    Draft,
    /// The branch is pushed, no pull request is opened (on a pull request: as `draft`).
    Branch,
    /// Nothing is pushed.
    Discard,
}

impl<'de> Deserialize<'de> for OnLimit {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor(
            "\"draft\", \"branch\" or \"discard\"",
            |s| match s {
                "draft" => Ok(OnLimit::Draft),
                "branch" => Ok(OnLimit::Branch),
                "discard" => Ok(OnLimit::Discard),
                other => Err(format!(
                    "must be \"draft\", \"branch\" or \"discard\", got \"{}\"",
                    other.escape_default()
                )),
            },
        ))
    }
}

/// The kind of run a limit is asked for.
pub use crate::job::RunKind;

impl RunKind {
    /// The built-in cost limit of this kind of run, in USD.
    pub fn default_cost_limit(self) -> f64 {
        match self {
            RunKind::Code => DEFAULT_CODE_COST_LIMIT,
            RunKind::Ask => DEFAULT_ASK_COST_LIMIT,
        }
    }
}

/// The server's ceilings, which a repository cannot raise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerMaxima {
    /// USD per run.
    pub cost_limit: f64,
    pub max_iterations: u32,
}

/// Why `.github/kodx.yml` cannot be used; the message is meant to be shown as it is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RepoConfigError {
    #[error("{}: {}{message}", RepoConfig::PATH, line_prefix(*.line))]
    Invalid {
        line: Option<usize>,
        message: String,
    },
}

fn line_prefix(line: Option<usize>) -> String {
    line.map(|l| format!("line {l}: ")).unwrap_or_default()
}

impl RepoConfig {
    /// Where the file lives, relative to the repository root (on the default branch).
    pub const PATH: &'static str = ".github/kodx.yml";

    /// Parses the file's text. Empty text (or only comments) gives the defaults.
    pub fn parse(text: &str) -> Result<RepoConfig, RepoConfigError> {
        let value: serde_norway::Value = serde_norway::from_str(text).map_err(|e| {
            let parts = split_yaml_error(&e);
            RepoConfigError::Invalid {
                line: parts.line,
                message: format!("invalid YAML: {}", parts.message),
            }
        })?;
        match value {
            serde_norway::Value::Null => return Ok(RepoConfig::default()),
            serde_norway::Value::Mapping(_) => {}
            other => {
                return Err(RepoConfigError::Invalid {
                    line: Some(1),
                    message: format!(
                        "expected a mapping of settings (one of: {}), found {}",
                        TOP_LEVEL_KEYS.join(", "),
                        yaml_kind(&other)
                    ),
                })
            }
        }
        // Parsed again from the text (not from `value`) so that errors keep their line.
        let raw: RawRepoConfig =
            serde_path_to_error::deserialize(serde_norway::Deserializer::from_str(text))
                .map_err(|e| to_error(&e))?;
        Ok(raw.into_config())
    }

    /// The cost limit in USD of a run of this kind: the repository's value, else the
    /// built-in default ($2.00 code, $1.00 ask), never above the server's maximum.
    pub fn cost_limit_for(&self, kind: RunKind, max: &ServerMaxima) -> f64 {
        let chosen = match kind {
            RunKind::Code => self.cost_limit.code,
            RunKind::Ask => self.cost_limit.ask,
        }
        .unwrap_or_else(|| kind.default_cost_limit());
        chosen.min(max.cost_limit)
    }

    /// The repair passes for red checks: the repository's value, else 2, never above
    /// `max`.
    pub fn check_repair(&self, max: u32) -> u32 {
        self.check_repair
            .unwrap_or(crate::checks::DEFAULT_CHECK_REPAIR)
            .min(max)
    }

    /// The repair runs after the pull request opens: the repository's value, else 0 (off),
    /// never above `max`.
    pub fn ci_repair(&self, max: u32) -> u32 {
        self.ci_repair.unwrap_or(0).min(max)
    }

    /// Whether failed GitHub Actions jobs are re-run once before a CI repair (on unless
    /// `ci_rerun: 0`).
    pub fn ci_rerun(&self) -> bool {
        self.ci_rerun != Some(0)
    }

    /// Whether adding `label` to an issue starts work here (names compare as GitHub's do,
    /// without regard to case).
    pub fn is_trigger_label(&self, label: &str) -> bool {
        self.trigger_label
            .as_deref()
            .is_some_and(|l| l.to_lowercase() == label.trim().to_lowercase())
    }

    /// The iteration limit: the repository's value, else 50, never above the server's
    /// maximum.
    pub fn max_iterations(&self, max: &ServerMaxima) -> u32 {
        self.max_iterations
            .unwrap_or(DEFAULT_MAX_ITERATIONS)
            .min(max.max_iterations)
    }
}

const TOP_LEVEL_KEYS: &[&str] = &[
    "image",
    "setup_script",
    "disable_network_after_setup",
    "setup_cache",
    "setup_cache_key_files",
    "model",
    "cost_limit",
    "max_iterations",
    "ask_permission",
    "pr",
    "checks",
    "check_repair",
    "checks_guard",
    "ci_repair",
    "ci_rerun",
    "reviews",
    "triggers",
    "confirm_above_usd",
];

// ---- the file's shape, as written; values are checked while deserializing so that
// ---- serde_norway reports the line of the offending value ----

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of settings (image, setup_script, disable_network_after_setup, setup_cache, setup_cache_key_files, model, cost_limit, max_iterations, ask_permission, pr, checks, check_repair, checks_guard, ci_repair, ci_rerun, reviews, triggers, confirm_above_usd, secrets, network)"
)]
struct RawRepoConfig {
    image: Option<Text>,
    setup_script: Option<Text>,
    disable_network_after_setup: Option<bool>,
    setup_cache: Option<bool>,
    setup_cache_key_files: Option<KeyFiles>,
    model: Option<Text>,
    cost_limit: Option<RawCostLimits>,
    max_iterations: Option<Iterations>,
    ask_permission: Option<AskPermission>,
    pr: Option<RawPr>,
    checks: Option<Checks>,
    check_repair: Option<Repairs>,
    checks_guard: Option<GuardGlobs>,
    ci_repair: Option<Repairs>,
    ci_rerun: Option<Reruns>,
    reviews: Option<RawReviews>,
    triggers: Option<RawTriggers>,
    confirm_above_usd: Option<UsdOrZero>,
    secrets: Option<secrets::Secrets>,
    network: Option<secrets::Network>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with the key resolve")]
struct RawReviews {
    resolve: Option<ResolveThreads>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with the key label")]
struct RawTriggers {
    label: Option<LabelName>,
}

/// A label's name as GitHub allows it: 1 to 50 characters, no control characters.
struct LabelName(String);

impl<'de> Deserialize<'de> for LabelName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor("a label name such as kodx", |s| {
            let name = s.trim();
            if name.is_empty() || name.chars().count() > 50 || name.chars().any(char::is_control) {
                return Err(format!(
                    "must be a label name of 1 to 50 characters, got \"{}\"",
                    s.chars().take(60).collect::<String>().escape_default()
                ));
            }
            Ok(LabelName(name.to_string()))
        }))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with the keys code, ask")]
struct RawCostLimits {
    code: Option<Usd>,
    ask: Option<Usd>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with the keys draft, branch_prefix, on_limit, template, on_red, keep_mergeable"
)]
struct RawPr {
    draft: Option<bool>,
    branch_prefix: Option<BranchPrefix>,
    on_limit: Option<OnLimit>,
    template: Option<TemplateName>,
    on_red: Option<OnRed>,
    keep_mergeable: Option<bool>,
}

/// `checks:` at most [`crate::checks::MAX_CHECKS`], names unique.
struct Checks(Vec<CheckSpec>);

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a check: a mapping with the keys name, run and (optionally) timeout"
)]
struct RawCheck {
    name: CheckName,
    run: CheckCommand,
    timeout: Option<CheckTimeout>,
}

struct CheckName(String);
struct CheckCommand(String);
struct CheckTimeout(u64);

impl<'de> Deserialize<'de> for CheckName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor("a check name such as tests", |s| {
            crate::checks::check_name(s).map(|()| CheckName(s.trim().to_string()))
        }))
    }
}

impl<'de> Deserialize<'de> for CheckCommand {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor("a shell command such as cargo test", |s| {
            crate::checks::check_command(s).map(|()| CheckCommand(s.to_string()))
        }))
    }
}

impl<'de> Deserialize<'de> for CheckTimeout {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use crate::checks::MAX_CHECK_TIMEOUT_SECS;
        deserializer.deserialize_any(IntegerVisitor("a whole number of seconds", |v| {
            match u64::try_from(v) {
                Ok(n) if (1..=MAX_CHECK_TIMEOUT_SECS).contains(&n) => Ok(CheckTimeout(n)),
                _ => Err(format!(
                    "must be from 1 to {MAX_CHECK_TIMEOUT_SECS} seconds, got {v}"
                )),
            }
        }))
    }
}

impl<'de> Deserialize<'de> for Checks {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use crate::checks::{DEFAULT_CHECK_TIMEOUT_SECS, MAX_CHECKS};
        let list: Vec<RawCheck> = Vec::deserialize(deserializer)?;
        if list.len() > MAX_CHECKS {
            return Err(serde::de::Error::custom(format!(
                "must list at most {MAX_CHECKS} checks, got {}",
                list.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        let mut checks = Vec::with_capacity(list.len());
        for c in list {
            if !seen.insert(c.name.0.to_lowercase()) {
                return Err(serde::de::Error::custom(format!(
                    "two checks are named \"{}\"; names must be unique",
                    c.name.0.escape_default()
                )));
            }
            checks.push(CheckSpec {
                name: c.name.0,
                run: c.run.0,
                timeout_secs: c.timeout.map_or(DEFAULT_CHECK_TIMEOUT_SECS, |t| t.0),
            });
        }
        Ok(Checks(checks))
    }
}

/// `checks_guard`: at most [`MAX_GUARD_GLOBS`] globs relative to the repository's root.
///
/// [`MAX_GUARD_GLOBS`]: crate::checks::guard::MAX_GUARD_GLOBS
struct GuardGlobs(Vec<String>);

/// One `checks_guard` glob.
struct GuardGlob(String);

impl<'de> Deserialize<'de> for GuardGlob {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor("a glob such as tests/**", |s| {
            crate::checks::guard::glob(s).map(|_| GuardGlob(s.trim().to_string()))
        }))
    }
}

impl<'de> Deserialize<'de> for GuardGlobs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use crate::checks::guard::MAX_GUARD_GLOBS;
        let list: Vec<GuardGlob> = Vec::deserialize(deserializer)?;
        if list.len() > MAX_GUARD_GLOBS {
            return Err(serde::de::Error::custom(format!(
                "must list at most {MAX_GUARD_GLOBS} globs, got {}",
                list.len()
            )));
        }
        Ok(GuardGlobs(list.into_iter().map(|g| g.0).collect()))
    }
}

/// `check_repair`: a whole number of passes, 0 (report only) or more.
struct Repairs(u32);

impl<'de> Deserialize<'de> for Repairs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(IntegerVisitor(
            "a whole number of repair passes (0: report only)",
            |v| match u32::try_from(v) {
                Ok(n) => Ok(Repairs(n)),
                _ => Err(format!("must be 0 or more, got {v}")),
            },
        ))
    }
}

/// `ci_rerun`: 0 (off) or 1 (failed Actions jobs get one more try before a repair).
struct Reruns(u32);

impl<'de> Deserialize<'de> for Reruns {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(IntegerVisitor("0 or 1", |v| match v {
            0 | 1 => Ok(Reruns(v as u32)),
            _ => Err(format!(
                "must be 0 (off) or 1 (re-run failed jobs once), got {v}"
            )),
        }))
    }
}

impl RawRepoConfig {
    fn into_config(self) -> RepoConfig {
        let cost_limit = self
            .cost_limit
            .map_or_else(CostLimits::default, |c| CostLimits {
                code: c.code.map(|u| u.0),
                ask: c.ask.map(|u| u.0),
            });
        let pr = self.pr.map_or_else(PrConfig::default, |p| PrConfig {
            draft: p.draft.unwrap_or(false),
            branch_prefix: p
                .branch_prefix
                .map_or_else(|| DEFAULT_BRANCH_PREFIX.to_string(), |b| b.0),
            on_limit: p.on_limit.unwrap_or_default(),
            template: p.template.map(|t| t.0),
            on_red: p.on_red.unwrap_or_default(),
            keep_mergeable: p.keep_mergeable.unwrap_or(false),
        });
        RepoConfig {
            image: self.image.map(|t| t.0),
            setup_script: self.setup_script.map(|t| t.0),
            disable_network_after_setup: self.disable_network_after_setup,
            setup_cache: self.setup_cache,
            setup_cache_key_files: self.setup_cache_key_files.map(|k| k.0).unwrap_or_default(),
            model: self.model.map(|t| t.0),
            cost_limit,
            max_iterations: self.max_iterations.map(|i| i.0),
            ask_permission: self.ask_permission.unwrap_or_default(),
            pr,
            checks: self.checks.map(|c| c.0).unwrap_or_default(),
            check_repair: self.check_repair.map(|r| r.0),
            checks_guard: self.checks_guard.map(|g| g.0),
            ci_repair: self.ci_repair.map(|r| r.0),
            ci_rerun: self.ci_rerun.map(|r| r.0),
            resolve_threads: self.reviews.and_then(|r| r.resolve).unwrap_or_default(),
            trigger_label: self.triggers.and_then(|t| t.label).map(|l| l.0),
            confirm_above_usd: self.confirm_above_usd.map(|u| u.0),
            secrets: self.secrets.map(|s| s.0).unwrap_or_default(),
            network_allow: self.network.map(|n| n.allow),
        }
    }
}

// The checks run inside the visitors (not after deserializing, as `try_from` would) so that
// serde_norway attaches the value's own key path and line to the error.

/// A string that was written as one: `image: 5` is refused rather than read as "5".
impl<'de> Deserialize<'de> for AskPermission {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrVisitor("\"write\" or \"read\"", |s| match s {
            "write" => Ok(AskPermission::Write),
            "read" => Ok(AskPermission::Read),
            other => Err(format!(
                "must be \"write\" or \"read\", got \"{}\"",
                other.escape_default()
            )),
        }))
    }
}

// ---- turning serde_norway's errors (with serde_path_to_error's key path) into RepoConfigError ----

fn to_error(e: &serde_path_to_error::Error<serde_norway::Error>) -> RepoConfigError {
    let SchemaError {
        path,
        message,
        line,
    } = yaml_path_error(e);
    let message = if let Some((key, expected)) = parse_unknown_field(&message) {
        // The path of an unknown key ends with the key itself.
        let key = path.unwrap_or(key);
        format!(
            "unknown key \"{key}\" (expected one of: {})",
            expected.join(", ")
        )
    } else {
        match path {
            Some(key) => format!("invalid value for \"{key}\": {message}"),
            None => message,
        }
    };
    RepoConfigError::Invalid { line, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC_EXAMPLE: &str = "\
image: python:3.12
setup_script: |
  pip install -r requirements.txt
disable_network_after_setup: true
model: claude-sonnet-4-5
cost_limit: { code: 2.00, ask: 1.00 }   # USD per run
max_iterations: 50
ask_permission: write                    # or: read
pr: { draft: false, branch_prefix: kodx/ }
";

    const MAXIMA: ServerMaxima = ServerMaxima {
        cost_limit: 5.0,
        max_iterations: 100,
    };

    fn err(text: &str) -> (Option<usize>, String) {
        match RepoConfig::parse(text) {
            Ok(c) => panic!("expected an error for {text:?}, got {c:?}"),
            Err(e) => {
                let shown = e.to_string();
                let RepoConfigError::Invalid { line, .. } = e;
                (line, shown)
            }
        }
    }

    #[test]
    fn a_bad_value_names_its_key_path_and_line() {
        let e = RepoConfig::parse("image: x\npr:\n  draft: maybe\n").unwrap_err();
        let shown = e.to_string();
        assert!(
            shown.starts_with(".github/kodx.yml: line 3: invalid value for \"pr.draft\": "),
            "{shown}"
        );
        let e = RepoConfig::parse("cost_limit:\n  code: [1]\n").unwrap_err();
        let shown = e.to_string();
        assert!(
            shown.starts_with(".github/kodx.yml: line 2: invalid value for \"cost_limit.code\": "),
            "{shown}"
        );
    }

    #[test]
    fn spec_example_parses_exactly() {
        let config = RepoConfig::parse(SPEC_EXAMPLE).unwrap();
        assert_eq!(
            config,
            RepoConfig {
                image: Some("python:3.12".into()),
                setup_script: Some("pip install -r requirements.txt\n".into()),
                disable_network_after_setup: Some(true),
                setup_cache: None,
                setup_cache_key_files: Vec::new(),
                model: Some("claude-sonnet-4-5".into()),
                cost_limit: CostLimits {
                    code: Some(2.0),
                    ask: Some(1.0),
                },
                max_iterations: Some(50),
                ask_permission: AskPermission::Write,
                pr: PrConfig {
                    draft: false,
                    branch_prefix: "kodx/".into(),
                    on_limit: OnLimit::Draft,
                    template: None,
                    on_red: OnRed::Draft,
                    keep_mergeable: false,
                },
                checks: Vec::new(),
                check_repair: None,
                checks_guard: None,
                ci_repair: None,
                ci_rerun: None,
                resolve_threads: ResolveThreads::None,
                trigger_label: None,
                confirm_above_usd: None,
                secrets: Vec::new(),
                network_allow: None,
            }
        );
    }

    #[test]
    fn secrets_are_named_with_how_they_are_used() {
        let c = RepoConfig::parse("secrets:\n  - { name: TEST_DB_PASSWORD, setup_only: true }\n")
            .unwrap();
        assert_eq!(
            c.secrets,
            [SecretSpec {
                name: "TEST_DB_PASSWORD".into(),
                setup_only: true,
                hosts: None,
            }]
        );
        let c = RepoConfig::parse(
            "secrets:\n  - { name: NPM_TOKEN, hosts: [npm.pkg.github.com, \"*.npmjs.org:443\"] }\nnetwork:\n  allow: [crates.io]\n",
        )
        .unwrap();
        let hosts = c.secrets[0].hosts.as_ref().unwrap();
        assert!(!c.secrets[0].setup_only);
        assert!(hosts.allows("npm.pkg.github.com", 443) && hosts.allows("registry.npmjs.org", 443));
        assert!(!hosts.allows("crates.io", 443));
        assert!(c.network_allow.unwrap().allows("crates.io", 443));
        for (text, says) in [
            (
                "secrets:\n  - { name: NPM_TOKEN, hosts: [] }\n",
                "names no host",
            ),
            (
                "secrets:\n  - { name: NPM_TOKEN, hosts: [\"a b\"] }\n",
                "NPM_TOKEN: hosts:",
            ),
            (
                "secrets:\n  - { name: NPM_TOKEN, setup_only: true, hosts: [x.org] }\n",
                "not both",
            ),
            ("secrets:\n  - { name: X }\n", "say how the run uses it"),
            (
                "secrets:\n  - { name: bad-name, setup_only: true }\n",
                "letters, digits",
            ),
            (
                "secrets:\n  - { name: X, setup_only: true }\n  - { name: X, setup_only: true }\n",
                "twice",
            ),
            ("secrets:\n  - { name: X, value: y }\n", "unknown key"),
            ("network:\n  allow: [\"crates io\"]\n", "network.allow"),
            ("network:\n  deny: [crates.io]\n", "unknown"),
            ("network: open\n", "a mapping"),
        ] {
            let e = RepoConfig::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn confirmation_takes_an_amount_of_zero_or_more() {
        for (text, want) in [
            ("confirm_above_usd: 0.5\n", Some(0.5)),
            ("confirm_above_usd: 2\n", Some(2.0)),
            ("confirm_above_usd: 0\n", Some(0.0)),
            ("model: x\n", None),
        ] {
            assert_eq!(
                RepoConfig::parse(text).unwrap().confirm_above_usd,
                want,
                "{text:?}"
            );
        }
        for (text, needle) in [
            ("confirm_above_usd: -1\n", "line 1: invalid value for \"confirm_above_usd\": must be an amount of USD, zero or more, got -1"),
            ("confirm_above_usd: lots\n", "\"confirm_above_usd\""),
        ] {
            let e = RepoConfig::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn the_pull_requests_life_is_configured() {
        let c = RepoConfig::parse(
            "ci_repair: 2\nreviews: { resolve: fixed }\ntriggers: { label: Kodx }\n",
        )
        .unwrap();
        assert_eq!(c.ci_repair(5), 2);
        assert_eq!(c.ci_repair(1), 1);
        assert_eq!(RepoConfig::default().ci_repair(5), 0);
        assert!(RepoConfig::default().ci_rerun());
        assert!(!RepoConfig::parse("ci_rerun: 0\n").unwrap().ci_rerun());
        assert!(RepoConfig::parse("ci_rerun: 1\n").unwrap().ci_rerun());
        assert_eq!(c.resolve_threads, ResolveThreads::Fixed);
        assert!(c.is_trigger_label("kodx"));
        assert!(!c.is_trigger_label("bug"));
        assert!(!RepoConfig::default().is_trigger_label("kodx"));
        for (text, needle) in [
            (
                "reviews: { resolve: all }\n",
                "\"reviews.resolve\": must be none or fixed",
            ),
            (
                "triggers: { label: \"\" }\n",
                "\"triggers.label\": must be a label name",
            ),
            (
                "triggers: { labels: kodx }\n",
                "unknown key \"triggers.labels\"",
            ),
            ("ci_repair: -2\n", "\"ci_repair\": must be 0 or more"),
            ("ci_rerun: 2\n", "\"ci_rerun\": must be 0 (off) or 1"),
        ] {
            let e = RepoConfig::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn empty_file_and_comments_only_are_the_defaults() {
        for text in ["", "\n\n", "# nothing here\n", "---\n"] {
            assert_eq!(
                RepoConfig::parse(text).unwrap(),
                RepoConfig::default(),
                "{text:?}"
            );
        }
        let d = RepoConfig::default();
        assert_eq!(d.ask_permission, AskPermission::Write);
        assert!(!d.pr.draft);
        assert_eq!(d.pr.branch_prefix, "kodx/");
        assert_eq!(d.cost_limit, CostLimits::default());
    }

    #[test]
    fn partial_sections_keep_the_other_defaults() {
        let c = RepoConfig::parse(
            "ask_permission: read\npr: { draft: true }\ncost_limit: { ask: 3 }\n",
        )
        .unwrap();
        assert_eq!(c.ask_permission, AskPermission::Read);
        assert_eq!(
            c.pr,
            PrConfig {
                draft: true,
                branch_prefix: "kodx/".into(),
                on_limit: OnLimit::Draft,
                template: None,
                on_red: OnRed::Draft,
                keep_mergeable: false,
            }
        );
        assert_eq!(
            c.cost_limit,
            CostLimits {
                code: None,
                ask: Some(3.0)
            }
        );
        assert_eq!(c.image, None);
        let c = RepoConfig::parse("image: \"5\"\npr:\n  branch_prefix: bots/kodx-\n").unwrap();
        assert_eq!(c.image.as_deref(), Some("5"));
        assert_eq!(c.pr.branch_prefix, "bots/kodx-");
        assert!(!c.pr.draft);
    }

    #[test]
    fn unknown_top_level_key_names_file_line_and_choices() {
        let (line, shown) = err("image: python:3.12\nmodel: x\n\ncost_limt: { code: 1 }\n");
        assert_eq!(line, Some(4));
        assert!(
            shown.starts_with(".github/kodx.yml: line 4: unknown key \"cost_limt\" (expected one of: image, setup_script,"),
            "{shown}"
        );
        assert!(
            shown.contains(
                "ask_permission, pr, checks, check_repair, checks_guard, ci_repair, ci_rerun, reviews, triggers, confirm_above_usd, secrets, network)"
            ),
            "{shown}"
        );
    }

    #[test]
    fn unknown_nested_key_names_its_path() {
        let (line, shown) = err("model: x\npr:\n  drafts: true\n");
        assert_eq!(line, Some(3));
        assert_eq!(
            shown,
            ".github/kodx.yml: line 3: unknown key \"pr.drafts\" (expected one of: draft, branch_prefix, on_limit, template, on_red, keep_mergeable)"
        );
        let (line, shown) = err("cost_limit: { code: 1, total: 2 }\n");
        assert_eq!(line, Some(1));
        assert!(
            shown.contains("unknown key \"cost_limit.total\" (expected one of: code, ask)"),
            "{shown}"
        );
    }

    #[test]
    fn bad_values_name_key_and_line() {
        let cases: &[(&str, usize, &[&str])] = &[
            (
                "model: x\ncost_limit:\n  code: -1\n",
                3,
                &["\"cost_limit.code\"", "positive", "-1"],
            ),
            (
                "cost_limit: { ask: 0 }\n",
                1,
                &["\"cost_limit.ask\"", "positive"],
            ),
            (
                "cost_limit: { ask: .nan }\n",
                1,
                &["\"cost_limit.ask\"", "positive"],
            ),
            (
                "cost_limit: { code: .inf }\n",
                1,
                &["\"cost_limit.code\"", "positive"],
            ),
            ("cost_limit: { code: lots }\n", 1, &["\"cost_limit.code\""]),
            (
                "\nmax_iterations: 0\n",
                2,
                &["\"max_iterations\"", "at least 1"],
            ),
            ("max_iterations: -3\n", 1, &["\"max_iterations\""]),
            ("max_iterations: 2.5\n", 1, &["\"max_iterations\""]),
            (
                "image: a\nask_permission: admin\n",
                2,
                &["\"ask_permission\"", "\"write\" or \"read\"", "admin"],
            ),
            (
                "pr:\n  branch_prefix: my bots/\n",
                2,
                &["\"pr.branch_prefix\"", "spaces"],
            ),
            (
                "pr: { branch_prefix: a..b/ }\n",
                1,
                &["\"pr.branch_prefix\"", "\"..\""],
            ),
            (
                "pr: { branch_prefix: \"\" }\n",
                1,
                &["\"pr.branch_prefix\"", "empty"],
            ),
            (
                "pr: { branch_prefix: /kodx }\n",
                1,
                &["\"pr.branch_prefix\"", "start"],
            ),
            (
                "pr: { branch_prefix: -kodx }\n",
                1,
                &["\"pr.branch_prefix\"", "start"],
            ),
            (
                "pr: { branch_prefix: \"a~b\" }\n",
                1,
                &["\"pr.branch_prefix\"", "'~'"],
            ),
            (
                "pr: { branch_prefix: \"a:b\" }\n",
                1,
                &["\"pr.branch_prefix\"", "':'"],
            ),
            (
                "pr: { branch_prefix: \"a\\\\b\" }\n",
                1,
                &["\"pr.branch_prefix\"", "'\\'"],
            ),
            ("pr: { draft: maybe }\n", 1, &["\"pr.draft\""]),
            (
                "model: x\nimage: 5\n",
                2,
                &["\"image\"", "integer", "string"],
            ),
            ("model: 1.5\n", 1, &["\"model\"", "expected a string"]),
            ("setup_script: [a]\n", 1, &["\"setup_script\"", "string"]),
            (
                "disable_network_after_setup: yes please\n",
                1,
                &["\"disable_network_after_setup\""],
            ),
            ("setup_cache: sometimes\n", 1, &["\"setup_cache\""]),
            (
                "setup_cache_key_files: go.sum\n",
                1,
                &["\"setup_cache_key_files\"", "sequence"],
            ),
            (
                "model: x\nsetup_cache_key_files: [\"../secrets\"]\n",
                2,
                &["\"setup_cache_key_files", "\"..\""],
            ),
            (
                "setup_cache_key_files: [\"/etc/passwd\"]\n",
                1,
                &["\"setup_cache_key_files", "relative"],
            ),
            (
                "setup_cache_key_files: [\"**/package.json\"]\n",
                1,
                &["\"setup_cache_key_files", "only the wildcards"],
            ),
            (
                "pr: true\n",
                1,
                &["\"pr\"", "draft, branch_prefix, on_limit"],
            ),
            (
                "pr: { on_limit: keep }\n",
                1,
                &["\"pr.on_limit\"", "\"draft\", \"branch\" or \"discard\""],
            ),
        ];
        for (text, want_line, needles) in cases {
            let (line, shown) = err(text);
            assert_eq!(line, Some(*want_line), "{text:?}: {shown}");
            assert!(
                shown.starts_with(&format!(".github/kodx.yml: line {want_line}: ")),
                "{text:?}: {shown}"
            );
            for needle in *needles {
                assert!(shown.contains(needle), "{text:?}: {shown} lacks {needle}");
            }
        }
    }

    #[test]
    fn branch_prefix_length_limit() {
        let ok = format!("pr: {{ branch_prefix: {} }}\n", "a".repeat(64));
        assert_eq!(RepoConfig::parse(&ok).unwrap().pr.branch_prefix.len(), 64);
        let (line, shown) = err(&format!("pr: {{ branch_prefix: {} }}\n", "a".repeat(65)));
        assert_eq!(line, Some(1));
        assert!(shown.contains("at most 64"), "{shown}");
    }

    #[test]
    fn not_a_mapping_or_not_yaml() {
        let (line, shown) = err("- image: x\n");
        assert_eq!(line, Some(1));
        assert!(shown.contains("found a list"), "{shown}");
        let (line, shown) = err("image: x\npr: { draft: true\n");
        assert!(line.is_some(), "{shown}");
        assert!(shown.starts_with(".github/kodx.yml: line "), "{shown}");
        assert!(shown.contains("invalid YAML"), "{shown}");
    }

    #[test]
    fn error_without_a_line_omits_it() {
        let e = RepoConfigError::Invalid {
            line: None,
            message: "broken".into(),
        };
        assert_eq!(e.to_string(), ".github/kodx.yml: broken");
    }

    #[test]
    fn defaults_when_unset() {
        let c = RepoConfig::default();
        assert_eq!(c.cost_limit_for(RunKind::Code, &MAXIMA), 2.00);
        assert_eq!(c.cost_limit_for(RunKind::Ask, &MAXIMA), 1.00);
        assert_eq!(c.max_iterations(&MAXIMA), 50);
    }

    #[test]
    fn repo_can_lower_freely_and_raise_only_to_the_maximum() {
        let c = RepoConfig::parse("cost_limit: { code: 9.5, ask: 0.25 }\nmax_iterations: 500\n")
            .unwrap();
        assert_eq!(c.cost_limit_for(RunKind::Code, &MAXIMA), 5.0);
        assert_eq!(c.cost_limit_for(RunKind::Ask, &MAXIMA), 0.25);
        assert_eq!(c.max_iterations(&MAXIMA), 100);

        let c = RepoConfig::parse("cost_limit: { code: 3 }\nmax_iterations: 7\n").unwrap();
        assert_eq!(c.cost_limit_for(RunKind::Code, &MAXIMA), 3.0);
        assert_eq!(c.cost_limit_for(RunKind::Ask, &MAXIMA), 1.0);
        assert_eq!(c.max_iterations(&MAXIMA), 7);
    }

    #[test]
    fn setup_cache_keys_parse_and_are_bounded() {
        let c = RepoConfig::parse(
            "setup_cache: false\nsetup_cache_key_files: [tools/versions.txt, \"requirements/*.txt\"]\n",
        )
        .unwrap();
        assert_eq!(c.setup_cache, Some(false));
        assert_eq!(
            c.setup_cache_key_files,
            ["tools/versions.txt", "requirements/*.txt"]
        );
        let d = RepoConfig::default();
        assert_eq!((d.setup_cache, d.setup_cache_key_files.len()), (None, 0));
        let many: Vec<String> = (0..65).map(|i| format!("f{i}")).collect();
        let (line, shown) = err(&format!("setup_cache_key_files: [{}]\n", many.join(", ")));
        assert_eq!(line, Some(1), "{shown}");
        assert!(shown.contains("at most 64 paths, got 65"), "{shown}");
    }

    #[test]
    fn defaults_are_clamped_by_a_low_maximum_too() {
        let low = ServerMaxima {
            cost_limit: 1.5,
            max_iterations: 20,
        };
        let c = RepoConfig::default();
        assert_eq!(c.cost_limit_for(RunKind::Code, &low), 1.5);
        assert_eq!(c.cost_limit_for(RunKind::Ask, &low), 1.0);
        assert_eq!(c.max_iterations(&low), 20);
    }

    #[test]
    fn pr_template_names_a_file() {
        let c = RepoConfig::parse("pr: { template: bugfix }\n").unwrap();
        assert_eq!(c.pr.template.as_deref(), Some("bugfix"));
        for bad in ["pr: { template: '' }\n", "pr: { template: a/b.md }\n"] {
            let e = RepoConfig::parse(bad).unwrap_err().to_string();
            assert!(e.contains("pr.template"), "{bad}: {e}");
        }
    }

    #[test]
    fn checks_guard_lists_globs_and_refuses_bad_ones_with_their_line() {
        let c = RepoConfig::parse("checks_guard: [\"tests/**\", \"**/*.snap\"]\n").unwrap();
        assert_eq!(
            c.checks_guard,
            Some(vec!["tests/**".to_string(), "**/*.snap".to_string()])
        );
        assert_eq!(RepoConfig::default().checks_guard, None);
        for (bad, says) in [
            ("checks_guard: [\"/etc/**\"]\n", "relative"),
            ("checks_guard: [\"a[b\"]\n", "valid glob"),
            ("checks_guard: tests\n", "sequence"),
        ] {
            let e = RepoConfig::parse(bad).unwrap_err().to_string();
            assert!(e.contains("checks_guard") && e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn checks_as_the_spec_writes_them() {
        let c = RepoConfig::parse(
            "checks:\n  - { name: tests, run: cargo test --quiet, timeout: 600 }\n  - { name: lint,  run: cargo clippy -- -D warnings }\ncheck_repair: 2\npr: { on_red: draft }\n",
        )
        .unwrap();
        assert_eq!(c.checks.len(), 2);
        assert_eq!(c.checks[0].run, "cargo test --quiet");
        assert_eq!(
            c.checks[1].timeout_secs,
            crate::checks::DEFAULT_CHECK_TIMEOUT_SECS
        );
        assert_eq!(c.check_repair(5), 2);
        assert_eq!(
            RepoConfig::parse("check_repair: 9\n")
                .unwrap()
                .check_repair(5),
            5
        );
        assert_eq!(RepoConfig::default().check_repair(5), 2);
        assert_eq!(c.pr.on_red, OnRed::Draft);
        assert_eq!(
            RepoConfig::parse("pr: { on_red: discard }\n")
                .unwrap()
                .pr
                .on_red,
            OnRed::Discard
        );
        for (bad, says) in [
            (
                "checks:\n  - { name: a, run: x }\n  - { name: A, run: y }\n",
                "\"checks\": two checks are named \"A\"",
            ),
            (
                "checks:\n  - { name: a }\n",
                "line 2: invalid value for \"checks[0]\": missing field `run`",
            ),
            (
                "checks:\n  - { name: a, run: x, timeout: 0 }\n",
                "\"checks[0].timeout\": must be from 1 to",
            ),
            (
                "checks:\n  - { name: 'a`b', run: x }\n",
                "\"checks[0].name\": may hold",
            ),
            (
                "checks:\n  - { name: a, run: x, when: always }\n",
                "unknown key \"checks[0].when\"",
            ),
            ("check_repair: -1\n", "\"check_repair\": must be 0 or more"),
            (
                "pr: { on_red: maybe }\n",
                "\"pr.on_red\": must be \"draft\", \"open\" or \"discard\"",
            ),
        ] {
            let e = RepoConfig::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let many: String = (0..21)
            .map(|i| format!("  - {{ name: c{i}, run: x }}\n"))
            .collect();
        let e = RepoConfig::parse(&format!("checks:\n{many}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 20 checks"), "{e}");
    }
}
