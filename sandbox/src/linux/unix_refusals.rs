//! Refusals of the pathname unix-socket gate ([`super::unix_sockets`]) as denial records.
//!
//! The holder (the sandbox's PID 1, or the `sandbox-run` child that holds the listener without
//! namespaces) refuses a `connect` it may not perform. When the denial audit runs, the outer
//! `sandbox-run` gives the holder the write end of a pipe, the refusal channel: each refusal
//! goes there as one JSON line ([`Refusal`]), and the outer turns it into a [`Denial`] of layer
//! `unix-sockets`, operation `unix.connect`, for the audit's pipeline (`--audit` reports,
//! `--audit-fd`, and so the server's `process/denied`). Without the audit there is no channel
//! and the holder prints one line on its stderr instead, as the egress proxy's refusals do (the
//! launcher's PID 1, whose own stdio is `/dev/null`, on a copy of the command's stderr).
//!
//! Bounds: a line is at most [`MAX_REFUSAL_LINE_BYTES`] (below `PIPE_BUF`, so a write is
//! atomic: whole or not at all) and the holder's end is non-blocking: when the outer is slow
//! and the pipe is full, the refusal is counted as dropped (the next line carries the count,
//! and the report says it is incomplete) rather than stalling the holder. The outer keeps no
//! more than one partial line; what it passes on is aggregated and capped by the pipeline.

use std::cell::Cell;
use std::os::fd::{AsFd, OwnedFd};

use serde::{Deserialize, Serialize};

use crate::denial::{Denial, Layer};
use crate::denial::{MAX_PATH_FIELD_BYTES, MAX_TEXT_FIELD_BYTES, cap_field};
use crate::egress::config::{escape_control, now_rfc3339};

/// Longest line on the refusal channel, newline included: below `PIPE_BUF` (4096), so each
/// write is atomic. A line holds two capped paths ([`MAX_PATH_FIELD_BYTES`] each), a capped
/// `exe` and a few numbers.
pub const MAX_REFUSAL_LINE_BYTES: usize = 4000;
/// The operation of a refused connect in denial records.
pub const UNIX_CONNECT: &str = "unix.connect";

/// One refused `connect` to a pathname unix socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// When it was refused (RFC 3339, UTC).
    pub time: String,
    /// The calling thread, as the holder sees it (with namespaces: the sandbox's PID
    /// namespace).
    pub pid: u32,
    /// The caller's executable, when it could be read.
    pub exe: Option<String>,
    /// The path as the command passed it.
    pub requested: String,
    /// The socket's path as resolved (symlinks followed, relative paths made absolute).
    pub path: String,
    /// The errno the call failed with.
    pub errno: i32,
    /// Refusals before this one that the channel had no room for (cumulative).
    #[serde(default)]
    pub dropped: u64,
}

impl Refusal {
    /// A refusal of `pid`'s connect to `requested` (resolved to `path`) with `errno`; the
    /// strings capped as the audit caps them.
    pub fn new(pid: u32, requested: &str, path: &str, errno: i32) -> Self {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .map(|exe| cap_field(&exe.to_string_lossy(), MAX_TEXT_FIELD_BYTES));
        Self {
            time: now_rfc3339(),
            pid,
            exe,
            requested: cap_field(requested, MAX_PATH_FIELD_BYTES),
            path: cap_field(path, MAX_PATH_FIELD_BYTES),
            errno,
            dropped: 0,
        }
    }

    /// The one-line stderr message (no audit), control characters escaped: the path is the
    /// command's choice and must not forge lines on the terminal.
    pub fn describe(&self) -> String {
        escape_control(&format!(
            "sandbox-run: denied: connect to unix socket {} (resolved {}): outside the writable \
             roots and not named by allowUnixSockets; to allow it: {}",
            self.requested,
            self.path,
            self.allow_rule()
        ))
    }

    /// The rule that would allow it.
    pub fn allow_rule(&self) -> String {
        format!(
            "allowUnixSockets = [{:?}] in the profile (sandbox-run --allow-unix-socket {})",
            self.path, self.path
        )
    }

    /// The denial record (layer `unix-sockets`, operation [`UNIX_CONNECT`]).
    pub fn to_denial(&self) -> Denial {
        Denial {
            time: self.time.clone(),
            pid: Some(self.pid),
            exe: self.exe.clone(),
            layer: Layer::UnixSockets,
            operation: UNIX_CONNECT.to_owned(),
            path: Some(self.path.clone()),
            address: None,
            syscall: Some("connect".to_owned()),
            errno: Some(errno_name(self.errno)),
            allow_rule: self.allow_rule(),
        }
    }
}

fn errno_name(errno: i32) -> String {
    match errno {
        libc::EACCES => "EACCES".to_owned(),
        libc::EPERM => "EPERM".to_owned(),
        other => nix::errno::Errno::from_raw(other).to_string(),
    }
}

/// The holder's end: where refusals go.
pub struct Reporter {
    channel: Option<OwnedFd>,
    /// Where the stderr line goes when there is no channel: the holder's own stderr, or a
    /// copy of the command's (the launcher's PID 1 points its own 0-2 at `/dev/null`).
    stderr: Option<std::fs::File>,
    dropped: Cell<u64>,
}

impl Reporter {
    /// The descriptors this reporter owns.
    pub fn descriptors(&self) -> impl Iterator<Item = std::os::fd::RawFd> + '_ {
        use std::os::fd::AsRawFd;
        self.channel
            .iter()
            .map(AsRawFd::as_raw_fd)
            .chain(self.stderr.iter().map(AsRawFd::as_raw_fd))
    }

    /// Refusals go to `channel` (made non-blocking here), or to stderr without one.
    pub fn new(channel: Option<OwnedFd>) -> Self {
        if let Some(channel) = &channel {
            let _ = nix::fcntl::fcntl(
                channel,
                nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
            );
        }
        Self {
            channel,
            stderr: None,
            dropped: Cell::new(0),
        }
    }

    /// Without a channel, refusals go as one line to `stderr` (a copy of the command's) instead
    /// of the holder's own descriptor 2.
    pub fn with_stderr(mut self, stderr: OwnedFd) -> Self {
        self.stderr = Some(std::fs::File::from(stderr));
        self
    }

    /// Reports `refusal`: one line on the channel (counted as dropped when it is full), or on
    /// stderr.
    pub fn report(&self, mut refusal: Refusal) {
        let Some(channel) = &self.channel else {
            let line = format!("{}\n", refusal.describe());
            match &self.stderr {
                Some(stderr) => {
                    use std::io::Write;
                    let mut stderr: &std::fs::File = stderr;
                    let _ = stderr.write_all(line.as_bytes());
                }
                None => eprint!("{line}"),
            }
            return;
        };
        refusal.dropped = self.dropped.get();
        let mut line = serde_json::to_vec(&refusal).unwrap_or_default();
        line.push(b'\n');
        if line.len() > MAX_REFUSAL_LINE_BYTES {
            // Not reachable with the caps above; never write a line the reader would split.
            self.dropped.set(self.dropped.get() + 1);
            return;
        }
        match nix::unistd::write(channel.as_fd(), &line) {
            Ok(written) if written == line.len() => {}
            _ => self.dropped.set(self.dropped.get() + 1),
        }
    }
}

/// The outer's end: reads the lines the holder wrote.
pub struct Reader {
    channel: OwnedFd,
    partial: Vec<u8>,
    dropped: u64,
    open: bool,
}

impl Reader {
    /// Reads `channel` (made non-blocking here).
    pub fn new(channel: OwnedFd) -> Self {
        let _ = nix::fcntl::fcntl(
            &channel,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        );
        Self {
            channel,
            partial: Vec::new(),
            dropped: 0,
            open: true,
        }
    }

    /// The descriptor to poll, while the holder may still write.
    pub fn poll_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.open.then(|| self.channel.as_fd())
    }

    /// The refusals readable now.
    pub fn read_available(&mut self) -> Vec<Refusal> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while self.open {
            match nix::unistd::read(&self.channel, &mut buf) {
                Ok(0) => self.open = false,
                Ok(read) => self.partial.extend_from_slice(&buf[..read]),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => self.open = false,
            }
            while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.partial.drain(..=end).collect();
                if let Ok(refusal) = serde_json::from_slice::<Refusal>(&line) {
                    self.dropped = self.dropped.max(refusal.dropped);
                    out.push(refusal);
                }
            }
            if self.partial.len() > MAX_REFUSAL_LINE_BYTES {
                // Only the holder writes here, in whole lines; never hold more than one.
                self.partial.clear();
            }
        }
        out
    }

    /// Refusals the holder could not report (the channel was full), as far as it said.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_travels_the_channel_and_becomes_a_unix_connect_denial() {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let reporter = Reporter::new(Some(write));
        let long = format!("/var/tmp/\n\u{1b}[2J{}sock", "x".repeat(5000));
        reporter.report(Refusal::new(7, "rel.sock", &long, libc::EACCES));
        reporter.report(Refusal::new(7, "/a", "/a", libc::EACCES));
        drop(reporter);
        let mut reader = Reader::new(read);
        let got = reader.read_available();
        assert_eq!(got.len(), 2);
        assert!(reader.poll_fd().is_none(), "end of file seen");
        let denial = got[0].to_denial();
        assert_eq!(denial.layer, Layer::UnixSockets);
        assert_eq!(denial.operation, UNIX_CONNECT);
        assert_eq!(denial.errno.as_deref(), Some("EACCES"));
        assert_eq!(denial.pid, Some(7));
        assert!(denial.path.as_deref().unwrap().starts_with("/var/tmp/\n"));
        assert!(denial.path.as_deref().unwrap().len() < MAX_PATH_FIELD_BYTES + 32);
        let line = got[0].describe();
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("\\u{1b}"), "{line:?}");
    }

    #[test]
    fn a_full_channel_drops_and_counts_instead_of_blocking() {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let reporter = Reporter::new(Some(write));
        let path = format!("/var/tmp/{}", "y".repeat(900));
        // A pipe holds 64 KiB by default: far fewer than 1,000 lines of ~2 KiB.
        for _ in 0..1000 {
            reporter.report(Refusal::new(1, &path, &path, libc::EACCES));
        }
        let mut reader = Reader::new(read);
        let first = reader.read_available();
        assert!(!first.is_empty() && first.len() < 1000, "{}", first.len());
        reporter.report(Refusal::new(1, "/z", "/z", libc::EACCES));
        let next = reader.read_available();
        assert_eq!(next.len(), 1);
        assert_eq!(reader.dropped() as usize, 1000 - first.len());
    }
}
