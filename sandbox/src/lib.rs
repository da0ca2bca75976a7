//! execward's sandbox: the policy model and its enforcement.
//!
//! - [`policy`]: the wire `sandbox` object ([`SandboxSpec`]), named profiles, resolution into a
//!   [`ResolvedPolicy`].
//! - [`linux`]: layered enforcement applied by a freshly exec'd process to itself
//!   ([`linux::restrict_current_process`]).
//! - [`macos`]: Seatbelt profile text (plain Rust, tested on every platform).
//! - [`limits`]: the rlimits and wall-clock time of a sandboxed command.
//! - [`egress`]: the egress proxy of a sandbox whose network is an allowlist.
//!
//! All unsafe code is in `sys`: raw calls, each behind a safe wrapper.
#![deny(unsafe_code)]

pub mod denial;
pub mod egress;
pub mod exit;
pub mod launch;
pub mod limits;
pub mod policy;
#[cfg(target_os = "linux")]
pub mod report_file;

#[cfg(target_os = "linux")]
pub mod linux;
// The only unsafe code of the crate: raw calls, each behind a safe wrapper.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod sys;

pub mod macos;
// The per-user registry of running servers' secrets, masked in every sandbox (its own module
// doc says so; an outer doc here would make rustdoc resolve that doc's links from this scope).
#[cfg(target_os = "linux")]
pub mod servers;
/// Syscall numbers and names of the supported architectures.
pub mod syscall_table;

pub use policy::{
    Access, EgressRules, FilesystemPolicy, NetworkPolicy, PathRule, PolicyError, ResolvedPolicy,
    SandboxSpec, WritableRoot,
};

/// Dies of `signal` (default action, unblocked, no core dump); returns if it was not fatal.
/// `sandbox-run` mirrors the command's fatal signal with it.
#[cfg(target_os = "linux")]
pub fn sys_die_of_signal(signal: i32) {
    sys::die_of_signal(signal);
}
