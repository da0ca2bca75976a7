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

use crate::enable::{self, EnableError, EnableGuard};
use crate::netlink::{
    Control, MulticastReader, NetlinkError, RECV_BUFFER_BYTES, Status, session_exit_rule,
};
use crate::records::{AUDIT_TRUSTED_APP, Record};
use sandbox::denial::Coverage;

/// Failed syscalls of the session that get a `SYSCALL` record: `EROFS` (the read-only mount
/// layer, which Landlock never sees), `EACCES` (pid, exe and syscall of Landlock denials; the
/// mount layer's masks) and `EPERM` (Landlock's scopes). An `EACCES`/`EPERM` that no layer's
/// record accounts for is reported as unexplained: it is how a layer that does not log (a
/// Landlock domain stacked with logging off) would show. A syscall seccomp refuses never
/// enters syscall auditing: its `SECCOMP` record stands alone.
const SESSION_RULE_ERRNOS: [i32; 3] = [libc::EROFS, libc::EACCES, libc::EPERM];
/// Where the kernel says which seccomp actions are logged.
const SECCOMP_ACTIONS_LOGGED: &str = "/proc/sys/kernel/seccomp/actions_logged";
/// The actions the sandbox's filter returns that must be logged: `errno` (every refusal) and
/// `kill_process` (the foreign-architecture guard).
const SECCOMP_ACTIONS_NEEDED: [&str; 2] = ["errno", "kill_process"];
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
    status_before: Status,
    marker_seen: bool,
    gaps: Vec<String>,
    buf: Vec<u8>,
}

/// Why audit records cannot be collected here.
#[derive(Debug, thiserror::Error)]
pub enum CollectorOpenError {
    /// Joining the audit multicast group failed (no `CAP_AUDIT_READ`, no audit in the kernel).
    #[error(transparent)]
    Multicast(NetlinkError),
    /// Opening the audit control socket failed.
    #[error(transparent)]
    Control(NetlinkError),
    /// The audit status could not be read.
    #[error("reading the audit status failed: {0}")]
    Status(#[source] NetlinkError),
    /// Auditing is off and could not be turned on.
    #[error("auditing is off and turning it on failed: {0}")]
    Enable(#[source] EnableError),
}

impl Collector {
    /// Joins the multicast group and turns auditing on if needed.
    ///
    /// # Errors
    /// [`CollectorOpenError`] when collection is impossible (no `CAP_AUDIT_READ`, no audit in
    /// the kernel, auditing off and not allowed to turn it on).
    pub fn open() -> Result<Self, CollectorOpenError> {
        let reader = MulticastReader::open().map_err(CollectorOpenError::Multicast)?;
        let mut control = Control::open().map_err(CollectorOpenError::Control)?;
        let status = control.status().map_err(CollectorOpenError::Status)?;
        let enable = if status.enabled == 0 {
            Some(enable::acquire(&mut control).map_err(CollectorOpenError::Enable)?)
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
            status_before: status,
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
                 immutable or not writable): read-only-mount (EROFS) denials and unexplained \
                 EACCES/EPERM refusals are not observed, and seccomp denials are attributed only \
                 to the first process"
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
                         read-only-mount (EROFS) denials and unexplained EACCES/EPERM refusals \
                         are not observed"
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
        let kernel_dropped = match self.control.status() {
            Ok(now) => {
                let lost = now.lost.wrapping_sub(self.status_before.lost);
                let ours_possible =
                    self.status_before.may_drop_waiting_records() || now.may_drop_waiting_records();
                if lost > 0 && ours_possible {
                    self.gaps.push(format!(
                        "the kernel dropped {lost} audit record(s) during the run (rate limit \
                         {} records/s; possibly another process's): the list may be incomplete",
                        now.rate_limit
                    ));
                    true
                } else {
                    false
                }
            }
            Err(err) => {
                self.gaps.push(format!(
                    "reading the kernel's count of dropped records failed ({err}): the list may \
                     be incomplete"
                ));
                true
            }
        };
        let seccomp_gap = seccomp_logging_gap(
            &std::fs::read_to_string(SECCOMP_ACTIONS_LOGGED).unwrap_or_default(),
        );
        if let Some(gap) = &seccomp_gap {
            self.gaps.push(gap.clone());
        }
        Coverage {
            audit: true,
            landlock: landlock_logged,
            seccomp: seccomp_logged && seccomp_gap.is_none(),
            mount: mount_observed && self.rules_ok,
            unexplained: mount_observed && self.rules_ok,
            complete: self.marker_seen && !self.lost_records && !kernel_dropped,
            gaps: std::mem::take(&mut self.gaps),
        }
    }
}

/// The gap when `actions_logged` (the text of `SECCOMP_ACTIONS_LOGGED`) lacks an action the
/// sandbox's filter returns: the kernel then logs none of those refusals.
pub fn seccomp_logging_gap(actions_logged: &str) -> Option<String> {
    let logged: Vec<&str> = actions_logged.split_whitespace().collect();
    let missing: Vec<&str> = SECCOMP_ACTIONS_NEEDED
        .iter()
        .copied()
        .filter(|action| !logged.contains(action))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{SECCOMP_ACTIONS_LOGGED} does not list {} (it holds {:?}): seccomp refusals are not \
             logged",
            missing.join(", "),
            actions_logged.trim()
        )
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seccomp_logging_must_include_errno_and_kill_process() {
        let default = "kill_process kill_thread trap errno user_notif trace log\n";
        assert_eq!(seccomp_logging_gap(default), None);
        let gap = seccomp_logging_gap("kill_process kill_thread log\n").unwrap();
        assert!(gap.contains("does not list errno"), "{gap}");
        let gap = seccomp_logging_gap("").unwrap();
        assert!(gap.contains("errno, kill_process"), "{gap}");
    }
}
