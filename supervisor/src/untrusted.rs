//! Strings that come from clients (a `clientName`, a `processId`, a path) on their way into logs
//! and error messages: escaped, so a newline cannot forge a log line and an escape sequence
//! cannot reach the operator's terminal, and cut, so a megabyte of input is not echoed back.

use std::borrow::Cow;
use std::fmt;

/// Bytes of an untrusted string shown in a log line; the rest is summarized by its length.
pub const MAX_LOGGED_UNTRUSTED_BYTES: usize = 200;

/// Displays a client's string quoted, every control or non-printable character escaped
/// (`\n`, `\u{1b}`, `\u{9b}`), and cut after [`MAX_LOGGED_UNTRUSTED_BYTES`].
#[derive(Debug, Clone, Copy)]
pub struct Untrusted<'a>(pub &'a str);

impl fmt::Display for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = cut_at_char_boundary(self.0, MAX_LOGGED_UNTRUSTED_BYTES);
        f.write_str("\"")?;
        for c in shown.chars() {
            // escape_debug escapes quotes, backslashes, every control character (C0, DEL, C1)
            // and other non-printable code points.
            write!(f, "{}", c.escape_debug())?;
        }
        f.write_str("\"")?;
        if shown.len() < self.0.len() {
            write!(f, "... ({} bytes in all)", self.0.len())?;
        }
        Ok(())
    }
}

/// A client's string as a structured log field (`process_id = %LogField(&id)`): every
/// control or non-printable character escaped and the text cut after
/// [`MAX_LOGGED_UNTRUSTED_BYTES`] as [`Untrusted`] does, but not quoted, so the JSON log
/// format's own quoting is the only one (`"process_id":"build"`, not `"\"build\""`).
/// Quotes and backslashes are left as they are: both formats already escape or delimit them.
#[derive(Debug, Clone, Copy)]
pub struct LogField<'a>(pub &'a str);

impl fmt::Display for LogField<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = cut_at_char_boundary(self.0, MAX_LOGGED_UNTRUSTED_BYTES);
        for c in shown.chars() {
            if c == '"' || c == '\\' || c == '\'' {
                write!(f, "{c}")?;
            } else {
                write!(f, "{}", c.escape_debug())?;
            }
        }
        if shown.len() < self.0.len() {
            write!(f, "... ({} bytes in all)", self.0.len())?;
        }
        Ok(())
    }
}

/// `text` cut to at most `max` bytes at a character boundary, with a note of what was cut.
pub fn cut(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let kept = cut_at_char_boundary(text, max);
    Cow::Owned(format!(
        "{kept}... (cut: {} of {} bytes shown)",
        kept.len(),
        text.len()
    ))
}

fn cut_at_char_boundary(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_field_is_unquoted_with_control_characters_escaped_and_cut() {
        assert_eq!(LogField("exec-1").to_string(), "exec-1");
        assert_eq!(
            LogField("a\nb\u{1b}[2J \"q\"").to_string(),
            "a\\nb\\u{1b}[2J \"q\""
        );
        let long = "x".repeat(MAX_LOGGED_UNTRUSTED_BYTES + 5);
        assert!(
            LogField(&long)
                .to_string()
                .ends_with(&format!("... ({} bytes in all)", long.len()))
        );
    }

    #[test]
    fn control_characters_are_escaped_so_no_line_or_sequence_is_forged() {
        let shown =
            Untrusted("me\n2026-01-01 INFO forged\u{1b}]52;c;aGk=\u{7}\u{9b}6n").to_string();
        assert_eq!(
            shown,
            r#""me\n2026-01-01 INFO forged\u{1b}]52;c;aGk=\u{7}\u{9b}6n""#
        );
        assert!(!shown.chars().any(char::is_control));
    }

    #[test]
    fn long_strings_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_LOGGED_UNTRUSTED_BYTES);
        let shown = Untrusted(&long).to_string();
        assert!(shown.len() < MAX_LOGGED_UNTRUSTED_BYTES + 40, "{shown}");
        assert!(shown.ends_with(&format!("({} bytes in all)", long.len())));
        let cut_text = cut(&long, 11);
        assert!(cut_text.starts_with("ééééé..."), "{cut_text}");
        assert_eq!(cut("short", 11), "short");
    }
}
