//! The outer `sandbox-run` process while the sandbox runs: forwards signals, relays the
//! terminal, logs egress decisions, enforces the wall-clock limit and collects the command's
//! status.

use std::os::fd::{AsFd, OwnedFd};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::{EXIT_SETUP_FAILED, Ended, Observer};
use crate::linux::pty;
use crate::linux::spec::{STATUS_EXITED, STATUS_SIGNALED};

/// The outer's state while the sandbox runs.
pub(super) struct Outer {
    pub(super) signals: SignalFd,
    /// PID 1's status channel (absent without namespaces: the root is the command itself).
    pub(super) status: Option<OwnedFd>,
    pub(super) relay: Option<pty::Relay>,
    pub(super) root: Pid,
    pub(super) reported: Option<Ended>,
    pub(super) root_status: Option<Ended>,
    /// When the wall-clock limit kills the sandbox (taken once it fired).
    pub(super) deadline: Option<std::time::Instant>,
    /// The egress proxy (network allowlist only), stopped when the sandbox has ended.
    pub(super) proxy: Option<crate::egress::launch::ProxyProcess>,
    /// Where egress decisions are logged.
    pub(super) egress_log: Option<std::sync::Arc<std::fs::File>>,
    /// SIGINT/SIGTERM received so far, when they escalate.
    pub(super) interrupts: Interrupts,
    /// The unix-socket gate's refusals (the denial audit runs and the gate is needed).
    pub(super) refusals: Option<crate::linux::unix_refusals::Reader>,
}

/// Counts interrupts when they escalate (`sandbox-run` run by hand).
pub(super) struct Interrupts {
    escalate: bool,
    received: u32,
}

impl Interrupts {
    pub(super) fn new(escalate: bool) -> Self {
        Self {
            escalate,
            received: 0,
        }
    }
}

/// When `limits.wall_seconds` runs out, counted from now.
pub(super) fn wall_deadline(limits: &crate::limits::CommandLimits) -> Option<std::time::Instant> {
    limits
        .wall_seconds
        .map(|seconds| std::time::Instant::now() + std::time::Duration::from_secs(seconds))
}

impl Outer {
    /// Forwards signals, relays the terminal and feeds the observer until the command has
    /// ended and its output is drained.
    pub(super) fn wait(&mut self, mut observer: Option<&mut dyn Observer>) -> Ended {
        loop {
            if self.root_status.is_some() && self.relay.as_ref().is_none_or(|r| !r.open()) {
                break;
            }
            self.poll_once(observer.as_deref());
            if let Some(observer) = observer.as_deref_mut() {
                observer.readable();
            }
            if let Some(proxy) = self.proxy.as_mut() {
                let events = proxy.read_events();
                self.egress_events(events, &mut observer);
            }
            self.unix_refusals(&mut observer);
            self.handle_signals();
            self.enforce_wall_clock();
            self.read_status();
            if let Some(relay) = self.relay.as_mut() {
                relay.pump();
            }
            self.reap_root();
        }
        self.read_status();
        // The holder is gone with the sandbox: what it wrote is all there is.
        self.unix_refusals(&mut observer);
        if let Some(dropped) = self
            .refusals
            .as_ref()
            .map(|r| r.dropped())
            .filter(|n| *n > 0)
            && let Some(observer) = observer.as_deref_mut()
        {
            observer.gap(format!(
                "{dropped} refused unix-socket connects were not reported (the refusal channel \
                 was full)"
            ));
        }
        if let Some(proxy) = self.proxy.take() {
            let events = proxy.stop();
            self.egress_events(events, &mut observer);
        }
        if let Some(relay) = self.relay.as_mut() {
            relay.restore_terminal();
        }
        self.reported
            .or(self.root_status)
            .unwrap_or(Ended::Exited(i32::from(EXIT_SETUP_FAILED)))
    }

    /// Logs the proxy's decisions and reports its refusals: to the observer (the denial
    /// audit) when there is one, else on stderr.
    fn egress_events(
        &mut self,
        events: Vec<crate::egress::EgressEvent>,
        observer: &mut Option<&mut dyn Observer>,
    ) {
        use std::io::Write;
        for event in events {
            if let Some(log) = self.egress_log.as_deref() {
                let mut line = serde_json::to_string(&event).unwrap_or_default();
                line.push('\n');
                let mut log = log;
                let _ = log.write_all(line.as_bytes());
            }
            if event.allowed {
                continue;
            }
            match observer {
                Some(observer) => observer.denial(event.to_denial()),
                None => eprintln!("sandbox-run: {}", event.describe()),
            }
        }
    }

    /// Reports the unix-socket gate's refusals: to the observer (the denial audit) when there
    /// is one, else on stderr (as the proxy's; without the audit the holder prints them itself
    /// and no channel exists).
    fn unix_refusals(&mut self, observer: &mut Option<&mut dyn Observer>) {
        let Some(reader) = self.refusals.as_mut() else {
            return;
        };
        for refusal in reader.read_available() {
            match observer {
                Some(observer) => observer.denial(refusal.to_denial()),
                None => eprintln!("{}", refusal.describe()),
            }
        }
    }

    fn poll_once(&self, observer: Option<&dyn Observer>) {
        let mut fds = vec![PollFd::new(self.signals.as_fd(), PollFlags::POLLIN)];
        if let Some(status) = &self.status {
            fds.push(PollFd::new(status.as_fd(), PollFlags::POLLIN));
        }
        if let Some(relay) = &self.relay {
            for (fd, read, write) in relay.interests() {
                let mut flags = PollFlags::empty();
                if read {
                    flags |= PollFlags::POLLIN;
                }
                if write {
                    flags |= PollFlags::POLLOUT;
                }
                fds.push(PollFd::new(fd, flags));
            }
        }
        if let Some(fd) = observer.and_then(Observer::poll_fd) {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        if let Some(fd) = self.refusals.as_ref().and_then(|r| r.poll_fd()) {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        if let Some(fd) = self.proxy.as_ref().and_then(|p| p.events_fd()) {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        // The root's exit is announced by SIGCHLD on the signalfd; a timeout only guards
        // against a lost wakeup (and wakes us for the wall-clock limit).
        let wait_ms = self.deadline.map_or(1000, |deadline| {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            u16::try_from(left.as_millis().min(1000)).unwrap_or(1000)
        });
        let _ = poll(&mut fds, PollTimeout::from(wait_ms));
    }

    /// Past the wall-clock limit: kill the sandbox's root (with namespaces, PID 1, whose end
    /// takes the whole PID namespace along). The terminal relay keeps draining what the
    /// command wrote before.
    fn enforce_wall_clock(&mut self) {
        if self.root_status.is_some()
            || self
                .deadline
                .is_none_or(|deadline| std::time::Instant::now() < deadline)
        {
            return;
        }
        self.deadline = None;
        let _ = nix::sys::signal::kill(self.root, Signal::SIGKILL);
    }

    fn handle_signals(&mut self) {
        while let Ok(Some(info)) = self.signals.read_signal() {
            let signo = i32::try_from(info.ssi_signo).unwrap_or(0);
            match Signal::try_from(signo) {
                Ok(Signal::SIGCHLD) => {}
                Ok(Signal::SIGWINCH) => {
                    if let Some(relay) = &self.relay {
                        pty::copy_window_size(relay.size_source(), relay.master());
                    }
                }
                Ok(signal @ (Signal::SIGINT | Signal::SIGTERM)) if self.interrupts.escalate => {
                    self.interrupt(signal);
                }
                Ok(signal) => {
                    let _ = nix::sys::signal::kill(self.root, signal);
                }
                Err(_) => {}
            }
        }
    }

    /// The first interrupt is forwarded; the second sends SIGTERM and kills the sandbox after
    /// [`super::INTERRUPT_GRACE`] (through the wall-clock deadline); the third kills it now.
    /// Each is said on stderr, so a command that ignores signals cannot trap its caller.
    fn interrupt(&mut self, signal: Signal) {
        self.interrupts.received += 1;
        match self.interrupts.received {
            1 => {
                eprintln!(
                    "sandbox-run: {} forwarded to the command; interrupt again to terminate it",
                    signal.as_str()
                );
                let _ = nix::sys::signal::kill(self.root, signal);
            }
            2 => {
                eprintln!(
                    "sandbox-run: terminating the command (SIGTERM, then SIGKILL in {} s); \
                     interrupt again to kill it now",
                    super::INTERRUPT_GRACE.as_secs()
                );
                let _ = nix::sys::signal::kill(self.root, Signal::SIGTERM);
                let grace = std::time::Instant::now() + super::INTERRUPT_GRACE;
                self.deadline = Some(self.deadline.map_or(grace, |wall| wall.min(grace)));
            }
            _ => {
                eprintln!("sandbox-run: killing the command (SIGKILL)");
                let _ = nix::sys::signal::kill(self.root, Signal::SIGKILL);
            }
        }
    }

    /// Reads PID 1's status message when it is there (the channel is non-blocking).
    fn read_status(&mut self) {
        let Some(status) = &self.status else {
            return;
        };
        let mut message = [0u8; 5];
        let read = loop {
            match nix::unistd::read(status, &mut message) {
                Err(nix::errno::Errno::EINTR) => {}
                other => break other,
            }
        };
        match read {
            Err(nix::errno::Errno::EAGAIN) => return,
            // Written in one piece before PID 1 exits (shorter than PIPE_BUF).
            Ok(5) => {
                let value = i32::from_le_bytes([message[1], message[2], message[3], message[4]]);
                self.reported = match message[0] {
                    STATUS_EXITED => Some(Ended::Exited(value)),
                    STATUS_SIGNALED => Some(Ended::Signaled(value)),
                    _ => None,
                };
            }
            // EOF without a message: PID 1 failed; its own exit status says how.
            _ => {}
        }
        self.status = None;
    }

    fn reap_root(&mut self) {
        if self.root_status.is_some() {
            return;
        }
        match waitpid(self.root, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => self.root_status = Some(Ended::Exited(code)),
            Ok(WaitStatus::Signaled(_, signal, _)) => {
                self.root_status = Some(Ended::Signaled(signal as i32));
            }
            Ok(_) => {}
            Err(_) => self.root_status = Some(Ended::Exited(i32::from(EXIT_SETUP_FAILED))),
        }
    }
}
