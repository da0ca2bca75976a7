//! Filesystem operations for execward's `fs/*` methods: one synchronous implementation used
//! in-process by the supervisor (on a blocking thread) for unsandboxed work and by the sandboxed
//! `fs-helper` binary.
//!
//! Inputs and outputs are plain Rust values (`Path`, `Vec<u8>`, small structs); mapping to and
//! from wire types happens elsewhere. Paths are `OsStr` bytes throughout, so non-UTF-8 names work.
//!
//! Guarantees every operation keeps:
//! - **No blocking on special files.** Files are only opened after their type is checked, with
//!   `O_NONBLOCK`, and checked again with `fstat`; FIFOs, sockets and devices are refused.
//! - **Writes cannot be redirected.** Writing operations resolve the named path's parent once
//!   (following symlinks as the client named them) into a directory descriptor and do
//!   everything below it by descriptor (`openat2`/`O_NOFOLLOW`, `mkdirat`, `unlinkat`,
//!   `O_EXCL`, `fchmod`), never following a symlink in the last component or inside a tree
//!   (the `dirfd` module states the rule). A component swapped for a symlink mid-operation stops it.
//! - **Reads follow symlinks deliberately.** `read_file`, `open_for_streaming`,
//!   `read_directory` and `canonicalize` follow them; `get_metadata` reports both the link and
//!   its target.
//! - **Errors name the operation and its inputs.** [`FsError::kind`] classifies them for the
//!   wire (`notFound`, `sandboxDenied` from `PermissionDenied`, ...).

// All unsafe code is in `sys`: owning a descriptor received with SCM_RIGHTS.
#![deny(unsafe_code)]

mod dirfd;
mod error;
pub mod frame;
pub mod helper;
mod open;
mod ops;
mod sys;
mod temp;
#[cfg(test)]
mod test_support;
pub mod wire;

pub use error::{Expected, FsError, FsErrorKind, FsOperation};
pub use ops::MAX_TREE_DEPTH;
pub use ops::copy::{COPY_MAX_BYTES, copy};
pub use ops::directory::{DirEntry, create_directory, read_directory, read_directory_at_most};
pub use ops::metadata::{Metadata, canonicalize, get_metadata};
pub use ops::read::{
    READ_BLOCK_MAX_BYTES, READ_FILE_MAX_BYTES, ReadOrSize, open_for_streaming, read_block,
    read_file, read_file_unless_above,
};
pub use ops::remove::remove;
pub use ops::walk::{
    WALK_DEFAULT_ENTRIES, WALK_MAX_ENTRIES, WALK_MAX_PATH_BYTES, Walk, WalkEntry, walk,
};
pub use ops::write::{WriteOptions, write_file};
pub use temp::ATOMIC_TEMP_PREFIX;
