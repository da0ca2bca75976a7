//! Syscall numbers to names for the running architecture (audit records carry numbers).
//!
//! The table ([`crate::syscall_table`]) holds every syscall the supported architectures had in
//! Linux 6.12: the allow-list refuses anything it does not name, so a denial record may carry
//! any number. Newer numbers render as `syscall_N`.

use crate::syscall_table;

/// The name of syscall `nr` on this architecture (`syscall_N` when not listed).
pub fn name(nr: i64) -> String {
    let table = syscall_table::current();
    table
        .binary_search_by_key(&nr, |(number, _)| *number)
        .map(|at| table[at].1.to_owned())
        .unwrap_or_else(|_| format!("syscall_{nr}"))
}

/// The number of syscall `name` on this architecture.
pub fn number(name: &str) -> Option<i64> {
    syscall_table::current()
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(number, _)| *number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syscall_of_the_seccomp_policies_has_a_name() {
        for (network_allowed, audit) in [(false, true), (true, true)] {
            let variant = crate::linux::seccomp::Variant {
                network_allowed,
                audit,
            };
            for (_, filter) in crate::linux::seccomp::filters_for(variant).unwrap() {
                for rule in filter.filter {
                    assert!(number(&rule.syscall).is_some(), "{} missing", rule.syscall);
                }
            }
        }
    }

    #[test]
    fn numbers_round_trip_to_names() {
        assert_eq!(name(libc::SYS_openat), "openat");
        assert_eq!(name(libc::SYS_socket), "socket");
        assert_eq!(name(libc::SYS_clone3), "clone3");
        assert_eq!(name(99_999), "syscall_99999");
        for arch in ["x86_64", "aarch64", "riscv64"] {
            let table = syscall_table::for_arch(arch).unwrap();
            assert!(
                table.windows(2).all(|w| w[0].0 < w[1].0),
                "{arch} sorted by number"
            );
        }
        assert_eq!(number("openat"), Some(libc::SYS_openat));
    }
}
