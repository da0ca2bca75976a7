//! The denial audit: which accesses did the sandbox refuse to a command tree?
//!
//! Sources (Linux kernel audit, read from the `AUDIT_NLGRP_READLOG` multicast group):
//! - Landlock `LANDLOCK_ACCESS`/`LANDLOCK_DOMAIN` records (1423/1424), logged after `execve`
//!   because the domain is created with `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON` (ABI >= 7);
//! - seccomp `SECCOMP` records (1326), because the filter is installed with
//!   `SECCOMP_FILTER_FLAG_LOG` so its `errno` actions are logged;
//! - `SYSCALL`/`PATH`/`CWD` records of failed syscalls of the tree's audit session: `EROFS` from
//!   the read-only mount layer (which Landlock never sees, because the mount check comes first),
//!   plus the pid, exe and socket arguments of the two kinds above.
//!
//! Besides the kernel, the outer `sandbox-run` reports the refusals it sees directly: the egress
//! proxy's (layer `proxy`) and the unix-socket gate's (layer `unix-sockets`, sent by the holder
//! over a pipe: `sandbox::linux::unix_refusals`). They need no kernel audit.
//!
//! Attribution is exact (see [`correlate`]); nothing of another process is reported.
//! Honesty: when collection is impossible the reports say so ([`Coverage`]) and never look
//! like an empty, clean list.
//!
//! A command cannot hide its own denials: under the audit it may not stack a Landlock domain or
//! seccomp filter of its own (`policies/seccomp/audit.json`; a refused attempt makes the report
//! incomplete), and every `EACCES`/`EPERM` of the tree that no layer logged is reported as
//! unexplained. The cost is bounded whatever the command does ([`limits`]).
//!
//! Module map: [`netlink`] (socket and messages), [`records`] (record text), [`correlate`]
//! (records → denials, sans-I/O), [`advice`] (the rule that would allow a denial),
//! [`aggregate`] (groups, counts, examples), [`pipeline`] (records → aggregate + streamed
//! lines), [`report`]/[`sarif`] (renderings), [`collect`] + [`enable`] (the privileged collector
//! lifecycle), [`supervise`] (`sandbox-run --audit`: collect, report), [`limits`] (the bounds).
#![deny(unsafe_code)]

pub mod aggregate;
pub mod limits;
pub mod records;
pub mod report;
pub mod sarif;

#[cfg(target_os = "linux")]
pub mod advice;
#[cfg(target_os = "linux")]
pub mod cli;
#[cfg(target_os = "linux")]
pub mod collect;
#[cfg(target_os = "linux")]
pub mod correlate;
#[cfg(target_os = "linux")]
pub mod enable;
#[cfg(target_os = "linux")]
pub mod netlink;
#[cfg(target_os = "linux")]
pub mod pipeline;
#[cfg(target_os = "linux")]
pub mod supervise;

pub use limits::RECORD_LINE_MAX_BYTES;
pub use report::{Format, RunAudit};
pub use sandbox::denial::{Coverage, Denial, Layer};
