//! Reading programs: files (YAML or TOML), the built-in ones, and the repository's
//! `.kodx/config.toml`.

use std::io;
use std::path::{Path, PathBuf};

use super::error::ProgramError;
use super::parse::{from_toml, from_yaml};
use super::raw::{check_cost_limit, RawCommand, RawDotKodxConfig, RawProgram};
use super::spec::{Format, Program};

const BUILTINS: [(&str, &str); 3] = [
    ("assistant", include_str!("../../prompts/assistant.yaml")),
    ("ask", include_str!("../../prompts/ask.yaml")),
    ("code", include_str!("../../prompts/code.yaml")),
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::program::{DockerSpec, Limits, Overrides, ProviderKind};

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

    pub(in crate::program) fn yaml(text: &str) -> Result<Program, ProgramError> {
        Program::parse(text, "my.yaml", Format::Yaml)
    }

    fn toml_program(text: &str) -> Result<Program, ProgramError> {
        Program::parse(text, "my.toml", Format::Toml)
    }

    pub(in crate::program) const MINIMAL_YAML: &str =
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
    fn errors_in_arrays_and_odd_keys_name_the_key_as_before() {
        let err = |r: Result<Program, ProgramError>| r.unwrap_err().to_string();
        // YAML names the element; TOML the key holding the array, or the [[table]].
        assert_eq!(
            err(yaml("parameters:\n  stop_sequences: [1, {a: b}]\n")),
            "my.yaml: invalid value for \"parameters.stop_sequences[1]\" at line 2: invalid type: map, expected a string"
        );
        assert_eq!(
            err(toml_program("[parameters]\nstop_sequences = [\"a\", 2]\n")),
            "my.toml: invalid value for \"parameters.stop_sequences\" at line 2: invalid type: integer `2`, expected a string"
        );
        assert_eq!(
            err(toml_program("[[model]]\nname = \"x\"\n")),
            "my.toml: invalid value for \"model\" at line 1: invalid type: map, expected a string"
        );
        // A key that is not a string names nothing.
        assert_eq!(
            err(yaml("? [a]\n: b\n")),
            "my.yaml at line 1: invalid type: sequence, expected field identifier"
        );
        assert_eq!(
            err(yaml("model:\n  ? [a]\n  : b\n")),
            "my.yaml: invalid value for \"model\" at line 2: invalid type: sequence, expected field identifier"
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
}
