//! `seccomp(2)` with `SECCOMP_FILTER_FLAG_LOG`, which `seccompiler` does not offer: the filter of
//! a command under the denial audit, whose `errno` actions must produce `SECCOMP` audit records.

use std::io;

/// `seccomp(2)` operation: install a filter.
const SECCOMP_SET_MODE_FILTER: libc::c_uint = 1;
/// `seccomp(2)` flag: log every action of this filter but `SECCOMP_RET_ALLOW` (subject to
/// `/proc/sys/kernel/seccomp/actions_logged`, which includes `errno` by default).
const SECCOMP_FILTER_FLAG_LOG: libc::c_uint = 1 << 1;

/// Installs `program` on the calling thread with `SECCOMP_FILTER_FLAG_LOG`, so its `errno`
/// actions produce `SECCOMP` audit records. `no_new_privs` must already be set.
///
/// # Errors
/// The OS error of `seccomp(2)` (e.g. `EINVAL` for an invalid program).
pub fn install_seccomp_filter_logged_on_current_thread(
    program: &[seccompiler::sock_filter],
) -> io::Result<()> {
    let mut filters: Vec<libc::sock_filter> = program
        .iter()
        .map(|insn| libc::sock_filter {
            code: insn.code,
            jt: insn.jt,
            jf: insn.jf,
            k: insn.k,
        })
        .collect();
    let prog = libc::sock_fprog {
        len: u16::try_from(filters.len())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        filter: filters.as_mut_ptr(),
    };
    // SAFETY: `prog` points at `filters`, a valid array of `len` instructions that outlives the
    // call; the kernel copies the program and validates it before installing.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            SECCOMP_FILTER_FLAG_LOG,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
