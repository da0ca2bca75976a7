//! Rendering a run's denials: JSON lines, the human summary, GitHub workflow annotations, the
//! Markdown job summary.
//! Pure functions; SARIF is in [`super::sarif`].
//!
//! The JSON-lines report (and the `--audit-fd` stream) is: one `denial` line per listed denial
//! (the examples of each group, written as they arrive), then one `group` line per group with
//! its count, then one `coverage` line with the totals (`denials`, `listed`, `aggregated`).
//!
//! Every rendering says what the collector could not see ([`Coverage::gaps`]), so an empty
//! list never reads as "nothing was denied" when the collector was blind.

mod github;
mod markdown;
#[cfg(test)]
mod tests;

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::aggregate::Aggregate;
use crate::limits::{EXAMPLES_PER_GROUP, printable};
use sandbox::denial::{Coverage, Denial, Layer};

pub use github::github;
pub use markdown::{MARKDOWN_MAX_GROUPS, markdown, markdown_cell};

/// Report format of `--audit FILE`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// One JSON object per line: `{"kind":"denial",...}` per listed denial (up to 4
    /// distinct examples per group, streamed as they arrive), one `{"kind":"group",...}` line
    /// per (layer, operation, path prefix) with its count, then one `{"kind":"coverage",...}`
    /// line with the totals.
    #[default]
    Jsonl,
    /// SARIF 2.1.0, one result per group of denials.
    Sarif,
    /// GitHub Actions workflow commands (`::warning ...`), one per group of denials.
    Github,
    /// A Markdown job summary (for `$GITHUB_STEP_SUMMARY`): one table row per group with its
    /// count and advice, then what the audit could not see.
    Markdown,
}

/// Everything a report needs.
#[derive(Clone, Debug)]
pub struct RunAudit {
    /// The command that ran.
    pub command: Vec<String>,
    /// The directory SARIF locations are relative to (`--audit-root`, else the command's
    /// working directory), absolute and resolved.
    pub root: std::path::PathBuf,
    /// Its exit status (as `sandbox-run` reports it: 128+N for a signal).
    pub exit_status: i32,
    /// The denials, aggregated.
    pub aggregate: Aggregate,
    /// What could be observed.
    pub coverage: Coverage,
}

/// Most groups the stderr summary lists one by one (the report has all of them).
const SUMMARY_MAX_GROUPS: usize = 40;

/// A line of the JSON-lines report (and of the `--audit-fd` stream).
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum Line<'a> {
    /// A listed denial (an example of its group), written as it arrives.
    Denial {
        group: usize,
        #[serde(flatten)]
        denial: &'a Denial,
    },
    /// A group's count, at the end.
    Group {
        group: usize,
        layer: Layer,
        operation: &'a str,
        prefix: &'a str,
        count: u64,
        listed: usize,
        first_seen: &'a str,
        last_seen: &'a str,
        allow_rule: &'a str,
    },
    /// What was observed and the totals, last.
    Coverage {
        #[serde(flatten)]
        coverage: &'a Coverage,
        denials: u64,
        groups: usize,
        listed: u64,
        aggregated: u64,
        folded_groups: usize,
        exit_status: i32,
    },
}

fn line(line: &Line<'_>) -> String {
    let mut text = serde_json::to_string(line).unwrap_or_default();
    text.push('\n');
    text
}

/// One JSON line for a listed denial of group `group` (what is streamed while the command runs).
pub fn denial_line(group: usize, denial: &Denial) -> String {
    line(&Line::Denial { group, denial })
}

/// The lines written after the command ended: one `group` line per group, then the
/// `coverage` line.
pub fn closing_lines(audit: &RunAudit) -> String {
    let aggregate = &audit.aggregate;
    let mut out = String::new();
    for group in aggregate.groups() {
        out.push_str(&line(&Line::Group {
            group: group.id,
            layer: group.layer,
            operation: &group.operation,
            prefix: &group.prefix,
            count: group.count,
            listed: group.examples.len(),
            first_seen: &group.first_seen,
            last_seen: &group.last_seen,
            allow_rule: group.allow_rule(),
        }));
    }
    out.push_str(&line(&Line::Coverage {
        coverage: &audit.coverage,
        denials: aggregate.total(),
        groups: aggregate.groups().len(),
        listed: aggregate.listed(),
        aggregated: aggregate.aggregated(),
        folded_groups: aggregate.folded_groups(),
        exit_status: audit.exit_status,
    }));
    out
}

/// The live line printed on stderr when a new group of denials appears (control characters
/// escaped, so a path cannot forge lines of the command's log):
/// `sandbox-run: audit: denied fs.make_reg /root (mount) — allow: "/root" = "write" (...)`.
pub fn live_line(denial: &Denial) -> String {
    format!(
        "sandbox-run: audit: denied {} {} ({}) — allow: {}\n",
        printable(&denial.operation),
        printable(denial.target()),
        denial.layer.as_str(),
        printable(&denial.allow_rule)
    )
}

/// The whole JSON-lines report: the listed denials in arrival order, the groups, the coverage.
pub fn jsonl(audit: &RunAudit) -> String {
    let mut out = String::new();
    for (group, denial) in audit.aggregate.examples() {
        out.push_str(&denial_line(group, denial));
    }
    out.push_str(&closing_lines(audit));
    out
}

/// The human summary printed on stderr at exit (control characters of paths shown escaped).
pub fn summary(audit: &RunAudit) -> String {
    let mut out = String::new();
    let coverage = &audit.coverage;
    if !coverage.audit {
        let _ = writeln!(
            out,
            "sandbox-run: audit: UNAVAILABLE, denials were not observed. {}",
            printable(&coverage.gaps.join("; "))
        );
        let _ = writeln!(
            out,
            "sandbox-run: audit: observed only the exit status ({}); this is not a clean report",
            audit.exit_status
        );
        return out;
    }
    let aggregate = &audit.aggregate;
    if aggregate.total() == 0 {
        if coverage.is_full() {
            let _ = writeln!(out, "sandbox-run: audit: no denials observed");
        } else {
            let _ = writeln!(
                out,
                "sandbox-run: audit: no denials observed, but the audit is INCOMPLETE (below): \
                 this is not a clean report"
            );
        }
    } else {
        let layers: Vec<&str> = aggregate.layers().into_iter().map(Layer::as_str).collect();
        let total = aggregate.total();
        let groups = aggregate.groups().len();
        let _ = writeln!(
            out,
            "sandbox-run: audit: {total} denial{} in {groups} group{} by {}",
            if total == 1 { "" } else { "s" },
            if groups == 1 { "" } else { "s" },
            layers.join(", ")
        );
        let mut rows: Vec<(String, String, u64, String)> = aggregate
            .groups()
            .iter()
            .map(|g| {
                (
                    printable(&g.operation),
                    printable(&g.prefix),
                    g.count,
                    printable(g.allow_rule()),
                )
            })
            .collect();
        rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        let shown = &rows[..rows.len().min(SUMMARY_MAX_GROUPS)];
        let width = shown.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
        let pwidth = shown.iter().map(|r| r.1.chars().count()).max().unwrap_or(0);
        for (op, prefix, count, rule) in shown {
            let _ = writeln!(
                out,
                "  {op:width$}  {prefix:pwidth$}  {count:>4}   allow: {rule}"
            );
        }
        if rows.len() > shown.len() {
            let _ = writeln!(
                out,
                "  ... and {} more groups (see the report)",
                rows.len() - shown.len()
            );
        }
        if aggregate.aggregated() > 0 {
            let _ = writeln!(
                out,
                "sandbox-run: audit: {} of them aggregated (counted in their group, not listed: \
                 the report lists up to {EXAMPLES_PER_GROUP} distinct examples per group)",
                aggregate.aggregated()
            );
        }
    }
    if !coverage.complete {
        let _ = writeln!(
            out,
            "sandbox-run: audit: INCOMPLETE: denials may have been hidden or lost (reasons below)"
        );
    }
    for gap in &coverage.gaps {
        let _ = writeln!(out, "sandbox-run: audit: gap: {}", printable(gap));
    }
    out
}
