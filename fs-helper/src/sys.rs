//! The crate's only unsafe code: taking ownership of a descriptor the kernel passed with
//! `SCM_RIGHTS` (nix hands it over as a raw number).
#![allow(unsafe_code)]

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Own a descriptor `recvmsg` just received with `SCM_RIGHTS`.
pub(crate) fn owned_fd_from_scm_rights(fd: RawFd) -> OwnedFd {
    // SAFETY: recvmsg just installed `fd` in our descriptor table for this message; nothing else
    // knows the number, so this is its only owner.
    unsafe { OwnedFd::from_raw_fd(fd) }
}
