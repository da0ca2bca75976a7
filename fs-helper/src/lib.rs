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
//! - **Symlinks are handled deliberately.** Reads, writes, `create_directory`, `read_directory`
//!   and `canonicalize` follow them; `remove` and `copy` never follow one in the last component
//!   (nor inside a tree), and `get_metadata` reports both the link and its target.
//! - **Errors name the operation and its inputs.** [`FsError::kind`] classifies them for the
//!   wire (`notFound`, `sandboxDenied` from `PermissionDenied`, ...).

#![forbid(unsafe_code)]

mod error;
pub mod helper;
mod open;
mod ops;
#[cfg(test)]
mod test_support;
pub mod wire;

pub use error::{FsError, FsErrorKind, FsOperation};
pub use ops::copy::copy;
pub use ops::directory::{DirEntry, create_directory, read_directory};
pub use ops::metadata::{Metadata, canonicalize, get_metadata};
pub use ops::read::{
    READ_BLOCK_MAX_BYTES, READ_FILE_MAX_BYTES, open_for_streaming, read_block, read_file,
};
pub use ops::remove::remove;
pub use ops::write::{ATOMIC_TEMP_PREFIX, WriteOptions, write_file};
