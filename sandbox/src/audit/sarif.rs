//! SARIF 2.1.0 rendering: one result per distinct denial, one rule per layer + operation.
//!
//! Paths become absolute `file://` URIs (percent-encoded by `proto::FileUri`). The invocation records whether the
//! collector could see (`executionSuccessful`) and each coverage gap as a notification, so a
//! code-scanning UI never shows a blind run as clean.

use serde_json::{Value, json};

use crate::audit::report::{RunAudit, distinct};

/// The schema URI written into `$schema`.
pub const SARIF_SCHEMA_URI: &str = "https://json.schemastore.org/sarif-2.1.0.json";

/// The SARIF log of a run.
pub fn sarif(audit: &RunAudit, fail_on_denial: bool) -> Value {
    let level = if fail_on_denial { "error" } else { "warning" };
    let mut rule_ids: Vec<String> = Vec::new();
    let mut results = Vec::new();
    for (denial, count) in distinct(&audit.denials) {
        let rule_id = format!("{}/{}", denial.layer.as_str(), denial.operation);
        let rule_index = match rule_ids.iter().position(|r| *r == rule_id) {
            Some(i) => i,
            None => {
                rule_ids.push(rule_id.clone());
                rule_ids.len() - 1
            }
        };
        let mut result = json!({
            "ruleId": rule_id,
            "ruleIndex": rule_index,
            "level": level,
            "message": {"text": format!(
                "The sandbox ({}) denied {} on {} ({count}x). Allow: {}",
                denial.layer.as_str(), denial.operation, denial.target(), denial.allow_rule
            )},
            "partialFingerprints": {
                "execwardDenial/v1": format!("{}|{}|{}", denial.layer.as_str(), denial.operation, denial.target())
            },
            "properties": {
                "layer": denial.layer.as_str(),
                "operation": denial.operation,
                "count": count,
                "pid": denial.pid,
                "exe": denial.exe,
                "syscall": denial.syscall,
                "address": denial.address,
                "allowRule": denial.allow_rule,
                "firstSeen": denial.time,
            },
        });
        if let Some(path) = &denial.path {
            result["locations"] = json!([{
                "physicalLocation": {"artifactLocation": {"uri": file_uri(path)}}
            }]);
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
    let notifications: Vec<Value> = audit
        .coverage
        .gaps
        .iter()
        .map(|gap| json!({"level": "warning", "message": {"text": gap}}))
        .collect();
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
                "executionSuccessful": audit.coverage.audit,
                "commandLine": audit.command.join(" "),
                "exitCode": audit.exit_status,
                "toolExecutionNotifications": notifications,
                "properties": {"coverage": audit.coverage},
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
