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

/// Longest path (or path prefix) of a denial, in bytes of its JSON encoding: the kernel
/// records paths up to `PATH_MAX` (4096) and a control character escapes to six bytes
/// (`\u0001`), so a command could otherwise make one path cost 24 KiB.
pub const MAX_PATH_FIELD_BYTES: usize = 1024;
/// Longest other text field (`exe`, `operation`, `syscall`, `address`, `errno`, times), in
/// bytes of its JSON encoding. `exe` is the command's choice too.
pub const MAX_TEXT_FIELD_BYTES: usize = 256;
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
/// groups, with allocator slack. `sandbox/tests/audit_cost.rs` checks it under a flood.
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
/// the pending events). `sandbox/tests/audit/robustness.rs` checks it under a flood of 1,000,000 denials.
pub const AUDIT_PEAK_RSS_BYTES: usize = 64 * 1024 * 1024;

/// Marker appended to a capped field: `…[+N bytes]` (N: how many bytes of the original were cut).
const TRUNCATION_MARKER_MAX_BYTES: usize = 24;

/// `text` capped to `max` bytes of JSON string encoding (quotes excluded), cut at a character
/// boundary and marked `…[+N bytes]` when cut.
pub fn cap_field(text: &str, max: usize) -> String {
    if json_len(text) <= max {
        return text.to_owned();
    }
    let budget = max.saturating_sub(TRUNCATION_MARKER_MAX_BYTES);
    let mut used = 0;
    let mut end = 0;
    for (at, c) in text.char_indices() {
        let cost = json_char_len(c);
        if used + cost > budget {
            break;
        }
        used += cost;
        end = at + c.len_utf8();
    }
    let mut out = text[..end].to_owned();
    let _ = write!(out, "…[+{} bytes]", text.len() - end);
    out
}

/// [`cap_field`] without a copy when `text` is short enough.
pub fn cap_cow(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max / 6 || json_len(text) <= max {
        std::borrow::Cow::Borrowed(text)
    } else {
        std::borrow::Cow::Owned(cap_field(text, max))
    }
}

/// Caps an optional field.
pub fn cap_opt(text: Option<String>, max: usize) -> Option<String> {
    text.map(|t| {
        if t.len() <= max / 6 {
            // Cannot exceed `max` even if every character escapes to six bytes.
            t
        } else {
            cap_field(&t, max)
        }
    })
}

/// Bytes of `text` inside a JSON string (as `serde_json` writes it).
pub fn json_len(text: &str) -> usize {
    text.chars().map(json_char_len).sum()
}

fn json_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{08}' | '\u{0c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

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
    fn short_fields_stay_as_they_are() {
        assert_eq!(cap_field("/etc/passwd", 64), "/etc/passwd");
        assert_eq!(cap_opt(Some("/x".to_owned()), 64).as_deref(), Some("/x"));
    }

    #[test]
    fn long_fields_are_cut_by_their_encoded_length_and_marked() {
        let controls = "\u{1}".repeat(4000);
        let capped = cap_field(&controls, MAX_PATH_FIELD_BYTES);
        let encoded = serde_json::to_string(&capped).unwrap();
        assert!(
            encoded.len() - 2 <= MAX_PATH_FIELD_BYTES,
            "{}",
            encoded.len()
        );
        assert!(
            capped.ends_with(&format!("…[+{} bytes]", 4000 - 166)),
            "{capped}"
        );
        let wide = "é".repeat(3000);
        let capped = cap_field(&wide, 100);
        assert!(serde_json::to_string(&capped).unwrap().len() - 2 <= 100);
        assert!(capped.starts_with("éé"));
    }

    #[test]
    fn control_characters_are_visible_on_a_terminal() {
        assert_eq!(printable("/a\u{1b}[2J\nb"), "/a\\x1b[2J\\x0ab");
    }
}
