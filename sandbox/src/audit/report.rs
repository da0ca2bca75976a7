//! Rendering a run's denials: JSON lines, the human summary, GitHub workflow annotations.
//! Pure functions; SARIF is in [`super::sarif`].
//!
//! Every rendering says what the collector could not see ([`Coverage::gaps`]), so an empty
//! list never reads as "nothing was denied" when the collector was blind.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::audit::denial::{Coverage, Denial, Layer};

/// Report format of `--audit FILE`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// One JSON object per line: `{"kind":"denial",...}` per denial, then one
    /// `{"kind":"coverage",...}` line.
    #[default]
    Jsonl,
    /// SARIF 2.1.0, one result per distinct denial.
    Sarif,
    /// GitHub Actions workflow commands (`::warning ...`), one per distinct denial.
    Github,
}

/// Everything a report needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAudit {
    /// The command that ran.
    pub command: Vec<String>,
    /// Its exit status (as `sandbox-run` reports it: 128+N for a signal).
    pub exit_status: i32,
    /// The denials, in the order the kernel logged them.
    pub denials: Vec<Denial>,
    /// What could be observed.
    pub coverage: Coverage,
}

/// A line of the JSON-lines report.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum Line<'a> {
    Denial(&'a Denial),
    Coverage {
        #[serde(flatten)]
        coverage: &'a Coverage,
        denials: usize,
        exit_status: i32,
    },
}

/// The JSON-lines report.
pub fn jsonl(audit: &RunAudit) -> String {
    let mut out = String::new();
    let lines = audit
        .denials
        .iter()
        .map(Line::Denial)
        .chain([Line::Coverage {
            coverage: &audit.coverage,
            denials: audit.denials.len(),
            exit_status: audit.exit_status,
        }]);
    for line in lines {
        out.push_str(&serde_json::to_string(&line).unwrap_or_default());
        out.push('\n');
    }
    out
}

/// One JSON line for a single denial (what `--audit-fd` streams while the command runs).
pub fn denial_line(denial: &Denial) -> String {
    let mut line = serde_json::to_string(&Line::Denial(denial)).unwrap_or_default();
    line.push('\n');
    line
}

/// Distinct denials with their counts, in first-seen order.
pub fn distinct(denials: &[Denial]) -> Vec<(&Denial, usize)> {
    let mut order: Vec<(&Denial, usize)> = Vec::new();
    for denial in denials {
        match order.iter_mut().find(|(d, _)| d.key() == denial.key()) {
            Some((_, count)) => *count += 1,
            None => order.push((denial, 1)),
        }
    }
    order
}

/// The prefix a denial is grouped under in the summary: the directory for file paths (Landlock
/// already names the directory for make/remove operations), the address otherwise.
fn group_prefix(denial: &Denial) -> String {
    match denial.path.as_deref() {
        Some(path) => {
            let names_dir = denial.operation.starts_with("fs.make_")
                || denial.operation.starts_with("fs.remove_")
                || denial.operation == "fs.refer";
            let dir = if names_dir {
                Path::new(path)
            } else {
                Path::new(path).parent().unwrap_or(Path::new(path))
            };
            let dir = dir.display().to_string();
            if dir.ends_with('/') {
                dir
            } else {
                format!("{dir}/")
            }
        }
        None => denial.address.clone().unwrap_or_else(|| "-".to_owned()),
    }
}

/// The human summary printed on stderr at exit.
pub fn summary(audit: &RunAudit) -> String {
    let mut out = String::new();
    let coverage = &audit.coverage;
    if !coverage.audit {
        let _ = writeln!(
            out,
            "sandbox-run: audit: UNAVAILABLE, denials were not observed. {}",
            coverage.gaps.join("; ")
        );
        let _ = writeln!(
            out,
            "sandbox-run: audit: observed only the exit status ({}); this is not a clean report",
            audit.exit_status
        );
        return out;
    }
    let layers: Vec<&str> = {
        let mut layers: Vec<Layer> = audit.denials.iter().map(|d| d.layer).collect();
        layers.sort();
        layers.dedup();
        layers.into_iter().map(Layer::as_str).collect()
    };
    if audit.denials.is_empty() {
        let _ = writeln!(out, "sandbox-run: audit: no denials observed");
    } else {
        let _ = writeln!(
            out,
            "sandbox-run: audit: {} denial{} ({} distinct) by {}",
            audit.denials.len(),
            if audit.denials.len() == 1 { "" } else { "s" },
            distinct(&audit.denials).len(),
            layers.join(", ")
        );
        let mut groups: BTreeMap<(String, String), (usize, String)> = BTreeMap::new();
        for denial in &audit.denials {
            let entry = groups
                .entry((denial.operation.clone(), group_prefix(denial)))
                .or_insert((0, denial.allow_rule.clone()));
            entry.0 += 1;
        }
        let width = groups.keys().map(|(op, _)| op.len()).max().unwrap_or(0);
        let pwidth = groups.keys().map(|(_, p)| p.len()).max().unwrap_or(0);
        for ((op, prefix), (count, rule)) in &groups {
            let _ = writeln!(
                out,
                "  {op:width$}  {prefix:pwidth$}  {count:>4}   allow: {rule}"
            );
        }
    }
    for gap in &coverage.gaps {
        let _ = writeln!(out, "sandbox-run: audit: not observed: {gap}");
    }
    out
}

/// GitHub workflow commands: one annotation per distinct denial (`error` when the run fails on
/// denials, else `warning`), or one warning saying the audit was blind.
pub fn github(audit: &RunAudit, fail_on_denial: bool) -> String {
    let mut out = String::new();
    let level = if fail_on_denial { "error" } else { "warning" };
    if !audit.coverage.audit {
        let _ = writeln!(
            out,
            "::warning title={}::{}",
            escape_property("Sandbox audit unavailable"),
            escape_data(&format!(
                "Denials were not observed, this is not a clean report: {}",
                audit.coverage.gaps.join("; ")
            ))
        );
        // Denials seen without the kernel audit (the egress proxy's) are still listed.
        if audit.denials.is_empty() {
            return out;
        }
    }
    for (denial, count) in distinct(&audit.denials) {
        let title = format!(
            "Sandbox denied {} ({})",
            denial.operation,
            denial.layer.as_str()
        );
        let mut message = format!("{} denied {count}x", denial.target());
        if let Some(exe) = &denial.exe {
            let _ = write!(message, " to {exe}");
        }
        let _ = write!(message, "; allow: {}", denial.allow_rule);
        let _ = writeln!(
            out,
            "::{level} title={}::{}",
            escape_property(&title),
            escape_data(&message)
        );
    }
    for gap in audit.coverage.gaps.iter().filter(|_| audit.coverage.audit) {
        let _ = writeln!(
            out,
            "::warning title={}::{}",
            escape_property("Sandbox audit incomplete"),
            escape_data(gap)
        );
    }
    out
}

fn escape_data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

fn escape_property(text: &str) -> String {
    escape_data(text).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn denial(op: &str, path: Option<&str>, layer: Layer) -> Denial {
        Denial {
            time: "2025-01-01T00:00:00.000Z".to_owned(),
            pid: Some(10),
            exe: Some("/usr/bin/touch".to_owned()),
            layer,
            operation: op.to_owned(),
            path: path.map(str::to_owned),
            address: None,
            syscall: Some("openat".to_owned()),
            allow_rule: "\"/out\" = \"write\"".to_owned(),
        }
    }

    fn full() -> Coverage {
        Coverage {
            audit: true,
            landlock: true,
            seccomp: true,
            mount: true,
            complete: true,
            gaps: Vec::new(),
        }
    }

    #[test]
    fn summary_groups_by_operation_and_directory() {
        let audit = RunAudit {
            command: vec!["make".to_owned()],
            exit_status: 0,
            denials: vec![
                denial("fs.write_file", Some("/out/a"), Layer::Mount),
                denial("fs.write_file", Some("/out/b"), Layer::Mount),
                denial("fs.make_dir", Some("/out"), Layer::Landlock),
            ],
            coverage: full(),
        };
        let text = summary(&audit);
        assert!(
            text.starts_with("sandbox-run: audit: 3 denials (3 distinct) by landlock, mount\n")
        );
        assert!(text.contains("fs.write_file  /out/     2"), "{text}");
        assert!(text.contains("fs.make_dir    /out/     1"), "{text}");
    }

    #[test]
    fn blind_reports_say_so_in_every_format() {
        let audit = RunAudit {
            command: vec!["make".to_owned()],
            exit_status: 0,
            denials: Vec::new(),
            coverage: Coverage::blind("joining the audit multicast group failed"),
        };
        assert!(summary(&audit).contains("UNAVAILABLE"));
        assert!(!summary(&audit).contains("no denials"));
        assert!(github(&audit, true).starts_with("::warning title=Sandbox audit unavailable::"));
        let last = jsonl(&audit);
        let value: serde_json::Value = serde_json::from_str(last.trim()).unwrap();
        assert_eq!(value["kind"], "coverage");
        assert_eq!(value["audit"], false);
    }

    #[test]
    fn github_annotations_escape_their_properties() {
        let audit = RunAudit {
            command: Vec::new(),
            exit_status: 0,
            denials: vec![denial("fs.write_file", Some("/out/a,b"), Layer::Landlock)],
            coverage: full(),
        };
        let text = github(&audit, false);
        assert_eq!(
            text,
            "::warning title=Sandbox denied fs.write_file (landlock)::/out/a,b denied 1x to \
             /usr/bin/touch; allow: \"/out\" = \"write\"\n"
        );
    }
}
