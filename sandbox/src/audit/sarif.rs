//! SARIF 2.1.0 rendering: one result per group of denials (layer, operation, path prefix) with
//! its count, one rule per layer + operation.
//!
//! Paths become absolute `file://` URIs (percent-encoded by `proto::FileUri`); a result's
//! locations are its group's listed examples. The invocation records whether the audit saw
//! everything (`executionSuccessful` is false when it was blind or incomplete) and each coverage
//! gap as a notification, so a code-scanning UI never shows a blind or incomplete run as clean.

use serde_json::{Value, json};

use crate::audit::report::RunAudit;

/// The schema URI written into `$schema`.
pub const SARIF_SCHEMA_URI: &str = "https://json.schemastore.org/sarif-2.1.0.json";

/// The SARIF log of a run.
pub fn sarif(audit: &RunAudit, fail_on_denial: bool) -> Value {
    let level = if fail_on_denial { "error" } else { "warning" };
    let mut rule_ids: Vec<String> = Vec::new();
    let mut results = Vec::new();
    for group in audit.aggregate.groups() {
        let rule_id = format!("{}/{}", group.layer.as_str(), group.operation);
        let rule_index = match rule_ids.iter().position(|r| *r == rule_id) {
            Some(i) => i,
            None => {
                rule_ids.push(rule_id.clone());
                rule_ids.len() - 1
            }
        };
        let targets: Vec<&str> = group.examples.iter().map(|e| e.denial.target()).collect();
        let first = group.examples.first().map(|e| &e.denial);
        let mut result = json!({
            "ruleId": rule_id,
            "ruleIndex": rule_index,
            "level": level,
            "message": {"text": format!(
                "The sandbox ({}) denied {} under {} ({}x; e.g. {}). Allow: {}",
                group.layer.as_str(), group.operation, group.prefix, group.count,
                targets.join(", "), group.allow_rule()
            )},
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
                "syscall": first.and_then(|d| d.syscall.as_deref()),
                "errno": first.and_then(|d| d.errno.as_deref()),
                "allowRule": group.allow_rule(),
                "firstSeen": group.first_seen,
                "lastSeen": group.last_seen,
            },
        });
        let locations: Vec<Value> = group
            .examples
            .iter()
            .filter_map(|e| e.denial.path.as_deref())
            .map(|path| json!({"physicalLocation": {"artifactLocation": {"uri": file_uri(path)}}}))
            .collect();
        if !locations.is_empty() {
            result["locations"] = Value::Array(locations);
        }
        results.push(result);
    }
    let rules: Vec<Value> = rule_ids
        .iter()
        .map(|id| {
            json!({
                "id": id,
                "name": id.replace(['/', '.'], "_"),
                "shortDescription": {"text": format!("Sandbox denial: {id}")},
                "fullDescription": {"text": format!(
                    "The execward sandbox refused {id} to the command under audit. Each result \
                     names the rule that would allow it."
                )},
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
    json!({
        "$schema": SARIF_SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "execward sandbox-run",
                "version": env!("CARGO_PKG_VERSION"),
                "rules": rules,
            }},
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
        }],
    })
}

fn file_uri(path: &str) -> String {
    match proto::FileUri::from_path(path) {
        Ok(uri) => uri.to_uri_string(),
        // A relative path (never produced by the audit) stays as it is.
        Err(_) => path.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_percent_encoded_file_uris() {
        assert_eq!(file_uri("/a b/c#d"), "file:///a%20b/c%23d");
    }
}
