//! Checks a JSON value against a schema of GitHub's REST description (`@octokit/openapi`,
//! dereferenced), the parts the fakes' answers are checked with: `type`, `nullable`,
//! `required`, `properties`, `items`, `enum`, `anyOf`/`oneOf`/`allOf`. Extracts of the
//! description live in `tests/data/openapi-*.json`.

use serde_json::Value;

/// An extract of `@octokit/openapi` from `tests/data/openapi-{name}.json`.
pub fn extract(name: &str) -> Value {
    let path = format!(
        "{}/tests/data/openapi-{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Every way `value` breaks `schema` (`at`: where, as a JSON path); empty when it fits.
pub fn violations(value: &Value, schema: &Value, at: &str) -> Vec<String> {
    let mut out = Vec::new();
    check(value, schema, at, &mut out);
    out
}

fn check(value: &Value, schema: &Value, at: &str, out: &mut Vec<String>) {
    if value.is_null() && schema["nullable"] == true {
        return;
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = schema[key].as_array() {
            if !options.iter().any(|s| violations(value, s, at).is_empty()) {
                out.push(format!("{at}: fits none of {key}"));
            }
            return;
        }
    }
    if let Some(all) = schema["allOf"].as_array() {
        for s in all {
            check(value, s, at, out);
        }
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(value) {
            out.push(format!("{at}: {value} is not one of {allowed:?}"));
        }
    }
    let fits = match schema["type"].as_str() {
        None => true,
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("array") => value.is_array(),
        Some("object") => value.is_object(),
        Some(other) => panic!("{at}: schema type {other} is not handled"),
    };
    if !fits {
        out.push(format!("{at}: {value} is not of type {}", schema["type"]));
        return;
    }
    if let (Some(required), Some(object)) = (schema["required"].as_array(), value.as_object()) {
        for key in required.iter().filter_map(Value::as_str) {
            if !object.contains_key(key) {
                out.push(format!("{at}: `{key}` is required"));
            }
        }
    }
    if let (Some(properties), Some(object)) = (schema["properties"].as_object(), value.as_object())
    {
        for (key, v) in object {
            if let Some(s) = properties.get(key) {
                check(v, s, &format!("{at}.{key}"), out);
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (i, v) in array.iter().enumerate() {
            check(v, items, &format!("{at}[{i}]"), out);
        }
    }
}
