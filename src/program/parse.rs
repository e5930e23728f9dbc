//! Reading YAML and TOML into the file shapes, and the parsers' errors as [`ProgramError`]s
//! that name the file, the key path and the line.
//!
//! The key path of an error comes from [`serde_path_to_error`], which tracks it while the
//! file is read: the path of the value that failed, or of the unknown key itself. What is
//! left of the parsers' messages is only the message: serde_norway's without the path and
//! location it adds, toml's as it is.

use serde::de::DeserializeOwned;
use serde_path_to_error::{Path, Segment};

use super::error::ProgramError;
use super::spec::Format;

/// A typed-deserialization error, taken apart: the dotted key path it is about (if known),
/// the message without path or location, and the 1-based line. (`.github/kodx.yml`'s
/// reader, [`crate::repo_config`], splits its errors with [`split_yaml_error`].)
pub(crate) struct SchemaError {
    pub(crate) path: Option<String>,
    pub(crate) message: String,
    pub(crate) line: Option<usize>,
}

/// The error of reading a typed value, with the key path serde_path_to_error tracked
/// (empty at the top level: no key). An unknown key's path ends with that key.
fn schema_error(
    path: &[&Segment],
    message: String,
    line: Option<usize>,
    file: &str,
) -> ProgramError {
    let file = file.to_string();
    let path = (!path.is_empty()).then(|| yaml_path(path));
    if let Some((key, expected)) = parse_unknown_field(&message) {
        return ProgramError::UnknownKey {
            file,
            key: path.unwrap_or(key),
            line,
            expected,
        };
    }
    match path {
        Some(key) => ProgramError::InvalidValue {
            file,
            key,
            line,
            message,
        },
        None => ProgramError::Invalid {
            file,
            line,
            message,
        },
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

/// serde_norway's message without the location it appends (" at line L column C").
fn yaml_message_of(e: &serde_norway::Error) -> String {
    let message = e.to_string();
    if let Some(loc) = e.location() {
        let suffix = format!(" at line {} column {}", loc.line(), loc.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            return stripped.to_string();
        }
    }
    message
}

/// serde_norway renders errors as "[path: ]message[ at line L column C]"; split that up.
/// (For a reader that does not track the path itself.)
pub(crate) fn split_yaml_error(e: &serde_norway::Error) -> SchemaError {
    let mut message = yaml_message_of(e);
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

/// The segments of `path` an error names: up to a key that is not a string (YAML's `? [a]`),
/// which names nothing; and in TOML up to the first array index, so the error names the
/// key holding the array (`parameters.stop_sequences`, `model` for `[[model]]`), as the
/// messages always have.
fn named_segments(path: &Path, format: Format) -> Vec<&Segment> {
    path.iter()
        .take_while(|s| match s {
            Segment::Unknown => false,
            Segment::Seq { .. } => format == Format::Yaml,
            Segment::Map { .. } | Segment::Enum { .. } => true,
        })
        .collect()
}

/// `segments` written as serde_norway writes a path: keys joined by `.`, indexes as `[i]`.
fn yaml_path(segments: &[&Segment]) -> String {
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } => push_key(&mut out, key),
            Segment::Enum { variant } => push_key(&mut out, variant),
            Segment::Unknown => push_key(&mut out, "?"),
        }
    }
    out
}

fn push_key(out: &mut String, key: &str) {
    if !out.is_empty() {
        out.push('.');
    }
    out.push_str(key);
}

/// The message of a typed YAML error at `path`: serde_norway starts it with the path of
/// the value it was reading — `path` itself, or for an unknown key the mapping holding it
/// (the path without its last segment) — which is taken off.
fn yaml_schema_message(e: &serde_norway::Error, path: &Path) -> String {
    let message = yaml_message_of(e);
    let segments: Vec<&Segment> = path.iter().collect();
    let whole = yaml_path(&segments);
    let parent = yaml_path(&segments[..segments.len().saturating_sub(1)]);
    for prefix in [whole, parent] {
        if prefix.is_empty() {
            continue;
        }
        if let Some(rest) = message.strip_prefix(&format!("{prefix}: ")) {
            return rest.to_string();
        }
    }
    message
}

pub(super) fn from_yaml<T: DeserializeOwned>(text: &str, file: &str) -> Result<T, ProgramError> {
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
    serde_path_to_error::deserialize(serde_norway::Deserializer::from_str(text)).map_err(|e| {
        let inner = e.inner();
        let message = yaml_schema_message(inner, e.path());
        let line = inner.location().map(|l| l.line());
        schema_error(&named_segments(e.path(), Format::Yaml), message, line, file)
    })
}

/// A typed YAML error taken apart, its key path from [`serde_path_to_error`] (for an
/// unknown key, the path ends with that key): `.github/kodx.yml`'s reader builds its own
/// messages from it.
pub(crate) fn yaml_path_error(e: &serde_path_to_error::Error<serde_norway::Error>) -> SchemaError {
    let inner = e.inner();
    let segments = named_segments(e.path(), Format::Yaml);
    SchemaError {
        path: (!segments.is_empty()).then(|| yaml_path(&segments)),
        message: yaml_schema_message(inner, e.path()),
        line: inner.location().map(|l| l.line()),
    }
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

pub(super) fn from_toml<T: DeserializeOwned>(text: &str, file: &str) -> Result<T, ProgramError> {
    let start_of = |e: &toml::de::Error| e.span().map(|span| span.start.min(text.len()));
    let line_of = |start: usize| text[..start].matches('\n').count() + 1;
    let syntax = |e: toml::de::Error| ProgramError::Syntax {
        file: file.to_string(),
        format: Format::Toml,
        line: start_of(&e).map(line_of),
        message: e.message().trim_end().to_string(),
    };
    toml::from_str::<toml::Table>(text).map_err(syntax)?;
    let document = toml::Deserializer::parse(text).map_err(syntax)?;
    serde_path_to_error::deserialize(document).map_err(|e| {
        let inner = e.inner();
        let message = inner.message().trim_end().to_string();
        let line = start_of(inner).map(line_of);
        schema_error(&named_segments(e.path(), Format::Toml), message, line, file)
    })
}
