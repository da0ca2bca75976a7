//! Output of a remote command on its way to the local terminal: the sequences that reach past
//! the screen are removed.
//!
//! `exec-server exec` runs commands that may be hostile. Written to a terminal unfiltered (as ssh
//! does), their output could set the clipboard (OSC 52), the window title or hyperlinks (OSC),
//! talk to the terminal in device control strings (DCS, APC, PM, SOS), or ask the terminal
//! questions (device status and attributes, window reports) whose answers the terminal types
//! into *our* stdin — which `exec` forwards to the command. [`TerminalFilter`] drops:
//! - OSC, DCS, APC, PM and SOS strings, in their 7-bit (`ESC ]` ...) and UTF-8-encoded C1
//!   (`U+009D` ...) forms, through their terminator (BEL or ST);
//! - queries: CSI sequences ending in `n` (DSR), `c` (DA), `t` (window reports and
//!   manipulation), `x` (DECREQTPARM), `$p` (DECRQM), `>q` (XTVERSION), `?u`, `?S`, `?m`;
//!   `ESC Z` (DECID); ENQ (answerback).
//!
//! Everything else passes unchanged, colours and cursor movement included. The filter is a
//! state machine fed chunk by chunk, so a sequence split across chunks is handled like a whole.

/// The longest CSI sequence kept; a longer one is dropped whole (no real one comes close).
const MAX_CSI_BYTES: usize = 256;

const ESC: u8 = 0x1b;
const BEL: u8 = 0x07;
const ENQ: u8 = 0x05;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Ground,
    /// Saw ESC.
    Escape,
    /// Saw the UTF-8 lead byte 0xC2 (the next byte may make a C1 control).
    C2,
    /// Inside `ESC [` ... (collected in `csi`).
    Csi,
    /// Inside a CSI sequence too long to keep: dropped through its final byte.
    CsiDropped,
    /// Inside an OSC, DCS, APC, PM or SOS string (dropped).
    String,
    /// Saw ESC inside a string (ST is `ESC \`).
    StringEscape,
    /// Saw 0xC2 inside a string (ST is also U+009C).
    StringC2,
}

/// Strips terminal-reaching sequences from a byte stream (see the module docs).
#[derive(Debug)]
pub struct TerminalFilter {
    state: State,
    csi: Vec<u8>,
}

impl Default for TerminalFilter {
    fn default() -> Self {
        Self::new()
    }
}

impl TerminalFilter {
    /// A filter at the start of a stream.
    pub fn new() -> Self {
        Self {
            state: State::Ground,
            csi: Vec::new(),
        }
    }

    /// Append what of `input` may reach the terminal to `out`.
    pub fn filter(&mut self, input: &[u8], out: &mut Vec<u8>) {
        for &byte in input {
            self.feed(byte, out);
        }
    }

    fn feed(&mut self, byte: u8, out: &mut Vec<u8>) {
        match self.state {
            State::Ground => match byte {
                ESC => self.state = State::Escape,
                0xC2 => self.state = State::C2,
                ENQ => {}
                _ => out.push(byte),
            },
            State::C2 => match byte {
                // DCS, SOS, OSC, PM, APC as UTF-8-encoded C1 controls.
                0x90 | 0x98 | 0x9D | 0x9E | 0x9F => self.state = State::String,
                // CSI.
                0x9B => self.start_csi(),
                _ => {
                    out.push(0xC2);
                    self.state = State::Ground;
                    self.feed(byte, out);
                }
            },
            State::Escape => match byte {
                b']' | b'P' | b'_' | b'^' | b'X' => self.state = State::String,
                b'[' => self.start_csi(),
                // DECID: the terminal answers with its attributes.
                b'Z' => self.state = State::Ground,
                ESC => out.push(ESC),
                _ => {
                    out.extend_from_slice(&[ESC, byte]);
                    self.state = State::Ground;
                }
            },
            State::Csi => match byte {
                0x20..=0x3F => {
                    if self.csi.len() >= MAX_CSI_BYTES {
                        self.csi.clear();
                        self.state = State::CsiDropped;
                    } else {
                        self.csi.push(byte);
                    }
                }
                0x40..=0x7E => {
                    if !is_query(&self.csi, byte) {
                        out.extend_from_slice(&[ESC, b'[']);
                        out.extend_from_slice(&self.csi);
                        out.push(byte);
                    }
                    self.csi.clear();
                    self.state = State::Ground;
                }
                // Anything else aborts the sequence; what was collected is not a query.
                _ => {
                    out.extend_from_slice(&[ESC, b'[']);
                    out.append(&mut self.csi);
                    self.state = State::Ground;
                    self.feed(byte, out);
                }
            },
            State::CsiDropped => {
                if (0x40..=0x7E).contains(&byte) {
                    self.state = State::Ground;
                }
            }
            State::String => match byte {
                BEL => self.state = State::Ground,
                ESC => self.state = State::StringEscape,
                0xC2 => self.state = State::StringC2,
                _ => {}
            },
            State::StringEscape => match byte {
                b'\\' => self.state = State::Ground,
                ESC => {}
                // ESC followed by anything else ends the string and starts a new sequence.
                _ => {
                    self.state = State::Escape;
                    self.feed(byte, out);
                }
            },
            State::StringC2 => {
                self.state = if byte == 0x9C {
                    State::Ground
                } else {
                    State::String
                };
            }
        }
    }

    fn start_csi(&mut self) {
        self.csi.clear();
        self.state = State::Csi;
    }
}

/// Whether the CSI sequence with `params` (parameter and intermediate bytes) and `last` asks the
/// terminal for an answer (or moves and resizes its window).
fn is_query(params: &[u8], last: u8) -> bool {
    let private = params.first().copied();
    match last {
        b'n' | b'c' | b't' | b'x' => true,
        b'p' => params.contains(&b'$'),
        b'q' => private == Some(b'>'),
        b'u' | b'S' | b'm' => private == Some(b'?'),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn run(chunks: &[&[u8]]) -> Vec<u8> {
        let mut filter = TerminalFilter::new();
        let mut out = Vec::new();
        for chunk in chunks {
            filter.filter(chunk, &mut out);
        }
        out
    }

    fn whole(input: &[u8]) -> Vec<u8> {
        run(&[input])
    }

    #[test]
    fn text_colours_and_cursor_movement_pass_unchanged() {
        let text = "plain\tté\u{1F600}xt\r\n\x1b[1;31mred\x1b[0m \x1b[2J\x1b[H\x1b[?25l\x1b[?1049h\x1b7\x1b(B\x08";
        assert_eq!(whole(text.as_bytes()), text.as_bytes());
    }

    #[test]
    fn osc_dcs_apc_pm_and_sos_strings_are_dropped_whatever_their_terminator() {
        let cases: [&[u8]; 8] = [
            b"a\x1b]52;c;aGVsbG8=\x07b",           // clipboard write, BEL
            b"a\x1b]0;evil title\x1b\\b",          // title, ST
            b"a\x1b]8;;http://x\x1b\\b",           // hyperlink
            b"a\x1bP+q544e\x1b\\b",                // DCS XTGETTCAP (a query)
            b"a\x1b_Gf=100;AAAA\x1b\\b",           // APC (kitty graphics)
            b"a\x1b^private\x1b\\b",               // PM
            b"a\x1bXsos\x1b\\b",                   // SOS
            "a\u{9d}0;c1 title\u{9c}b".as_bytes(), // UTF-8-encoded C1 OSC and ST
        ];
        for case in cases {
            assert_eq!(whole(case), b"ab", "{:?}", String::from_utf8_lossy(case));
        }
    }

    #[test]
    fn terminal_queries_are_dropped() {
        for query in [
            &b"\x1b[6n"[..],
            b"\x1b[5n",
            b"\x1b[?6n",
            b"\x1b[c",
            b"\x1b[>c",
            b"\x1b[=0c",
            b"\x1b[14t",
            b"\x1b[21t",
            b"\x1b[8;1000;1000t",
            b"\x1b[x",
            b"\x1b[?25$p",
            b"\x1b[>q",
            b"\x1b[?u",
            b"\x1bZ",
            b"\x05",
            "\u{9b}6n".as_bytes(),
        ] {
            assert_eq!(
                whole(&[b"<", query, b">"].concat()),
                b"<>",
                "{:?}",
                String::from_utf8_lossy(query)
            );
        }
    }

    #[test]
    fn a_sequence_split_across_chunks_is_handled_like_a_whole() {
        let input = b"x\x1b]52;c;aGk=\x07y\x1b[6nz\x1b[31mr".to_vec();
        let expected = whole(&input);
        assert_eq!(expected, b"xyz\x1b[31mr");
        for size in 1..input.len() {
            let chunks: Vec<&[u8]> = input.chunks(size).collect();
            assert_eq!(run(&chunks), expected, "chunks of {size}");
        }
    }

    #[test]
    fn an_escape_inside_a_string_ends_it_and_starts_a_new_sequence() {
        assert_eq!(whole(b"\x1b]0;t\x1b[32mg"), b"\x1b[32mg");
    }

    #[test]
    fn an_overlong_csi_is_dropped_and_the_text_after_it_kept() {
        let mut input = b"\x1b[".to_vec();
        input.extend(std::iter::repeat_n(b'1', MAX_CSI_BYTES * 2));
        input.extend_from_slice(b"mafter");
        assert_eq!(whole(&input), b"after");
    }

    #[test]
    fn a_lone_c2_lead_byte_of_ordinary_text_passes() {
        assert_eq!(whole("©±".as_bytes()), "©±".as_bytes());
    }
}
