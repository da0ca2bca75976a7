//! Every syscall name of the supported architectures, by number (generated from the kernel
//! tables of Linux 6.12 that seccompiler carries; numbers above them render as `syscall_N`).
//! Audit records carry numbers; the allow-list refuses any call, so any call can be named.
//! `build.rs` includes this module too: the seccomp allow-list is compiled from these numbers.
//! Each architecture's table is in its own file, re-exported here.

mod aarch64;
mod riscv64;
mod x86_64;

pub use aarch64::AARCH64;
pub use riscv64::RISCV64;
pub use x86_64::X86_64;

/// The table of `arch` (Rust's `target_arch` name), if it is supported.
pub fn for_arch(arch: &str) -> Option<&'static [(i64, &'static str)]> {
    match arch {
        "x86_64" => Some(X86_64),
        "aarch64" => Some(AARCH64),
        "riscv64" => Some(RISCV64),
        _ => None,
    }
}

/// The running architecture's table (empty on an unsupported one).
pub fn current() -> &'static [(i64, &'static str)] {
    for_arch(std::env::consts::ARCH).unwrap_or(&[])
}
