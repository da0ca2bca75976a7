//! The Markdown job summary (`$GITHUB_STEP_SUMMARY`), every text the command controls escaped.

use std::fmt::Write as _;

use super::RunAudit;
use crate::limits::{EXAMPLES_PER_GROUP, printable};
use sandbox::denial::Layer;

/// Most groups the Markdown summary lists as rows (GitHub caps a step summary at 1 MiB; 512
/// groups of 1 KiB paths would not fit).
pub const MARKDOWN_MAX_GROUPS: usize = 100;

/// A Markdown job summary (for `$GITHUB_STEP_SUMMARY`): a heading with the totals, one table
/// row per group (layer, operation, where, count, advice), then the coverage gaps. Every text
/// the command controls (paths, addresses, advice naming them) is escaped by [`markdown_cell`],
/// so it stays inside its cell as plain text.
pub fn markdown(audit: &RunAudit, fail_on_denial: bool) -> String {
    let mut out = String::new();
    let coverage = &audit.coverage;
    let aggregate = &audit.aggregate;
    let _ = writeln!(out, "### Sandbox denials\n");
    if !coverage.audit {
        let _ = writeln!(
            out,
            "**Audit unavailable: denials were not observed; this is not a clean report.** {}\n",
            markdown_cell(&coverage.gaps.join("; "))
        );
    }
    let total = aggregate.total();
    if total == 0 {
        if coverage.is_full() {
            let _ = writeln!(out, "No denials observed.");
        } else if coverage.audit {
            let _ = writeln!(
                out,
                "No denials observed, but the audit is **incomplete** (below): this is not a \
                 clean report."
            );
        }
    } else {
        let layers: Vec<&str> = aggregate.layers().into_iter().map(Layer::as_str).collect();
        let groups = aggregate.groups().len();
        let _ = writeln!(
            out,
            "**{total} denial{} in {groups} group{}** by {}{}\n",
            if total == 1 { "" } else { "s" },
            if groups == 1 { "" } else { "s" },
            layers.join(", "),
            if fail_on_denial {
                " (the job fails on denials)"
            } else {
                ""
            }
        );
        let _ = writeln!(out, "| layer | operation | where | count | allow |");
        let _ = writeln!(out, "|---|---|---|---:|---|");
        for group in aggregate.groups().iter().take(MARKDOWN_MAX_GROUPS) {
            let targets: Vec<&str> = group.examples.iter().map(|e| e.denial.target()).collect();
            let place = match targets.as_slice() {
                [one] if !group.folded() => (*one).to_owned(),
                _ => format!("{} (e.g. {})", group.prefix, targets.join(", ")),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                group.layer.as_str(),
                markdown_cell(&group.operation),
                markdown_cell(&place),
                group.count,
                markdown_cell(group.allow_rule())
            );
        }
        if groups > MARKDOWN_MAX_GROUPS {
            let _ = writeln!(
                out,
                "\n... and {} more groups (see the report file).",
                groups - MARKDOWN_MAX_GROUPS
            );
        }
        if aggregate.aggregated() > 0 {
            let _ = writeln!(
                out,
                "\n{} of them aggregated (counted in their group; up to {EXAMPLES_PER_GROUP} \
                 distinct examples per group are listed).",
                aggregate.aggregated()
            );
        }
    }
    if coverage.audit && !coverage.gaps.is_empty() {
        let _ = writeln!(
            out,
            "\n**The audit is {}:**\n",
            if coverage.complete {
                "partial"
            } else {
                "incomplete"
            }
        );
        for gap in &coverage.gaps {
            let _ = writeln!(out, "- {}", markdown_cell(gap));
        }
    }
    out
}

/// `text` as plain text inside a Markdown table cell: control characters shown escaped (no new
/// row, no forged line), every ASCII punctuation character that Markdown or GitHub's renderer
/// gives a meaning (`|` ends a cell; `[`, `!`, `<`, `` ` ``, `*`, ... make links, images,
/// HTML, code or emphasis) backslash-escaped.
pub fn markdown_cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in printable(text).chars() {
        if matches!(
            c,
            '\\' | '`'
                | '*'
                | '_'
                | '{'
                | '}'
                | '['
                | ']'
                | '<'
                | '>'
                | '('
                | ')'
                | '#'
                | '+'
                | '!'
                | '|'
                | '~'
                | '&'
                | ':'
                | '@'
                | '$'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
