//! SARIF 2.1.0 rendering: one result per group of denials (layer, operation, path prefix) with
//! its count, one rule per layer + operation.
//!
//! Every result has at least one location, and every location is repository-relative
//! (`uriBaseId` [`SRCROOT`], whose absolute value is written in `originalUriBaseIds`), as GitHub
//! code scanning requires:
//! - a denied path under the audit root (`--audit-root`, else the command's working directory)
//!   is that path, relative to the root, percent-encoded, without a `.` or `..` segment;
//! - anything else (a path outside the root, or the root itself; a seccomp, proxy or
//!   unix-socket denial with no path in the root) points at [`RUNTIME_ARTIFACT_URI`], which is
//!   not a file: it stands for "the sandboxed run", and is described so in `artifacts`. The real
//!   path, address or syscall stays in the location's message and in the result's `properties`.
//!
//! The invocation records whether the audit saw everything (`executionSuccessful` is false when
//! it was blind or incomplete) and each coverage gap as a notification, so a code-scanning UI
//! never shows a blind or incomplete run as clean.

use std::path::{Component, Path};

use serde_json::{Value, json};

use crate::report::RunAudit;
use sandbox::denial::Layer;

/// The schema URI written into `$schema`.
pub const SARIF_SCHEMA_URI: &str = "https://json.schemastore.org/sarif-2.1.0.json";

/// The `uriBaseId` of every location: the audit root.
pub const SRCROOT: &str = "%SRCROOT%";

/// The artifact a denial outside the audit root points at (relative to [`SRCROOT`]). It is not
/// a file of the repository: code scanning needs a location in the repository for every result,
/// and a runtime denial of `/etc/x`, of `socket()` or of `evil.example:443` has none.
pub const RUNTIME_ARTIFACT_URI: &str = ".execward/sandbox-run";

/// Where the documentation lives (`informationUri`, and each rule's `helpUri` with an anchor
/// of docs/audit.md). Set `EXECWARD_DOCS_URL` at build time to point a fork at its own copy.
pub const DOCS_BASE_URI: &str = match option_env!("EXECWARD_DOCS_URL") {
    Some(url) => url,
    None => "https://github.com/execward/execward/blob/main/",
};

/// The docs/audit.md section that explains denials of `layer`.
fn help_anchor(layer: Layer) -> &'static str {
    match layer {
        Layer::Proxy => "egress-proxy-denials",
        Layer::UnixSockets => "unix-socket-gate-denials",
        Layer::Unexplained => "what-the-audit-can-and-cannot-see",
        Layer::Landlock | Layer::Seccomp | Layer::Mount | Layer::Helper => "the-advice-allow_rule",
    }
}

/// `path` relative to `root` as a percent-encoded URI reference, when it lies strictly under
/// `root` and every segment is a plain name (no `.`, `..`, or empty segment).
pub fn relative_uri(root: &Path, path: &str) -> Option<String> {
    let path = Path::new(path);
    if !path.is_absolute() || !root.is_absolute() {
        return None;
    }
    // Component-wise: `/repo-other` is not under `/repo`, and `..` never counts as inside.
    let relative = path.strip_prefix(root).ok()?;
    // Rebuilt from its plain names only (a `.` is dropped, a `..` refuses).
    let mut rebuilt = std::path::PathBuf::from("/");
    for component in relative.components() {
        match component {
            Component::Normal(name) => rebuilt.push(name),
            _ => return None,
        }
    }
    if rebuilt == Path::new("/") {
        return None;
    }
    // The file-URI encoder of the wire protocol, on the path as if it were at `/`.
    let uri = proto::FileUri::from_path(rebuilt).ok()?.to_uri_string();
    uri.strip_prefix("file:///").map(str::to_owned)
}

/// The URI of the audit root, ending in `/` as `originalUriBaseIds` requires.
fn root_uri(root: &Path) -> String {
    let mut uri = match proto::FileUri::from_path(root) {
        Ok(uri) => uri.to_uri_string(),
        Err(_) => "file:///".to_owned(),
    };
    if !uri.ends_with('/') {
        uri.push('/');
    }
    uri
}

fn location(uri: &str, text: &str) -> Value {
    json!({
        "physicalLocation": {"artifactLocation": {"uri": uri, "uriBaseId": SRCROOT}},
        "message": {"text": text},
    })
}

/// The SARIF log of a run.
pub fn sarif(audit: &RunAudit, fail_on_denial: bool) -> Value {
    let level = if fail_on_denial { "error" } else { "warning" };
    let mut rules: Vec<(String, Layer)> = Vec::new();
    let mut results = Vec::new();
    let mut runtime_artifact_used = false;
    for group in audit.aggregate.groups() {
        let rule_id = format!("{}/{}", group.layer.as_str(), group.operation);
        let rule_index = match rules.iter().position(|(r, _)| *r == rule_id) {
            Some(i) => i,
            None => {
                rules.push((rule_id.clone(), group.layer));
                rules.len() - 1
            }
        };
        let targets: Vec<&str> = group.examples.iter().map(|e| e.denial.target()).collect();
        let first = group.examples.first().map(|e| &e.denial);
        let mut locations: Vec<Value> = Vec::new();
        for example in &group.examples {
            let denial = &example.denial;
            let inside = denial
                .path
                .as_deref()
                .and_then(|path| relative_uri(&audit.root, path));
            locations.push(match inside {
                Some(uri) => location(
                    &uri,
                    &format!("denied {} {}", group.operation, denial.target()),
                ),
                None => {
                    runtime_artifact_used = true;
                    location(
                        RUNTIME_ARTIFACT_URI,
                        &format!(
                            "denied {} {} (outside the repository; not a file of it)",
                            group.operation,
                            denial.target()
                        ),
                    )
                }
            });
        }
        if locations.is_empty() {
            runtime_artifact_used = true;
            locations.push(location(
                RUNTIME_ARTIFACT_URI,
                &format!("denied {} under {}", group.operation, group.prefix),
            ));
        }
        results.push(json!({
            "ruleId": rule_id,
            "ruleIndex": rule_index,
            "level": level,
            "message": {"text": format!(
                "The sandbox ({}) denied {} under {} ({}x; e.g. {}). Allow: {}",
                group.layer.as_str(), group.operation, group.prefix, group.count,
                targets.join(", "), group.allow_rule()
            )},
            "locations": locations,
            "partialFingerprints": {
                "execwardDenial/v2": format!("{}|{}|{}", group.layer.as_str(), group.operation, group.prefix)
            },
            "properties": {
                "layer": group.layer.as_str(),
                "operation": group.operation,
                "prefix": group.prefix,
                "count": group.count,
                "listed": group.examples.len(),
                "examples": targets,
                "pid": first.and_then(|d| d.pid),
                "exe": first.and_then(|d| d.exe.as_deref()),
                "path": first.and_then(|d| d.path.as_deref()),
                "address": first.and_then(|d| d.address.as_deref()),
                "syscall": first.and_then(|d| d.syscall.as_deref()),
                "errno": first.and_then(|d| d.errno.as_deref()),
                "allowRule": group.allow_rule(),
                "firstSeen": group.first_seen,
                "lastSeen": group.last_seen,
            },
        }));
    }
    let rules: Vec<Value> = rules
        .iter()
        .map(|(id, layer)| {
            json!({
                "id": id,
                "name": id.replace(['/', '.', '-'], "_"),
                "shortDescription": {"text": format!("Sandbox denial: {id}")},
                "fullDescription": {"text": format!(
                    "The execward sandbox refused {id} to the command under audit. Each result \
                     names the rule that would allow it."
                )},
                "helpUri": format!("{DOCS_BASE_URI}docs/audit.md#{}", help_anchor(*layer)),
                "defaultConfiguration": {"level": level},
            })
        })
        .collect();
    let coverage = &audit.coverage;
    let gap_level = if coverage.is_full() {
        "warning"
    } else {
        "error"
    };
    let notifications: Vec<Value> = coverage
        .gaps
        .iter()
        .map(|gap| json!({"level": gap_level, "message": {"text": gap}}))
        .collect();
    let aggregate = &audit.aggregate;
    let mut run = json!({
        "tool": {"driver": {
            "name": "execward sandbox-run",
            "version": env!("CARGO_PKG_VERSION"),
            "informationUri": format!("{DOCS_BASE_URI}docs/audit.md"),
            "rules": rules,
        }},
        "originalUriBaseIds": {
            SRCROOT: {
                "uri": root_uri(&audit.root),
                "description": {"text": "The audit root: --audit-root, else the command's working directory."},
            },
        },
        "invocations": [{
            "executionSuccessful": coverage.is_full(),
            "commandLine": audit.command.join(" "),
            "exitCode": audit.exit_status,
            "toolExecutionNotifications": notifications,
            "properties": {
                "coverage": coverage,
                "denials": aggregate.total(),
                "groups": aggregate.groups().len(),
                "listed": aggregate.listed(),
                "aggregated": aggregate.aggregated(),
            },
        }],
        "results": results,
    });
    if runtime_artifact_used {
        run["artifacts"] = json!([{
            "location": {"uri": RUNTIME_ARTIFACT_URI, "uriBaseId": SRCROOT},
            "description": {"text": "Not a file: the sandboxed run itself. Denials outside the \
                repository (absolute paths, seccomp, egress proxy, unix sockets) point here; \
                the real path, address or syscall is in each location's message and the \
                result's properties."},
        }]);
    }
    json!({
        "$schema": SARIF_SCHEMA_URI,
        "version": "2.1.0",
        "runs": [run],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn paths_under_the_root_become_percent_encoded_relative_uris() {
        let root = Path::new("/work/repo");
        assert_eq!(
            relative_uri(root, "/work/repo/a b/c#d").as_deref(),
            Some("a%20b/c%23d")
        );
        assert_eq!(relative_uri(root, "/work/repo/x").as_deref(), Some("x"));
        // `.` segments are dropped by the component walk, never written.
        assert_eq!(
            relative_uri(root, "/work/repo/a/./b").as_deref(),
            Some("a/b")
        );
    }

    #[test]
    fn paths_outside_the_root_or_the_root_itself_have_no_relative_uri() {
        let root = Path::new("/work/repo");
        for path in [
            "/work/repo",
            "/work/repo/",
            "/work/repo-other/x",
            "/work/repo/../etc/passwd",
            "/work/repo/a/../../etc/passwd",
            "/etc/passwd",
            "relative/x",
            "-",
        ] {
            assert_eq!(relative_uri(root, path), None, "{path}");
        }
    }

    #[test]
    fn the_root_uri_ends_in_a_slash() {
        assert_eq!(root_uri(Path::new("/a b")), "file:///a%20b/");
        assert_eq!(root_uri(Path::new("/")), "file:///");
    }
}
