//! GitHub workflow commands: annotations for the groups and the coverage gaps.

use std::fmt::Write as _;

use super::RunAudit;

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

fn escape_data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

fn escape_property(text: &str) -> String {
    escape_data(text).replace(':', "%3A").replace(',', "%2C")
}
