//! Syscall numbers to names for the running architecture (audit records carry numbers).
//!
//! Only the calls the sandbox refuses or whose failure the collector reports are listed;
//! anything else renders as `syscall_N`. A unit test checks that every syscall named in
//! `policies/seccomp/*.json` is here.

macro_rules! syscall_table {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), libc::$name as i64)),*]
    };
}

/// Calls present on every supported architecture.
const COMMON: &[(&str, i64)] = syscall_table!(
    SYS_openat,
    SYS_openat2,
    SYS_mkdirat,
    SYS_unlinkat,
    SYS_renameat2,
    SYS_linkat,
    SYS_symlinkat,
    SYS_mknodat,
    SYS_truncate,
    SYS_ftruncate,
    SYS_fchmod,
    SYS_fchmodat,
    SYS_fchown,
    SYS_fchownat,
    SYS_utimensat,
    SYS_setxattr,
    SYS_lsetxattr,
    SYS_fsetxattr,
    SYS_removexattr,
    SYS_lremovexattr,
    SYS_fremovexattr,
    SYS_socket,
    SYS_socketpair,
    SYS_connect,
    SYS_bind,
    SYS_sendto,
    SYS_sendmsg,
    SYS_ptrace,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
    SYS_bpf,
    SYS_perf_event_open,
    SYS_userfaultfd,
    SYS_keyctl,
    SYS_add_key,
    SYS_request_key,
    SYS_mount,
    SYS_umount2,
    SYS_pivot_root,
    SYS_fsopen,
    SYS_fsconfig,
    SYS_fsmount,
    SYS_fspick,
    SYS_move_mount,
    SYS_open_tree,
    SYS_mount_setattr,
    SYS_unshare,
    SYS_setns,
    SYS_clone,
    SYS_clone3,
    SYS_ioctl,
    SYS_init_module,
    SYS_finit_module,
    SYS_delete_module,
    SYS_kexec_load,
    SYS_open_by_handle_at,
    SYS_name_to_handle_at,
    SYS_acct,
    SYS_swapon,
    SYS_swapoff,
    SYS_reboot,
    SYS_execve,
    SYS_execveat,
    SYS_kill,
    SYS_tgkill,
    SYS_fchmodat2,
    SYS_landlock_restrict_self,
    SYS_seccomp,
);

/// Legacy calls only x86_64 has.
#[cfg(target_arch = "x86_64")]
const LEGACY: &[(&str, i64)] = syscall_table!(
    SYS_open,
    SYS_creat,
    SYS_mkdir,
    SYS_rmdir,
    SYS_unlink,
    SYS_rename,
    SYS_renameat,
    SYS_link,
    SYS_symlink,
    SYS_mknod,
    SYS_chmod,
    SYS_chown,
    SYS_lchown,
    SYS_utime,
    SYS_utimes,
    SYS_futimesat,
    SYS_kexec_file_load,
    SYS_iopl,
    SYS_ioperm,
);
#[cfg(not(target_arch = "x86_64"))]
const LEGACY: &[(&str, i64)] = &[];

/// The name of syscall `nr` on this architecture (`syscall_N` when not listed).
pub fn name(nr: i64) -> String {
    COMMON
        .iter()
        .chain(LEGACY)
        .find(|(_, n)| *n == nr)
        .map(|(name, _)| name.trim_start_matches("SYS_").to_owned())
        .unwrap_or_else(|| format!("syscall_{nr}"))
}

/// The number of syscall `name` on this architecture.
pub fn number(name: &str) -> Option<i64> {
    COMMON
        .iter()
        .chain(LEGACY)
        .find(|(n, _)| n.trim_start_matches("SYS_") == name)
        .map(|(_, nr)| *nr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syscall_of_the_seccomp_policies_has_a_name() {
        for network in [false, true] {
            for (_, filter) in crate::linux::seccomp::filters_for(network).unwrap() {
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
        assert_eq!(name(99_999), "syscall_99999");
    }
}
