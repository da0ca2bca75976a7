//! Pathname unix sockets: a sandboxed command reaches one only inside its writable roots or
//! when the policy names it (`allowUnixSockets`).
//!
//! Landlock mediates connecting to a pathname socket from ABI 9
//! (`LANDLOCK_ACCESS_FS_RESOLVE_UNIX`, part of every write right there, so a writable root
//! grants it and a named socket gets a rule of its own). Before ABI 9 this module enforces the
//! same rule with seccomp user notification:
//!
//! - The command's process, before it execs, installs a small filter of its own
//!   ([`command_filter`]) with a listener: `connect` notifies; `socket`/`socketpair` of
//!   `AF_UNIX` datagram sockets are refused with `EACCES` (a datagram socket is the only unix
//!   socket that can send to a pathname named in the send call, and a send cannot be performed
//!   on the command's behalf without a time-of-check gap; stream and seqpacket sockets ignore
//!   or refuse an address on send); `pidfd_getfd` is refused. It shares its parent's
//!   descriptor table (`CLONE_FILES`) while it installs it, so the listener lands in the
//!   parent's table, then takes a private table and execs. The parent (the sandbox's PID 1, or
//!   the holder without namespaces) holds the listener; the command never does.
//! - The holder answers every `connect` itself and never lets the kernel continue the call
//!   (the command could swap the descriptor or rewrite the address after the check): it reads
//!   the address from the caller's memory, checks the notification is still valid, takes the
//!   caller's socket with `pidfd_getfd`, and connects *that* socket to its copy of the address.
//!   A pathname is first opened `O_PATH` relative to the caller's working directory: that
//!   descriptor is the resolution (symlinks followed once, as `connect` would); it is allowed
//!   when its inode is a named socket (pinned by device and inode when the sandbox started) or
//!   its path lies in a writable root (on an overlaid `/tmp`'s own mount: only when the inode
//!   lives in the command's upper layer; the host's sockets seen through the lower layer are
//!   refused whatever their path), and then the socket is connected to
//!   `/proc/self/fd/N`, the pinned inode, so nothing swapped in since can receive the
//!   connection. Otherwise the call fails with `EACCES` and the refusal is reported: as a
//!   denial record on the refusal channel when the denial audit runs, else one line on the
//!   holder's stderr ([`super::unix_refusals`]).
//! - Sockets of other families are connected the same way (on the caller's socket, in the
//!   holder, which is in the same Landlock domain, seccomp filter and network namespace as the
//!   command, so Landlock's TCP rule still decides); a blocking one in a short-lived child of
//!   the holder, so a slow TCP handshake stalls nothing else.
//!
//! The holder must not be the command: PID 1 (its handler runs in its supervision loop) or,
//! without namespaces, the `sandbox-run` process that stays the command's parent. If the holder
//! is gone, every notified call fails (`ENOSYS`): the rule fails closed.

mod command;
mod gate;
mod notifier;
#[cfg(test)]
mod tests;

use serde::Serialize;

use crate::policy::ResolvedPolicy;
use crate::sys;

pub use command::{CommandFilters, command_filter, render_command_filter, spawn_command};
pub(crate) use command::{start_command, start_command_under_installed_filter};
pub use gate::Gate;
pub use notifier::Notifier;

/// The Landlock ABI whose `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` mediates pathname sockets.
pub const LANDLOCK_UNIX_ABI: i32 = 9;

/// How this host keeps a sandbox's pathname-socket rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// Landlock ABI 9 and later (`LANDLOCK_ACCESS_FS_RESOLVE_UNIX`).
    Landlock,
    /// seccomp user notification handled by the sandbox's PID 1 (or holder).
    SeccompNotify,
}

impl Mechanism {
    /// The mechanism for a kernel of Landlock ABI `abi`.
    pub fn for_abi(abi: i32) -> Self {
        if abi >= LANDLOCK_UNIX_ABI {
            Mechanism::Landlock
        } else {
            Mechanism::SeccompNotify
        }
    }

    /// The mechanism of the running kernel.
    pub fn of_this_host() -> Self {
        Self::for_abi(sys::landlock_abi())
    }
}

/// Whether a command under `policy` gets the notifier on this host: its filesystem is
/// restricted (an unrestricted one makes every path a writable root) and Landlock cannot keep
/// the rule.
pub fn needs_notifier(policy: &ResolvedPolicy) -> bool {
    policy.restricts_filesystem() && Mechanism::of_this_host() == Mechanism::SeccompNotify
}
