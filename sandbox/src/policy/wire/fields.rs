//! Taking the fields of a wire object apart: typed values with messages that show the
//! accepted forms, leftover keys refused, paths absolute (or `file:` URIs).

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::policy::PolicyError;

pub(super) fn object(value: Result<Value, serde_json::Error>) -> Map<String, Value> {
    match value {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// The top-level `network` value, with a message that shows the accepted forms.
pub(super) fn network_value(value: Value) -> Result<crate::policy::NetworkPolicy, PolicyError> {
    let setting: crate::policy::network::NetworkSetting = serde_json::from_value(value.clone())
        .map_err(|_| crate::policy::network::NetworkError::Malformed { value })?;
    crate::policy::NetworkPolicy::from_setting(setting)
}

pub(super) fn reject_extra(map: &Map<String, Value>, source: &str) -> Result<(), PolicyError> {
    match map.keys().next() {
        None => Ok(()),
        Some(key) => Err(PolicyError::Shape {
            message: format!(
                "unknown key {key:?} beside {source:?} (expected only \"cwd\", \"workspaceRoots\", \
                 \"network\", \"writableRoots\", \"allowances\", \"denyPaths\" and \
                 \"readableCredentialStores\")"
            ),
        }),
    }
}

/// Removes `key`, an array of strings (absent or `null`: empty); `example` shows an entry in the
/// error.
pub(super) fn take_strings(
    map: &mut Map<String, Value>,
    key: &str,
    example: &str,
) -> Result<Vec<String>, PolicyError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(PolicyError::Shape {
                    message: format!(
                        "{key} entries must be strings such as {example} (got {other})"
                    ),
                }),
            })
            .collect(),
        Some(other) => Err(PolicyError::Shape {
            message: format!("{key} must be an array such as [{example}] (got {other})"),
        }),
    }
}

pub(super) fn take_path(
    map: &mut Map<String, Value>,
    key: &str,
) -> Result<Option<PathBuf>, PolicyError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => parse_abs(key, &s).map(Some),
        Some(other) => Err(PolicyError::Shape {
            message: format!("{key} must be a file: URI string (got {other})"),
        }),
    }
}

pub(super) fn shape(what: &str, err: serde_json::Error) -> PolicyError {
    PolicyError::Shape {
        message: format!("{what}: {err}"),
    }
}

/// Parses an absolute path or a `file:` URI (`file:///abs/path`, `file://localhost/abs`),
/// percent-decoding the URI form.
///
/// # Errors
/// [`PolicyError::NotAbsolute`] for relative paths, other URI schemes or remote hosts.
pub(crate) fn parse_abs(field: &str, value: &str) -> Result<PathBuf, PolicyError> {
    let not_absolute = || PolicyError::NotAbsolute {
        field: field.to_owned(),
        value: value.to_owned(),
    };
    // One `file:` URI parser for the whole project (exact for non-UTF-8 names).
    let raw = if value
        .get(..5)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("file:"))
    {
        proto::FileUri::parse(value)
            .map_err(|_| not_absolute())?
            .into_path_buf()
    } else {
        PathBuf::from(value)
    };
    if !raw.is_absolute() || raw.as_os_str().is_empty() {
        return Err(not_absolute());
    }
    if raw
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(not_absolute());
    }
    Ok(raw)
}
