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

/// The name of syscall `nr` on this architecture (`syscall_N` when not listed): audit records
/// carry numbers, and the allow-list refuses anything it does not name, so a denial record may
/// carry any number.
pub fn name(nr: i64) -> String {
    let table = current();
    table
        .binary_search_by_key(&nr, |(number, _)| *number)
        .map(|at| table[at].1.to_owned())
        .unwrap_or_else(|_| format!("syscall_{nr}"))
}

/// The number of syscall `name` on this architecture.
pub fn number(name: &str) -> Option<i64> {
    current()
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(number, _)| *number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip_to_names() {
        assert_eq!(name(libc::SYS_openat), "openat");
        assert_eq!(name(libc::SYS_socket), "socket");
        assert_eq!(name(libc::SYS_clone3), "clone3");
        assert_eq!(name(99_999), "syscall_99999");
        for arch in ["x86_64", "aarch64", "riscv64"] {
            let table = for_arch(arch).unwrap();
            assert!(
                table.windows(2).all(|w| w[0].0 < w[1].0),
                "{arch} sorted by number"
            );
        }
        assert_eq!(number("openat"), Some(libc::SYS_openat));
    }
}
