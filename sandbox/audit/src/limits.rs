//! What the denial audit's cost is bounded by, whatever the command does.
//!
//! `sandbox-run --audit` runs as root outside the sandbox while the command decides how many
//! denials it causes and how long their paths are. So:
//! - every string of a record is capped in bytes of its JSON encoding ([`cap_field`]), which
//!   bounds every line written to the report and to `--audit-fd` ([`RECORD_LINE_MAX_BYTES`]);
//! - denials are aggregated by (layer, operation, path prefix) with counts
//!   ([`super::aggregate`]); only [`EXAMPLES_PER_GROUP`] distinct examples of a group and
//!   [`MAX_GROUPS`] groups are kept, so memory does not grow with the number of denials
//!   ([`AGGREGATE_MAX_BYTES`]);
//! - the correlator holds at most [`MAX_PENDING_EVENTS`] unfinished kernel events of at most
//!   [`MAX_RECORDS_PER_EVENT`] records each.

use std::fmt::Write as _;

pub use sandbox::denial::{
    MAX_PATH_FIELD_BYTES, MAX_TEXT_FIELD_BYTES, cap_cow, cap_field, cap_opt, json_len,
};

/// Longest `allow_rule`, in bytes of its JSON encoding (it may quote a path twice).
pub const MAX_ALLOW_RULE_BYTES: usize = 2 * MAX_PATH_FIELD_BYTES + MAX_TEXT_FIELD_BYTES;
/// Longest line `sandbox-run` writes to the JSON-lines report or to `--audit-fd` (`denial`,
/// `group` and `coverage` records, newline included). exec-server reads `--audit-fd` and can
/// refuse longer lines as forged: this is the cap it shares with `sandbox-run`.
pub const RECORD_LINE_MAX_BYTES: usize = 8 * 1024;
/// Distinct examples (different path or address) kept, written and streamed per group: enough
/// to see what a group is about, few enough that a flood of one kind costs nothing.
pub const EXAMPLES_PER_GROUP: usize = 4;
/// Groups of (layer, operation, path prefix) kept with their examples. Denials of further
/// prefixes are still counted, folded into one group per (layer, operation).
pub const MAX_GROUPS: usize = 512;
/// Folded groups (one per layer and operation beyond [`MAX_GROUPS`]); beyond those, every
/// further denial is counted in a single catch-all group. Operations are syscall and access
/// names, a few hundred at most, so this is reached only by a forged record stream.
pub const MAX_FOLDED_GROUPS: usize = 256;
/// Live denial lines `sandbox-run --audit FILE` prints on stderr while the command runs, one
/// per new group: enough to see what goes wrong as it happens, few enough that a command
/// causing thousands of kinds of denial cannot flood the log it shares (the rest are in the
/// summary at exit and in the report).
pub const LIVE_LINES_MAX: usize = 20;
/// Upper bound of the aggregate's heap (groups, examples, index), from the caps above: 4 MiB of
/// capped strings per [`MAX_GROUPS`] groups of [`EXAMPLES_PER_GROUP`] examples plus folded
/// groups, with allocator slack. `sandbox/audit/tests/cost.rs` checks it under a flood.
pub const AGGREGATE_MAX_BYTES: usize = 16 * 1024 * 1024;
/// Kernel events (records sharing a serial) waiting for their end record. Records of one event
/// arrive together; more open events than this means some never end, and the oldest is then
/// completed with what it has.
pub const MAX_PENDING_EVENTS: usize = 32;
/// Records kept per event (a syscall, its cwd, its paths, Landlock's records): a rename has five
/// path items, so sixteen is plenty; further records of the event are ignored.
pub const MAX_RECORDS_PER_EVENT: usize = 16;
/// Documented bound of `sandbox-run --audit`'s peak resident memory, whatever the number of
/// denials (binary, the 8 MiB socket buffer is kernel memory and not counted, the aggregate,
/// the pending events). `sandbox/run/tests/audit/robustness.rs` checks it under a flood of
/// 1,000,000 denials.
pub const AUDIT_PEAK_RSS_BYTES: usize = 64 * 1024 * 1024;

/// `text` for a terminal: control characters shown as `\xNN` (so a path cannot move the cursor,
/// clear lines or forge summary lines in a CI log).
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn control_characters_are_visible_on_a_terminal() {
        assert_eq!(printable("/a\u{1b}[2J\nb"), "/a\\x1b[2J\\x0ab");
    }
}
