//! The collector: joins the audit multicast group, makes sure auditing is on, installs the
//! per-session exit rules for the command tree, reads records, and cleans up.
//!
//! Ordering:
//! 1. [`Collector::open`] before the command tree exists (no record can be missed);
//! 2. the root process starts a fresh audit session (see [`start_audit_session`]) and waits;
//! 3. [`Collector::attach`] installs the rules keyed on that session, then the root goes on to
//!    confine itself with logging enabled and `execve`s the command;
//! 4. [`Collector::read_available`] whenever the socket is readable;
//! 5. after the tree exited, [`Collector::drain`] (a marker record proves every earlier record
//!    arrived), then [`Collector::close`] removes the rules and restores the audit status.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::audit::denial::Coverage;
use crate::audit::enable::{self, EnableGuard};
use crate::audit::netlink::{Control, MulticastReader, RECV_BUFFER_BYTES, session_exit_rule};
use crate::audit::records::{AUDIT_TRUSTED_APP, Record};

/// Failed syscalls of the session that get a `SYSCALL` record: `EROFS` (the read-only mount
/// layer, which Landlock never sees) and `EACCES` (pid, exe and syscall of Landlock denials).
/// Not `EPERM`: a syscall seccomp refuses never enters syscall auditing, so its `SECCOMP`
/// record stands alone (it has pid and exe, but no arguments).
const SESSION_RULE_ERRNOS: [i32; 2] = [libc::EROFS, libc::EACCES];
/// How long [`Collector::drain`] waits for its marker record.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// `/proc/*/sessionid` and `loginuid` value meaning "unset".
const AUDIT_UNSET: u32 = u32::MAX;

/// An open collector.
#[derive(Debug)]
pub struct Collector {
    reader: MulticastReader,
    control: Control,
    enable: Option<EnableGuard>,
    rules: Vec<Vec<u8>>,
    rules_ok: bool,
    lost_records: bool,
    marker_seen: bool,
    gaps: Vec<String>,
    buf: Vec<u8>,
}

impl Collector {
    /// Joins the multicast group and turns auditing on if needed.
    ///
    /// # Errors
    /// A plain-words reason when collection is impossible (no `CAP_AUDIT_READ`, no audit in
    /// the kernel, auditing off and not allowed to turn it on).
    pub fn open() -> Result<Self, String> {
        let reader = MulticastReader::open().map_err(|err| err.to_string())?;
        let mut control = Control::open().map_err(|err| err.to_string())?;
        let status = control
            .status()
            .map_err(|err| format!("reading the audit status failed: {err}"))?;
        let enable = if status.enabled == 0 {
            Some(
                enable::acquire(&mut control)
                    .map_err(|err| format!("auditing is off and turning it on failed: {err}"))?,
            )
        } else {
            // Register anyway, so an overlapping run that turned it on keeps it on for us.
            enable::acquire(&mut control).ok()
        };
        Ok(Self {
            reader,
            control,
            enable,
            rules: Vec::new(),
            rules_ok: false,
            lost_records: false,
            marker_seen: false,
            gaps: Vec::new(),
            buf: vec![0; RECV_BUFFER_BYTES],
        })
    }

    /// Installs the exit rules for audit session `session` (`None`: the root could not start
    /// one). Returns whether the mount layer (and syscall details) will be observed.
    pub fn attach(&mut self, session: Option<u32>) -> bool {
        let Some(session) = session else {
            self.gaps.push(
                "no fresh audit session could be started for the command (loginuid is \
                 immutable or not writable): read-only-mount (EROFS) denials are not observed \
                 and seccomp denials are attributed only to the first process"
                    .to_owned(),
            );
            return false;
        };
        for errno in SESSION_RULE_ERRNOS {
            let rule = session_exit_rule(session, errno);
            match self.control.add_rule(&rule) {
                Ok(()) => self.rules.push(rule),
                Err(err) => {
                    self.gaps.push(format!(
                        "adding the audit rule for session {session} failed ({err}): \
                         read-only-mount (EROFS) denials are not observed"
                    ));
                    return false;
                }
            }
        }
        self.rules_ok = true;
        true
    }

    /// The descriptor to poll for readability.
    pub fn poll_fd(&self) -> BorrowedFd<'_> {
        self.reader.as_fd()
    }

    /// Reads every queued record and hands it to `sink`, without blocking.
    pub fn read_available(&mut self, sink: &mut dyn FnMut(Record)) {
        loop {
            match self.reader.try_recv(&mut self.buf) {
                Ok(Some(messages)) => {
                    for msg in messages {
                        if let Ok(record) = Record::parse(msg.kind, &msg.payload) {
                            sink(record);
                        }
                    }
                }
                Ok(None) => return,
                Err(nix::Error::ENOBUFS) => self.lost_records = true,
                Err(nix::Error::EINTR) => {}
                Err(_) => return,
            }
        }
    }

    /// Sends a marker record and reads until it comes back (every record logged before it
    /// has then arrived), or until `DRAIN_TIMEOUT`.
    pub fn drain(&mut self, sink: &mut dyn FnMut(Record)) {
        let nonce = format!("{}-{}", std::process::id(), nanos());
        let text = format!("op=execward-audit-drain nonce={nonce}");
        if let Err(err) = self.control.send_user(AUDIT_TRUSTED_APP, &text) {
            self.gaps.push(format!(
                "could not send the drain marker ({err}); late records may be missing"
            ));
        }
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        let mut seen = false;
        while !seen {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::ZERO);
            let mut fds = [PollFd::new(self.reader.as_fd(), PollFlags::POLLIN)];
            if poll(&mut fds, timeout).is_err() {
                continue;
            }
            self.read_available(&mut |record| {
                let marker = record.kind == AUDIT_TRUSTED_APP
                    && record.text("msg").is_some_and(|m| m.contains(&nonce));
                if marker {
                    seen = true;
                } else {
                    sink(record);
                }
            });
        }
        self.marker_seen = seen;
    }

    /// Removes the rules and restores the audit status; returns the coverage of the run.
    pub fn close(
        mut self,
        landlock_logged: bool,
        seccomp_logged: bool,
        mount_observed: bool,
    ) -> Coverage {
        for rule in std::mem::take(&mut self.rules) {
            if let Err(err) = self.control.delete_rule(&rule) {
                self.gaps
                    .push(format!("removing an audit rule of this run failed: {err}"));
            }
        }
        if let Some(guard) = self.enable.take()
            && let Some(problem) = guard.release(&mut self.control)
        {
            self.gaps.push(problem);
        }
        if self.lost_records {
            self.gaps.push(
                "the audit socket overflowed: some records were dropped, the list is incomplete"
                    .to_owned(),
            );
        }
        if !self.marker_seen {
            self.gaps
                .push("the drain marker did not come back: late records may be missing".to_owned());
        }
        Coverage {
            audit: true,
            landlock: landlock_logged,
            seccomp: seccomp_logged,
            mount: mount_observed && self.rules_ok,
            complete: self.marker_seen && !self.lost_records,
            gaps: std::mem::take(&mut self.gaps),
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        for rule in std::mem::take(&mut self.rules) {
            let _ = self.control.delete_rule(&rule);
        }
        if let Some(guard) = self.enable.take() {
            let _ = guard.release(&mut self.control);
        }
    }
}

/// In the root process of the tree, before it confines itself: starts a fresh audit session
/// by writing `/proc/self/loginuid` (keeping the login uid when one is set, else the real
/// uid). Every descendant inherits the session id. Returns whether it worked.
pub fn start_audit_session() -> bool {
    let current = std::fs::read_to_string("/proc/self/loginuid")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let uid = match current {
        Some(uid) if uid != AUDIT_UNSET => uid,
        _ => nix::unistd::getuid().as_raw(),
    };
    std::fs::write("/proc/self/loginuid", uid.to_string()).is_ok()
}

/// The audit session of `pid` (`None` when unset or unreadable).
pub fn session_of(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/sessionid"))
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|s| *s != AUDIT_UNSET)
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
