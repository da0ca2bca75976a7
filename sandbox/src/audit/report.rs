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

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::audit::aggregate::Aggregate;
use crate::audit::denial::{Coverage, Denial, Layer};
use crate::audit::limits::{EXAMPLES_PER_GROUP, printable};

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

/// GitHub workflow commands: one annotation per group (`error` when the run fails on denials,
/// else `warning`), one per coverage gap, or one warning saying the audit was blind.
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
        if audit.aggregate.total() == 0 {
            return out;
        }
    }
    for group in audit.aggregate.groups() {
        let title = format!(
            "Sandbox denied {} ({})",
            group.operation,
            group.layer.as_str()
        );
        let targets: Vec<&str> = group.examples.iter().map(|e| e.denial.target()).collect();
        let mut message = match targets.as_slice() {
            [one] if !group.folded() => format!("{one} denied {}x", group.count),
            _ => format!(
                "{} denied {}x (e.g. {})",
                group.prefix,
                group.count,
                targets.join(", ")
            ),
        };
        if let Some(exe) = group.examples.first().and_then(|e| e.denial.exe.as_deref()) {
            let _ = write!(message, " to {exe}");
        }
        let _ = write!(message, "; allow: {}", group.allow_rule());
        let _ = writeln!(
            out,
            "::{level} title={}::{}",
            escape_property(&title),
            escape_data(&message)
        );
    }
    let gap_level = if fail_on_denial && !audit.coverage.is_full() {
        "error"
    } else {
        "warning"
    };
    // Blind: the gaps were said once above.
    for gap in audit.coverage.gaps.iter().filter(|_| audit.coverage.audit) {
        let _ = writeln!(
            out,
            "::{gap_level} title={}::{}",
            escape_property("Sandbox audit incomplete"),
            escape_data(gap)
        );
    }
    out
}

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
    use crate::audit::limits::RECORD_LINE_MAX_BYTES;
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
            errno: None,
            allow_rule: String::new(),
        }
    }

    fn full() -> Coverage {
        Coverage {
            audit: true,
            landlock: true,
            seccomp: true,
            mount: true,
            unexplained: true,
            complete: true,
            gaps: Vec::new(),
        }
    }

    fn run(denials: Vec<Denial>, coverage: Coverage) -> RunAudit {
        let mut aggregate = Aggregate::new();
        for d in denials {
            aggregate.add(d, |_| "\"/out\" = \"write\"".to_owned());
        }
        RunAudit {
            command: vec!["make".to_owned()],
            root: std::path::PathBuf::from("/repo"),
            exit_status: 0,
            aggregate,
            coverage,
        }
    }

    #[test]
    fn summary_groups_by_operation_and_directory() {
        let audit = run(
            vec![
                denial("fs.write_file", Some("/out/a"), Layer::Mount),
                denial("fs.write_file", Some("/out/b"), Layer::Mount),
                denial("fs.make_dir", Some("/out"), Layer::Landlock),
            ],
            full(),
        );
        let text = summary(&audit);
        assert!(
            text.starts_with("sandbox-run: audit: 3 denials in 2 groups by landlock, mount\n"),
            "{text}"
        );
        assert!(text.contains("fs.write_file  /out/     2"), "{text}");
        assert!(text.contains("fs.make_dir    /out/     1"), "{text}");
        assert!(!text.contains("INCOMPLETE"), "{text}");
    }

    #[test]
    fn jsonl_lists_examples_then_groups_then_totals() {
        let mut denials = Vec::new();
        for i in 0..10 {
            denials.push(denial(
                "fs.write_file",
                Some(&format!("/out/{}", i % 5)),
                Layer::Mount,
            ));
        }
        let audit = run(denials, full());
        let lines: Vec<serde_json::Value> = jsonl(&audit)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let kinds: Vec<&str> = lines.iter().map(|l| l["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["denial", "denial", "denial", "denial", "group", "coverage"]
        );
        assert_eq!(lines[0]["group"], 0);
        assert_eq!(lines[0]["path"], "/out/0");
        assert_eq!(lines[4]["count"], 10);
        assert_eq!(lines[4]["listed"], 4);
        assert_eq!(lines[4]["prefix"], "/out/");
        let coverage = &lines[5];
        assert_eq!(
            (
                &coverage["denials"],
                &coverage["listed"],
                &coverage["aggregated"]
            ),
            (
                &serde_json::json!(10),
                &serde_json::json!(4),
                &serde_json::json!(6)
            )
        );
        assert_eq!(coverage["complete"], true);
        assert!(summary(&audit).contains("6 of them aggregated"));
    }

    #[test]
    fn incomplete_reports_never_read_as_clean() {
        let coverage = Coverage {
            complete: false,
            gaps: vec!["the command tried to stack a seccomp filter of its own".to_owned()],
            ..full()
        };
        let audit = run(Vec::new(), coverage);
        let text = summary(&audit);
        assert!(
            text.starts_with(
                "sandbox-run: audit: no denials observed, but the audit is INCOMPLETE"
            ),
            "{text}"
        );
        assert!(text.contains("gap: the command tried"), "{text}");
        assert_eq!(
            github(&audit, true),
            "::error title=Sandbox audit incomplete::the command tried to stack a seccomp filter \
             of its own\n"
        );
    }

    #[test]
    fn blind_reports_say_so_in_every_format() {
        let audit = run(
            Vec::new(),
            Coverage::blind("joining the audit multicast group failed"),
        );
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
        let audit = run(
            vec![denial("fs.write_file", Some("/out/a,b"), Layer::Landlock)],
            full(),
        );
        let text = github(&audit, false);
        assert_eq!(
            text,
            "::warning title=Sandbox denied fs.write_file (landlock)::/out/a,b denied 1x to \
             /usr/bin/touch; allow: \"/out\" = \"write\"\n"
        );
    }

    #[test]
    fn markdown_renders_one_row_per_group_with_hostile_paths_escaped() {
        let hostile = "/out/a|b\n| forged | row |![x](https://t.example/p)";
        let audit = run(
            vec![
                denial("fs.write_file", Some("/out/a"), Layer::Mount),
                denial("fs.write_file", Some("/out/b"), Layer::Mount),
                denial("fs.make_dir", Some(hostile), Layer::Landlock),
                denial("socket", None, Layer::Seccomp),
            ],
            full(),
        );
        let text = markdown(&audit, true);
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(
            rows,
            [
                "| layer | operation | where | count | allow |",
                "|---|---|---|---:|---|",
                "| mount | fs.write\\_file | /out/ \\(e.g. /out/a, /out/b\\) | 2 | \"/out\" = \"write\" |",
                "| landlock | fs.make\\_dir | /out/a\\|b\\\\x0a\\| forged \\| row \\|\\!\\[x\\]\\(https\\://t.example/p\\) | 1 | \"/out\" = \"write\" |",
                "| seccomp | socket | - | 1 | \"/out\" = \"write\" |",
            ],
            "{text}"
        );
        assert!(
            text.contains("**4 denials in 3 groups** by landlock, seccomp, mount"),
            "{text}"
        );
        // Every row has exactly the table's five cells: no `|` of a path ends a cell.
        for row in &rows {
            let cells = row.replace("\\|", "").matches('|').count();
            assert_eq!(cells, 6, "{row}");
        }
    }

    #[test]
    fn markdown_never_reads_as_clean_when_blind_or_incomplete() {
        let blind = run(Vec::new(), Coverage::blind("no CAP_AUDIT_READ"));
        let text = markdown(&blind, false);
        assert!(text.contains("Audit unavailable"), "{text}");
        assert!(!text.contains("No denials observed"), "{text}");
        let incomplete = run(
            Vec::new(),
            Coverage {
                complete: false,
                gaps: vec!["the audit socket overflowed".to_owned()],
                ..full()
            },
        );
        let text = markdown(&incomplete, false);
        assert!(text.contains("**incomplete**"), "{text}");
        assert!(text.contains("- the audit socket overflowed"), "{text}");
        assert_eq!(
            markdown(&run(Vec::new(), full()), false),
            "### Sandbox denials\n\nNo denials observed.\n"
        );
    }

    #[test]
    fn a_path_of_control_characters_cannot_forge_summary_lines() {
        let path = "/out/x\nsandbox-run: audit: no denials observed\u{1b}[1A";
        let audit = run(
            vec![denial("fs.write_file", Some(path), Layer::Mount)],
            full(),
        );
        let text = summary(&audit);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
    }

    #[test]
    fn every_line_stays_under_the_shared_cap_whatever_the_command_chose() {
        let evil = "\u{1}".repeat(100_000);
        let mut d = denial(&evil, Some(&format!("/{evil}/{evil}")), Layer::Unexplained);
        d.exe = Some(evil.clone());
        d.syscall = Some(evil.clone());
        d.address = Some(evil.clone());
        d.errno = Some(evil.clone());
        d.time = evil.clone();
        let mut aggregate = Aggregate::new();
        aggregate.add(d, |d| format!("{} {:?}", evil, d.path));
        let coverage = Coverage {
            gaps: vec!["x".repeat(400); 8],
            ..full()
        };
        let audit = RunAudit {
            command: vec![evil.clone()],
            root: std::path::PathBuf::from("/repo"),
            exit_status: 0,
            aggregate,
            coverage,
        };
        for line in jsonl(&audit).split_inclusive('\n') {
            assert!(line.len() <= RECORD_LINE_MAX_BYTES, "{} bytes", line.len());
        }
    }
}
